"""Printing, plotting and saving happen once, on the main process.

A statement that only calls `print`, `pprint`, `display`, `plt.show`, `*.savefig`, `*.save_pretrained*`,
`*.push_to_hub*` (Unsloth's `save_pretrained_merged`, `push_to_hub_gguf`, ... included) or `*.save_lora` becomes
`if ddp.is_main_process:` + the statement, wherever it is; consecutive ones share one `if`. After a
guarded save or push at the cell's top level comes `ddp.barrier()`, so no rank reads a half-written
save. A trainer's own `trainer.save_model()`/`trainer.push_to_hub()` save on rank 0 by themselves and
must be called on every rank: they are left alone. A statement whose arguments make a collective call
(`print(trainer.evaluate())`) is left for all ranks, with a note. The report's line for one of Unsloth's merged
saves or GGUF conversions says what `--strategy fsdp` makes of it (a merge by the main process alone; a refusal).

Experiment trackers (`wandb`, `mlflow`, `trackio`) keep one run, the main process's: a statement calling into
one (`wandb.init(...)`, `wandb.log(...)`, `mlflow.log_params(...)`, `trackio.finish()`) is guarded the same way,
and so is `run = wandb.init(...)` (or `mlflow.start_run`, `trackio.init`), with the calls on `run` in that cell
(`run` then exists on the main process only). A Trainer's own tracker callbacks log from the main process
already. `with mlflow.start_run():` around training is left for all ranks, with a note.

Cells tagged `rank0` run on the main process already; code already under `if ddp.is_main_process:`
(such as a cell `guard-inference-cell` wrapped) is not guarded twice.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of, keyword, literal_value, receiver_name
from nbddp.export.rewrites.ddp_blocks import (
    BARRIER,
    MAIN_PROCESS_ONLY,
    barrier,
    collective_calls,
    indented,
    main_process_only,
)
from nbddp.export.rewrites.vocabulary import holds_trainer

DISPLAY_FUNCTIONS = {"print", "pprint", "display"}
SAVE_PREFIXES = ("save_pretrained", "push_to_hub", "save_lora")  # save_lora: Unsloth's, for vLLM (GRPO notebooks)
TRACKERS = frozenset({"wandb", "mlflow", "trackio"})
STARTS_A_RUN = {"init", "start_run"}  # wandb.init, trackio.init, mlflow.start_run
# Unsloth's saves that merge the LoRA into the base weights (unless save_method="lora") and that convert to GGUF:
# under --strategy fsdp the fallback merges in one process (nbddp.fallback.fsdp.merged_in_one_process) and the
# Transformers+PEFT path it trains on has no GGUF converter (nbddp.fallback.save)
MERGED_SAVES = frozenset({"save_pretrained_merged", "push_to_hub_merged", "save_pretrained_torchao"})
GGUF_SAVES = frozenset({"save_pretrained_gguf", "push_to_hub_gguf"})
SAVE_METHOD_POSITION = 2  # save_pretrained_merged(save_directory, tokenizer, save_method, ...)


def is_save(call: cst.Call) -> bool:
    """`model.save_pretrained*(...)`, `tokenizer.push_to_hub*(...)`; not the trainer's, which handles ranks itself."""
    name = callee_name(call) or ""
    return (isinstance(call.func, cst.Attribute) and name.startswith(SAVE_PREFIXES)
            and not holds_trainer(receiver_name(call)))


def under_fsdp(call: cst.Call) -> str:
    """What the report adds for a save that `--strategy fsdp` changes: a merge made by the main process alone, a
    GGUF conversion refused; "" for any other call."""
    name = callee_name(call)
    if name in GGUF_SAVES:
        return ("; under --strategy fsdp it is refused: the Transformers+PEFT path FSDP trains on has no GGUF "
                "converter (save merged_16bit, then convert it with llama.cpp)")
    if name not in MERGED_SAVES:
        return ""
    method = keyword(call, "save_method")
    if method is None and len(call.args) > SAVE_METHOD_POSITION and call.args[SAVE_METHOD_POSITION].keyword is None:
        method = call.args[SAVE_METHOD_POSITION]
    value = literal_value(method.value) if method is not None else "merged_16bit"  # Unsloth's default
    key = str(value).lower().strip().replace("-", "_").replace(" ", "_")  # as Unsloth (and the runtime) read it
    if key == "lora":
        return ""
    if isinstance(value, str) and key != "merged_16bit":
        return (f"; under --strategy fsdp it is refused: the Transformers+PEFT path FSDP trains on writes "
                f"save_method \"merged_16bit\" or \"lora\", not {value!r}")
    return ("; under --strategy fsdp it merges in this one process, on the CPU, from the base checkpoint and the "
            "adapter gathered when training ended (PEFT cannot merge a sharded model)")


def is_tracker_call(call: cst.Call, runs=frozenset()) -> bool:
    """`wandb.log(...)`, `mlflow.log_metric(...)`, `wandb.run.summary.update(...)`: a call into a tracker module,
    or into one of `runs` (names this cell bound to a tracker's run)."""
    root = call.func
    while isinstance(root, cst.Attribute):
        root = root.value
    return isinstance(call.func, cst.Attribute) and isinstance(root, cst.Name) and root.value in TRACKERS | runs


def tracker_runs(module: cst.Module) -> frozenset:
    """The names a cell binds to a tracker's new run: `run = wandb.init(...)`."""
    return frozenset(
        target.target.value
        for assign in m.findall(module, m.Assign(value=m.Call()))
        if is_tracker_call(assign.value) and callee_name(assign.value) in STARTS_A_RUN
        for target in assign.targets if isinstance(target.target, cst.Name)
    )


