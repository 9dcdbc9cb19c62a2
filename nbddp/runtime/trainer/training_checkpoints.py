"""Every Trainer's checkpoints keep the `nbddp.formats.checkpoint_markers` contract: `CompleteCheckpointsCallback`, and
the three `transformers.Trainer` methods `register` wraps.

`register` appends the callback to `transformers.trainer.DEFAULT_CALLBACKS`, the callbacks every `Trainer.__init__`
starts from, so each trainer a notebook builds (TRL's, Unsloth's, plain Transformers') has it without a line of
the notebook changing; a rewrite adding it to `callbacks=[...]` would miss trainers built by helper functions.
The wrapped methods:

- `_get_output_dir`, where `_save_checkpoint` puts `checkpoint-<step>/`: the trainer's own folder
  (`checkpoint_folder`). The first trainer of the process to train with an output_dir checkpoints into that
  output_dir, the k-th into `<output_dir>/trainer-<k>/`, so that two trainers of one notebook (continued pretraining,
  then instructions, both into "outputs") never write, rotate or resume each other's checkpoints. A script builds
  its trainers in the same order every time it runs, so each one resumes its own. A later trainer's
  `MetricsCallback` that would write `<output_dir>/metrics.jsonl` writes `<output_dir>/trainer-<k>/metrics.jsonl`,
  beside its checkpoints, so that the first trainer's record is kept.
- `train`: `resume_from_checkpoint=True`, as a notebook may write it, means the trainer's last complete checkpoint
  (`resume_point`), or a fresh start and a line saying so; Transformers' own choice, the highest-numbered
  directory, may be half-written or another run's. A checkpoint where the training ends (max_steps reached: a
  finished run resumed) is loaded and nothing trained, with a line saying so (`_finished`); Transformers would
  train a step past max_steps and write another checkpoint. A fresh run (nothing to resume from) then gets a new run id,
  and rank 0 moves the checkpoints its folder holds aside (`checkpoint_markers.move_aside`), saying where; a
  resumed run keeps the run id of its checkpoint. Moved aside rather than refused: re-running a notebook whose
  output_dir is a fixed "outputs" is what researchers do, and it should train, while the earlier run's
  checkpoints stay whole, marked, in `nbddp-previous-runs/<run>/`, never rewritten in place.
- `_save_checkpoint`, which writes the checkpoint's files in place: rank 0 first removes the directory's marker
  (a run resumed from an earlier checkpoint rewrites a later one), and a barrier keeps every rank from writing
  before it has.

Trainer calls `on_save` on every rank after `_save_checkpoint` has returned there. The barrier waits until every
rank has written its part (its RNG state; optimizer shards where they are sharded); then rank 0 marks the
directory complete, with the run id, and rotates.

Trainer's own rotation (`save_total_limit`) runs inside `_save_checkpoint`, before the new checkpoint is complete,
and counts it: with `save_total_limit=1` it deletes the last complete checkpoint while the new one is still being
written, and it deletes a directory's files in any order, marker included or not. So this callback takes the limit
over when the trainer is built (`args.save_total_limit` reads None afterwards) and applies it to the run's complete
checkpoints only, once the new one is marked.
"""
import functools
import os
from pathlib import Path

import torch.distributed as dist
from transformers import Trainer, TrainerCallback
from transformers import trainer as transformers_trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

from nbddp import log, patches
from nbddp.formats import checkpoint_markers, metrics
from nbddp.errors import UsageError
from nbddp.rank import is_main_process
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.reporting.metrics import MetricsCallback
from nbddp.runtime.trainer.finite_loss import NonFiniteLoss

_trainers_per_output_dir = {}  # os.path.realpath(output_dir) -> trainers of this process given a folder in it


