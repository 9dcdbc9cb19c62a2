"""Let the run cap the training length: `max_steps=X` in training arguments becomes `ddp.max_steps(X)`.

`ddp.max_steps` returns the notebook's value unless NBDDP_MAX_STEPS is set, and then at most that many steps.
`pipeline.py smoke` sets it (3) for a script with no `max_steps` parameter, which is every notebook not
written for nbddp: its smoke run would otherwise train for the notebook's whole `max_steps = 60`, or
`num_train_epochs = 1` over the full dataset, on one GPU before torchrun starts. Arguments that give no
`max_steps` (they train by epochs) get `max_steps=ddp.max_steps(-1)`, -1 being the default.

Same calls as set-ddp-training-args: `TrainingArguments`, `Seq2SeqTrainingArguments` and TRL's configs.
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import append_keyword, callee_name, code_of, has_double_star, keyword
from nbddp.export.rewrites.ddp_blocks import ddp_call, is_ddp_call, wrap_keyword
from nbddp.export.rewrites.set_ddp_training_args import TRANSFORMERS_ARGUMENTS, TRL_CONFIGS

EPOCHS = cst.UnaryOperation(operator=cst.Minus(), expression=cst.Integer("1"))  # max_steps' default: train by epochs


class CapMaxSteps(Rewrite):
    NAME = "cap-max-steps"
    DESCRIPTION = "max_steps in training arguments goes through ddp.max_steps(), which NBDDP_MAX_STEPS can cap."

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        name = callee_name(original_node)
        if name not in TRANSFORMERS_ARGUMENTS and name not in TRL_CONFIGS:
            return updated_node
        given = keyword(original_node, "max_steps")
        if given is not None:
            if is_ddp_call(given.value, "max_steps"):
                return updated_node
            written = code_of(given.value)
            self.record(given, f"max_steps={written} -> ddp.max_steps({written}) (NBDDP_MAX_STEPS caps it; "
                               "smoke runs set 3)")
            return wrap_keyword(updated_node, "max_steps", "max_steps")
        if has_double_star(original_node):
            return updated_node
        self.record(original_node, "added max_steps=ddp.max_steps(-1) (trains by epochs as before; NBDDP_MAX_STEPS "
                                   "caps it, smoke runs set 3)")
        return append_keyword(updated_node, "max_steps", ddp_call("max_steps", EPOCHS))