def has_side_effect(call: cst.Call, runs=frozenset()) -> bool:
    name = callee_name(call)
    return (
        (isinstance(call.func, cst.Name) and name in DISPLAY_FUNCTIONS)
        or (name == "pprint" and receiver_name(call) == "pprint")
        or (name == "show" and receiver_name(call) == "plt")
        or (isinstance(call.func, cst.Attribute) and name == "savefig")
        or is_save(call)
        or is_tracker_call(call, runs)
    )


def guardable_call(small: cst.BaseSmallStatement, runs=frozenset()) -> cst.Call | None:
    """The call of a side-effect statement (`print(x)`; `run = wandb.init()` for `run` in `runs`) that makes no
    collective call, else None."""
    if isinstance(small, cst.Assign):
        names = {target.target.value for target in small.targets if isinstance(target.target, cst.Name)}
        call = small.value if len(names) == len(small.targets) and names <= runs else None
    else:
        call = small.value if isinstance(small, cst.Expr) else None
    if isinstance(call, cst.Call) and has_side_effect(call, runs):
        return None if collective_calls(small) else call
    return None


def side_effect_calls(statement: cst.BaseStatement | None, runs=frozenset()) -> list[cst.Call] | None:
    """The calls of a line made only of side-effect statements (`print(x); plt.show()`), else None."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return None
    calls = [guardable_call(small, runs) for small in statement.body]
    return calls if all(calls) else None


class GuardRank0SideEffects(Rewrite):
    NAME = "guard-rank0-side-effects"
    DESCRIPTION = ("Print, plot, save, push and log to experiment trackers (wandb, mlflow, trackio) on the main "
                   "process only; after a save, all ranks wait at ddp.barrier().")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._main_process_only = 0  # depth inside `if ddp.is_main_process:`
        self._block_depth = 0  # 0 at the cell's top level
        self._runs = frozenset()  # names the cell binds to a tracker's run

    def visit_Module(self, node: cst.Module) -> bool:
        self._runs = tracker_runs(node)
        return "rank0" not in self.context.cell_tags

    def visit_If(self, node: cst.If) -> None:
        self._main_process_only += m.matches(node, MAIN_PROCESS_ONLY)

    def leave_If(self, original_node, updated_node):
        self._main_process_only -= m.matches(original_node, MAIN_PROCESS_ONLY)
        return updated_node

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._block_depth += 1

    def visit_With(self, node: cst.With) -> None:
        starts = [item.item for item in node.items if isinstance(item.item, cst.Call) and is_tracker_call(item.item)]
        if starts and not self._main_process_only:
            self.record(starts[0], f"left for all ranks: `with {code_of(starts[0].func)}(...)` starts a run on every "
                                   "rank; call it as a statement (nbddp runs that on the main process only) and end "
                                   "the run after the block")

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if not self._main_process_only:
            self._record_guards(node.body, whole_line=True)

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> None:
        if not self._main_process_only:
            self._record_guards(node.body, whole_line=False)

    def _record_guards(self, smalls, whole_line):
        """Record what `_guard` will wrap: a whole line of side effects, or each one in a one-line block."""
        calls = [guardable_call(small, self._runs) for small in smalls]
        if all(calls) or not whole_line:
            for small, call in zip(smalls, calls):
                if call is None:
                    continue
                waits = "; then all ranks wait at ddp.barrier()" if is_save(call) and self._block_depth == 0 else ""
                if isinstance(small, cst.Assign):
                    names = ", ".join(f"`{target.target.value}`" for target in small.targets)
                    waits = f"; {names} exists there only"
                self.record(call, f"{code_of(call.func)}() runs on the main process only{waits}{under_fsdp(call)}")
        for small in smalls:
            collectives = collective_calls(small)
            if collectives and any(has_side_effect(call, self._runs) for call in m.findall(small, m.Call())):
                collective = code_of(collectives[0].func)
                self.record(small, f"left for all ranks: it calls {collective}(), which every rank must run")

    def leave_IndentedBlock(self, original_node, updated_node):
        self._block_depth -= 1
        if self._main_process_only:
            return updated_node
        return updated_node.with_changes(body=self._guard(updated_node.body, top_level=False))

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        """`for x in xs: print(x)` -> a block, so the `if` has a line of its own."""
        lines = [
            cst.SimpleStatementLine(body=[small.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
            for small in updated_node.body
        ]
        if self._main_process_only or not any(side_effect_calls(line, self._runs) for line in lines):
            return updated_node
        return indented(self._guard(lines, top_level=False)).with_changes(header=updated_node.trailing_whitespace)

    def leave_Module(self, original_node, updated_node):
        if "rank0" in self.context.cell_tags:
            return updated_node
        return updated_node.with_changes(body=self._guard(updated_node.body, top_level=True))

    def _guard(self, statements, top_level):
        """Runs of side-effect lines under one `if ddp.is_main_process:`; a barrier after top-level saves."""
        guarded, run = [], []
        for statement in [*statements, None]:
            if side_effect_calls(statement, self._runs):
                run.append(statement)
                continue
            if run:
                guarded.append(main_process_only(run))
                saves = any(is_save(call) for line in run for call in side_effect_calls(line, self._runs))
                if top_level and saves and (statement is None or not m.matches(statement, BARRIER)):
                    guarded.append(barrier())
                run = []
            if statement is not None:
                guarded.append(statement)
        return guarded
