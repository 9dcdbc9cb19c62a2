"""`CompleteCheckpointsCallback`: every Trainer's checkpoints get a completion marker (`nbddp.checkpoint_markers`).

`setup` appends it to `transformers.trainer.DEFAULT_CALLBACKS`, the callbacks every `Trainer.__init__` starts
from, so each trainer a notebook builds (TRL's, Unsloth's, plain Transformers') has it without a line of the
notebook changing; a rewrite adding it to `callbacks=[...]` would miss trainers built by helper functions.

Trainer calls `on_save` on every rank after `_save_checkpoint` has returned there. The barrier waits until every
rank has written its part (its RNG state; optimizer shards where they are sharded); then rank 0 marks the
directory complete and rotates.

Trainer's own rotation (`save_total_limit`) runs inside `_save_checkpoint`, before the new checkpoint is complete,
and counts it: with `save_total_limit=1` it deletes the last complete checkpoint while the new one is still being
written, and it deletes a directory's files in any order, marker included or not. So this callback takes the limit
over when the trainer is built (`args.save_total_limit` reads None afterwards) and applies it to complete
checkpoints only, once the new one is marked.
"""
import os

import torch.distributed as dist
from transformers import TrainerCallback
from transformers import trainer as transformers_trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from nbddp import checkpoint_markers
from nbddp.runtime import batch_plan


class CompleteCheckpointsCallback(TrainerCallback):
    def __init__(self):
        self.keep = None  # the trainer's save_total_limit

    def on_init_end(self, args, state, control, **kwargs):
        self.keep, args.save_total_limit = args.save_total_limit, None

    def on_save(self, args, state, control, **kwargs):
        if dist.is_initialized():
            dist.barrier()
        if not state.is_world_process_zero:
            return
        checkpoint = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")  # as _save_checkpoint
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        plan = batch_plan.of(args)
        checkpoint_markers.mark_complete(checkpoint, state.global_step, world_size,
                                         plan.global_batch if plan else None)
        checkpoint_markers.rotate(args.output_dir, self.keep, protected=[state.best_model_checkpoint])


def register() -> None:
    """Give every Trainer built from now on a `CompleteCheckpointsCallback`; registering twice is once."""
    if CompleteCheckpointsCallback not in transformers_trainer.DEFAULT_CALLBACKS:
        transformers_trainer.DEFAULT_CALLBACKS.append(CompleteCheckpointsCallback)
