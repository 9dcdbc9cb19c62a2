"""Give the strings inside an f-string's `{...}` the other quote, on a Python older than 3.12, in a cell it rejects.

Unsloth's notebooks are written on Colab's Python 3.12, whose f-strings may reuse their own quote inside a
replacement field (PEP 701): `f"{sample["question"]}"`. Python 3.11 and older end the f-string at that quote, so the
cell is a syntax error there; `f"{sample['question']}"` means the same on every Python (a `{expr=}` field prints the
expression as respelled). A string or f-string inside a field, quoted as an enclosing f-string is, gets the other
quote, as many times, where its text lacks that quote. An f-string that needs more than that is left as written, and
`export/syntax.py` reports the cell's syntax error: a backslash or a comment inside `{...}`, both quotes in one inner
string, f-strings nested deeper than the quotes allow. A cell the running Python parses, and every cell on Python
3.12 or newer, is left alone.
"""
import ast
import sys
import warnings

import libcst as cst

from nbddp.export.rewrites.base import Rewrite

OLD_FSTRINGS = sys.version_info < (3, 12)  # before PEP 701, an f-string ends at the first of its own quotes
RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"


def syntax_error(code: str) -> SyntaxError | None:
    """The running Python's syntax error in `code`, None when it parses. Escape-sequence warnings are the cell's
    business when it runs, not the export's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            ast.parse(code)
        except SyntaxError as error:
            return error
    return None


class RespellFstrings(Rewrite):
    NAME = "respell-fstrings"
    DESCRIPTION = ("On Python < 3.12, give the strings inside an f-string's {...} the other quote where the cell "
                   "reuses the outer one (Python 3.12's f-strings), so the script compiles on the exporting Python.")

    def visit_Module(self, node: cst.Module) -> bool:
        return OLD_FSTRINGS and syntax_error(node.code) is not None

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        return False  # the f-strings inside it are respelled with it

    def leave_FormattedString(self, original_node, updated_node):
        respelled = _with_fields_respelled(updated_node, (updated_node.quote,))
        if respelled.deep_equals(updated_node) or syntax_error(cst.Module([]).code_for_node(respelled)):
            return updated_node  # nothing to respell, or more than quotes to change: export/syntax.py reports it
        self.record(original_node, f"gave the strings inside this f-string's {{...}} the other quote: Python {RUNNING} "
                                   "ends an f-string at its own quote, 3.12 does not")
        return respelled


def _with_fields_respelled(fstring: cst.FormattedString, enclosing: tuple) -> cst.FormattedString:
    """`fstring` with the strings in its fields (and their format specs) quoted apart from `enclosing`: its own
    quote and those of the f-strings around it."""
    inner = _InnerStrings(enclosing)
    return fstring.with_changes(parts=[part.visit(inner) for part in fstring.parts])


class _InnerStrings(cst.CSTTransformer):
    """Respells the string literals in a replacement field, an f-string's fields in turn with its own quote added."""

    def __init__(self, enclosing: tuple):
        super().__init__()
        self.enclosing = enclosing

    def leave_SimpleString(self, original_node, updated_node):
        quote = _free_quote(updated_node.quote, updated_node.raw_value, self.enclosing)
        if quote == updated_node.quote:
            return updated_node
        return updated_node.with_changes(value=f"{updated_node.prefix}{quote}{updated_node.raw_value}{quote}")

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        return False  # its fields are respelled in leave, inside its own (new) quote

    def leave_FormattedString(self, original_node, updated_node):
        quote = _free_quote(updated_node.quote, cst.Module([]).code_for_node(updated_node), self.enclosing)
        fstring = updated_node.with_changes(start=updated_node.prefix + quote, end=quote)
        return _with_fields_respelled(fstring, (*self.enclosing, quote))


def _free_quote(quote: str, text: str, enclosing: tuple) -> str:
    """`quote`, or the other quote character (as many times) where an enclosing f-string ends at `quote` and
    neither does at the other one nor `text` holds it; `quote` again when there is no such other quote."""
    if not any(_ends_at(quote, outer) for outer in enclosing):
        return quote
    other = ("'" if quote[0] == '"' else '"') * len(quote)
    if other[0] in text or any(_ends_at(other, outer) for outer in enclosing):
        return quote
    return other


def _ends_at(quote: str, outer: str) -> bool:
    """Whether an f-string opened with `outer` ends (before 3.12) at a string quoted `quote` inside it: at its
    quote character if it is single-quoted, at the same three if it is triple-quoted."""
    return quote[0] == outer[0] and (len(outer) == 1 or quote == outer)
