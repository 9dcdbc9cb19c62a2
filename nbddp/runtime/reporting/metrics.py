"""`MetricsCallback`: the Trainer's logs as JSON lines in `<output_dir>/metrics.jsonl`, written by rank 0.

The file's records (steps, evaluations, the end, the batch plan) are described in nbddp.formats.metrics, which
writes them: each `trainer.train()` starts the file afresh (`start`: one resumed from a checkpoint keeps the lines
up to its step), then every record is appended.

`tokens` are counted on the device by a forward pre-hook and summed over ranks once per logged step. (Trainer's own
count, `include_num_input_tokens_seen`, gathers over ranks and waits for the GPU before every micro batch:
on 2×H200 the generated 8B run went from 0.955× to 0.997× of a hand-written script without it,
docs/performance.md.)

`MetricsCallback()` without a path writes to the trainer's `<args.output_dir>/metrics.jsonl`: what the rewrite
record-metrics adds (as `ddp.metrics_callback()`) to a trainer that a notebook built without callbacks.

On a GPU, rank 0 measures its matmul rate when training starts and each step record carries `mfu`, the model FLOPs
of its tokens over that rate (nbddp.runtime.reporting.utilization says the convention; a `utilization` record holds
the rate), for a Llama-style model.

On a GPU or a CPU, a step record carries `step_split`, the seconds its steps spent between steps, in forward and
backward and in the optimizer, once they have finished (nbddp.runtime.reporting.step_split: on a GPU the GPU's
timeline, read without waiting for it; a step the GPU has not finished goes into the next record).

On rank 0 it also adds `tokens_per_s`, `peak_mem_gib`, `mfu` and (with a batch plan) `global_batch` to the Trainer's
training logs, for the callbacks that come after it: `nbddp.runtime.trainer.trainer_patches` puts it before the
reporting ones, so TensorBoard (`train/tokens_per_s`, ...) and the others show them beside Transformers' own
scalars, and `TrainingProgress` (nbddp.runtime.reporting.progress) shows tokens/s. The Trainer's `log_history` does
not get them.
"""
import functools
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from nbddp.formats import metrics
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.reporting import utilization
from nbddp.runtime.reporting.step_split import StepSplit

LOGGED = ("tokens_per_s", "peak_mem_gib", "mfu")  # added to the training log, for the callbacks after this one


class MetricsCallback(TrainerCallback):
    def __init__(self, path=None):
        self.path = None if path is None else Path(path)  # None: the training arguments' output_dir, at train begin
        self._started = self._last_time = 0.0
        self._tokens = None  # a device tensor: tokens counted since the last logged step, on this rank
        self._hook = None
        self._flops = None  # rank 0 on a GPU: (model config, LoRA rank, measured matmul FLOP/s) for MFU
        self._last_step = 0
        self._split = None  # rank 0: a StepSplit from train begin

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._hook is not None:  # a train() that raised never reached on_train_end: count once, not twice
            self._hook.remove()
        self._tokens = torch.zeros((), dtype=torch.int64, device=args.device)
        self._hook = model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)
        self._last_step = state.global_step
        if self.path is None:
            self.path = Path(args.output_dir) / metrics.METRICS_FILE
        if state.is_world_process_zero:  # one file per training run
            metrics.start(self.path, resumed_at=state.global_step)
            plan = batch_plan.of(args)  # made by ddp.training_args; None for other arguments
            if plan is not None:
                metrics.append(self.path, {"event": "batch_plan", **plan.as_record(), "text": plan.describe()})
            self._flops = _flops_basis(model, args.device)
            if self._flops is not None:
                peak = self._flops[2]
                metrics.append(self.path, {"event": "utilization", "device": peak["device"],
                                           "peak_flops_per_s": peak["median_flops_per_s"],
                                           "convention": utilization.CONVENTION})
        self._started = self._last_time = time.perf_counter()  # after the measurement: not a training second
        self._split = StepSplit(args.device) if state.is_world_process_zero else None
        self._mark("step_end")

    def on_step_begin(self, args, state, control, **kwargs):
        self._mark("step_begin")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._mark("pre_optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        self._mark("step_end")

    def _mark(self, boundary):
        if self._split is not None:
            self._split.mark(boundary)

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
                record = self._step_record(state, logs, tokens, args)
                metrics.append(self.path, record)
                plan = batch_plan.of(args)
                logs.update({name: record[name] for name in LOGGED if record.get(name) is not None})
                if plan is not None:
                    logs["global_batch"] = plan.global_batch
        elif not state.is_world_process_zero or not logs:
            return
        elif "eval_loss" in logs:
            metrics.append(self.path, {"event": "eval", "step": state.global_step, "eval_loss": logs["eval_loss"]})
        elif "train_runtime" in logs:
            metrics.append(self.path, {"event": "end", "step": state.global_step, **logs, "ended_at": time.time()})

    def _take_tokens(self) -> int:
        counted = self._tokens.clone()
        self._tokens.zero_()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(counted)
        return int(counted.item())

    def _step_record(self, state, logs, tokens, args) -> dict:
        now = time.perf_counter()
        elapsed = now - self._last_time
        steps = state.global_step - self._last_step
        self._last_time, self._last_step = now, state.global_step
        record = {
            "step": state.global_step,
            "loss": logs["loss"],
            "learning_rate": logs.get("learning_rate"),
            "tokens": tokens,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else None,
            "peak_mem_gib": _peak_memory_gib(),
            "time_s": now - self._started,
        }
        split = self._split.take() if self._split is not None else None
        if split is not None:
            record["step_split"] = split
        if self._flops is not None and elapsed > 0 and steps > 0 and tokens > 0:
            config, lora_r, peak = self._flops
            rows = steps * _global_batch(args)
            per_gpu = tokens / elapsed / args.world_size
            flops = utilization.flops_per_token(config, tokens / rows, lora_r)
            record["mfu"] = utilization.mfu(per_gpu, flops, peak["median_flops_per_s"])
        return record


def _flops_basis(model, device):
    """(the model's config as a dict, its LoRA rank, this GPU's measured matmul rate), or None off a GPU or for a
    model whose config has no Llama-style widths (a vision-language model's nested text config, a mixture of
    experts): what the step records' MFU needs."""
    config = model.config.to_dict() if hasattr(model, "config") else {}
    widths = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    if device.type != "cuda" or not all(isinstance(config.get(key), int) for key in widths):
        return None
    peft = getattr(model, "peft_config", None) or {}
    lora_r = next((c.r for c in peft.values() if isinstance(getattr(c, "r", None), int)), 0)
    return config, lora_r, _matmul_peak(device)


@functools.cache
def _matmul_peak(device) -> dict:
    """This GPU's measured matmul rate, once a process: a script's later trainers reuse it."""
    return utilization.measure_matmul_peak(device)


def _global_batch(args) -> int:
    """Rows per optimizer step over all processes: the batch plan's, else the arguments' own."""
    plan = batch_plan.of(args)
    if plan is not None:
        return plan.global_batch
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size


def _peak_memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_reserved() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
