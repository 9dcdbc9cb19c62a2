"""An excepthook for generated scripts: the usual traceback, then the notebook cell the failing line came from.

    [rank 1] Traceback (most recent call last):
    [rank 1]   File "generated/train.py", line 57, in <module>
    ...
    [rank 1] nbddp: generated/train.py line 57 comes from notebooks/03_train.ipynb, cell 4, line 2

The `[rank R]` prefix appears only when torchrun started more than one process, so interleaved reports
from several ranks stay readable.
"""
import os
import sys
import traceback

from nbddp.runtime import sourcemap


def install(script: str) -> None:
    """Report uncaught exceptions of this process against the source map that sits beside `script`."""
    script = os.path.abspath(script)

    def report_with_origin(exc_type, exc, tb):
        sys.stderr.write(format_report(exc_type, exc, tb, script))
        sys.stderr.flush()

    sys.excepthook = report_with_origin


def format_report(exc_type, exc, tb, script: str) -> str:
    lines = traceback.format_exception(exc_type, exc, tb)
    origin_line = _origin_line(tb, script)
    if origin_line:
        lines.append(origin_line + "\n")
    text = "".join(lines)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        prefix = f"[rank {os.environ.get('RANK', '?')}] "
        text = "".join(prefix + line for line in text.splitlines(keepends=True))
    return text


def _origin_line(tb, script: str) -> str | None:
    """One sentence locating the innermost frame of `script` in the notebooks, or saying that the source map
    could not be read; None when nothing is known."""
    script_lines = [line for frame, line in traceback.walk_tb(tb) if os.path.abspath(frame.f_code.co_filename) == script]
    if not script_lines:
        return None
    path = sourcemap.sourcemap_path(script)
    try:
        mapping = sourcemap.load(path)
    except (OSError, sourcemap.SourceMapError) as error:
        # The report must still come out: an excepthook that raises buries the user's error under its own.
        return f"nbddp: could not read the source map {os.path.relpath(path)}: {error}"
    found = sourcemap.lookup(mapping, script_lines[-1]) if mapping else None
    if found is None:
        return None
    where = f"nbddp: {os.path.relpath(script)} line {script_lines[-1]}"
    if found.origin is None:
        return f"{where} was written by nbddp (cell {found.cell_title!r})"
    return f"{where} comes from {found.origin}"
