"""Find the failing cell, line and exception in a notebook papermill executed.

Papermill's executed notebook differs from the notebook it was given: it inserts an
`injected-parameters` cell after the `parameters` cell and, on failure, two markdown cells tagged
`papermill-error-cell-tag`. Dropping those gives back the original cell indices. The line comes from
IPython's traceback text, whose frames in notebook code read `Cell In[<execution count>], line <n>`.
"""

import re
from dataclasses import dataclass

INSERTED_BY_PAPERMILL = {"injected-parameters", "papermill-error-cell-tag"}
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
CELL_FRAME = re.compile(r"Cell In\[(\d+)\], line (\d+)")


@dataclass(frozen=True)
class CellFailure:
    """`cell_index` is 0-based in the notebook before papermill touched it; `line` is 1-based in that cell."""

    cell_index: int
    line: int | None
    ename: str
    evalue: str
    duration_s: float | None


def find_failure(executed):
    """The first cell of the executed notebook `executed` with an error output, or None."""
    original_index = _original_indices(executed.cells)
    for index, cell in enumerate(executed.cells):
        error = _error_output(cell)
        if error is None:
            continue
        frame = _deepest_cell_frame(error.get("traceback", []), executed.cells, original_index)
        cell_index, line = frame if frame else (original_index[index], None)
        return CellFailure(cell_index, line, error.ename, error.evalue, _duration(cell))
    return None


def last_started_cell(executed):
    """The failure to report when the kernel died: no error output, so the last cell that started."""
    original_index = _original_indices(executed.cells)
    started = [i for i, cell in enumerate(executed.cells) if cell.metadata.get("papermill", {}).get("start_time")]
    started = [i for i in started if original_index[i] is not None]
    if not started:
        return None
    index = started[-1]
    return CellFailure(original_index[index], None, "DeadKernelError", "the kernel died", _duration(executed.cells[index]))


def _duration(cell):
    return cell.metadata.get("papermill", {}).get("duration")


def _original_indices(cells):
    """Executed-notebook index -> index in the notebook papermill was given (None for its own cells)."""
    mapping, original = {}, 0
    for index, cell in enumerate(cells):
        if INSERTED_BY_PAPERMILL & set(cell.metadata.get("tags", [])):
            mapping[index] = None
        else:
            mapping[index] = original
            original += 1
    return mapping


def _error_output(cell):
    for output in cell.get("outputs", []):
        # `sys.exit(0)` is how a notebook stops early on purpose; papermill does not count it either.
        if output.output_type == "error" and not (output.ename == "SystemExit" and output.evalue in ("", "0")):
            return output
    return None


def _deepest_cell_frame(traceback, cells, original_index):
    """(cell index, line) of the innermost traceback frame that is notebook code, if any.

    The innermost frame is where the exception was raised, e.g. inside a function that an earlier
    cell defined; frames in library code are skipped.
    """
    text = ANSI_ESCAPE.sub("", "\n".join(traceback))
    by_count = {cell.get("execution_count"): index for index, cell in enumerate(cells) if cell.cell_type == "code"}
    for count, line in reversed(CELL_FRAME.findall(text)):
        index = by_count.get(int(count))
        if index is not None and original_index[index] is not None:
            return original_index[index], int(line)
    return None
