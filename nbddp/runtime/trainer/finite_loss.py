"""Stop training at the first optimizer step whose loss is not finite: `FiniteLossCallback`, on every Trainer.

Transformers goes on training after a NaN or infinite loss: with `logging_nan_inf_filter` (its default) it logs the
average of the earlier losses in its place, so the console and metrics.jsonl show a finite loss while the weights
turn to NaN, and the run ends with status 0 and a useless adapter. Here a forward hook on the model marks every
training forward pass whose `loss` output is not finite (on the device: no wait for the GPU), and at the end of each
optimizer step the ranks take the maximum of their marks (one small all-reduce) so that all of them stop at the same
step: `NonFiniteLoss` (exit status 1), raised before the step's checkpoint is saved, names the step, the likely
causes and, through `training_checkpoints`, the last complete checkpoint.

Not stopped: a step that fp16's loss scaler skipped (the optimizer did not step: an overflow the scaler answers by
halving its scale, which is normal), while the scale is still 1 or more; below that no scale can make the loss
finite. Trainers whose model computes no loss itself (DPO, GRPO: the loss is computed outside the forward pass)
are not checked.
"""
import math
from collections.abc import Mapping

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from nbddp.errors import TrainingError
from nbddp.formats.checkpoint_markers import DAMAGED


class NonFiniteLoss(TrainingError):
    def __init__(self, step: int, max_steps: int, learning_rate: float, checkpoints=None, folder=None):
        self.step, self.max_steps, self.learning_rate = step, max_steps, learning_rate
        self.checkpoints, self.folder = checkpoints, folder
        super().__init__(str(self))

    def resumable_from(self, checkpoints, folder) -> "NonFiniteLoss":
        """The same error, naming where to go on from among `checkpoints` (`checkpoint_markers.complete_checkpoints`
        of `folder`, oldest first), once the `suspect` one is set aside."""
        return NonFiniteLoss(self.step, self.max_steps, self.learning_rate, checkpoints, folder)

    def suspect(self, checkpoints):
        """The checkpoint among `checkpoints` of the step before: the weights that gave the non-finite loss (a too
        high learning rate leaves them overflowed), or None."""
        return next((checkpoint for checkpoint in checkpoints if checkpoint.step == self.step - 1), None)

    def __str__(self):
        of = f" of {self.max_steps}" if self.max_steps > 0 else ""
        text = (f"the training loss is not finite (NaN or infinite) at step {self.step}{of}: training stopped there, "
                f"before saving it. Likely causes: a learning rate too high for this model (learning_rate "
                f"{self.learning_rate:g}), which makes the weights overflow: lower it; or a row of step {self.step}'s "
                f"batch whose loss cannot be computed (no token left to predict, values out of range): check the "
                f"data rows that step reads.")
        if self.checkpoints is None:
            return text
        suspect = self.suspect(self.checkpoints)
        if suspect is not None:
            text += f" {suspect.path} holds the weights that gave that loss: moved into {DAMAGED}/."
        before = [checkpoint for checkpoint in self.checkpoints if checkpoint.step < self.step - 1]
        if before:
            return (f"{text} Last complete checkpoint before it: {before[-1].path} (step {before[-1].step}); once "
                    "fixed, rerun with --resume true to continue from it")
        return f"{text} No complete checkpoint from before it in {self.folder}: once fixed, train afresh"


class FiniteLossCallback(TrainerCallback):
    def __init__(self):
        self._nonfinite = None  # a device tensor: 1 once a training forward pass of this step gave a non-finite loss
        self._hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._hook is not None:  # a train() that raised never reached on_train_end
            self._hook.remove()
        self._nonfinite = torch.zeros((), dtype=torch.int32, device=args.device)
        self._hook = model.register_forward_hook(self._mark)

    def on_train_end(self, args, state, control, **kwargs):
        self._hook.remove()
        self._hook = None

    def _mark(self, module, args, output):
        if not (module.training and torch.is_grad_enabled()):  # evaluation and generation are not training
            return
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if isinstance(loss, torch.Tensor):
            self._nonfinite |= (~torch.isfinite(loss.detach())).any().to(self._nonfinite.device, torch.int32)

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        marked = self._nonfinite.clone()
        self._nonfinite.zero_()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(marked, op=dist.ReduceOp.MAX)  # every rank stops at the same step, or none does
        if marked.item() and not _scaler_skipped(optimizer):
            raise NonFiniteLoss(state.global_step, state.max_steps, args.learning_rate)


def _scaler_skipped(optimizer) -> bool:
    """Whether fp16's loss scaler skipped this step for an overflow and can still lower its scale usefully."""
    scaler = getattr(optimizer, "scaler", None)  # accelerate's AcceleratedOptimizer
    if scaler is None or not getattr(optimizer, "step_was_skipped", False):
        return False
    scale = scaler.get_scale()
    return math.isfinite(scale) and scale >= 1
