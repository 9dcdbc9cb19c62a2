"""Let the run choose where training writes: `output_dir=X` in training arguments becomes `ddp.output_dir(X)`.

`ddp.output_dir` returns the notebook's value unless NBDDP_OUTPUT_DIR is set. `pipeline.py smoke` and `run` set
it for a script without an `output_dir` parameter (a notebook not written for nbddp), as they set that parameter
for a script that has one: the smoke run's checkpoints go to its run folder instead of the notebook's
`outputs/`, where the training run would find them beside its own, and the run's summary finds the training
run's checkpoints and logs.

Same calls as set-ddp-training-args: `TrainingArguments`, `Seq2SeqTrainingArguments` and TRL's configs.
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import callee_name, code_of, keyword
from nbddp.export.rewrites.ddp_blocks import is_ddp_call, wrap_keyword
from nbddp.export.rewrites.set_ddp_training_args import TRANSFORMERS_ARGUMENTS, TRL_CONFIGS


class RedirectOutputDir(Rewrite):
    NAME = "redirect-output-dir"
    DESCRIPTION = "output_dir in training arguments goes through ddp.output_dir(), which NBDDP_OUTPUT_DIR can set."

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = callee_name(original_node)
        given = keyword(original_node, "output_dir")
        if (name not in TRANSFORMERS_ARGUMENTS and name not in TRL_CONFIGS) or given is None:
            return updated_node
        if is_ddp_call(given.value, "output_dir"):
            return updated_node
        written = code_of(given.value)
        self.record(given, f"output_dir={written} -> ddp.output_dir({written}) (NBDDP_OUTPUT_DIR replaces it; "
                           "pipeline.py smoke and run set it to their run folder)")
        return wrap_keyword(updated_node, "output_dir", "output_dir")
