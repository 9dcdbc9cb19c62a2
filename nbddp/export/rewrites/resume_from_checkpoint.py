"""`trainer.train()` -> `trainer.train(resume_from_checkpoint=ddp.checkpoint_to_resume(trainer))`.

`ddp.checkpoint_to_resume(trainer)` is None unless the run resumes (`--resume true`, or torchrun restarted the
workers after a failure), so a plain run trains from the start as the notebook does. When resuming, it is the
newest checkpoint in the trainer's output_dir that every rank finished writing, and Trainer restores the
weights, optimizer, scheduler and RNG states from it and skips the batches already seen.

Matched: `<x>.train(...)` where the receiver's name contains "trainer" (`trainer`, `sft_trainer`,
`self.trainer`), so `model.train()` (PyTorch's training mode) is left alone. A call that already says where to
resume from (`resume_from_checkpoint=`, or positionally) is the author's and stays as written.
"""
import libcst as cst

from nbddp.export.rewrites.base import Rewrite
from nbddp.export.rewrites.call_args import append_keyword, callee_name, code_of, has_double_star, keyword, receiver_name
from nbddp.export.rewrites.ddp_blocks import ddp_call, is_ddp_call
from nbddp.export.rewrites.vocabulary import holds_trainer


def is_trainer_train(call: cst.Call) -> bool:
    return callee_name(call) == "train" and holds_trainer(receiver_name(call))


class ResumeFromCheckpoint(Rewrite):
    NAME = "resume-from-checkpoint"
    DESCRIPTION = (
        "trainer.train() gets resume_from_checkpoint=ddp.checkpoint_to_resume(trainer): with --resume, or after "
        "a torchrun restart, training continues from the last complete checkpoint."
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not is_trainer_train(original_node):
            return updated_node
        given = keyword(original_node, "resume_from_checkpoint")
        if given is not None and is_ddp_call(given.value, "checkpoint_to_resume"):
            return updated_node
        positional = next((arg for arg in original_node.args if arg.keyword is None and not arg.star), None)
        if given is not None or positional is not None:
            written = code_of((given or positional).value)
            self.record(original_node, f"left resume_from_checkpoint={written} as written; --resume does not change it")
            return updated_node
        if has_double_star(original_node):
            self.record(original_node, "cannot see whether ** arguments set resume_from_checkpoint; left as written")
            return updated_node
        trainer = code_of(original_node.func.value)
        self.record(
            original_node,
            f"added resume_from_checkpoint=ddp.checkpoint_to_resume({trainer}) "
            "(--resume or a torchrun restart continues from the last complete checkpoint)",
        )
        argument = ddp_call("checkpoint_to_resume", updated_node.func.value.deep_clone())
        return append_keyword(updated_node, "resume_from_checkpoint", argument)
