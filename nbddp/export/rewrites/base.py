"""What every rewrite shares: a libcst transformer that records the changes it makes, by line."""
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import PositionProvider

from nbddp.errors import NotebookError


@dataclass(frozen=True)
class CellLocation:
    """Where a cell's code came from: the notebook path and the 1-based cell number."""

    notebook: str
    cell: int


@dataclass(frozen=True)
class Change:
    """One applied rewrite, for the export report: `<notebook>, cell <c>, line <l>: [<rewrite>] <message>`."""

    rewrite: str
    location: CellLocation
    line: int
    message: str

    def __str__(self):
        return f"{self.location.notebook}, cell {self.location.cell}, line {self.line}: [{self.rewrite}] {self.message}"


@dataclass(frozen=True)
class ExportContext:
    """What a rewrite may need to know about the whole pipeline."""

    stage_notebooks: frozenset = frozenset()  # file names of the stages, e.g. {"01_data_prep.ipynb"}
    cell_tags: frozenset = frozenset()  # tags of the cell being rewritten, e.g. {"rank0"}


class Rewrite(cst.CSTTransformer):
    """Base class: subclasses set NAME and DESCRIPTION and call `record` for every change they make."""

    NAME = ""
    DESCRIPTION = ""
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, location: CellLocation, context: ExportContext = ExportContext()):
        super().__init__()
        self.location = location
        self.context = context
        self.changes: list[Change] = []

    def line_of(self, node) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def record(self, node, message):
        self.changes.append(Change(self.NAME, self.location, self.line_of(node), message))

    def fail(self, node, message, hint=None):
        raise NotebookError(self.location.notebook, message, cell=self.location.cell, line=self.line_of(node), hint=hint)
