"""Stage notebooks -> generated/train.py and its source map: the export steps in order."""
import os
from dataclasses import dataclass
from pathlib import Path

from nbddp.export.cells import export_code_cell, export_text_cell, parameters_cell, setup_cell, teardown_cell
from nbddp.export.notebooks import read_stages
from nbddp.export.parameters import merge_parameters
from nbddp.export.report import CellNote, ExportReport
from nbddp.export.script import header_cell, render_script
from nbddp.export.sourcemap import sourcemap_text
from nbddp.export.writer import check_out_dir, refuse_hand_edited, stale_files, write_files

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
    script_path = out / SCRIPT_NAME
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
        out / SOURCEMAP_NAME: sourcemap_text(SCRIPT_NAME, script_text, cells),
    }
    if check:
        return ExportResult(script_path, files, report, stale_files(files, script_path), written=False)
    if not force:
        refuse_hand_edited(script_path)
    write_files(files)
    return ExportResult(script_path, files, report, stale=[], written=True)


def assemble_cells(stages, workdir=".") -> tuple[list, ExportReport]:
    """The script's cells after the header (parameters, setup, stage cells, teardown) and the report; `workdir`:
    the notebooks' folder from the script's."""
    stage_notebooks = frozenset(stage.name for stage in stages)
    report = ExportReport(notebooks=len(stages))
    parameter_cells, body = [], []
    for stage in stages:
        for cell in stage.cells:
            if "notebook-only" in cell.tags:
                report.entries.append(CellNote(cell.location, "dropped (notebook-only)"))
            elif "injected-parameters" in cell.tags:
                report.entries.append(CellNote(cell.location, "dropped (papermill's injected-parameters)"))
            elif "parameters" in cell.tags:
                parameter_cells.append(cell)
            elif cell.cell_type == "code":
                generated, entries = export_code_cell(cell, stage_notebooks)
                report.entries.extend(entries)
                body.append(generated)
            else:
                body.append(export_text_cell(cell))
    body = [cell for cell in body if cell is not None]
    report.cells = len(body)
    parameters = merge_parameters(parameter_cells, workdir)
    return [parameters_cell(parameters), setup_cell(parameters.defined_in), *body, teardown_cell()], report
