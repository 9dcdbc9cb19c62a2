"""`--batch-layout auto`'s layout check, inside the one smoke process (orchestration's layout_check starts it).

The smoke kernel gets the run settings `layout_check` (<path>) and `plan_processes` (N), and `--batch_layout auto`. Its
`trainer.train()` then trains the smoke steps twice from the same start: first in the plan's own layout (the
notebook's, laid out for N processes; fuller_batch leaves it alone), whose metrics.jsonl is moved to <path>; then,
with the trainable weights, the random state and a fresh optimizer as before the first, in the fuller layout
fuller_batch chooses, whose metrics.jsonl stays where the trainer writes it. orchestration compares the two files'
losses step by step. <path> ends with `{"event": "layout_check", "wall_s": ...}`: what the second training cost.
The cells after train() see the model of the second training, in the layout torchrun will use.

Both layouts share one model load, data preparation and trainer: before, the second layout was a second smoke
process that did all of that again. A trainer given its own optimizer (`optimizers=`), a resumed train(), or one
without nbddp's MetricsCallback trains once, in the fuller layout, and the check then keeps the notebook's.
"""
import functools
import os
import random
import time

import numpy
import torch
import torch.distributed as dist

from nbddp import log, patches
from nbddp.formats import metrics, run_settings
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.reporting.metrics import MetricsCallback

ENV = run_settings.ENV.LAYOUT_CHECK


def patch_trainer(trainer_class) -> None:
    """With the run setting `layout_check`, `train()` trains in both layouts (see the module); call after
    fuller_batch's."""
    def make(original):
        @functools.wraps(original)
        def train(self, *args, **kwargs):
            target = os.environ.get(ENV)
            if not target or not _checkable(self, kwargs.get("resume_from_checkpoint", args[0] if args else None)):
                return original(self, *args, **kwargs)
            saved = _snapshot(self)
            self.nbddp_laid_out = True  # fuller_batch: this train() keeps the plan's layout
            original(self, *args, **kwargs)
            os.replace(_metrics_path(self), target)
            log.info("nbddp: layout check: the same steps again, in the fuller layout")
            started = time.perf_counter()
            _restore(self, saved)
            self.nbddp_laid_out = False
            result = original(self, *args, **kwargs)
            metrics.append(target, {"event": "layout_check", "wall_s": time.perf_counter() - started})
            return result

        return train

    patches.wrap("layout-check-in-smoke", trainer_class, "train", make)


def _checkable(trainer, resume) -> bool:
    """One process, a fuller plan not yet applied, nbddp's metrics, Trainer's own optimizer, no resume."""
    plan = batch_plan.of(trainer.args)
    return (plan is not None and plan.fuller and not getattr(trainer, "nbddp_laid_out", False) and not resume
            and not dist.is_initialized() and trainer.optimizer is None
            and any(isinstance(callback, MetricsCallback) for callback in trainer.callback_handler.callbacks))


def _metrics_path(trainer):
    """Where the trainer's MetricsCallback wrote its metrics.jsonl (set by its on_train_begin)."""
    return next(callback.path for callback in trainer.callback_handler.callbacks
                if isinstance(callback, MetricsCallback))


def _snapshot(trainer) -> dict:
    """The trainable weights (on the CPU) and the random state, as the first train() starts."""
    weights = {name: parameter.detach().to("cpu", copy=True)
               for name, parameter in trainer.model.named_parameters() if parameter.requires_grad}
    rng = {"python": random.getstate(), "numpy": numpy.random.get_state(), "cpu": torch.get_rng_state(),
           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    return {"weights": weights, "rng": rng}


def _restore(trainer, saved: dict) -> None:
    """Back to `saved`, with no optimizer or schedule: the second train() starts as the first did."""
    with torch.no_grad():
        for name, parameter in trainer.model.named_parameters():
            if name in saved["weights"]:
                parameter.copy_(saved["weights"][name])
    trainer.model.zero_grad(set_to_none=True)
    trainer.optimizer, trainer.lr_scheduler = None, None  # train() creates them afresh
    trainer.accelerator.free_memory()  # its hold on the first optimizer's state, which fuller_batch's budget would miss
    rng = saved["rng"]
    random.setstate(rng["python"])
    numpy.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["cpu"])
    if rng["cuda"] is not None:
        torch.cuda.set_rng_state_all(rng["cuda"])
