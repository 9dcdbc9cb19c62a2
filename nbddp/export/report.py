"""The export report: what export did to each cell, one line each, and a summary."""
from dataclasses import dataclass, field

from nbddp.export.rewrites.base import CellLocation, Change


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
    def rewrites(self) -> int:
        return sum(isinstance(entry, Change) for entry in self.entries)

    def summary(self, script_path) -> str:
        return f"wrote {script_path} from {self.notebooks} notebooks: {self.cells} cells, {self.rewrites} rewrites"

    def text(self, script_path) -> str:
        return "\n".join([*map(str, self.entries), self.summary(script_path)])
