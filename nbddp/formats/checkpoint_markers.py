"""Which of the Trainer's checkpoints are complete: those holding the marker rank 0 writes once every rank is done.

Transformers' Trainer writes `<output_dir>/checkpoint-<step>/` in place, file by file: rank 0 the model, optimizer,
scheduler and trainer state, every rank its own `rng_state_<rank>.pth`. A run killed half-way leaves a directory that
looks like a checkpoint, and `transformers.trainer_utils.get_last_checkpoint` would pick it. So after a barrier, rank 0
writes `nbddp-complete.json` into the directory (temp file, fsync, os.replace), and resuming only ever considers
directories that have it:

    {"step": 40, "world_size": 2, "completed_at": 1764450000.5, "global_batch": 8, "run": "20261201T101500Z-3fa2c1"}

`global_batch` (rows per optimizer step, nbddp.runtime.memory.batch_plan) is absent from markers written before it, and
for trainers whose arguments nbddp did not lay out. `run` (`new_run_id()`: the UTC time the run started and a random
suffix) names the training run that wrote the checkpoint; a resumed run keeps the id of the checkpoint it resumed
from. Markers written before it have none (`Checkpoint.run` None).

The contract around the marker (nbddp.runtime.trainer.training_checkpoints keeps it for every Trainer):
- the marker is removed (`unmark`) before any file of its directory is rewritten, and written only once every
  rank has finished, so a marked directory never mixes two saves;
- a fresh (not resumed) run first moves the checkpoint directories it finds aside (`move_aside`, into
  `nbddp-previous-runs/<their run>/`), so that it never rewrites another run's checkpoint in place.

Standard library only: the runtime writes markers, the orchestration reads them to report the last complete one.
"""
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "nbddp-complete.json"
PREVIOUS_RUNS = "nbddp-previous-runs"  # where a fresh run moves the checkpoints it finds (`move_aside`)
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR + "-<step>"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its directory and what its marker says."""

    path: Path
    step: int
    world_size: int
    completed_at: float  # time.time() when the marker was written; orders checkpoints across runs
    global_batch: int | None = None  # rows per optimizer step of the run that wrote it, when known
    run: str | None = None  # the run that wrote it (`new_run_id`); None in markers written before runs had ids


def checkpoint_dirs(output_dir) -> list[Path]:
    """The `checkpoint-<step>` directories in `output_dir` (none when it does not exist), complete or not."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted(path for path in output_dir.iterdir() if _CHECKPOINT_NAME.fullmatch(path.name) and path.is_dir())


def read_marker(directory) -> Checkpoint | None:
    """The checkpoint in `directory` if it is complete, else None."""
    try:
        with open(Path(directory) / MARKER, encoding="utf-8") as file:
            marker = json.load(file)
        step, world_size, completed_at = int(marker["step"]), int(marker["world_size"]), float(marker["completed_at"])
        global_batch, run = marker.get("global_batch"), marker.get("run")
        return Checkpoint(Path(directory), step, world_size, completed_at,
                          None if global_batch is None else int(global_batch), None if run is None else str(run))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):  # not the JSON we write (os.replace never leaves half a marker)
        return None


def complete_checkpoints(output_dir) -> list[Checkpoint]:
    """The complete checkpoints in `output_dir`, oldest first, in the order they were completed.

    Completion time rather than step number: a run resumed from checkpoint-10 of a directory that also holds a
    checkpoint-50 (of an older nbddp's run, or copied in) writes checkpoint-20 after it, and that is the one to
    resume from next.
    """
    found = [read_marker(path) for path in checkpoint_dirs(output_dir)]
    return sorted((checkpoint for checkpoint in found if checkpoint), key=lambda checkpoint: checkpoint.completed_at)


def latest_complete(output_dir) -> Checkpoint | None:
    checkpoints = complete_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def incomplete_dirs(output_dir) -> list[Path]:
    """Checkpoint directories without a marker: a run stopped while writing them."""
    return [path for path in checkpoint_dirs(output_dir) if read_marker(path) is None]


def new_run_id() -> str:
    """A new training run's id: its UTC start time and a random suffix, `20261201T101500Z-3fa2c1`."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(3)}"


def mark_complete(directory, step: int, world_size: int, global_batch: int | None = None,
                  run: str | None = None) -> Checkpoint:
    """Write the marker into `directory`, whose files every rank has finished writing.

    The files are flushed to disk first, so that after a power cut a marker never vouches for data still in
    the page cache; the marker itself goes through a temp file and os.replace, so it is there whole or not at all.
    """
    directory = Path(directory)
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            _fsync(path)
    checkpoint = Checkpoint(directory, step, world_size, time.time(), global_batch, run)
    record = {"step": step, "world_size": world_size, "completed_at": checkpoint.completed_at}
    if global_batch is not None:
        record["global_batch"] = global_batch
    if run is not None:
        record["run"] = run
    temp = directory / f".{MARKER}.{os.getpid()}.tmp"
    with open(temp, "w", encoding="utf-8") as file:
        json.dump(record, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, directory / MARKER)
    _fsync(directory)  # the rename itself
    return checkpoint


def unmark(directory) -> None:
    """Make `directory` incomplete before any of its files is rewritten: remove its marker, durably (the removal
    reaches the disk before the new files do)."""
    directory = Path(directory)
    try:
        (directory / MARKER).unlink()
    except FileNotFoundError:
        return
    _fsync(directory)


def remove(directory) -> None:
    """Delete a checkpoint directory, its marker first: a deletion cut short never leaves a marked remnant."""
    unmark(directory)
    shutil.rmtree(directory)


def move_aside(output_dir) -> Path | None:
    """Move every checkpoint directory of `output_dir`, complete or not, into `<output_dir>/nbddp-previous-runs/
    <run>/` (`run`: the newest complete one's run id, else `unknown`; `-2`, `-3`... when taken); returns that
    folder, or None when there was nothing to move. Each directory moves whole (os.rename), marker included."""
    found = checkpoint_dirs(output_dir)
    if not found:
        return None
    newest = latest_complete(output_dir)
    name = (newest.run if newest else None) or "unknown"
    folder, suffix = Path(output_dir) / PREVIOUS_RUNS / name, 1
    while folder.exists():
        suffix += 1
        folder = folder.with_name(f"{name}-{suffix}")
    folder.mkdir(parents=True)
    for path in found:
        os.rename(path, folder / path.name)
    _fsync(Path(output_dir))
    return folder


def rotate(output_dir, keep: int | None, protected=(), run: str | None = None) -> list[Path]:
    """Delete the oldest complete checkpoints of `run` (when given; of any run otherwise) until `keep` are left;
    returns what was deleted. Another run's checkpoints are never deleted by this one's limit.

    As Trainer's own rotation (`transformers.trainer_utils.rotate_checkpoints`): `keep` None or <= 0 keeps
    everything; the newest checkpoint and those in `protected` (the best model's) are never deleted.
    """
    checkpoints = [checkpoint for checkpoint in complete_checkpoints(output_dir)
                   if run is None or checkpoint.run == run]
    if not keep or keep <= 0 or len(checkpoints) <= keep:
        return []
    paths = {checkpoint.path.resolve() for checkpoint in checkpoints}
    kept = {checkpoints[-1].path.resolve()} | ({Path(path).resolve() for path in protected if path} & paths)
    remaining, deleted = len(checkpoints), []
    for checkpoint in checkpoints:
        if remaining <= max(keep, len(kept)):
            break
        if checkpoint.path.resolve() not in kept:
            remove(checkpoint.path)
            deleted.append(checkpoint.path)
            remaining -= 1
    return deleted


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
