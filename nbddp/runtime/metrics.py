"""`MetricsCallback`: the Trainer's logs as JSON lines in `<output_dir>/metrics.jsonl`, written by rank 0.

    {"step": 10, "loss": 2.31, "learning_rate": 0.0002, "tokens_per_s": 5120.4, "peak_mem_gib": 3.2, "time_s": 12.5}
    {"event": "eval", "step": 10, "eval_loss": 2.29}
    {"event": "end", "step": 60, "train_runtime": 75.1, "train_loss": 2.05, ...}

Tokens are Trainer's own count of non-padding input tokens, gathered over all ranks, so `tokens_per_s` is
the throughput of the whole run over the logging interval. Peak memory is this rank's CUDA memory reserved
by PyTorch on a GPU, and the process's peak resident memory on a CPU.

Each `trainer.train()` starts the file afresh, except one that resumes from a checkpoint at step S: it keeps
the lines up to step S and appends, so a run killed and resumed reads as one run.
"""
import json
import os
import resource
import time
from pathlib import Path

import torch
from transformers import TrainerCallback


class MetricsCallback(TrainerCallback):
    def __init__(self, path):
        self.path = Path(path)
        self._started = self._last_time = 0.0
        self._last_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        # Trainer counts input tokens only when asked; every rank must ask, since counting gathers them.
        if args.include_num_input_tokens_seen == "no":
            args.include_num_input_tokens_seen = "non_padding"
        self._started = self._last_time = time.perf_counter()
        self._last_tokens = state.num_input_tokens_seen
        if state.is_world_process_zero:  # one file per training run
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._start_file(resumed_at=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "loss" in logs:
            self._write(self._step_record(state, logs))
        elif "eval_loss" in logs:
            self._write({"event": "eval", "step": state.global_step, "eval_loss": logs["eval_loss"]})
        elif "train_runtime" in logs:
            self._write({"event": "end", "step": state.global_step, **logs})

    def _step_record(self, state, logs) -> dict:
        now, tokens = time.perf_counter(), state.num_input_tokens_seen
        elapsed = now - self._last_time
        record = {
            "step": state.global_step,
            "loss": logs["loss"],
            "learning_rate": logs.get("learning_rate"),
            "tokens_per_s": (tokens - self._last_tokens) / elapsed if elapsed > 0 else None,
            "peak_mem_gib": _peak_memory_gib(),
            "time_s": now - self._started,
        }
        self._last_time, self._last_tokens = now, tokens
        return record

    def _start_file(self, resumed_at: int) -> None:
        """Empty the file; when resuming from a checkpoint at step `resumed_at` > 0, keep the lines up to that step,
        so the file reads as one run. Rewritten whole (temp file, os.replace): the old lines are the only record of
        the steps before the checkpoint."""
        kept = []
        if resumed_at and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # the last line of a run killed while writing it
                    continue
                if record.get("step", resumed_at + 1) <= resumed_at:
                    kept.append(line + "\n")
        temp = self.path.with_name(f".{self.path.name}.tmp")
        temp.write_text("".join(kept), encoding="utf-8")
        os.replace(temp, self.path)

    def _write(self, record: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")


def _peak_memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_reserved() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
