"""bitsandbytes' 8-bit AdamW in one update launch a step (the run setting `one_launch_optimizer`; docs/performance.md).

bitsandbytes steps its 8-bit blockwise optimizers one tensor at a time: for an 8B model's LoRA (448 tensors) a step's
optimizer is some 28 ms of the host's Python and dispatch for 2.5 ms of kernels. Its update kernel is elementwise,
with one scale (absmax) per block of BLOCK elements of each state, and it has no multi-tensor form. Laid end to end
in flat buffers, tensors whose sizes are multiples of BLOCK keep every block their own, so one launch over the flat
buffers does, element by element, what one launch per tensor does: the same algorithm, the same arithmetic.

From the second step of each param group (the first creates the states), a global optimizer step pre-hook copies
the eligible tensors' gradients and values into flat buffers, runs the update once on those and the flat states
(the parameters' own state tensors become views of them, so checkpoints keep bitsandbytes' format), copies the
values back and hides those gradients from bitsandbytes' own loop, which then steps the rest (tensors of other
sizes, dtypes, devices or settings); a post-hook gives the gradients back. Eligible: a 2-state 8-bit blockwise
state ("adam", as `optim="adamw_8bit"` makes), a gradient, not paged, on CUDA, the group's settings unchanged for
the tensor and its step count the others'. States replaced from outside (a checkpoint loaded) are taken in again.
"""
import dataclasses
import importlib.util
import os

import torch

from nbddp import log, patches
from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV
from nbddp.rank import is_main_process

PATCH = "bitsandbytes-one-launch"
BLOCK = 256  # bitsandbytes' blocks of the 8-bit blockwise optimizer states (Optimizer2State.init_state)
STATES = ("state1", "state2", "absmax1", "absmax2")
TRUE, FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def wanted() -> bool:
    """Whether the run setting `one_launch_optimizer` is on; a value that is neither on nor off is a usage error."""
    text = os.environ.get(ENV.ONE_LAUNCH_OPTIMIZER, "").strip().lower()
    if text not in TRUE + FALSE:
        raise UsageError(f"{ENV.ONE_LAUNCH_OPTIMIZER}={text!r}: expected 1 or 0 (on or off): the run setting "
                         "`one_launch_optimizer`, bitsandbytes' 8-bit AdamW in one update launch a step")
    return text in TRUE


def install() -> None:
    """Under `one_launch_optimizer`, with CUDA and a loadable bitsandbytes: the step hooks (see the module), said on
    rank 0; nothing otherwise. Installing twice is once."""
    if PATCH in patches.active() or not wanted() or not torch.cuda.is_available() \
            or importlib.util.find_spec("bitsandbytes") is None:
        return
    import bitsandbytes.functional
    import bitsandbytes.optim.optimizer

    hooks = Hooks(bitsandbytes.optim.optimizer.Optimizer2State,
                  bitsandbytes.functional.optimizer_update_8bit_blockwise)
    hooks.register()
    if is_main_process():
        log.info("nbddp: the run setting `one_launch_optimizer`: bitsandbytes' 8-bit AdamW updates the tensors "
                 f"whose sizes are multiples of {BLOCK} in one launch a step, from the second step")


