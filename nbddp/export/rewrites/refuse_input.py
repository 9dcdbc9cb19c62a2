"""Refuse every way a cell can wait for standard input: under torchrun no process reads the terminal, so every rank
would wait for an answer forever.

Refused: `input()`, `builtins.input()` (and `__builtins__.input()`), `getpass()` / `getpass.getpass()`, a `read`,
`readline` or `readlines` call on `sys.stdin` (`stdin`, `sys.stdin.buffer`, `sys.__stdin__`), and a `for` loop
over `sys.stdin`. The export stops (exit 2) at the call's notebook, cell and line; the hint says to make the answer
a parameter (a `parameters` cell: `answer = "yes"`, then `--answer VALUE` on the script), a secret an environment
variable, or tag the cell notebook-only. (`pipeline.py launch` also gives the workers no terminal: their stdin is
/dev/null, so what export cannot see reads end-of-file instead of waiting.)
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite

HINT = ("make the answer a parameter (in a cell tagged parameters: `answer = \"...\"`, then `--answer VALUE` on the "
        "script), or tag the cell notebook-only to leave it out of the script")
SECRET_HINT = ("read the secret from an environment variable (`os.environ[\"HF_TOKEN\"]`, set where the script "
               "runs), or tag the cell notebook-only to leave it out of the script")
WAITS = "under torchrun no process reads one, so every rank would wait forever"
_STDIN = m.Name("stdin") | m.Attribute(attr=m.Name("stdin") | m.Name("__stdin__"))
_READS = m.Name("read") | m.Name("readline") | m.Name("readlines")


class RefuseInput(Rewrite):
    NAME = "refuse-input"
    DESCRIPTION = ("Stop the export at input(), getpass() and reads of sys.stdin: under torchrun no process reads "
                   "the terminal, so the script would hang.")

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if m.matches(func, m.Name("input") | m.Attribute(value=m.Name("builtins") | m.Name("__builtins__"),
                                                           attr=m.Name("input"))):
            self.fail(node, f"{_code(func)}() waits for an answer typed at the terminal; {WAITS}", hint=HINT)
        if m.matches(func, m.Name("getpass") | m.Attribute(value=m.Name("getpass"), attr=m.Name("getpass"))):
            self.fail(node, f"{_code(func)}() waits for a secret typed at the terminal; {WAITS}", hint=SECRET_HINT)
        if m.matches(func, m.Attribute(value=_STDIN | m.Attribute(value=_STDIN, attr=m.Name("buffer")), attr=_READS)):
            self.fail(node, f"{_code(func)}() waits for standard input, the terminal's; {WAITS}", hint=HINT)

    def visit_For(self, node: cst.For) -> None:
        if m.matches(node.iter, _STDIN):
            self.fail(node, f"`for ... in {_code(node.iter)}` waits for standard input, the terminal's; {WAITS}",
                      hint=HINT)


def _code(node) -> str:
    return cst.Module([]).code_for_node(node)
