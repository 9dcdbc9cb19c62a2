"""`MetricsCallback`: the Trainer's logs as JSON lines in `<output_dir>/metrics.jsonl`, written by rank 0.

    {"step": 10, "loss": 2.31, "learning_rate": 0.0002, "tokens": 5120, "tokens_per_s": 5120.4, "peak_mem_gib": 3.2, "time_s": 12.5}
    {"event": "eval", "step": 10, "eval_loss": 2.29}
    {"event": "end", "step": 60, "train_runtime": 75.1, "train_loss": 2.05, ...}
    {"event": "batch_plan", "micro_batch": 2, "accumulation": 2, "processes": 2, "text": "global batch 8 rows = ..."}

The batch plan (nbddp.runtime.batch_plan, as the trainer's arguments carry it) is written when training starts.

`tokens` are the non-padding input tokens of the training forward passes since the previous line, summed
over all ranks, so `tokens_per_s` is the throughput of the whole run over the logging interval. They are
counted on the device by a forward pre-hook and summed over ranks once per logged step. (Trainer's own
count, `include_num_input_tokens_seen`, gathers over ranks and waits for the GPU before every micro batch:
on 2×H200 the generated 8B run went from 0.955× to 0.997× of a hand-written script without it,
docs/performance.md.) Peak memory is this rank's CUDA memory reserved by PyTorch on a GPU, and the
process's peak resident memory on a CPU.

`MetricsCallback()` without a path writes to the trainer's `<args.output_dir>/metrics.jsonl`: what the rewrite
record-metrics adds (as `ddp.metrics_callback()`) to a trainer that a notebook built without callbacks.

On rank 0 it also adds `tokens_per_s`, `peak_mem_gib` and (with a batch plan) `global_batch` to the Trainer's
training logs, for the callbacks that come after it: `nbddp.runtime.trainer_patches` puts it before the reporting
ones, so TensorBoard (`train/tokens_per_s`, ...) and the others show them beside Transformers' own scalars, and
`TrainingProgress` (nbddp.runtime.progress) shows tokens/s. The Trainer's `log_history` does not get them.

Each `trainer.train()` starts the file afresh, except one that resumes from a checkpoint at step S: it keeps
the lines up to step S and appends, so a run killed and resumed reads as one run.
"""
import json
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from nbddp.runtime import batch_plan

LOGGED = ("tokens_per_s", "peak_mem_gib")  # added to the training log, for the callbacks after this one


class MetricsCallback(TrainerCallback):
    def __init__(self, path=None):
        self.path = None if path is None else Path(path)  # None: the training arguments' output_dir, at train begin
        self._started = self._last_time = 0.0
        self._tokens = None  # a device tensor: tokens counted since the last logged step, on this rank
        self._hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._hook is not None:  # a train() that raised never reached on_train_end: count once, not twice
            self._hook.remove()
        self._tokens = torch.zeros((), dtype=torch.int64, device=args.device)
        self._hook = model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)
        self._started = self._last_time = time.perf_counter()
        if self.path is None:
            self.path = Path(args.output_dir) / "metrics.jsonl"
        if state.is_world_process_zero:  # one file per training run
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._start_file(resumed_at=state.global_step)
            plan = batch_plan.of(args)  # made by ddp.training_args; None for other arguments
            if plan is not None:
                self._write({"event": "batch_plan", **plan.as_record(), "text": plan.describe()})

    def on_train_end(self, args, state, control, **kwargs):
        self._hook.remove()
        self._hook = None

    def _count_tokens(self, module, args, kwargs):
        # Training passes only: evaluation runs in eval mode and generation without gradients.
        if not (module.training and torch.is_grad_enabled()):
            return
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids", args[0] if args else None)
        if mask is not None:
            self._tokens += mask.sum()  # stays on the device: no wait for the GPU here
        elif ids is not None:
            self._tokens += ids.numel()  # padding-free batches (one packed row) have no mask and no padding

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:  # every rank logs the training loss at the same steps: sum the count here
            tokens = self._take_tokens()
            if state.is_world_process_zero:
                record = self._step_record(state, logs, tokens)
                self._write(record)
                plan = batch_plan.of(args)
                logs.update({name: record[name] for name in LOGGED if record[name] is not None})
                if plan is not None:
                    logs["global_batch"] = plan.global_batch
        elif not state.is_world_process_zero or not logs:
            return
        elif "eval_loss" in logs:
            self._write({"event": "eval", "step": state.global_step, "eval_loss": logs["eval_loss"]})
        elif "train_runtime" in logs:
            self._write({"event": "end", "step": state.global_step, **logs})

    def _take_tokens(self) -> int:
        counted = self._tokens.clone()
        self._tokens.zero_()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(counted)
        return int(counted.item())

    def _step_record(self, state, logs, tokens) -> dict:
        now = time.perf_counter()
        elapsed = now - self._last_time
        self._last_time = now
        return {
            "step": state.global_step,
            "loss": logs["loss"],
            "learning_rate": logs.get("learning_rate"),
            "tokens": tokens,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else None,
            "peak_mem_gib": _peak_memory_gib(),
            "time_s": now - self._started,
        }

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
