"""Export room: stage notebooks -> rewrites -> generated/train.py. Never imports torch."""
from nbddp.export.exporter import ExportResult, export

__all__ = ["ExportResult", "export"]
