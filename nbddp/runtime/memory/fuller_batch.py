"""`--batch_layout auto`: the notebook's global batch in the fullest micro batch that fits, with the cheapest
gradient checkpointing that fits.

Notebooks write small micro batches with accumulation (Unsloth's: 2 x 4) and offloaded gradient checkpointing,
sized for a free Colab GPU; on a large GPU that layout starves it. The same rows per optimizer step in fewer,
fuller micro batches train the same model (equal in exact arithmetic: Trainer normalises the loss by the tokens
of the whole step) in less time. At `trainer.train()`, before the dataloader and the accumulation are read:

1. Candidates: every micro batch b that divides the rows a process takes per step (the plan's micro batch x
   accumulation) and is at least the plan's (only b under `--batch_layout <b>`), each with checkpointing off or
   as the model trains now.
2. Each is estimated (memory_estimate) at the longest rows of the training set; the choice is the fullest micro
   batch up to SATURATED_TOKENS tokens, then the cheapest checkpointing, among those within the budget.
3. Probe: one forward and backward of the b longest rows on the bare model, on every rank, with the random
   state restored and the gradients dropped after it. An out-of-memory on any rank and every rank keeps the
   plan's layout, saying so: it never kills the run. The probe's peak is printed beside the estimate.

Only for configs built by `ddp.training_args` under `--batch_layout auto` or `<b>`; GRPO's (its generation batch is laid
out from the micro batch) and datasets without `input_ids` rows keep the plan's layout, saying why.
"""
import dataclasses
import functools
import os
import resource

import pyarrow.compute
import torch
import torch.distributed as dist

from nbddp import log, patches
from nbddp.rank import is_main_process
from nbddp.runtime import graphed_layers
from nbddp.runtime.memory import batch_plan
from nbddp.runtime.memory.batch_plan import BatchPlan
from nbddp.runtime.memory.gradient_checkpointing import (capacity_gib, checkpointed_modules, real_unsloth_imported,
                                                         smallest_over_ranks, switch_back, switch_off)
from nbddp.runtime.memory.gradient_checkpointing_check import FirstStepMemoryCheck, mode_not_in_force
from nbddp.runtime.memory.memory_estimate import GIB, HEADROOM, estimate_peak, format_gib, shape_from_model

# Tokens per micro batch from which a fuller one buys little more GPU efficiency, and cheaper recompute is worth
# more: the 1.1B shape at 8 x 2048 ran 1.39x the tokens/s of 4 x 2048 (bench/results/batch_1b.json).
SATURATED_TOKENS = 16384
MODE_COST = {"off": 0, "true": 1, "unsloth": 2}  # recompute work, cheapest first


@dataclasses.dataclass(frozen=True)
class Candidate:
    micro_batch: int
    mode: str  # gradient checkpointing: "off" | "true" | "unsloth"
    estimate_gib: float
    activations_gib: float = 0.0  # of the estimate, what the step itself adds: activations (and logits)


def patch_trainer(trainer_class) -> None:
    """Lay out the batch at `train()` for configs planned with `auto`; patching twice is once."""
    def make(original):
        @functools.wraps(original)
        def train(self, *args, **kwargs):
            plan = batch_plan.of(self.args)
            if plan is not None and plan.fuller and not getattr(self, "nbddp_laid_out", False):
                self.nbddp_laid_out = True  # a second train() on the same trainer keeps the first one's layout
                lay_out(self, plan)
            return original(self, *args, **kwargs)

        return train

    patches.wrap("batch-layout-at-train", trainer_class, "train", make)


