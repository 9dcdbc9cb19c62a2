"""Let the run set the length and the place of training: in training arguments `max_steps=X` becomes
`ddp.max_steps(X)` and `output_dir=X` becomes `ddp.output_dir(X)`.

The runtime returns the notebook's value unless the run setting `max_steps` (at most that many steps) or
`output_dir` (that folder instead) is set (docs/settings.md). `pipeline.py smoke` and `run` set them for a script
without `max_steps` or `output_dir` parameters, which is every notebook not written for nbddp, as they set those
parameters for a script that has them: otherwise its smoke run trains for the notebook's whole `max_steps = 60` (or
`num_train_epochs = 1` over the full dataset) on one GPU before torchrun starts, and writes its checkpoints
into the notebook's `outputs/` beside the training run's. Arguments without `max_steps` (they train by
epochs) get `max_steps=ddp.max_steps(-1)`, -1 being its default.

Same calls as set-ddp-training-args: `TrainingArguments`, `Seq2SeqTrainingArguments` and TRL's configs.
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import append_keyword, callee_name, code_of, has_double_star, keyword
from nbddp.export.rewrites.ddp_blocks import ddp_call, is_ddp_call, wrap_keyword
from nbddp.export.rewrites.vocabulary import TRAINING_ARGUMENTS
from nbddp.formats.run_settings import ENV

# keyword (also the ddp method) -> what the report says overrides it
OVERRIDDEN_BY = {
    "max_steps": f"{ENV.MAX_STEPS} caps it; smoke runs set 3",
    "output_dir": f"{ENV.OUTPUT_DIR} replaces it; pipeline.py smoke and run set it to their run folder",
}
EPOCHS = cst.UnaryOperation(operator=cst.Minus(), expression=cst.Integer("1"))  # max_steps' default: train by epochs


class RunOverrides(Rewrite):
    NAME = "run-overrides"
    DESCRIPTION = ("max_steps and output_dir in training arguments go through ddp.max_steps()/ddp.output_dir(), "
                   f"which {ENV.MAX_STEPS}/{ENV.OUTPUT_DIR} override.")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = callee_name(original_node)
        if name not in TRAINING_ARGUMENTS:
            return updated_node
        for argument, overridden_by in OVERRIDDEN_BY.items():
            given = keyword(original_node, argument)
            if given is not None and not is_ddp_call(given.value, argument):
                written = code_of(given.value)
                self.record(given, f"{argument}={written} -> ddp.{argument}({written}) ({overridden_by})")
                updated_node = wrap_keyword(updated_node, argument, argument)
        if keyword(original_node, "max_steps") is None and not has_double_star(original_node):
            self.record(original_node, "added max_steps=ddp.max_steps(-1) (trains by epochs as before; "
                                       f"{OVERRIDDEN_BY['max_steps']})")
            updated_node = append_keyword(updated_node, "max_steps", ddp_call("max_steps", EPOCHS))
        return updated_node
