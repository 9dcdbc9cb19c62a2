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
state ("adam", as `optim="adamw_8bit"` makes), a gradient, not paged, on the device's default stream (the stream
bitsandbytes' kernels run on), the tensor's settings and step count those of the most tensors of the group, at most
MAX_ELEMENTS in all (the kernel counts elements in 32 bits; the flat copies cost their size again). A step with a
closure, before bitsandbytes' first (which reads its per-tensor overrides), or after overrides changed, is
bitsandbytes' own. States replaced from outside (a checkpoint loaded) are taken in again. If bitsandbytes' loop
raises, the hidden gradients stay hidden: the step failed anyway.
"""
import collections
import dataclasses
import importlib.util

import torch

from nbddp import log, patches
from nbddp.formats import run_settings
from nbddp.rank import is_main_process

PATCH = "bitsandbytes-one-launch"
BLOCK = 256  # bitsandbytes' blocks of the 8-bit blockwise optimizer states (Optimizer2State.init_state)
# Elements one flat may hold: the kernel's count is an int32 (bitsandbytes passes ct.c_int32(g.numel())), and the
# flat copies of gradients and values take memory of their size (an 8B model's LoRA at r 16: 42M elements).
MAX_ELEMENTS = 2 ** 28
STATES = ("state1", "state2", "absmax1", "absmax2")


def wanted() -> bool:
    """Whether the run setting `one_launch_optimizer` is on; a value that is neither on nor off is a usage error."""
    return run_settings.switch("one_launch_optimizer")


def install() -> None:
    """Under `one_launch_optimizer`, with CUDA and a loadable bitsandbytes: the step hooks (see the module), said on
    rank 0; nothing otherwise. Installing twice is once."""
    if PATCH in patches.active() or not wanted() or not torch.cuda.is_available() \
            or importlib.util.find_spec("bitsandbytes") is None:
        return
    try:
        import bitsandbytes.functional
        import bitsandbytes.optim.optimizer
    except Exception as error:  # a bitsandbytes that cannot load here: nothing of it runs to hook
        if is_main_process():
            log.warning(f"nbddp: the run setting `one_launch_optimizer` does nothing: bitsandbytes does not load "
                        f"({type(error).__name__}: {error})")
        return
    hooks = Hooks(bitsandbytes.optim.optimizer.Optimizer2State,
                  bitsandbytes.functional.optimizer_update_8bit_blockwise)
    hooks.register()
    if is_main_process():
        log.info("nbddp: the run setting `one_launch_optimizer`: bitsandbytes' 8-bit AdamW is to update the tensors "
                 f"whose sizes are multiples of {BLOCK} in one launch a step, from its second step (its first hooked "
                 "step says how many, or why none)")


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
        """Update each group's flat tensors in one launch; hide their gradients from the optimizer's own loop.
        (`args`: the step's, the optimizer first; accelerate passes `closure=None` positionally.)"""
        unfit = _unfit(optimizer, self.optimizer_class)
        if unfit:
            if not optimizer.__dict__.get("nbddp_flat_said") and is_main_process():
                optimizer.nbddp_flat_said = True
                log.warning(f"nbddp: one_launch_optimizer: {unfit}: its step is its own")
            return
        if any(arg is not None for arg in args[1:]) or kwargs.get("closure") is not None \
                or not getattr(optimizer, "initialized", True):
            return
        overrides = repr((optimizer.mng.pid2config, optimizer.mng.index2config)) if hasattr(optimizer, "mng") else ""
        flats = optimizer.__dict__.setdefault("nbddp_flat", {})
        hidden = []
        for index, group in enumerate(optimizer.param_groups):
            flat = flats.get(index)
            # a group without one is scanned again only when tensors got states or the overrides changed
            scan = (len(optimizer.state), overrides)
            if flat is None or (isinstance(flat, tuple) and flat != scan) \
                    or (isinstance(flat, Flat) and not flat.current(optimizer, overrides)):
                flat = flats[index] = Flat.build(optimizer, index, group, overrides, flat) or scan
            if not isinstance(flat, Flat):
                continue
            flat.step(optimizer, group, self.update)
            hidden += [(p, p.grad) for p in flat.params]
        for p, _ in hidden:
            p.grad = None
        optimizer.nbddp_hidden = hidden
        if not optimizer.__dict__.get("nbddp_flat_said") and is_main_process():
            optimizer.nbddp_flat_said = True
            _say_what_was_done(optimizer, hidden)

    def after(self, optimizer, args, kwargs):
        """Give back the gradients `before` hid."""
        for p, grad in optimizer.__dict__.pop("nbddp_hidden", ()):
            p.grad = grad


@dataclasses.dataclass
class Flat:
    """One param group's eligible tensors end to end: their gradients' and values' flat copies (`grads`, `values`),
    the flat states (STATES), and each tensor's views of them (`views`: per tensor, its grads, values and STATES
    views); `overrides`: bitsandbytes' per-tensor overrides when it was built."""

    group: int
    params: list
    indexes: list  # each tensor's index in the group
    grads: torch.Tensor
    values: torch.Tensor
    states: dict
    views: list
    overrides: str

    @classmethod
    def build(cls, optimizer, group_index: int, group: dict, overrides: str, old=None) -> "Flat | None":
        """The group's eligible tensors (see the module) laid out flat, their states copied in and replaced by views,
        or None for fewer than two (or no memory for the copies). The tensors of `old` (the Flat this replaces) get
        states of their own first, so that its buffers go."""
        if isinstance(old, Flat):
            for p in old.params:
                optimizer.state[p].update({name: optimizer.state[p][name].clone() for name in STATES})
        candidates = []
        for index, p in enumerate(group["params"]):
            state = optimizer.state.get(p, {})
            if p.grad is None or not _blockwise_8bit(p, state):
                continue
            key = (p.device, p.dtype, p.grad.dtype, state["step"],
                   _settings(optimizer.get_config(group_index, index, group)))
            candidates.append((key, index, p))
        if not candidates:
            return None
        most = collections.Counter(key for key, _, _ in candidates).most_common(1)[0][0]
        chosen, total = [], 0
        for key, index, p in candidates:
            if key == most and total + p.numel() <= MAX_ELEMENTS and _same_maps(optimizer.state, p, chosen):
                chosen.append((index, p))
                total += p.numel()
        if len(chosen) < 2 or (chosen[0][1].device.type == "cuda" and
                               torch.cuda.current_stream(chosen[0][1].device)
                               != torch.cuda.default_stream(chosen[0][1].device)):
            return None
        params = [p for _, p in chosen]
        device, first = params[0].device, optimizer.state[params[0]]
        try:
            grads = torch.empty(total, dtype=params[0].grad.dtype, device=device)
            values = torch.empty(total, dtype=params[0].dtype, device=device)
            states = {name: torch.empty(total // BLOCK if name.startswith("absmax") else total,
                                        dtype=first[name].dtype, device=device) for name in STATES}
        except torch.OutOfMemoryError:
            return None
        views, offset = [], 0
        for p in params:
            state, size = optimizer.state[p], p.numel()
            view = {"grads": grads[offset:offset + size].view_as(p), "values": values[offset:offset + size].view_as(p)}
            for name in STATES:
                start, end = (offset // BLOCK, (offset + size) // BLOCK) if name.startswith("absmax") \
                    else (offset, offset + size)
                view[name] = states[name][start:end].view_as(state[name])
                view[name].copy_(state[name])
                state[name] = view[name]
            views.append(view)
            offset += size
        return cls(group_index, params, [index for index, _ in chosen], grads, values, states, views, overrides)

    def current(self, optimizer, overrides: str) -> bool:
        """Whether the overrides are as they were and every tensor still has a gradient and its states are still
        this one's views."""
        return overrides == self.overrides and all(
            p.grad is not None and all(optimizer.state[p][name] is view[name] for name in STATES)
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


def _say_what_was_done(optimizer, hidden) -> None:
    """Rank 0's one line at the first step the hooks ran: how many tensors update in one launch."""
    stepped = sum(1 for group in optimizer.param_groups for p in group["params"] if p.grad is not None) + len(hidden)
    if hidden:
        elements = sum(p.numel() for p, _ in hidden)
        launches = sum(isinstance(flat, Flat) for flat in optimizer.nbddp_flat.values())
        others = "; bitsandbytes steps the others one by one" if len(hidden) < stepped else ""
        log.info(f"nbddp: one_launch_optimizer: {len(hidden)} of the {stepped} tensors stepped "
                 f"({elements:,} elements) update in {launches} launch{'es' if launches > 1 else ''} a step{others}")
    else:
        log.warning(f"nbddp: one_launch_optimizer: none of the {stepped} tensors stepped updates in one launch at "
                    f"the first step it could (no two alike: sizes not whole blocks of {BLOCK}, or other dtypes, "
                    "devices, settings, step counts or quantization maps; or a stream other than the default one, or "
                    "no memory for the flat copies): bitsandbytes steps them one by one")


def _unfit(optimizer, optimizer_class) -> str:
    """Why `optimizer` is not one the hooks step ("" when it is one)."""
    if not isinstance(optimizer, optimizer_class):
        kind = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        return f"the optimizer is {kind}, not bitsandbytes' 2-state one"
    if optimizer.is_paged:
        return "bitsandbytes' paged optimizers move their states between host and device"
    if optimizer.optimizer_name != "adam":
        return f"bitsandbytes' {optimizer.optimizer_name!r} update keeps its states otherwise than Adam's"
    return ""


def _blockwise_8bit(p, state) -> bool:
    """Whether `p` is stepped by the 2-state 8-bit blockwise update, in whole blocks."""
    return (state.get("state1") is not None and state["state1"].dtype == torch.uint8
            and state.get("state2") is not None and state.get("absmax2") is not None
            and p.numel() % BLOCK == 0 and p.is_contiguous() and p.grad.is_contiguous())


def _same_maps(states, p, chosen) -> bool:
    """Whether `p`'s quantization maps are those of the first tensor chosen (bitsandbytes shares one pair; a
    checkpoint loaded gives each tensor copies, equal in value)."""
    if not chosen:
        return True
    first, state = states[chosen[0][1]], states[p]
    return all(state[name] is first[name] or torch.equal(state[name], first[name]) for name in ("qmap1", "qmap2"))


def _settings(config: dict) -> tuple:
    """A tensor's optimizer settings as a comparable value."""
    return tuple(sorted((key, tuple(value) if isinstance(value, list) else value) for key, value in config.items()))
