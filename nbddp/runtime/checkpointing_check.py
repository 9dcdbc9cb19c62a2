"""`FirstStepMemoryCheck`: the estimate that chose the gradient checkpointing mode, next to the measured peak.

`checkpointing.patch_trainer` adds it to every Trainer whose model carries a choice. On a GPU, after the first
optimizer step, rank 0 prints

    nbddp: after step 1: peak 16.5 GiB allocated (estimated 17.7 GiB with gradient checkpointing unsloth), 18.0 GiB reserved of 139.8 GiB on cuda:0

and any rank whose reserved peak is within `CLOSE_TO_LIMIT` of its GPU says so: rows longer than the first
step's may not fit. The peak is the process's since it started (weights loading included, and the held-out
loss before step 1 with `eval_on_start`), as the benchmarks measure it. Before training it also checks the
trainer's per-device batch and `max_length` against those the choice assumed.
"""
import torch
from transformers import TrainerCallback

from nbddp.runtime.memory_estimate import GIB, estimate_peak, format_gib

CLOSE_TO_LIMIT = 0.90  # reserved peak over this share of the GPU after step 1: little left for longer rows


class FirstStepMemoryCheck(TrainerCallback):
    def __init__(self, choice):
        self.choice = choice
        self.estimate_gib = choice.estimate_gib
        self._checked = False

    def on_train_begin(self, args, state, control, **kwargs):
        choice = self.choice
        batch = args.per_device_train_batch_size
        seq_len = getattr(args, "max_length", None) or choice.seq_len  # SFTConfig's; plain TrainingArguments have none
        if (batch, seq_len) == (choice.micro_batch, choice.seq_len) or choice.shape is None:
            return
        self.estimate_gib = estimate_peak(choice.shape, seq_len, batch, choice.mode, choice.transformers_peft)["total_gib"]
        if state.is_world_process_zero:
            print(f"nbddp: gradient checkpointing {choice.mode} was chosen for batch {choice.micro_batch} x "
                  f"{choice.seq_len} tokens, the trainer runs {batch} x {seq_len}: estimated peak "
                  f"{self.estimate_gib:.1f} GiB against a {choice.budget_gib:.1f} GiB budget", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self._checked or args.device.type != "cuda":
            return
        self._checked = True
        device = args.device
        peak, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        total = torch.cuda.get_device_properties(device).total_memory
        report, warning = first_step_report(self.choice.mode, self.estimate_gib, peak / GIB, reserved / GIB,
                                            total / GIB, str(device))
        if state.is_world_process_zero:
            print(f"nbddp: {report}", flush=True)
        if warning:
            print(f"nbddp: warning: rank {args.process_index}: {warning}", flush=True)


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
