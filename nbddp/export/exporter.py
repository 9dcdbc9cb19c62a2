"""Stage notebooks -> generated/train.py and its source map: the export steps in order."""
import os
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

from nbddp.export.cells import (
    GeneratedCell,
    export_code_cell,
    export_text_cell,
    parameters_cell,
    setup_cell,
    teardown_cell,
)
from nbddp.export.notebooks import SourceCell, read_stages
from nbddp.export.parameters import merge_parameters
from nbddp.export.report import CellNote, ExportReport
from nbddp.export.script import header_cell, render_script
from nbddp.export.writer import check_out_dir, refuse_hand_edited, stale_files, write_files
from nbddp.formats.sourcemap import sourcemap_text

SCRIPT_NAME = "train.py"
SOURCEMAP_NAME = "train.sourcemap.json"


@dataclass
class ExportResult:
    """What export produced (path -> text), its report, and, for a check, the stale files (else [])."""

    script_path: Path
    files: dict
    report: ExportReport
    stale: list
    written: bool


def export(notebooks="notebooks", out="generated", *, check=False, force=False) -> ExportResult:
    """Export the stage notebooks in `notebooks` to `out`/train.py and `out`/train.sourcemap.json.

    `check`: write nothing, list in `stale` the files that differ from what export would write.
    `force`: overwrite a train.py that was edited by hand (otherwise that is an NbddpError).
    Bad notebooks raise NotebookError before anything is written; an `out` that cannot be written, UsageError.
    The paths the script and its map name are relative to the folder that holds `out` (the project), so an
    export from any working directory writes the same files.
    """
    out = Path(out)
    script_path, sourcemap_path = out / SCRIPT_NAME, out / SOURCEMAP_NAME
    if not check:
        check_out_dir(out)
    project = os.path.dirname(os.path.abspath(out))
    stages = read_stages(notebooks, relative_to=project)
    workdir = Path(os.path.relpath(os.path.abspath(notebooks), os.path.abspath(out))).as_posix()
    cells, report = assemble_cells(stages, workdir)
    cells.insert(0, header_cell(stages, Path(os.path.relpath(os.path.abspath(script_path), project)).as_posix()))
    script_text = render_script(cells)
    files = {
        script_path: script_text,
        sourcemap_path: sourcemap_text(SCRIPT_NAME, script_text, cells, stages),
    }
    if check:
        return ExportResult(script_path, files, report, stale_files(files, script_path, sourcemap_path), written=False)
    if not force:
        refuse_hand_edited(script_path, sourcemap_path)
    write_files(files)
    return ExportResult(script_path, files, report, stale=[], written=True)


def assemble_cells(stages, workdir=".") -> tuple[list, ExportReport]:
    """The script's cells after the header (parameters, setup, stage cells, teardown) and the report; `workdir`:
    the notebooks' folder from the script's."""
    stage_notebooks = frozenset(stage.name for stage in stages)
    report = ExportReport(notebooks=len(stages))
    parameter_cells, body = [], []
    for stage in stages:
        exported = [_export_cell(cell, stage_notebooks) for cell in stage.cells]
        parameter_cells += [item.cell for item in exported if item.parameters]
        for index, item in enumerate(exported):
            if _over_dropped_cells_only(exported, index):
                item = _Exported(item.cell, None, [CellNote(item.cell.location, ORPHAN_NOTE)], dropped=True)
            report.entries.extend(item.entries)
            if item.generated is not None:
                body.append(item.generated)
    report.cells = len(body)
    parameters = merge_parameters(parameter_cells, workdir)
    return [parameters_cell(parameters), setup_cell(), *body, teardown_cell()], report


ORPHAN_NOTE = "dropped: a markdown cell over dropped cells only"


@dataclass(frozen=True)
class _Exported:
    """A stage cell as export takes it: what the script's body gets of it (None: nothing) and the report's entries."""

    cell: SourceCell
    generated: GeneratedCell | None
    entries: list
    dropped: bool = False  # left out of the script (a parameters cell is not: it joins the script's parameters cell)
    parameters: bool = False


def _export_cell(cell: SourceCell, stage_notebooks: frozenset) -> _Exported:
    if "notebook-only" in cell.tags:
        return _Exported(cell, None, [CellNote(cell.location, "dropped (notebook-only)")], dropped=True)
    if "injected-parameters" in cell.tags:
        note = CellNote(cell.location, "dropped (papermill's injected-parameters)")
        return _Exported(cell, None, [note], dropped=True)
    if "parameters" in cell.tags:
        return _Exported(cell, None, [], parameters=True)
    if cell.cell_type == "code":
        generated, entries = export_code_cell(cell, stage_notebooks)
        return _Exported(cell, generated, entries, dropped=generated is None and bool(cell.source.strip()))
    return _Exported(cell, export_text_cell(cell), [])


def _over_dropped_cells_only(exported: list, index: int) -> bool:
    """Whether `exported[index]` is a markdown cell whose section (the cells after it up to the next markdown cell
    the script keeps) is all dropped: its heading would stand over the next section's code."""
    item = exported[index]
    if item.cell.cell_type != "markdown" or item.generated is None:
        return False
    section = list(takewhile(lambda later: later.cell.cell_type != "markdown" or later.generated is None,
                             exported[index + 1 :]))
    return bool(section) and all(later.dropped for later in section)
