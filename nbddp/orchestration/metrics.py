"""Boil a run's metrics.jsonl (nbddp.formats.metrics) down to the figures `run` and `regress` show."""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from nbddp.formats import checkpoint_markers
from nbddp.formats import metrics


@dataclass(frozen=True)
class Metrics:
    losses: list  # [(step, train loss)] in file order
    eval_losses: list  # [(step, held-out loss)]
    tokens_per_s: list
    peak_mem_gib: list
    batch_plan: dict | None = None  # the last `{"event": "batch_plan"}` record: how the processes shared the batch
    train_runtime_s: float | None = None  # the last `{"event": "end"}` record's: Trainer's train() time
    mfu: list = ()  # the step records' model FLOPs utilisation (on a GPU)
    utilization: dict | None = None  # the last `{"event": "utilization"}` record: the GPU's rate, the convention
    step_split: dict | None = None  # the step records' `step_split` summed, the first record's left out (warm-up)

    @property
    def final_train_loss(self):
        return self.losses[-1][1] if self.losses else None

    @property
    def eval_loss(self):
        """The last held-out loss: the one the finished adapter has."""
        return self.eval_losses[-1][1] if self.eval_losses else None

    @property
    def median_tokens_per_s(self):
        # The median ignores the slow first step (compilation, warm-up).
        return statistics.median(self.tokens_per_s) if self.tokens_per_s else None

    @property
    def median_mfu(self):
        return statistics.median(self.mfu) if self.mfu else None

    @property
    def max_peak_mem_gib(self):
        return max(self.peak_mem_gib) if self.peak_mem_gib else None

    def loss_at(self, step):
        return dict(self.losses).get(step)


def read_metrics(path):
    """Parse `path`; a line that is not JSON is an error naming the file and line."""
    records = metrics.read(path)
    steps = [record for record in metrics.steps(records) if record.get("loss") is not None]
    evals = [record for record in metrics.events(records, "eval") if record.get("eval_loss") is not None]
    plans = metrics.events(records, "batch_plan")
    runtimes = [record["train_runtime"] for record in metrics.events(records, "end")
                if isinstance(record.get("train_runtime"), (int, float))]
    rates = metrics.events(records, "utilization")
    return Metrics([(record["step"], record["loss"]) for record in steps],
                   [(record["step"], record["eval_loss"]) for record in evals],
                   _numbers(record.get("tokens_per_s") for record in steps),
                   _numbers(record.get("peak_mem_gib") for record in steps),
                   plans[-1] if plans else None, float(runtimes[-1]) if runtimes else None,
                   _numbers(record.get("mfu") for record in steps), rates[-1] if rates else None,
                   _split_total([record["step_split"] for record in steps
                                 if isinstance(record.get("step_split"), dict)]))


def _split_total(splits):
    """The splits summed, leaving out the first when there are more (its steps include the warm-up); None for none,
    or for splits that lack a phase (a file of another version)."""
    keys = ["steps", *(f"{phase}_s" for phase in metrics.STEP_PHASES)]
    counted = splits[1:] if len(splits) > 1 else splits
    if not counted or not all(isinstance(split.get(key), (int, float)) for split in counted for key in keys):
        return None
    return {key: sum(split[key] for split in counted) for key in keys}


def last_trainer_state(output_dir):
    """`trainer_state.json` of the last complete checkpoint under `output_dir` (checkpoint_markers), or None."""
    checkpoint = checkpoint_markers.latest_complete(output_dir)
    state = checkpoint.path / "trainer_state.json" if checkpoint else None
    return state if state and state.is_file() else None


def read_trainer_state(path):
    """The losses in a Trainer's `trainer_state.json` (`log_history`): what a script that writes no metrics.jsonl
    (a notebook not written for nbddp) leaves; no tokens/s or memory there."""
    history = json.loads(Path(path).read_text(encoding="utf-8"))["log_history"]
    losses = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]
    eval_losses = [(entry["step"], entry["eval_loss"]) for entry in history if "eval_loss" in entry]
    return Metrics(losses, eval_losses, [], [])


def _numbers(values):
    return [value for value in values if isinstance(value, (int, float))]
