"""A cell that generates text runs on the main process only, and the other ranks wait for it.

Sampling from the model on every rank would only repeat the same work N times (and print it N
times). A cell generates text when it calls `*.generate(...)`, Unsloth's vLLM `*.fast_generate(...)`,
`FastLanguageModel.for_inference(...)` (or `FastModel`/`FastVisionModel`), `TextStreamer(...)`/
`TextIteratorStreamer(...)`, or `pipeline("text-generation", ...)`; a `model.load_lora(...)` (the LoRA request
`fast_generate` samples with) generates nothing alone and goes where its cell goes. The cell becomes
`if ddp.is_main_process:` + its code, then `ddp.barrier()` (`rank0_block`, which the export also uses for
cells tagged `rank0`).

A cell that also makes a collective call (`trainer.train()`, `ddp.barrier()`, ...) is left for all
ranks with a note: guarding it would leave the other ranks waiting forever. Generation inside a
function the cell only defines does not count. Names the wrapped cell assigns exist on the main
process only; a later cell that needs them on every rank must not read them.

The cell's leading imports and leading statements that rebind a name from its own old value
(`tokenizer = get_chat_template(tokenizer, ...)`, 14 inference cells of unslothai/notebooks) stay
before the block, on every rank: under the guard the other ranks would keep the old tokenizer (and lack
the imported names) for every later cell. Such a rebinding after the cell's first other statement
stays in the block with a note.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of, keyword, literal_value, receiver_name
from nbddp.export.rewrites.ddp_blocks import MAIN_PROCESS_ONLY, WHOLE_CELL_TAGS, collective_calls, rank0_block
from nbddp.export.rewrites.vocabulary import UNSLOTH_LOADERS

__all__ = ["GuardInferenceCell", "rank0_block"]

STREAMERS = {"TextStreamer", "TextIteratorStreamer"}
GENERATE_METHODS = {"generate", "fast_generate"}
GENERATION_TASKS = {"text-generation", "text2text-generation", "image-text-to-text"}


def generates_text(call: cst.Call) -> bool:
    name = callee_name(call)
    if isinstance(call.func, cst.Attribute) and name in GENERATE_METHODS:
        return True
    if name == "for_inference" and receiver_name(call) in UNSLOTH_LOADERS:
        return True
    if name in STREAMERS:
        return True
    if name == "pipeline":
        task = keyword(call, "task") or (call.args[0] if call.args and call.args[0].keyword is None else None)
        return task is not None and literal_value(task.value) in GENERATION_TASKS
    return False


class _GenerationFinder(cst.CSTVisitor):
    """Text-generating calls that the cell makes when it runs: not those inside a function or class it
    only defines, nor those already under `if ddp.is_main_process:`."""

    def __init__(self):
        super().__init__()
        self.calls: list[cst.Call] = []

    def visit_If(self, node: cst.If) -> bool:
        return not m.matches(node, MAIN_PROCESS_ONLY)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> None:
        if generates_text(node):
            self.calls.append(node)


class GuardInferenceCell(Rewrite):
    NAME = "guard-inference-cell"
    DESCRIPTION = "Run a cell that generates text on the main process only; the other ranks wait at ddp.barrier()."

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.context.cell_tags & WHOLE_CELL_TAGS:
            return updated_node
        finder = _GenerationFinder()
        original_node.visit(finder)
        if not finder.calls:
            return updated_node
        first = finder.calls[0]
        collectives = collective_calls(original_node)
        if collectives:
            self.record(
                first,
                f"the cell generates text but also calls {code_of(collectives[0].func)}(), which every rank must run;"
                " left for all ranks (put the generation in a cell of its own to run it on the main process only)",
            )
            return updated_node
        generation = code_of(first.func)
        setup = _leading_setup(original_node)
        message = f"the cell generates text ({generation}): it runs on the main process only, then ddp.barrier()"
        self.record(first, message)
        for index, statement in enumerate(original_node.body):
            for name in _rebound_names(statement):
                if index < setup:
                    self.record(statement, f"`{name}` is rebound from its old value before the main-process block, "
                                           f"on every rank, so that all ranks go on with the same `{name}`")
                else:
                    self.record(statement, f"`{name}` is rebound from its old value on the main process only; the "
                                           f"other ranks keep the old `{name}` (move that line to a cell of its own "
                                           "to run it on every rank)")
        guarded = rank0_block(updated_node.with_changes(body=updated_node.body[setup:]))
        return guarded.with_changes(body=[*updated_node.body[:setup], *guarded.body])


def _rebound_names(statement: cst.BaseStatement) -> list[str]:
    """The names a top-level `name = f(name, ...)` line rebinds: it changes a value the rest of the pipeline holds."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return []
    names = []
    for small in statement.body:
        if isinstance(small, cst.Assign):
            targets = {t.target.value for t in small.targets if isinstance(t.target, cst.Name)}
            read = {name.value for name in m.findall(small.value, m.Name())}
            names += sorted(targets & read)
    return names


def _leading_setup(module: cst.Module) -> int:
    """How many of the cell's first statements are imports or rebindings that generate nothing: they run on
    every rank, before the main-process block."""
    count = 0
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            break
        finder = _GenerationFinder()
        statement.visit(finder)
        setup = all(isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body) or (
            _rebound_names(statement) and all(isinstance(small, cst.Assign) for small in statement.body))
        if finder.calls or not setup:
            break
        count += 1
    return count
