"""The DDP rewrites, applied to one cell's source in order. Each one lives in its own module."""
import libcst as cst
from libcst.metadata import MetadataWrapper

from nbddp.export.rewrites.base import CellLocation, Change, ExportContext, Rewrite

# Filled in order by the rewrite modules; magics are converted before any of these run.
REWRITES: list[type[Rewrite]] = []


def apply(source: str, location: CellLocation, context: ExportContext = ExportContext()) -> tuple[str, list[Change]]:
    """Rewrite one code cell's source; returns the new source and the changes made, in order."""
    changes: list[Change] = []
    module = cst.parse_module(source)
    for rewrite_class in REWRITES:
        rewrite = rewrite_class(location, context)
        module = MetadataWrapper(module).visit(rewrite)
        changes.extend(rewrite.changes)
    return module.code, changes
