"""Gradient checkpointing chosen from memory, not habit: the notebooks' `use_gradient_checkpointing`.

The parameter is a string, so that flags (`--use_gradient_checkpointing false`) and papermill carry every value
as typed; `nbddp.gradient_checkpointing_modes` reads it, for this module and the fallback's `get_peft_model`:

    "auto"     the cheapest mode whose estimated peak memory fits this GPU; off on a CPU
    "false"    no recompute: the fastest, the most activation memory
    "true"     each decoder layer recomputed in backward, its input kept on the GPU
    "unsloth"  the same recompute with the layer inputs offloaded to host memory (Unsloth's mode; the
               Transformers+PEFT fallback has no offloading and recomputes as "true")

A notebook resolves it once the model is loaded, and passes the result to Unsloth's API:

    gradient_checkpointing = choose_gradient_checkpointing(
        use_gradient_checkpointing, model, max_seq_length=2048, per_device_train_batch_size=2, lora_r=16)
    model = FastLanguageModel.get_peft_model(model, ..., use_gradient_checkpointing=gradient_checkpointing)

The choice needs the per-device batch, which is why the notebooks define `per_device_train_batch_size` in the
LoRA setup stage, before the trainer. It is printed with its estimate on rank 0 and kept on the model
(`model.nbddp_checkpointing`), where `patch_trainer` finds it: a Trainer built on the model then honours it
(TRL's configs default `gradient_checkpointing` to True, which would switch recompute back on) and checks the
estimate against the measured peak after its first step (`gradient_checkpointing_check.FirstStepMemoryCheck`).
"""
import dataclasses
import functools
import sys

import torch

from nbddp import log, patches
from nbddp.gradient_checkpointing_modes import parse_mode
from nbddp.rank import is_main_process
from nbddp.runtime.memory.memory_estimate import (GIB, HEADROOM, MODES, ModelShape, cheapest_fitting, estimate_peak,
                                           format_gib, shape_from_model)

UNSLOTH_MIN_OFFLOAD_SEQ = 512  # below this Unsloth recomputes as "true" (offloading is not worth it there)
_UNSLOTH_VALUES = {"off": False, "true": True, "unsloth": "unsloth"}  # what Unsloth's get_peft_model takes
# Where Unsloth's get_peft_model records the mode on the model (unsloth 2026.10.9, models/llama.py patch_peft_model);
# its trainers' train() re-applies it to every layer through for_training (models/rl.py prepare_for_training_mode).
UNSLOTH_RECORDED_MODE = "_unsloth_gradient_checkpointing"


@dataclasses.dataclass(frozen=True)
class CheckpointingChoice:
    """A decided mode, why, and the estimates behind it (none on a CPU)."""

    requested: str  # parse_mode's reading of the parameter
    mode: str  # "off" | "true" | "unsloth"
    reason: str
    seq_len: int
    micro_batch: int
    shape: ModelShape | None = None
    transformers_peft: bool = False  # estimated for the fallback: more activations per layer, materialised logits
    estimates: dict = dataclasses.field(default_factory=dict)  # mode -> estimate_peak(...) of the modes available
    capacity_gib: float | None = None  # memory this process can have on its GPU (smallest over ranks)
    budget_gib: float | None = None  # HEADROOM * capacity

    @property
    def value(self):
        """What Unsloth's get_peft_model takes for this mode: False, True or "unsloth"."""
        return _UNSLOTH_VALUES[self.mode]

    @property
    def estimate_gib(self) -> float | None:
        estimate = self.estimates.get(self.mode)
        return estimate["total_gib"] if estimate else None

    def describe(self) -> str:
        text = f"gradient checkpointing {self.mode} ({self.reason})"
        if not self.estimates:
            return text
        each = ", ".join(f"{mode} {format_gib(estimate['total_gib'])}" for mode, estimate in self.estimates.items())
        return (f"{text}; estimated peak per GPU for batch {self.micro_batch} x {self.seq_len} tokens: {each} GiB; "
                f"budget {self.budget_gib:.1f} GiB ({HEADROOM:.0%} of {self.capacity_gib:.1f} GiB free)")

    def warning(self) -> str | None:
        """What to say when the chosen mode's estimate does not fit the budget."""
        if self.estimate_gib is None or self.estimate_gib <= self.budget_gib:
            return None
        advice = "lower --per_device_train_batch_size or --max_seq_length"
        if self.requested != "auto":
            advice += ", or let --use_gradient_checkpointing auto choose"
        return (f"gradient checkpointing {self.mode} is estimated at {self.estimate_gib:.1f} GiB, over the "
                f"{self.budget_gib:.1f} GiB budget: this run may run out of memory; {advice}")


