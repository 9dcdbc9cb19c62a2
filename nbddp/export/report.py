"""The export report: what export did to each cell, one line each, and a summary.

A change whose message starts with `warning:` is something the user must act on that export could not make
DDP-safe (a training loop of the notebook's own, a remote API every rank calls): the summary counts those apart.
"""
from dataclasses import dataclass, field

from nbddp.export.rewrites.base import CellLocation, Change

WARNING = "warning:"


@dataclass(frozen=True)
class CellNote:
    """Something export did to a whole cell (dropped it, wrapped it): `<notebook>, cell <c>: <message>`."""

    location: CellLocation
    message: str

    def __str__(self):
        return f"{self.location.notebook}, cell {self.location.cell}: {self.message}"


@dataclass
class ExportReport:
    """Changes and cell notes in cell order, and the counts for the summary line."""

    entries: list = field(default_factory=list)  # Change and CellNote
    notebooks: int = 0
    cells: int = 0  # cells of the script taken from the notebooks

    @property
    def warnings(self) -> int:
        return sum(isinstance(entry, Change) and entry.message.startswith(WARNING) for entry in self.entries)

    @property
    def rewrites(self) -> int:
        return sum(isinstance(entry, Change) for entry in self.entries) - self.warnings

    def summary(self, script_path) -> str:
        summary = f"wrote {script_path} from {self.notebooks} notebooks: {self.cells} cells, {self.rewrites} rewrites"
        if self.warnings:
            summary += f", {self.warnings} warning{'s' * (self.warnings > 1)} (the lines marked {WARNING} above)"
        return summary

    def text(self, script_path) -> str:
        return "\n".join([*map(str, self.entries), self.summary(script_path)])
