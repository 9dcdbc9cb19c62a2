"""`FirstStepMemoryCheck`: the estimate that chose the gradient checkpointing mode, next to the measured peak.

`gradient_checkpointing.patch_trainer` adds it to every Trainer whose model carries a choice. On a GPU, after the first
optimizer step, rank 0 prints

    nbddp: after step 1: peak 16.5 GiB allocated (estimated 17.7 GiB with gradient checkpointing unsloth), 18.0 GiB reserved of 139.8 GiB on cuda:0

and any rank whose reserved peak is within `CLOSE_TO_LIMIT` of its GPU says so: rows longer than the first
step's may not fit. The peak is the process's since it started (weights loading included, and the held-out
loss before step 1 with `eval_on_start`), as the benchmarks measure it. Before training it also checks the
trainer's per-device batch and `max_length` against those the choice assumed.

When the trainer's gradient accumulation is even and twice its per-device batch is estimated to fit the budget
(also counting from what step 1 reserved), rank 0 adds one line (`larger_micro_batch_tip`; wrapped here):

    nbddp: tip: micro batch 8 is estimated at 20.2 GiB, within the 119.3 GiB budget: per_device_train_batch_size=8
    with gradient_accumulation_steps=2 (--set NAME=VALUE, or --batch_layout auto, which chooses for you) keeps the
    global batch (16 rows per rank and optimizer step) in fewer, fuller micro batches; on a 1.1B model on an H200,
    micro batch 8 instead of 4 ran 1.39x the tokens/s (docs/performance.md)
"""
import torch
from transformers import TrainerCallback

from nbddp import log
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.memory.memory_estimate import GIB, estimate_peak, format_gib

CLOSE_TO_LIMIT = 0.90  # reserved peak over this share of the GPU after step 1: little left for longer rows
# A step that adds less than this share of the activations estimated for its tokens under a mode does not run that
# mode: layers still recompute or offload (at 8B estimate and measurement agreed within 7%: docs/performance.md).
FAR_BELOW = 0.5
# What a fuller micro batch bought where it was measured (median of 2 pairs, bench/results/batch_1b.json): a
# host-bound small model gains most, which the tip says rather than promising the same elsewhere.
MEASURED_GAIN = "on a 1.1B model on an H200, micro batch 8 instead of 4 ran 1.39x the tokens/s (docs/performance.md)"


