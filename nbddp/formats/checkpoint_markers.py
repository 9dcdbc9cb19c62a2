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
  `nbddp-previous-runs/<their run>/`), so that it never rewrites another run's checkpoint in place;
- a marked checkpoint that would not load (`damage`: a marker that is not ours or contradicts its directory, a
  file empty or cut short) is never resumed from: a resume moves it into `nbddp-damaged/` (`set_aside`), whole.

Standard library only: the runtime writes markers, the orchestration reads them to report the last complete one.
"""
import json
import os
import re
import secrets
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

MARKER = "nbddp-complete.json"
PREVIOUS_RUNS = "nbddp-previous-runs"  # where a fresh run moves the checkpoints it finds (`move_aside`)
DAMAGED = "nbddp-damaged"  # where a resume moves the marked checkpoints that would not load (`set_aside`)
# The files of tensors Trainer loads on resume, beside trainer_state.json: torch.save's, the weights (`damage`).
_TENSOR_SUFFIXES = {".pt", ".pth", ".bin", ".safetensors"}
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
    """The checkpoint in `directory` if it is complete (its marker is the JSON we write), else None."""
    try:
        with open(Path(directory) / MARKER, "rb") as file:
            marker = json.loads(file.read().decode("utf-8"))
        step, world_size, completed_at = int(marker["step"]), int(marker["world_size"]), float(marker["completed_at"])
        global_batch, run = marker.get("global_batch"), marker.get("run")
        return Checkpoint(Path(directory), step, world_size, completed_at,
                          None if global_batch is None else int(global_batch), None if run is None else str(run))
    except OSError:  # no marker: a run stopped while writing the directory
        return None
    except (ValueError, KeyError, TypeError, AttributeError):  # not the JSON we write: see `damage`
        return None


def damage(directory) -> str | None:
    """Why the marked checkpoint in `directory` cannot be resumed from, or None when nothing is found wrong: a
    marker that is not the JSON nbddp writes (os.replace never leaves half of one: the disk, or a hand, changed
    it) or that contradicts the directory (its step, the RNG states of its processes), or a file Trainer loads
    on resume that is empty or cut short. Only for directories that have a marker file."""
    directory = Path(directory)
    checkpoint = read_marker(directory)
    if checkpoint is None:
        return f"its marker {MARKER} is not the JSON nbddp writes"
    named = _CHECKPOINT_NAME.fullmatch(directory.name)
    if named and int(named[1]) != checkpoint.step:
        return f"its marker {MARKER} says step {checkpoint.step}, the directory is {directory.name}"
    states = len(list(directory.glob("rng_state_*.pth"))) or (1 if (directory / "rng_state.pth").exists() else 0)
    if states and states != checkpoint.world_size:
        return (f"its marker {MARKER} says {checkpoint.world_size} processes wrote it, the directory holds the RNG "
                f"states of {states}")
    return next(filter(None, map(_file_damage, sorted(directory.rglob("*")))), None)


def _file_damage(path: Path) -> str | None:
    """Why `path`, a file of a checkpoint, would not load: empty, a zip archive (torch.save's) or a safetensors
    file cut short, a trainer_state.json that is not JSON; None for other files, and for these when whole."""
    if path.name != "trainer_state.json" and path.suffix not in _TENSOR_SUFFIXES or not path.is_file():
        return None
    name, size = path.name, path.stat().st_size
    if size == 0:
        return f"{name} is empty (0 bytes)"
    if path.suffix == ".json":
        try:
            json.loads(path.read_bytes().decode("utf-8"))
        except ValueError as error:
            return f"{name} is not valid JSON ({error})"
        return None
    with open(path, "rb") as file:
        head = file.read(8)
        if head.startswith(b"PK\x03\x04") and not zipfile.is_zipfile(file):
            return f"{name} is cut short ({size} bytes: not a whole zip archive, as torch.save writes)"
        if path.suffix == ".safetensors":
            return _safetensors_damage(name, size, head, file)
    return None


def _safetensors_damage(name, size, head, file) -> str | None:
    """Why a safetensors file (8 bytes of header length, the JSON header, the tensors' bytes) is not whole."""
    length = int.from_bytes(head, "little") if len(head) == 8 else size
    if 8 + length > size:
        return f"{name} is cut short ({size} bytes, not a whole safetensors file)"
    try:
        header = json.loads(file.read(length).decode("utf-8"))
        end = max((tensor["data_offsets"][1] for key, tensor in header.items() if key != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{name} is not a safetensors file (its header is not the JSON one)"
    if 8 + length + end > size:
        return f"{name} is cut short ({size} bytes of the {8 + length + end} its header describes)"
    return None


def complete_checkpoints(output_dir) -> list[Checkpoint]:
    """The complete checkpoints in `output_dir` that are not damaged (`damage`), oldest first, in the order they
    were completed.

    Completion time rather than step number: a run resumed from checkpoint-10 of a directory that also holds a
    checkpoint-50 (of an older nbddp's run, or copied in) writes checkpoint-20 after it, and that is the one to
    resume from next.
    """
    found = [read_marker(path) for path in checkpoint_dirs(output_dir) if damage(path) is None]
    return sorted((checkpoint for checkpoint in found if checkpoint), key=lambda checkpoint: checkpoint.completed_at)


def latest_complete(output_dir) -> Checkpoint | None:
    checkpoints = complete_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def incomplete_dirs(output_dir) -> list[Path]:
    """Checkpoint directories without a marker file: a run stopped while writing them."""
    return [path for path in checkpoint_dirs(output_dir) if not (path / MARKER).exists()]


def damaged_dirs(output_dir) -> list[tuple[Path, str]]:
    """(directory, what is wrong) for each checkpoint directory with a marker file that `damage` finds wrong."""
    found = [(path, damage(path)) for path in checkpoint_dirs(output_dir) if (path / MARKER).exists()]
    return [(path, why) for path, why in found if why]


def set_aside(directory) -> Path:
    """Move a damaged checkpoint directory, whole, to `<its folder>/nbddp-damaged/<its name>` (`-2`, `-3`... when
    taken), where nothing resumes from or rotates it; returns where it went. Never deleted: its files may be
    what the user can still recover."""
    directory = Path(directory)
    target, suffix = directory.parent / DAMAGED / directory.name, 1
    while target.exists():
        suffix += 1
        target = target.with_name(f"{directory.name}-{suffix}")
    target.parent.mkdir(exist_ok=True)
    os.rename(directory, target)
    _fsync(directory.parent)
    return target


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