class Hooks:
    """The step hooks for optimizers of class `optimizer_class` (bitsandbytes' Optimizer2State), `update` being
    bitsandbytes.functional.optimizer_update_8bit_blockwise (tests give stand-ins)."""

    def __init__(self, optimizer_class, update):
        self.optimizer_class, self.update = optimizer_class, update

    def register(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        handles = (register_optimizer_step_pre_hook(self.before), register_optimizer_step_post_hook(self.after))
        patches.record(PATCH, lambda: [handle.remove() for handle in handles])

    @torch.no_grad()
    def before(self, optimizer, args, kwargs):
        """Update each group's flat tensors in one launch; hide their gradients from the optimizer's own loop."""
        if not isinstance(optimizer, self.optimizer_class) or optimizer.is_paged or optimizer.optimizer_name != "adam":
            return
        flats = optimizer.__dict__.setdefault("nbddp_flat", {})
        hidden = []
        for index, group in enumerate(optimizer.param_groups):
            flat = flats.get(index)
            if flat is None or not flat.current(optimizer):
                flat = flats[index] = Flat.build(optimizer, index, group)
            if flat is None:
                continue
            flat.step(optimizer, group, self.update)
            hidden += [(p, p.grad) for p in flat.params]
        for p, _ in hidden:
            p.grad = None
        optimizer.nbddp_hidden = hidden

    def after(self, optimizer, args, kwargs):
        """Give back the gradients `before` hid."""
        for p, grad in optimizer.__dict__.pop("nbddp_hidden", ()):
            p.grad = grad


@dataclasses.dataclass
class Flat:
    """One param group's eligible tensors end to end: their gradients' and values' flat copies (`grads`, `values`),
    the flat states (STATES), and each tensor's views of them (`views`: per tensor, its grads, values and STATES
    views)."""

    group: int
    params: list
    indexes: list  # each tensor's index in the group
    grads: torch.Tensor
    values: torch.Tensor
    states: dict
    views: list

    @classmethod
    def build(cls, optimizer, group_index: int, group: dict) -> "Flat | None":
        """The group's eligible tensors (see the module) laid out flat, their states copied in and replaced by views,
        or None for fewer than two."""
        chosen, first = [], None
        for index, p in enumerate(group["params"]):
            state = optimizer.state.get(p, {})
            if p.grad is None or not _blockwise_8bit(p, state):
                continue
            key = (p.device, p.dtype, p.grad.dtype, state["step"], id(state["qmap1"]), id(state["qmap2"]),
                   _settings(optimizer.get_config(group_index, index, group)))
            if first is None:
                first = key
            if key == first:
                chosen.append((index, p))
        if len(chosen) < 2:
            return None
        params = [p for _, p in chosen]
        sizes = [p.numel() for p in params]
        total, device = sum(sizes), params[0].device
        grads = torch.empty(total, dtype=params[0].grad.dtype, device=device)
        values = torch.empty(total, dtype=params[0].dtype, device=device)
        states = {name: torch.empty(total // BLOCK if name.startswith("absmax") else total,
                                    dtype=optimizer.state[params[0]][name].dtype, device=device) for name in STATES}
        views, offset = [], 0
        for p, size in zip(params, sizes):
            state = optimizer.state[p]
            view = {"grads": grads[offset:offset + size].view_as(p), "values": values[offset:offset + size].view_as(p)}
            for name in STATES:
                start, end = (offset // BLOCK, (offset + size) // BLOCK) if name.startswith("absmax") \
                    else (offset, offset + size)
                view[name] = states[name][start:end].view_as(state[name])
                view[name].copy_(state[name])
                state[name] = view[name]
            views.append(view)
            offset += size
        return cls(group_index, params, [index for index, _ in chosen], grads, values, states, views)

    def current(self, optimizer) -> bool:
        """Whether every tensor still has a gradient and its states are still this one's views."""
        return all(p.grad is not None and all(optimizer.state[p][name] is view[name] for name in STATES)
                   for p, view in zip(self.params, self.views))

    def step(self, optimizer, group: dict, update) -> None:
        """One update of every tensor, as the optimizer's `update_step` does for one."""
        torch._foreach_copy_([view["grads"] for view in self.views], [p.grad for p in self.params])
        torch._foreach_copy_([view["values"] for view in self.views], self.params)
        for p in self.params:
            optimizer.state[p]["step"] += 1
        state = optimizer.state[self.params[0]]
        config = optimizer.get_config(self.group, self.indexes[0], group)
        betas = config["betas"]
        update(optimizer.optimizer_name, self.grads, self.values, self.states["state1"], self.states["state2"],
               betas[0], betas[1], betas[2] if len(betas) >= 3 else 0.0, config.get("alpha", 0.0), config["eps"],
               state["step"], config["lr"], state["qmap1"], state["qmap2"], self.states["absmax1"],
               self.states["absmax2"], config["weight_decay"], gnorm_scale=1.0, skip_zeros=config["skip_zeros"])
        torch._foreach_copy_(self.params, [view["values"] for view in self.views])


def _blockwise_8bit(p, state) -> bool:
    """Whether `p` is stepped by the 2-state 8-bit blockwise update, in whole blocks."""
    return (state.get("state1") is not None and state["state1"].dtype == torch.uint8
            and state.get("state2") is not None and state.get("absmax2") is not None
            and p.numel() % BLOCK == 0 and p.is_contiguous() and p.grad.is_contiguous())


def _settings(config: dict) -> tuple:
    """A tensor's optimizer settings as a comparable value."""
    return tuple(sorted((key, tuple(value) if isinstance(value, list) else value) for key, value in config.items()))
