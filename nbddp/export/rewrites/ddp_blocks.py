"""The `ddp` blocks the guard rewrites write, and what they need to recognise in code.

- `if ddp.is_main_process:` + statements, then `ddp.barrier()`: only global rank 0 runs them, the
  others wait (`rank0_block` wraps a whole cell this way, as for a cell tagged `rank0`);
- `with ddp.main_process_first():` + statements: local rank 0 runs them first, then the others
  (`main_process_first_block`, as for a cell tagged `main-process-first`).

A collective call (every rank must make it, or all of them hang) must never end up inside
`if ddp.is_main_process:`; `collective_calls` finds them.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.call_args import callee_name, keyword, receiver_name, set_keyword_value
from nbddp.export.rewrites.vocabulary import TRAINER_COLLECTIVES, holds_trainer

IS_MAIN_PROCESS = m.Attribute(value=m.Name("ddp"), attr=m.Name("is_main_process"))
MAIN_PROCESS_ONLY = m.If(test=IS_MAIN_PROCESS)
MAIN_PROCESS_FIRST = m.With(
    items=[m.WithItem(item=m.Call(func=m.Attribute(value=m.Name("ddp"), attr=m.Name("main_process_first"))))]
)
BARRIER = m.SimpleStatementLine(
    body=[m.Expr(value=m.Call(func=m.Attribute(value=m.Name("ddp"), attr=m.Name("barrier"))))]
)

DDP_COLLECTIVES = {"barrier", "main_process_first", "shutdown"}
WHOLE_CELL_TAGS = frozenset({"rank0", "main-process-first"})  # cells the export wraps whole, in the blocks below


class _UnindentBlankLines(cst.CSTTransformer):
    """Blank lines of code moved into a block would otherwise get the block's indentation as trailing spaces."""

    def leave_EmptyLine(self, original_node: cst.EmptyLine, updated_node: cst.EmptyLine) -> cst.EmptyLine:
        return updated_node.with_changes(indent=False) if updated_node.comment is None else updated_node


def indented(statements, footer=()) -> cst.IndentedBlock:
    """`statements` as the body of a new block (one level deeper than where they were)."""
    return cst.IndentedBlock(body=list(statements), footer=list(footer)).visit(_UnindentBlankLines())


def main_process_only(statements: list[cst.BaseStatement]) -> cst.If:
    """`if ddp.is_main_process:` + statements; the first statement's comments move above the `if`."""
    first, *rest = statements
    return cst.If(
        test=cst.parse_expression("ddp.is_main_process"),
        body=indented([first.with_changes(leading_lines=[]), *rest]),
        leading_lines=first.leading_lines,
    )


def main_process_first(statements: list[cst.BaseStatement]) -> cst.With:
    """`with ddp.main_process_first():` + statements; the first statement's comments move above the `with`."""
    first, *rest = statements
    return cst.With(
        items=[cst.WithItem(item=cst.parse_expression("ddp.main_process_first()"))],
        body=indented([first.with_changes(leading_lines=[]), *rest]),
        leading_lines=first.leading_lines,
    )


def ddp_call(attribute: str, value: cst.BaseExpression) -> cst.Call:
    """`ddp.<attribute>(<value>)`."""
    return cst.Call(func=cst.Attribute(value=cst.Name("ddp"), attr=cst.Name(attribute)), args=[cst.Arg(value)])


def is_ddp_call(node: cst.BaseExpression, attribute: str) -> bool:
    return m.matches(node, m.Call(func=m.Attribute(value=m.Name("ddp"), attr=m.Name(attribute))))


def wrap_keyword(call: cst.Call, name: str, attribute: str) -> cst.Call:
    """`call` with its `name=value` argument turned into `name=ddp.<attribute>(value)`."""
    return set_keyword_value(call, name, ddp_call(attribute, keyword(call, name).value))


def barrier() -> cst.SimpleStatementLine:
    return cst.parse_statement("ddp.barrier()\n")


def rank0_block(module: cst.Module) -> cst.Module:
    """The whole cell under `if ddp.is_main_process:`, then `ddp.barrier()` so the other ranks wait."""
    if not module.body:
        return module
    guarded = cst.If(
        test=cst.parse_expression("ddp.is_main_process"),
        body=indented(module.body, module.footer),
    )
    return module.with_changes(body=[guarded, barrier()], footer=[])


def main_process_first_block(module: cst.Module) -> cst.Module:
    """The whole cell under `with ddp.main_process_first():`."""
    if not module.body:
        return module
    first_block = cst.With(
        items=[cst.WithItem(item=cst.parse_expression("ddp.main_process_first()"))],
        body=indented(module.body, module.footer),
    )
    return module.with_changes(body=[first_block], footer=[])


def is_collective(call: cst.Call) -> bool:
    """`trainer.train()`/`.evaluate()`/`.predict()`/`.save_model()`, `ddp.barrier()`, `ddp.main_process_first()`."""
    receiver, name = receiver_name(call), callee_name(call)
    return (name in TRAINER_COLLECTIVES and holds_trainer(receiver)) or (receiver == "ddp" and name in DDP_COLLECTIVES)


def collective_calls(node: cst.CSTNode) -> list[cst.Call]:
    return [call for call in m.findall(node, m.Call()) if is_collective(call)]
