"""Read a run's metrics.jsonl (docs/design.md) and boil it down to the figures `run` and `regress` show.

Lines are per-step `{"step", "loss", "learning_rate", "tokens_per_s", "peak_mem_gib", "time_s"}`,
`{"event": "eval", "step", "eval_loss"}`, `{"event": "batch_plan", ..., "text"}` and `{"event": "end", ...}`.
"""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from nbddp import checkpoint_markers
from nbddp.errors import NbddpError

METRICS_FILE = "metrics.jsonl"  # in the run's output_dir, written by rank 0


@dataclass(frozen=True)
class Metrics:
    losses: list  # [(step, train loss)] in file order
    eval_losses: list  # [(step, held-out loss)]
    tokens_per_s: list
    peak_mem_gib: list
    batch_plan: dict | None = None  # the last `{"event": "batch_plan"}` record: how the processes shared the batch
    train_runtime_s: float | None = None  # the last `{"event": "end"}` record's: Trainer's train() time

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
    def max_peak_mem_gib(self):
        return max(self.peak_mem_gib) if self.peak_mem_gib else None

    def loss_at(self, step):
        return dict(self.losses).get(step)


def read_metrics(path):
    """Parse `path`; a line that is not JSON is an error naming the file and line."""
    losses, eval_losses, tokens, memory, plan, runtime = [], [], [], [], None, None
    with open(path, encoding="utf-8") as stream:
        for number, text in enumerate(stream, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise NbddpError(f"{path}, line {number}: not a JSON line ({error.msg})") from None
            if record.get("event") == "batch_plan":
                plan = record
            elif record.get("event") == "end" and isinstance(record.get("train_runtime"), (int, float)):
                runtime = float(record["train_runtime"])
            elif record.get("event") == "eval" and record.get("eval_loss") is not None:
                eval_losses.append((record["step"], record["eval_loss"]))
            elif "event" not in record and record.get("loss") is not None:
                losses.append((record["step"], record["loss"]))
                _append_number(tokens, record.get("tokens_per_s"))
                _append_number(memory, record.get("peak_mem_gib"))
    return Metrics(losses, eval_losses, tokens, memory, plan, runtime)


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


def _append_number(values, value):
    if isinstance(value, (int, float)):
        values.append(value)