class CompleteCheckpointsCallback(TrainerCallback):
    def __init__(self):
        self.keep = None  # the trainer's save_total_limit
        self.folder = None  # where its checkpoints go, from its first train() (`checkpoint_folder`)
        self.run = None  # the run id rank 0 marks its checkpoints with, from train()

    def on_init_end(self, args, state, control, **kwargs):
        self.keep, args.save_total_limit = args.save_total_limit, None

    def on_save(self, args, state, control, **kwargs):
        if dist.is_initialized():
            dist.barrier()
        if not state.is_world_process_zero:
            return
        folder = self.folder or args.output_dir
        checkpoint = os.path.join(folder, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")  # as _save_checkpoint
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        plan = batch_plan.of(args)
        checkpoint_markers.mark_complete(checkpoint, state.global_step, world_size,
                                         plan.global_batch if plan else None, run=self.run)
        checkpoint_markers.rotate(folder, self.keep, protected=[state.best_model_checkpoint], run=self.run)


def register() -> None:
    """Give every Trainer built from now on a `CompleteCheckpointsCallback` and wrap its methods (see above);
    registering twice is once."""
    patches.append("checkpoint-markers", transformers_trainer.DEFAULT_CALLBACKS, CompleteCheckpointsCallback)
    for name, wrap in (("_get_output_dir", _own_folder), ("train", _resume_marked), ("_save_checkpoint", _unmark_first)):
        patches.wrap("checkpoint-markers", Trainer, name, lambda method, wrap=wrap: functools.wraps(method)(wrap(method)))


def checkpoint_folder(trainer) -> str:
    """The folder of `trainer`'s checkpoints: its output_dir, or `<output_dir>/trainer-<k>` for the k-th trainer of
    this process to train there (fixed at its first call); the output_dir of an object without the callback."""
    callback = _callback(trainer)
    if callback is None:
        return trainer.args.output_dir
    if callback.folder is None:
        output_dir = trainer.args.output_dir
        key = os.path.realpath(output_dir)
        index = _trainers_per_output_dir[key] = _trainers_per_output_dir.get(key, 0) + 1
        callback.folder = output_dir if index == 1 else os.path.join(output_dir, f"trainer-{index}")
        if index > 1:
            moved = _own_metrics(trainer, output_dir, callback.folder)
            if trainer.is_world_process_zero():
                log.info(f"nbddp: {type(trainer).__name__} is trainer {index} of this script with output_dir "
                         f"{output_dir}: its checkpoints go to {callback.folder}"
                         + (f", its {metrics.METRICS_FILE} beside them" if moved else ""))
    return callback.folder


def _own_metrics(trainer, output_dir, folder) -> bool:
    """Point `trainer`'s metrics callbacks that would write into `output_dir` at `folder`, its checkpoints' (the
    first trainer of the output_dir would otherwise have its record started afresh by this one); whether any was."""
    moved = False
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, MetricsCallback):
            path = callback.path or Path(output_dir) / metrics.METRICS_FILE
            if os.path.realpath(path.parent) == os.path.realpath(output_dir):
                callback.path, moved = Path(folder) / path.name, True
    return moved


def resume_point(trainer, why: str, world_size: int) -> str | None:
    """The newest complete checkpoint in `trainer`'s folder, to resume from, or None: training starts over.

    Rank 0 first deletes the checkpoint directories a stopped run left half-written and sets the damaged ones
    aside (`checkpoint_markers.set_aside`), then chooses and says which
    (`why`: what asked for resuming); every rank gets rank 0's choice, so all of them load the same checkpoint. A
    checkpoint trained with another global batch (another --batch_layout or process count under per-device) is
    refused, on every rank (UsageError). `world_size`: this run's processes, for the warning about a checkpoint
    written by another number of them.
    """
    folder = checkpoint_folder(trainer)
    decision = [None, None]  # (the checkpoint's path, why resuming it is refused)
    if is_main_process():
        for path in checkpoint_markers.incomplete_dirs(folder):
            log.info(f"nbddp: removing {path}: incomplete (the run stopped while writing it)")
            checkpoint_markers.remove(path)
        for path, damage in checkpoint_markers.damaged_dirs(folder):
            log.warning(f"nbddp: warning: {path} would not load ({damage}): moved it to "
                        f"{checkpoint_markers.set_aside(path)}, whole, and looking for an earlier checkpoint")
        chosen = checkpoint_markers.latest_complete(folder)
        decision = [str(chosen.path) if chosen else None, _changed_batch(chosen, batch_plan.of(trainer.args), why)]
        if decision[1] is None:
            _announce_resume(chosen, folder, why, world_size)
    if dist.is_initialized():
        dist.broadcast_object_list(decision, src=0)  # on the current device: the rank's GPU under NCCL
    if decision[1]:
        raise UsageError(decision[1])
    return decision[0]


def _own_folder(original):
    def _get_output_dir(self, trial):
        if trial is not None or _callback(self) is None:  # a hyperparameter search's trial keeps Transformers' folder
            return original(self, trial)
        return checkpoint_folder(self)

    return _get_output_dir


def _resume_marked(original):
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        callback = _callback(self)
        if callback is not None:
            if resume_from_checkpoint is True:
                world_size = dist.get_world_size() if dist.is_initialized() else 1
                resume_from_checkpoint = resume_point(self, "resume_from_checkpoint=True", world_size)
            # FSDP loads a checkpoint into the wrapped model only, inside train(): left to Transformers.
            if resume_from_checkpoint and not self.is_fsdp_enabled and _finished(self, resume_from_checkpoint):
                return _load_finished(self, resume_from_checkpoint)
            _begin_run(self, callback, resume_from_checkpoint or None)
        try:
            return original(self, resume_from_checkpoint, *args, **kwargs)
        except NonFiniteLoss as error:  # say where to go on from, and keep --resume true from the suspect weights
            folder = checkpoint_folder(self)
            checkpoints = checkpoint_markers.complete_checkpoints(folder)
            suspect = error.suspect(checkpoints)
            if dist.is_initialized():
                dist.barrier()  # every rank raised at this step and read the checkpoints before one moves
            if suspect is not None and self.is_world_process_zero():
                checkpoint_markers.set_aside(suspect.path)
            raise error.resumable_from(checkpoints, folder) from None

    return train