def lay_out(trainer, plan: BatchPlan) -> None:
    """Choose, probe and apply the fullest layout for `trainer` (see the module); print on rank 0. Rank 0's choice
    is every rank's, and every rank joins the same collectives whatever it finds."""
    device = trainer.args.device
    budget = HEADROOM * _capacity_gib(device)  # a collective: before anything a rank may skip
    rows = _longest_rows(trainer)
    current = _current_mode(trainer)
    reason, chosen = _from_rank0(_decide(trainer, plan, rows, current, budget), device)
    seq_len = len(rows[0]["input_ids"]) if rows else 0
    if reason:
        _say(f"--batch_layout {plan.layout}: {reason}; {plan.describe()}")
        return
    switched = _set_mode(trainer, chosen.mode, current)
    ok, peak_gib, used_gib, note = _probe(trainer, (rows or [])[: chosen.micro_batch], device)
    if not ok:
        _set_mode(trainer, current, chosen.mode, switched)
        _say(f"--batch_layout {plan.layout}: micro batch {chosen.micro_batch} with checkpointing {chosen.mode} {note} "
             f"on the probe step; the notebook's layout instead: {plan.describe()}")
        return
    new_plan = dataclasses.replace(plan, micro_batch=chosen.micro_batch,
                                   accumulation=plan.micro_batch * plan.accumulation // chosen.micro_batch)
    trainer.args.per_device_train_batch_size = chosen.micro_batch
    # Trainer divides by its accumulation itself and keeps accelerate's at 1 (Trainer.create_accelerator_and_
    # postprocess), so the accelerator is left alone here.
    trainer.args.gradient_accumulation_steps = new_plan.accumulation_here
    trainer._train_batch_size = trainer.args.train_batch_size  # what get_train_dataloader batches by
    trainer.args.nbddp_batch_plan = new_plan
    _update_checkpointing_choice(trainer, chosen)
    used = "" if used_gib is None else (f" (the probe step added {format_gib(used_gib)} GiB; activations estimated "
                                        f"{format_gib(chosen.activations_gib)} GiB)")
    _say(f"--batch_layout {plan.layout}: micro batch {chosen.micro_batch} with gradient checkpointing {chosen.mode} "
         f"(was {plan.micro_batch}, {current}): estimated {format_gib(chosen.estimate_gib)} GiB, this process's "
         f"peak after the probe {format_gib(peak_gib)} GiB{used} at the longest rows ({seq_len} tokens), budget "
         f"{budget:.1f} GiB; {new_plan.describe()}")
    graphed_layers.install(trainer, chosen.mode)
    warning = None if used_gib is None else mode_not_in_force(chosen.mode, f"the probe step at micro batch "
                                                            f"{chosen.micro_batch}", used_gib, chosen.activations_gib)
    if warning:
        _say(f"warning: {warning}")


def _decide(trainer, plan, rows, current, budget) -> tuple[str | None, Candidate | None]:
    """(why the layout stays, None) or (None, the candidate to probe), from this rank's view."""
    if hasattr(trainer.args, "num_generations"):
        return "GRPO's generation batch is laid out from the micro batch, so its layout stays", None
    if rows is None:
        return ("the training set has no tokenized `input_ids` rows to estimate and probe with, so the layout "
                "stays"), None
    seq_len = len(rows[0]["input_ids"])
    candidates = _candidates(trainer.model, plan, seq_len, current, _lora_r(trainer.model),
                             transformers_peft=not real_unsloth_imported())
    chosen = choose(candidates, budget, seq_len)
    if chosen is not None and (chosen.micro_batch, chosen.mode) != (plan.micro_batch, current):
        return None, chosen
    if plan.layout.isdigit():
        return (f"micro batch {plan.layout} is not estimated to fit the {budget:.1f} GiB budget here at the "
                f"longest rows ({seq_len} tokens), so the notebook's split stays"), None
    return (f"nothing fuller fits the {budget:.1f} GiB budget at the longest rows ({seq_len} tokens), or the "
            "notebook's layout is already the fullest"), None


def _from_rank0(decision, device):
    """Rank 0's `decision` on every rank (ranks may see other rows, or other free memory)."""
    if not dist.is_initialized():
        return decision
    shared = [decision]
    dist.broadcast_object_list(shared, src=0, device=device)
    return shared[0]


def _update_checkpointing_choice(trainer, chosen) -> None:
    """The example notebooks' choose_gradient_checkpointing choice, and its first-step check, see the new layout."""

    choice = getattr(trainer.model, "nbddp_checkpointing", None)
    if choice is None:
        return
    choice = dataclasses.replace(choice, mode=chosen.mode, micro_batch=chosen.micro_batch,
                                 reason="--batch_layout", estimates={chosen.mode: {"total_gib": chosen.estimate_gib}})
    trainer.model.nbddp_checkpointing = choice
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, FirstStepMemoryCheck):
            callback.choice, callback.estimate_gib = choice, chosen.estimate_gib


def choose(candidates: list[Candidate], budget_gib: float, seq_len: int) -> Candidate | None:
    """The fullest micro batch up to SATURATED_TOKENS, then the cheapest mode, then the fuller, within the budget;
    None when nothing fits (the plan's own layout is kept then)."""
    fitting = [c for c in candidates if c.estimate_gib <= budget_gib]
    if not fitting:
        return None
    return max(fitting, key=lambda c: (min(c.micro_batch * seq_len, SATURATED_TOKENS), -MODE_COST[c.mode],
                                       c.micro_batch))


def _candidates(model, plan, seq_len, current, lora_r, transformers_peft) -> list[Candidate]:
    shape = shape_from_model(model, lora_r)
    if shape is None:
        return []
    per_process = plan.micro_batch * plan.accumulation
    modes = sorted({"off", current}, key=MODE_COST.get)
    sizes = [int(plan.layout)] if plan.layout.isdigit() else [
        b for b in range(plan.micro_batch, per_process + 1) if per_process % b == 0]
    candidates = []
    for b in sizes:
        for mode in modes:
            estimate = estimate_peak(shape, seq_len, b, mode, transformers_peft)
            candidates.append(Candidate(b, mode, estimate["total_gib"],
                                        estimate["activations_gib"] + estimate["logits_gib"]))
    return candidates


