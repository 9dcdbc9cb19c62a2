"""The metrics file: `<output_dir>/metrics.jsonl`, one JSON object a line, written by rank 0 only.

    {"step": 10, "loss": 2.31, "learning_rate": 0.0002, "tokens": 5120, "tokens_per_s": 5120.4, "peak_mem_gib": 3.2, "time_s": 12.5}
    {"event": "eval", "step": 10, "eval_loss": 2.29}
    {"event": "end", "step": 60, "train_runtime": 75.1, "train_loss": 2.05, ..., "ended_at": 1767225600.5}
    {"event": "batch_plan", "micro_batch": 2, "accumulation": 2, "processes": 2, "text": "global batch 8 rows = ..."}

Step records (no `event` key), one per logged training step: the loss and learning rate Trainer logged; `tokens`, the
non-padding input tokens of the training forward passes since the previous step record, summed over all ranks;
`tokens_per_s`, those over the wall time since it (the whole run's throughput; null when no time passed);
`peak_mem_gib`, rank 0's peak memory (CUDA memory reserved by PyTorch on a GPU, resident memory on a CPU); `time_s`,
seconds since training started; on a GPU, `mfu`: the model FLOPs of those tokens per GPU over the GPU's measured
matmul rate (nbddp.runtime.reporting.utilization); `step_split`, where the time of the steps since the previous step
record went: `{"steps": 2, "between_steps_s": 0.01, "forward_backward_s": 0.4, "optimizer_s": 0.05}`
(nbddp.runtime.reporting.step_split names the phases; on a GPU the GPU's timeline; absent where not measured). Event
records: `eval` per evaluation, `end` when training ends (Trainer's final metrics, `train_runtime`, `train_loss`,
..., and `ended_at`, the time.time() then: where `run` splits its wall time), `utilization` when training starts on a
GPU (`device`, `peak_flops_per_s` and the FLOP `convention` of `mfu`) and `batch_plan` when training starts
(nbddp.runtime.memory.batch_plan's `as_record()` and `text`, its `describe()`: the layout the processes train with,
and the notebook's). The smoke run's layout check moves its first training's file aside and appends `layout_check`
with `wall_s`, what training again took (nbddp.runtime.memory.smoke_layout_check).

nbddp.runtime.reporting.metrics.MetricsCallback writes it (`start`, `append`); `run`, `regress`, the smoke's layout
check, the failure report and bench read it (`read`, `steps`, `events`, `last_step`). Each `trainer.train()` starts
the file afresh, except one that resumes from a checkpoint at step S: it keeps the lines up to step S and appends,
so a run killed and resumed reads as one run. A rank 0 killed while writing leaves a torn last line.

Standard library only (and nbddp.errors): the runtime writes the file, the orchestration and bench read it.
"""
import json
import math
import os
from pathlib import Path

from nbddp.errors import NbddpError

METRICS_FILE = "metrics.jsonl"  # in the run's output_dir
STEP_PHASES = ("between_steps", "forward_backward", "optimizer")  # a step_split's f"{phase}_s", in step order


def append(path, record: dict) -> None:
    """Add `record` as one line at the end of the file at `path` (created, with its folder, when missing). A value
    that is a NaN or infinite float is written as null: the file stays standard JSON, which has no such numbers."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(_finite(record), allow_nan=False) + "\n")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def start(path, resumed_at: int = 0) -> None:
    """Empty the file at `path` (created, with its folder, when missing); when resuming from a checkpoint at step
    `resumed_at` > 0, keep its records (their lines as they are) up to that step; lines that are no record (torn,
    not UTF-8, not a JSON object) go. Rewritten whole (temp file, os.replace): the old lines are the only record
    of the steps before the checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = []
    if resumed_at and path.exists():
        for _, line, record in _lines(path):
            step = record.get("step", resumed_at + 1) if isinstance(record, dict) else None
            if _is_step_number(step) and step <= resumed_at:
                kept.append(line + "\n")
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text("".join(kept), encoding="utf-8")
    os.replace(temp, path)


def read(path, strict: bool = True) -> list[dict]:
    """The records of the file at `path`, in file order, blank lines left out. A line that is no record (not
    UTF-8, not JSON, not a JSON object) is an error naming the file and line; with `strict` False it is left out
    (a torn last line, a file read while rank 0 writes it, or bytes something else wrote)."""
    records = []
    for number, line, record in _lines(path):
        if isinstance(record, dict):
            records.append(record)
        elif strict:
            raise NbddpError(f"{path}, line {number}: not a JSON line ({record}): {line[:60]!r}")
    return records


def _lines(path):
    """(line number, the line's text, its record or why it is none) for each line of the file at `path` that is not
    blank; a line that is not UTF-8 is given with its bad bytes replaced."""
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                yield number, raw.decode("utf-8", errors="replace").rstrip("\r\n"), f"not UTF-8 text: {error.reason}"
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                yield number, line, error.msg
                continue
            yield number, line, record if isinstance(record, dict) else "not a JSON object"


def _is_step_number(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def steps(records) -> list[dict]:
    """The step records among `records`."""
    return [record for record in records if "event" not in record]


def events(records, name: str) -> list[dict]:
    """The `{"event": name, ...}` records among `records`."""
    return [record for record in records if record.get("event") == name]


def last_step(path) -> int | None:
    """The step of the last step record of the file at `path`; None when there is none, or no file to read."""
    try:
        records = read(path, strict=False)
    except OSError:  # no file, or output_dir is no folder
        return None
    logged = [record["step"] for record in steps(records) if _is_step_number(record.get("step"))]
    return logged[-1] if logged else None
