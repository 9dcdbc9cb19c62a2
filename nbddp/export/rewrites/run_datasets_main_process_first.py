"""Dataset loading and mapping run on local rank 0 first; the other ranks then reuse its cache.

A statement that calls a dataset builder is wrapped in `with ddp.main_process_first():`, so that
local rank 0 downloads and fills the Hugging Face datasets cache alone and the other ranks read the
finished cache files instead of racing to write the same ones. Consecutive such statements share
one `with`. `num_proc=N` in those calls becomes `ddp.cap_num_proc(N)`: every rank starts its own
worker processes.

Which calls (a heuristic, since types are unknown before running):
- `load_dataset(...)`;
- `Dataset.from_*(...)` (also `DatasetDict`/`IterableDataset`): `from_dict`, `from_list`, `from_generator`, ...;
- `<anything>.map(f, ...)` and `<anything>.filter(f, ...)` given a function, positionally or as
  `function=`; the builtins `map(f, xs)` and `filter(f, xs)` have no receiver and do not match. A
  pandas `.map` also matches, which costs a barrier and nothing else;
- Unsloth's chat-template helpers that map a dataset inside, with workers of their own:
  `standardize_sharegpt`, `standardize_data_formats` and `train_on_responses_only` (its trainer's datasets).

Only statements that every rank runs are wrapped: not those in functions or classes (a function may
be called on one rank only, and `main_process_first` waits for all of them), nor those under
`if ddp.is_main_process:` or already under `with ddp.main_process_first():`.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of, keyword, receiver_name
from nbddp.export.rewrites.ddp_blocks import (
    MAIN_PROCESS_FIRST,
    MAIN_PROCESS_ONLY,
    WHOLE_CELL_TAGS,
    is_ddp_call,
    main_process_first,
    wrap_keyword,
)

DATASET_CLASSES = {"Dataset", "DatasetDict", "IterableDataset", "IterableDatasetDict"}
# unsloth.chat_templates helpers that call dataset.map themselves
MAPPING_HELPERS = {"standardize_sharegpt", "standardize_data_formats", "train_on_responses_only"}


def builds_dataset(call: cst.Call) -> bool:
    name = callee_name(call)
    if name == "load_dataset" or name in MAPPING_HELPERS:
        return True
    if name and name.startswith("from_") and receiver_name(call) in DATASET_CLASSES:
        return True
    if isinstance(call.func, cst.Attribute) and name in {"map", "filter"}:
        return keyword(call, "function") is not None or any(arg.keyword is None and not arg.star for arg in call.args)
    return False


def dataset_calls(node: cst.CSTNode) -> list[cst.Call]:
    return [call for call in m.findall(node, m.Call()) if builds_dataset(call)]


class RunDatasetsMainProcessFirst(Rewrite):
    NAME = "run-datasets-main-process-first"
    DESCRIPTION = "Load and map datasets on local rank 0 first (ddp.main_process_first()); the others reuse its cache."

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._not_every_rank = 0  # depth inside functions, classes and main-process-only/first blocks

    def visit_Module(self, node: cst.Module) -> bool:
        return not self.context.cell_tags & WHOLE_CELL_TAGS

    # Where statements may be wrapped.

    def visit_FunctionDef(self, node) -> None:
        self._not_every_rank += 1

    def leave_FunctionDef(self, original_node, updated_node):
        self._not_every_rank -= 1
        return updated_node

    def visit_ClassDef(self, node) -> None:
        self._not_every_rank += 1

    def leave_ClassDef(self, original_node, updated_node):
        self._not_every_rank -= 1
        return updated_node

    def visit_If(self, node: cst.If) -> None:
        self._not_every_rank += m.matches(node, MAIN_PROCESS_ONLY)

    def leave_If(self, original_node, updated_node):
        self._not_every_rank -= m.matches(original_node, MAIN_PROCESS_ONLY)
        return updated_node

    def visit_With(self, node: cst.With) -> None:
        self._not_every_rank += m.matches(node, MAIN_PROCESS_FIRST)

    def leave_With(self, original_node, updated_node):
        self._not_every_rank -= m.matches(original_node, MAIN_PROCESS_FIRST)
        return updated_node

    # What is wrapped and capped.

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self._not_every_rank == 0:
            for call in dataset_calls(node):
                self.record(call, f"{code_of(call.func)}() runs on local rank 0 first; the other ranks reuse its cache")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        given = keyword(original_node, "num_proc")
        if not builds_dataset(original_node) or given is None or is_ddp_call(given.value, "cap_num_proc"):
            return updated_node
        written = code_of(given.value)
        self.record(given, f"num_proc={written} -> ddp.cap_num_proc({written}) (every rank starts its own workers)")
        return wrap_keyword(updated_node, "num_proc", "cap_num_proc")

    def leave_IndentedBlock(self, original_node, updated_node):
        if self._not_every_rank:
            return updated_node
        return updated_node.with_changes(body=self._wrap(updated_node.body))

    def leave_Module(self, original_node, updated_node):
        if self.context.cell_tags & WHOLE_CELL_TAGS:
            return updated_node
        return updated_node.with_changes(body=self._wrap(updated_node.body))

    def _wrap(self, statements):
        """Each run of consecutive dataset statements under one `with ddp.main_process_first():`."""
        wrapped, run = [], []
        for statement in [*statements, None]:
            if isinstance(statement, cst.SimpleStatementLine) and dataset_calls(statement):
                run.append(statement)
                continue
            if run:
                wrapped.append(main_process_first(run))
                run = []
            if statement is not None:
                wrapped.append(statement)
        return wrapped
