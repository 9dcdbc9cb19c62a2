"""Syntax errors in code cells, reported at the notebook, cell and line where they are."""
import sys

import libcst as cst
from libcst.metadata import MetadataWrapper

from nbddp.errors import NotebookError
from nbddp.export.rewrites.base import CellLocation
from nbddp.export.rewrites.convert_magics import to_python
from nbddp.export.rewrites.respell_fstrings import RespellFstrings, syntax_error


def check_syntax(location: CellLocation, source: str) -> str:
    """The cell as Python that the running Python parses (magics turned into `get_ipython()` calls, line for line),
    or a NotebookError at Python's own message and line ("'(' was never closed"), which beat libcst's.

    A cell only a newer grammar accepts that respell-fstrings makes valid (3.12 f-strings on an older Python)
    passes, respelled: rewrites.apply runs that rewrite too, and reports it; what it leaves invalid is the error.
    """
    code = to_python(source)
    error = syntax_error(code)
    if error is None:
        return code
    try:
        module = cst.parse_module(code)  # libcst knows newer grammars than the Python running the export
    except cst.ParserSyntaxError:
        raise _notebook_error(location, error, hint=None) from error
    respelled = MetadataWrapper(module).visit(RespellFstrings(location)).code
    respelled_error = syntax_error(respelled)
    if respelled_error is None:
        return respelled
    raise _notebook_error(location, respelled_error, _newer_python_hint()) from error


def _notebook_error(location: CellLocation, error: SyntaxError, hint: str | None) -> NotebookError:
    return NotebookError(location.notebook, f"syntax error: {error.msg}", cell=location.cell, line=error.lineno,
                         hint=hint)


def _newer_python_hint() -> str:
    """For a cell that a newer Python's grammar accepts: what to do, and what respell-fstrings cannot respell."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (f"a newer Python's grammar accepts this cell, Python {running}'s does not (Python 3.12's f-strings, for "
            f"one): export and run the script with Python 3.12 or newer, or spell the line for {running}. nbddp gives "
            f"the strings inside an f-string's {{...}} the other quote itself, but not a backslash, a comment or both "
            f"quotes there, nor f-strings nested deeper than the quotes allow: compute such a value on a line above")