class FirstStepMemoryCheck(TrainerCallback):
    def __init__(self, choice):
        self.choice = choice
        self.estimate_gib = choice.estimate_gib
        self.seq_len = choice.seq_len  # the trainer's, once on_train_begin has seen it
        self._checked = False
        self._allocated_at_start = None  # on a GPU: bytes allocated when training began (weights, adapters)
        self._longest = 0  # tokens of step 1's largest micro batch, padding included
        self._hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        choice = self.choice
        if args.device.type == "cuda" and model is not None and not self._checked:
            self._allocated_at_start = torch.cuda.memory_allocated(args.device)
            self._hook = model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)
        batch = args.per_device_train_batch_size
        seq_len = getattr(args, "max_length", None) or choice.seq_len  # SFTConfig's; plain TrainingArguments have none
        self.seq_len = seq_len
        if (batch, seq_len) == (choice.micro_batch, choice.seq_len) or choice.shape is None:
            return
        self.estimate_gib = estimate_peak(choice.shape, seq_len, batch, choice.mode, choice.transformers_peft)["total_gib"]
        if state.is_world_process_zero:
            log.info(f"nbddp: gradient checkpointing {choice.mode} was chosen for batch {choice.micro_batch} x "
                     f"{choice.seq_len} tokens, the trainer runs {batch} x {seq_len}: estimated peak "
                     f"{self.estimate_gib:.1f} GiB against a {choice.budget_gib:.1f} GiB budget")

    def _count_tokens(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if module.training and torch.is_grad_enabled() and isinstance(ids, torch.Tensor):
            self._longest = max(self._longest, ids.numel())

    def on_step_end(self, args, state, control, **kwargs):
        if self._checked or args.device.type != "cuda":
            return
        self._checked = True
        if self._hook is not None:
            self._hook.remove()
        device = args.device
        peak, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        in_force = self._mode_check(peak)
        if in_force:
            log.info(f"nbddp: warning: rank {args.process_index}: {in_force}")
        total = torch.cuda.get_device_properties(device).total_memory
        report, warning = first_step_report(self.choice.mode, self.estimate_gib, peak / GIB, reserved / GIB,
                                            total / GIB, str(device))
        if state.is_world_process_zero:
            log.info(f"nbddp: {report}")
            tip = larger_micro_batch_tip(self.choice, args.per_device_train_batch_size,
                                         args.gradient_accumulation_steps, self.seq_len, reserved / GIB)
            plan = batch_plan.of(args)
            if tip and not (plan and plan.fuller):  # --batch_layout auto already chose the micro batch
                log.info(f"nbddp: tip: {tip}")
        if warning:
            log.info(f"nbddp: warning: rank {args.process_index}: {warning}")


    def _mode_check(self, peak_bytes) -> str | None:
        """`mode_not_in_force` for step 1: what it added to the memory training began with, against the
        activations estimated for its largest micro batch (as one row of its tokens)."""
        choice = self.choice
        if choice.shape is None or self._allocated_at_start is None or not self._longest:
            return None
        estimate = estimate_peak(choice.shape, self._longest, 1, choice.mode, choice.transformers_peft)
        return mode_not_in_force(choice.mode, f"step 1 (its largest micro batch {self._longest} tokens)",
                                 (peak_bytes - self._allocated_at_start) / GIB,
                                 estimate["activations_gib"] + estimate["logits_gib"])


def first_step_report(mode: str, estimate_gib: float | None, peak_gib: float, reserved_gib: float,
                      total_gib: float, device: str) -> tuple[str, str | None]:
    """(the line that compares measured and estimated memory, a warning or None when the GPU is nearly full)."""
    estimated = f"estimated {format_gib(estimate_gib)} GiB" if estimate_gib is not None else "no estimate"
    report = (f"after step 1: peak {format_gib(peak_gib)} GiB allocated ({estimated} with gradient checkpointing "
              f"{mode}), {format_gib(reserved_gib)} GiB reserved of {total_gib:.1f} GiB on {device}")
    if reserved_gib < CLOSE_TO_LIMIT * total_gib:
        return report, None
    advice = ("lower --per_device_train_batch_size or --max_seq_length" if mode == "unsloth"
              else "use --use_gradient_checkpointing true or unsloth, or a smaller batch")
    return report, (f"{device} holds {reserved_gib:.1f} of {total_gib:.1f} GiB after step 1, within "
                    f"{1 - CLOSE_TO_LIMIT:.0%} of its memory: longer rows may run out of memory; {advice}")


def larger_micro_batch_tip(choice, batch: int, accumulation: int, seq_len: int, reserved_gib: float) -> str | None:
    """What to say when twice the per-device `batch` fits `choice`'s budget and halving an even gradient
    `accumulation` keeps the global batch; None otherwise (no shape or budget to estimate with). It fits when its
    estimate does and so does what step 1 reserved (`reserved_gib`) plus the estimated growth: the measurement
    keeps the tip from contradicting a GPU that is already nearly full."""
    # Odd accumulation cannot be halved, so a doubled micro batch would change the global batch, and with it
    # the training run; that is the user's call, not a speed tip.
    if accumulation < 2 or accumulation % 2 or choice.shape is None or choice.budget_gib is None:
        return None
    larger = 2 * batch
    estimate_gib, current_gib = (
        estimate_peak(choice.shape, seq_len, micro_batch, choice.mode, choice.transformers_peft)["total_gib"]
        for micro_batch in (larger, batch))
    if max(estimate_gib, reserved_gib + estimate_gib - current_gib) > choice.budget_gib:
        return None
    return (f"micro batch {larger} is estimated at {format_gib(estimate_gib)} GiB, within the "
            f"{choice.budget_gib:.1f} GiB budget: per_device_train_batch_size={larger} with "
            f"gradient_accumulation_steps={accumulation // 2} (--set NAME=VALUE, or --batch_layout auto, which "
            f"chooses for you) keeps the global batch ({batch * accumulation} rows per rank and optimizer step) in fewer, "
            f"fuller micro batches; {MEASURED_GAIN}")


def mode_not_in_force(mode: str, what: str, used_gib: float, activations_gib: float) -> str | None:
    """What to say when `what` (a step) added less than FAR_BELOW of the `activations_gib` estimated for it under
    gradient checkpointing `mode`: the mode that ran is not `mode`. None when the measurement agrees."""
    if used_gib >= FAR_BELOW * activations_gib:
        return None
    return (f"{what} added {format_gib(used_gib)} GiB, under {FAR_BELOW:.0%} of the {format_gib(activations_gib)} GiB "
            f"of activations estimated with gradient checkpointing {mode}: the layers still recompute or offload, so "
            f"the mode in force is not {mode!r} and its step time and memory are not what nbddp says")
