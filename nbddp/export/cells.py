"""One cell of the generated script: a stage cell rewritten (and guarded, by its tags), or one nbddp writes."""
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from nbddp.export import rewrites
from nbddp.export.notebooks import SourceCell
from nbddp.export.parameters import MergedParameters
from nbddp.export.report import CellNote
from nbddp.export.rewrites.base import ExportContext
from nbddp.export.rewrites.ddp_blocks import main_process_first_block, rank0_block
from nbddp.export.rewrites.dropped_lines import shorten_comments
from nbddp.export.syntax import check_syntax
from nbddp.formats.sourcemap import align_origins

RANK0_NOTE = "wrapped in `if ddp.is_main_process:` and followed by `ddp.barrier()` (rank0)"
MAIN_PROCESS_FIRST_NOTE = "wrapped in `with ddp.main_process_first():` (main-process-first)"


@dataclass(frozen=True)
class GeneratedCell:
    """A cell of the script, with the origin of each of its source lines (see nbddp/formats/sourcemap.py)."""

    cell_type: str  # "code", "markdown" or "raw"
    source: str
    origin: list
    title: str | None = None
    tags: tuple = ()

    @property
    def label(self) -> str:
        """Its name in the source map: the title, or for the two untitled cells nbddp writes, what they are."""
        return self.title or ("parameters" if "parameters" in self.tags else "nbddp header")


def export_code_cell(cell: SourceCell, stage_notebooks: frozenset) -> tuple[GeneratedCell | None, list]:
    """The rewritten cell (None when no code is left) and the report entries for it."""
    check_syntax(cell.location, cell.source)
    context = ExportContext(stage_notebooks=stage_notebooks, cell_tags=cell.tags)
    code, changes = rewrites.apply(cell.source, cell.location, context)
    entries = sorted(changes, key=lambda change: change.line)  # rewrites run in turn; report in line order
    code = _without_blank_edges(code)
    if not code:
        if cell.source.strip():
            entries.append(CellNote(cell.location, "dropped: no code left after rewrites"))
        return None, entries
    origin = align_origins(cell.source, code, cell.location)
    module = cst.parse_module(code)
    if module.body and "rank0" in cell.tags:
        code, origin = _wrapped(code, rank0_block(module).code.rstrip("\n"), origin, cell)
        entries.append(CellNote(cell.location, RANK0_NOTE))
    elif module.body and "main-process-first" in cell.tags:
        code, origin = _wrapped(code, main_process_first_block(module).code.rstrip("\n"), origin, cell)
        entries.append(CellNote(cell.location, MAIN_PROCESS_FIRST_NOTE))
    return GeneratedCell("code", shorten_comments(code), origin, title(cell)), entries


def _wrapped(code: str, wrapped: str, origin: list, cell: SourceCell) -> tuple[str, list]:
    """`wrapped` (the cell's code inside a block) and its origins, through those of `code`: aligned with the cell
    at once, a cell whose every line a rewrite changed (a %%writefile) would have nothing to anchor on."""
    through = align_origins(code, wrapped, cell.location)  # lines of `code`, or None for the block's header
    return wrapped, [origin[entry[2] - 1] if entry else None for entry in through]


def export_text_cell(cell: SourceCell) -> GeneratedCell | None:
    """A markdown or raw cell, kept as it is (None when empty)."""
    text = _without_blank_edges(cell.source)
    if not text:
        return None
    return GeneratedCell(cell.cell_type, text, align_origins(cell.source, text, cell.location), title(cell))


def title(cell: SourceCell) -> str:
    return f"{Path(cell.location.notebook).name} cell {cell.location.cell}"


def parameters_cell(parameters: MergedParameters) -> GeneratedCell:
    return GeneratedCell("code", parameters.source, parameters.origin, tags=("parameters",))


def setup_cell() -> GeneratedCell:
    """`runtime.setup(globals())` reads the flags (which notebook defines each, from the parameters cell's
    `# <notebook>` lines) and sets the process up."""
    lines = ["from nbddp import runtime", "ddp = runtime.setup(globals())"]
    return GeneratedCell("code", "\n".join(lines), [None] * len(lines), "nbddp setup")


def teardown_cell() -> GeneratedCell:
    return GeneratedCell("code", "ddp.shutdown()", [None], "nbddp teardown")


def _without_blank_edges(text: str) -> str:
    """`text` without its leading and trailing blank lines (and trailing whitespace)."""
    lines = text.rstrip().splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)
