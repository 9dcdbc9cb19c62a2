"""Refuse `input()`: under torchrun no process reads the terminal, so every rank would wait for an answer forever.

The export stops (exit 2) at the call's notebook, cell and line; the hint says to make the answer a parameter
(a `parameters` cell: `answer = "yes"`, then `--answer VALUE` on the script) or tag the cell notebook-only.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite

HINT = ("make the answer a parameter (in a cell tagged parameters: `answer = \"...\"`, then `--answer VALUE` on the "
        "script), or tag the cell notebook-only to leave it out of the script")


class RefuseInput(Rewrite):
    NAME = "refuse-input"
    DESCRIPTION = "Stop the export at input(): under torchrun no process reads the terminal, so the script would hang."

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Name("input")):
            self.fail(node, "input() waits for an answer typed at the terminal; under torchrun no process reads "
                            "one, so every rank would wait forever", hint=HINT)
