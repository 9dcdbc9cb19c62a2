"""Syntax errors in code cells, reported at the notebook, cell and line where they are."""
import ast
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
            raise NotebookError(location.notebook, f"syntax error: {err.msg}", cell=location.cell, line=err.lineno) from err
    return code


def parse_cell(location: CellLocation, source: str) -> cst.Module:
    """The checked cell as a libcst tree."""
    code = check_syntax(location, source)
    try:
        return cst.parse_module(code)
    except cst.ParserSyntaxError as err:  # code Python accepts but libcst cannot parse
        raise NotebookError(
            location.notebook, f"libcst cannot parse this cell: {err.message}", cell=location.cell, line=err.raw_line
        ) from err
