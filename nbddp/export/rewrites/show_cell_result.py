"""A cell's last expression -> `ddp.show(<expression>)`: the value Jupyter would show, shown by the script too.

Jupyter displays the value of a cell's last statement when it is an expression (`tokenizer.batch_decode(outputs)`
after generating, `dataset[0]`, `trainer.evaluate()`); a script run by python or torchrun drops it silently.
`ddp.show(value)` does what Jupyter does, once: the expression still runs on every rank (it may change state or
take part in a collective, as `trainer.evaluate()` does), and the main process displays a value that is not None.

Left alone: a last expression ending in `;` (Jupyter shows nothing after it), calls that print, plot or save by
themselves (`print(...)`, `display(...)`, `plt.show()`, `model.save_pretrained(...)`), which guard-rank0-side-effects
puts on the main process, and nbddp's own calls (`ddp.barrier()` that another rewrite put last).
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import code_of
from nbddp.export.rewrites.ddp_blocks import ddp_call
from nbddp.export.rewrites.guard_rank0_side_effects import has_side_effect, tracker_runs

DDP_CALL = m.Call(func=m.Attribute(value=m.Name("ddp")))  # nbddp's own (`ddp.barrier()`, `ddp.show(...)`)


def shown_value(statement: cst.BaseStatement, runs=frozenset()) -> cst.Expr | None:
    """The expression statement Jupyter would display if `statement` ended a cell, else None (`runs`: the names
    the cell bound to a tracker's run, whose calls guard-rank0-side-effects guards)."""
    if not isinstance(statement, cst.SimpleStatementLine) or not isinstance(statement.body[-1], cst.Expr):
        return None
    last = statement.body[-1]
    if isinstance(last.semicolon, cst.Semicolon) or m.matches(last.value, DDP_CALL):
        return None
    if isinstance(last.value, cst.Call) and has_side_effect(last.value, runs):
        return None
    return last


class ShowCellResult(Rewrite):
    NAME = "show-cell-result"
    DESCRIPTION = (
        "A cell's last expression is shown as Jupyter shows it, once: ddp.show(<expression>) runs it on every "
        "rank and displays a value that is not None on the main process."
    )

    def visit_Module(self, node: cst.Module) -> bool:
        return False  # only the last top-level statement matters: leave_Module sees it

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not original_node.body:
            return updated_node
        last = shown_value(original_node.body[-1], tracker_runs(original_node))
        if last is None:
            return updated_node
        self.record(original_node.body[-1],
                    f"{_brief(code_of(last.value))} is shown once unless None, as Jupyter shows a cell's last value")
        statement = updated_node.body[-1]
        value = last.value
        if isinstance(value, cst.Tuple) and not value.lpar:  # `ok, info` is one value, a tuple: one argument
            value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        shown = last.with_changes(value=ddp_call("show", value))
        statement = statement.with_changes(body=[*statement.body[:-1], shown])
        return updated_node.with_changes(body=[*updated_node.body[:-1], statement])


def _brief(code: str, width: int = 60) -> str:
    """The expression's first line, cut to `width` characters, for the export report."""
    first = code.strip().splitlines()[0]
    return first if len(first) <= width and first == code.strip() else first[: width - 3].rstrip() + "..."
