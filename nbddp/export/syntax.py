"""Syntax errors in code cells, reported at the notebook, cell and line where they are."""
import ast
import sys
import warnings

import libcst as cst

from nbddp.errors import NotebookError
from nbddp.export.rewrites.base import CellLocation
from nbddp.export.rewrites.convert_magics import to_python


def check_syntax(location: CellLocation, source: str) -> str:
    """The cell as Python (magics turned into `get_ipython()` calls, line for line), checked by Python's
    parser: its messages ("'(' was never closed") and lines beat libcst's, which can point past the mistake.
    """
    code = to_python(source)
    with warnings.catch_warnings():
        # Escape-sequence warnings are the cell's business when it runs, not the export's.
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            ast.parse(code)
        except SyntaxError as err:
            raise NotebookError(location.notebook, f"syntax error: {err.msg}", cell=location.cell, line=err.lineno,
                                hint=_newer_python_hint(code)) from err
    return code


def _newer_python_hint(code: str) -> str | None:
    """Notebooks written on Colab's newer Python use its grammar (3.12's f-strings reuse the outer quotes inside
    `{...}`); libcst knows newer grammars than the Python running the export, so its parse tells the two apart."""
    try:
        cst.parse_module(code)
    except cst.ParserSyntaxError:
        return None
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (f"a newer Python's grammar accepts this cell, Python {running}'s does not (3.12 allows quotes inside "
            f"f-strings, for one): export and run the script with a newer Python, or rewrite the line for {running}")


def parse_cell(location: CellLocation, source: str) -> cst.Module:
    """The checked cell as a libcst tree."""
    code = check_syntax(location, source)
    try:
        return cst.parse_module(code)
    except cst.ParserSyntaxError as err:  # code Python accepts but libcst cannot parse
        raise NotebookError(
            location.notebook, f"libcst cannot parse this cell: {err.message}", cell=location.cell, line=err.raw_line
        ) from err