def decide(requested: str, available: tuple, estimates: dict, budget_gib: float | None) -> tuple[str, str]:
    """(mode, reason) for a parsed request, the modes this backend and length can run (cheapest first), their
    estimates (empty when there is nothing to estimate) and the memory budget (None off the GPU)."""
    if requested != "auto":
        if requested == "unsloth" and "unsloth" not in available:
            return "true", "requested unsloth, which offloads only under Unsloth from 512 tokens on: plain recompute"
        return requested, "requested"
    if budget_gib is None:
        return "off", "auto: no GPU, so no GPU memory to save; recompute would only cost time"
    if not estimates:
        return available[-1], "auto: this model's config has no Llama-style widths to estimate from: the most saving mode"
    fitting = cheapest_fitting([estimates[mode] for mode in available], budget_gib)
    if fitting is None:
        return available[-1], "auto: no mode fits the budget: the most saving one"
    return fitting["mode"], "auto: the cheapest mode that fits"


def choose_gradient_checkpointing(use_gradient_checkpointing, model, max_seq_length: int,
                                  per_device_train_batch_size: int, lora_r: int = 16):
    """Decide the mode for `model` (loaded, adapters not yet added), print it on rank 0, keep it on the model,
    and return what Unsloth's `get_peft_model(use_gradient_checkpointing=...)` takes: False, True or "unsloth"."""
    requested = parse_mode(use_gradient_checkpointing)
    unsloth = real_unsloth_imported()
    offloads = unsloth and max_seq_length >= UNSLOTH_MIN_OFFLOAD_SEQ
    available = MODES if offloads else tuple(mode for mode in MODES if mode != "unsloth")
    choice = CheckpointingChoice(requested, "off", "", max_seq_length, per_device_train_batch_size,
                                 transformers_peft=not unsloth)
    if model.device.type == "cuda":
        capacity = smallest_over_ranks(capacity_gib(model.device), model.device)
        shape = shape_from_model(model, lora_r)
        estimates = {} if shape is None else {
            mode: estimate_peak(shape, max_seq_length, per_device_train_batch_size, mode, transformers_peft=not unsloth)
            for mode in available
        }
        choice = dataclasses.replace(choice, shape=shape, estimates=estimates, capacity_gib=capacity,
                                     budget_gib=HEADROOM * capacity)
    mode, reason = decide(requested, available, choice.estimates, choice.budget_gib)
    choice = dataclasses.replace(choice, mode=mode, reason=reason)
    model.nbddp_checkpointing = choice
    if is_main_process():
        log.info(f"nbddp: {choice.describe()}")
        if choice.warning():
            log.info(f"nbddp: warning: {choice.warning()}")
    return choice.value