def _longest_rows(trainer):
    """The training set's rows, longest first (as many as one process takes per step), without text columns;
    None for a dataset without `input_ids` (streamed, or tokenized in the collator)."""
    dataset = trainer.train_dataset
    if not hasattr(dataset, "with_format") or "input_ids" not in (dataset.column_names or []):
        return None
    lengths = pyarrow.compute.list_value_length(dataset.with_format("arrow")["input_ids"]).to_pylist()
    plan = trainer.args.nbddp_batch_plan
    take = min(len(lengths), plan.micro_batch * plan.accumulation)
    longest = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)[:take]
    max_length = getattr(trainer.args, "max_length", None)
    rows = []
    for index in longest:
        row = {key: value for key, value in dataset[index].items() if not isinstance(value, str) and value is not None}
        if max_length:
            row = {key: value[:max_length] if isinstance(value, list) else value for key, value in row.items()}
        rows.append(row)
    return rows or None


def _probe(trainer, rows, device) -> tuple[bool, float | None, float | None, str]:
    """Forward and backward of `rows` on the bare model, leaving no trace (random state, gradients, mode):
    (every rank got through, this process's peak memory since it started in GiB, what the probe step added to the
    memory it started with in GiB (on a GPU; else None), what went wrong). A failure other than running out of
    memory is raised once every rank has heard of it."""
    model = trainer.model
    was_training = model.training
    failure, note = None, ""
    earlier_peak, start = _start_measuring(device)
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        model.train()
        try:
            if not rows:
                raise _CannotProbe("found no rows to probe with")
            batch = {key: value.to(device) for key, value in trainer.data_collator(rows).items()
                     if isinstance(value, torch.Tensor)}
            loss = model(**batch).loss
            if loss is None:
                raise _CannotProbe("gave no loss (the collator made no labels)")
            loss.backward()
        except torch.OutOfMemoryError:
            note = "ran out of memory"
        except RuntimeError as error:  # cuBLAS, bitsandbytes and Triton report running out of memory so
            if "out of memory" not in str(error).lower():
                failure = error
            note = "ran out of memory" if failure is None else f"failed ({type(error).__name__})"
        except _CannotProbe as error:
            note = str(error)
        finally:
            model.zero_grad(set_to_none=True)
            model.train(was_training)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    ok = _all_ranks(not note, device)
    if failure is not None:
        raise failure
    if not ok:
        return False, None, None, note or "failed on another rank"
    if start is None:
        return True, _peak_gib(device), None, ""
    probe_peak = torch.cuda.max_memory_allocated(device)
    return True, max(earlier_peak, probe_peak) / GIB, (probe_peak - start) / GIB, ""


def _start_measuring(device) -> tuple[int | None, int | None]:
    """On a GPU: (the peak allocated so far, what is allocated now), with the peak counter reset so that the probe's
    own peak can be read; (None, None) elsewhere."""
    if device.type != "cuda":
        return None, None
    earlier_peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return earlier_peak, torch.cuda.memory_allocated(device)


class _CannotProbe(Exception):
    """The probe step cannot run here: the layout stays, as after running out of memory."""


def _current_mode(trainer) -> str:
    """The gradient checkpointing the model trains with now: "off", "true", or Unsloth's "unsloth"."""
    choice = getattr(trainer.model, "nbddp_checkpointing", None)  # the example notebooks' choose_gradient_checkpointing
    if choice is not None:
        return choice.mode
    on = trainer.args.gradient_checkpointing or bool(checkpointed_modules(trainer.model))
    if not on:
        return "off"
    return "unsloth" if real_unsloth_imported() else "true"


def _set_mode(trainer, mode, current, saved=None):
    """Switch recompute off (returns what `switch_back` needs), or back on given what switching off returned."""
    if mode == current:
        return None
    if mode == "off":
        return switch_off(trainer.model, trainer.args)
    switch_back(trainer.args, saved)
    return None


def _lora_r(model) -> int:
    configs = getattr(model, "peft_config", None) or {}
    return next((config.r for config in configs.values() if hasattr(config, "r")), 16)


def _capacity_gib(device) -> float:
    """Memory this process can have: on a GPU what is free plus what its allocator holds (the smallest over
    ranks); on a CPU the host's available memory shared by this machine's processes."""
    if device.type == "cuda":
        return smallest_over_ranks(capacity_gib(device), device)
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return smallest_over_ranks(available / int(os.environ.get("LOCAL_WORLD_SIZE", "1")) / GIB, device)


def _peak_gib(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # Linux: KiB


def _all_ranks(ok: bool, device) -> bool:
    if not dist.is_initialized():
        return ok
    tensor = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())


def _say(text: str) -> None:
    if is_main_process():
        log.info(f"nbddp: {text}")
