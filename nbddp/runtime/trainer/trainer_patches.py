"""What every Trainer gets, on either backend (`install`, which `runtime.backend.activate` calls once the backend is
active), where nbddp's own callbacks join it (`register_callbacks`), and the one Trainer patch the unsloth backend
needs under DDP (`patch_compute_loss`).

Unsloth issue #3452 (https://github.com/unslothai/unsloth/issues/3452): Unsloth's fused cross-entropy returns
the loss as a view created inside a custom autograd Function. With more than one process, transformers'
`Trainer.compute_loss` then rescales it in place (`loss *= num_processes`, when `num_items_in_batch` is
known and `average_tokens_across_devices` is on, the default), which autograd forbids:

    RuntimeError: Output 0 of UnslothFusedLossBackward is a view and is being modified inplace.

Unsloth's own fix rewrites the source text of `Trainer.compute_loss` (`loss *=` -> `loss = loss *`) when a
model is patched; ours depends on no source text: while `compute_loss` runs, a forward hook hands it a clone
of the model's loss, an ordinary tensor that it may scale in place. Trainers that subclass `Trainer` (TRL's
`SFTTrainer`, Unsloth's generated `UnslothSFTTrainer`) reach it through `super().compute_loss`.
"""
import functools
from collections.abc import Mapping

from nbddp import patches


def install() -> None:
    """Trainers honour and check the gradient checkpointing the notebook chose (see `memory.gradient_checkpointing`),
    lay out the batch at train() under `--batch_layout auto` (see `fuller_batch`; in a smoke run, in both layouts:
    `smoke_layout_check`), their held-out loss on N processes is one process's (see `eval_loss`), a multimodal model's
    unused tower adapters do not stop DDP (see `unused_parameters`), and nbddp's progress and metrics callbacks join
    every trainer (`register_callbacks`), with the gathering of an FSDP model's adapter under `--strategy fsdp` (see
    `fsdp`). Imports transformers: after Unsloth. Installing twice is once."""
    from transformers import Trainer

    from nbddp.runtime.memory import fuller_batch, gradient_checkpointing, smoke_layout_check
    from nbddp.runtime.trainer import eval_loss, fsdp, unused_parameters

    gradient_checkpointing.patch_trainer(Trainer)
    fuller_batch.patch_trainer(Trainer)
    smoke_layout_check.patch_trainer(Trainer)  # around fuller_batch's
    eval_loss.patch_evaluation_loop(Trainer)
    unused_parameters.patch_trainer(Trainer)
    register_callbacks()
    if fsdp.active():
        fsdp.install()


def clone_model_loss(module, args, output):
    """Forward hook: replace `output["loss"]` by a clone, which is not a view of a custom Function's output."""
    if isinstance(output, Mapping) and output.get("loss") is not None:
        output["loss"] = output["loss"].clone()
    return output


def patch_compute_loss(trainer_class) -> None:
    """Make `trainer_class.compute_loss` see a cloned model loss; patching twice changes nothing."""

    # No functools.wraps: Unsloth reads `inspect.getsource(Trainer.compute_loss)`, which would follow
    # `__wrapped__` to the original, rewrite that and drop this wrapper.
    def make(original):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            hook = model.register_forward_hook(clone_model_loss)
            try:
                return original(self, model, inputs, return_outputs=return_outputs,
                                num_items_in_batch=num_items_in_batch)
            finally:
                hook.remove()

        return compute_loss

    patches.wrap("clone-model-loss", trainer_class, "compute_loss", make)


def register_callbacks() -> None:
    """Every Trainer built from now on stops at a loss that is not finite (`finite_loss.FiniteLossCallback`), shows
    its progress through `progress.TrainingProgress`, and has its
    `metrics.MetricsCallback` (given by the notebook or added later) ahead of its other callbacks: it adds nbddp's
    figures to the training logs, which the reporting callbacks (TensorBoard, ...), first in Transformers' order,
    would otherwise have written before it. Registering twice is once."""
    from transformers.trainer_callback import CallbackHandler

    from transformers import trainer as transformers_trainer

    from nbddp.runtime.reporting import progress
    from nbddp.runtime.trainer.finite_loss import FiniteLossCallback

    progress.register()
    patches.append("finite-loss", transformers_trainer.DEFAULT_CALLBACKS, FiniteLossCallback)
    patches.wrap("progress-and-metrics-callbacks", CallbackHandler, "add_callback", _metrics_first)


def _metrics_first(original):
    from nbddp.runtime.reporting.metrics import MetricsCallback

    @functools.wraps(original)
    def add_callback(self, callback):
        original(self, callback)
        if isinstance(self.callbacks[-1], MetricsCallback):
            self.callbacks.insert(0, self.callbacks.pop())

    return add_callback
