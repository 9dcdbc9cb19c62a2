"""Build training arguments through the runtime: `SFTConfig(...)` becomes `ddp.training_args(SFTConfig)(...)`.

The runtime then applies the run's `--set NAME=VALUE` overrides to the keywords and lays out the batch for
the number of processes (`nbddp.runtime.memory.batch_plan`): by default the notebook's global batch,
per_device_train_batch_size x gradient_accumulation_steps rows per optimizer step, is kept on N processes,
instead of growing N times under the notebook's learning rate and `max_steps`. Rank 0 prints the layout.

Same calls as set-ddp-training-args, whose keyword edits come first (they find the call by its name).
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of, keyword
from nbddp.export.rewrites.ddp_blocks import ddp_call
from nbddp.export.rewrites.vocabulary import TRAINING_ARGUMENTS

BATCH_KEYWORDS = ("per_device_train_batch_size", "gradient_accumulation_steps")


class PlanTrainingArgs(Rewrite):
    NAME = "plan-training-args"
    DESCRIPTION = ("TrainingArguments/TRL configs are built by ddp.training_args(...): --set overrides, and the "
                   "notebook's global batch kept on N processes (--batch_layout).")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if callee_name(original_node) not in TRAINING_ARGUMENTS:
            return updated_node
        name = code_of(original_node.func)
        written = [keyword(original_node, argument) for argument in BATCH_KEYWORDS]
        batch = " x ".join(code_of(arg.value) if arg else f"{argument}'s default"
                           for argument, arg in zip(BATCH_KEYWORDS, written))
        self.record(original_node, f"{name}(...) -> ddp.training_args({name})(...) (the notebook's {batch} rows per "
                                   "step kept on N processes, see --batch_layout; --set NAME=VALUE overrides)")
        return updated_node.with_changes(func=ddp_call("training_args", updated_node.func))