def patch_trainer(trainer_class) -> None:
    """Make `trainer_class` (transformers' Trainer) honour and check the choice kept on its model; patching twice
    is once. Trainers whose model carries no choice are left as they are."""
    def make(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            choice = getattr(self.model, "nbddp_checkpointing", None)
            if isinstance(choice, CheckpointingChoice):
                apply_to_trainer(self, choice)

        return __init__

    patches.wrap("gradient-checkpointing-choice", trainer_class, "__init__", make)


def apply_to_trainer(trainer, choice: CheckpointingChoice) -> None:
    """Turn the trainer's own checkpointing off when the choice is off, and add the first-step memory check."""
    # imports transformers: after Unsloth
    from nbddp.runtime.memory.gradient_checkpointing_check import FirstStepMemoryCheck

    if choice.mode == "off" and (trainer.args.gradient_checkpointing or checkpointed_modules(trainer.model)):
        # Trainer.train() would enable it on the model (TRL 0.x's trainers already did, in their __init__).
        # Unsloth's own trainers do the same for a config left at TRL's default; the Transformers+PEFT fallback
        # needs it here, with the input-gradient hook that TRL adds for checkpointing taken off again.
        switch_off(trainer.model, trainer.args)
        if hasattr(trainer.model, "_require_grads_hook"):  # transformers 4.x fails without one to remove
            trainer.model.disable_input_require_grads()
        if is_main_process():
            log.info("nbddp: the trainer's gradient_checkpointing turned off, as use_gradient_checkpointing chose")
    trainer.add_callback(FirstStepMemoryCheck(choice))


@dataclasses.dataclass
class Recompute:
    """What `switch_off` changed, for `switch_back`: (object, value) pairs."""

    layer_flags: list
    unsloth_modes: list
    trainer_flag: bool


def checkpointed_modules(model) -> list:
    """The modules that recompute in backward from the next training forward on: their `gradient_checkpointing` flag
    is set. Transformers sets it to True; Unsloth's `for_training` to the mode it records ("unsloth" or True)."""
    return [module for module in model.modules() if getattr(module, "gradient_checkpointing", False) not in (False, None)]


def switch_off(model, args) -> Recompute:
    """No layer of `model` recomputes, and nothing is offloaded, from the next forward on, under Unsloth as under the
    Transformers+PEFT fallback: the layers' flags, the training arguments' flag (Trainer.train() would enable it
    again) and the mode Unsloth recorded at `get_peft_model` (`_unsloth_gradient_checkpointing`, which its trainers'
    train() hands to `for_training`, which sets every layer's flag to it) all say off."""
    saved = Recompute(
        layer_flags=[(module, module.gradient_checkpointing) for module in checkpointed_modules(model)],
        unsloth_modes=[(module, module.__dict__[UNSLOTH_RECORDED_MODE]) for module in model.modules()
                       if UNSLOTH_RECORDED_MODE in module.__dict__],
        trainer_flag=args.gradient_checkpointing)
    for module, _ in saved.layer_flags:
        module.gradient_checkpointing = False
    for module, _ in saved.unsloth_modes:
        setattr(module, UNSLOTH_RECORDED_MODE, False)
    args.gradient_checkpointing = False
    return saved


def switch_back(args, saved: Recompute) -> None:
    """Undo `switch_off`: the same layers recompute as they did, with the checkpoint function they had."""
    for module, value in saved.layer_flags:
        module.gradient_checkpointing = value
    for module, value in saved.unsloth_modes:
        setattr(module, UNSLOTH_RECORDED_MODE, value)
    args.gradient_checkpointing = saved.trainer_flag


def real_unsloth_imported() -> bool:
    """True once backend.activate imported Unsloth; the fallback installed as `unsloth` keeps its own name."""
    module = sys.modules.get("unsloth")
    return module is not None and module.__name__ == "unsloth"


def capacity_gib(device) -> float:
    """Memory this process can have on `device`: what is free, plus what its allocator already holds."""
    free, _ = torch.cuda.mem_get_info(device)
    return (free + torch.cuda.memory_reserved(device)) / GIB


def smallest_over_ranks(value: float, device) -> float:
    """The smallest `value` of all ranks, so that every rank makes the same choice."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MIN)
    return tensor.item()