def _finished(trainer, checkpoint) -> bool:
    """Whether `checkpoint` (a path) is where `trainer`'s training ends: its step has reached max_steps, or (without
    max_steps) the steps of as many epochs as this trainer's. Transformers would train one step past it."""
    path = os.path.join(checkpoint, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return False
    state = TrainerState.load_from_json(path)
    if trainer.args.max_steps > 0:
        return state.global_step >= trainer.args.max_steps
    return state.global_step >= state.max_steps > 0 and trainer.args.num_train_epochs <= state.num_train_epochs


def _load_finished(trainer, checkpoint) -> TrainOutput:
    """Train nothing: load `checkpoint`'s weights and state, so that what the notebook does after training
    (evaluate, save the adapter, generate) has the trained model, and say so. The training loss returned is the
    mean of the losses the run logged (Trainer's own, the mean over all steps, was not saved)."""
    trainer._load_from_checkpoint(checkpoint)
    trainer.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
    # as train() does: the saved state is rank 0's, and callbacks write only where these say so
    trainer.state.is_local_process_zero = trainer.is_local_process_zero()
    trainer.state.is_world_process_zero = trainer.is_world_process_zero()
    if trainer.is_world_process_zero():
        limit = f"max_steps is {trainer.args.max_steps}" if trainer.args.max_steps > 0 else \
            f"num_train_epochs is {trainer.args.num_train_epochs:g}"
        log.info(f"nbddp: {checkpoint} (step {trainer.state.global_step}) is where this training ends ({limit}): "
                 "nothing left to train. Loaded its weights; the script goes on after training. Raise --max_steps "
                 "to train further")
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return TrainOutput(trainer.state.global_step, sum(losses) / len(losses) if losses else 0.0, {})


def _unmark_first(original):
    def _save_checkpoint(self, model, trial, *args, **kwargs):
        if self.is_world_process_zero():
            checkpoint = os.path.join(self._get_output_dir(trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            checkpoint_markers.unmark(checkpoint)
        if dist.is_initialized():
            dist.barrier()  # no rank writes a file of the checkpoint while it is still marked
        return original(self, model, trial, *args, **kwargs)

    return _save_checkpoint


def _begin_run(trainer, callback, checkpoint):
    """On rank 0: the run id of a run resumed from `checkpoint`, or a new one for a fresh run (None), whose folder's
    checkpoints are moved aside first. Then every rank waits, so none writes into the folder before."""
    folder = checkpoint_folder(trainer)
    if trainer.is_world_process_zero():
        marker = checkpoint_markers.read_marker(checkpoint) if checkpoint else None
        callback.run = marker.run if marker and marker.run else checkpoint_markers.new_run_id()
        found = checkpoint_markers.checkpoint_dirs(folder) if checkpoint is None else []
        if found:
            moved = checkpoint_markers.move_aside(folder)
            log.info(f"nbddp: {folder} held the checkpoints of an earlier run ({', '.join(p.name for p in found)}): "
                     f"moved them to {moved}, so that this run starts afresh without rewriting them; to continue that "
                     "run instead, move them back and pass --resume true")
    if dist.is_initialized():
        dist.barrier()


def _callback(trainer) -> CompleteCheckpointsCallback | None:
    handler = getattr(trainer, "callback_handler", None)
    callbacks = getattr(handler, "callbacks", ())
    return next((callback for callback in callbacks if isinstance(callback, CompleteCheckpointsCallback)), None)


def _announce_resume(chosen, folder, why, world_size):
    if chosen is None:
        log.info(f"nbddp: {why}: no complete checkpoint in {folder}; training from the start")
        return
    log.info(f"nbddp: {why}: resuming from {chosen.path} (step {chosen.step})")
    if chosen.world_size != world_size and chosen.global_batch is None:  # before markers had it
        log.warning(f"nbddp: warning: {chosen.path} was written by {chosen.world_size} processes, this run has "
                    f"{world_size}: the batches after it may differ from an uninterrupted run's")


def _changed_batch(checkpoint, plan, why) -> str | None:
    """What to say when `checkpoint` was trained with another global batch than `plan`'s: resuming would change
    the training in mid-run (and Trainer would skip a wrong number of batches to find its place in the data)."""
    if checkpoint is None or plan is None or checkpoint.global_batch in (None, plan.global_batch):
        return None
    return (f"{why}: {checkpoint.path} was trained with a global batch of {checkpoint.global_batch} rows per step, "
            f"this run's is {plan.global_batch} ({plan.describe()}); resuming would change the training in mid-run. "
            f"Resume with the layout it was written with (--batch_layout, the process count), or train afresh in "
            f"another output_dir")
