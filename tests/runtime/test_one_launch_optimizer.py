"""bitsandbytes' 8-bit AdamW in one update launch a step (runtime.trainer.one_launch_optimizer), on a stand-in for
bitsandbytes' Optimizer2State and its blockwise kernel (bitsandbytes' own needs CUDA): the hooked optimizer must
step every tensor as the plain one does, bit for bit, with fewer update calls. bench/bnb_step_syncs.py checks the
same against the real kernel on a GPU."""
import types

import pytest
import torch

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.runtime.trainer import one_launch_optimizer
from nbddp.runtime.trainer.one_launch_optimizer import BLOCK, Hooks

SHAPES = [(16, 64), (32, 16), (8, 96), (3, 5)]  # the last is no whole number of blocks: stepped on its own


def blockwise_update(calls):
    """A stand-in for bitsandbytes.functional.optimizer_update_8bit_blockwise: AdamW on states kept in 8 bits with
    one scale a block of BLOCK elements, elementwise otherwise; records each call's element count in `calls`."""

    def update(name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
               absmax2, weight_decay, gnorm_scale=1.0, skip_zeros=False):
        calls.append(g.numel())
        m = beta1 * dequantize(state1, absmax1, signed=True) + (1 - beta1) * g.reshape(-1).float()
        v = beta2 * dequantize(state2, absmax2, signed=False) + (1 - beta2) * g.reshape(-1).float() ** 2
        flat = p.view(-1)
        flat.mul_(1 - lr * weight_decay)
        flat.sub_(lr * (m / (1 - beta1 ** step)) / ((v / (1 - beta2 ** step)).sqrt() + eps))
        quantize(m, state1, absmax1, signed=True)
        quantize(v, state2, absmax2, signed=False)

    return update


def blocks(x):
    padded = torch.nn.functional.pad(x.reshape(-1), (0, -x.numel() % BLOCK))
    return padded.view(-1, BLOCK)


def dequantize(state, absmax, signed):
    values = blocks(state.float()) / 255
    values = values * 2 - 1 if signed else values
    return (values * absmax[:, None]).reshape(-1)[: state.numel()]


def quantize(x, state, absmax, signed):
    scaled = blocks(x)
    absmax.copy_(scaled.abs().amax(1).clamp_min(1e-12))
    unit = scaled / absmax[:, None]
    codes = ((unit + 1) / 2 if signed else unit) * 255
    state.view(-1).copy_(codes.round().reshape(-1)[: state.numel()].to(torch.uint8))


class Optimizer2State(torch.optim.Optimizer):
    """bitsandbytes 0.50's Optimizer2State, cut to what the hooks depend on: its state layout, `get_config` with
    per-tensor overrides (`mng.pid2config`, its GlobalOptimManager's), `initialized` after its first step, and a
    step that runs a closure, skips tensors without a gradient and updates the others one call each."""

    def __init__(self, params, update, lr=2e-3, name="adam", is_paged=False):
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01})
        self.update, self.optimizer_name, self.is_paged = update, name, is_paged
        self.qmap1, self.qmap2 = torch.linspace(-1, 1, 256), torch.linspace(0, 1, 256)
        self.mng, self.initialized = types.SimpleNamespace(pid2config={}, index2config={}), False

    def get_config(self, gindex, pindex, group):
        config = {"betas": group["betas"], "eps": group["eps"], "weight_decay": group["weight_decay"],
                  "lr": group["lr"], "alpha": 0.0, "skip_zeros": False, "optim_bits": 8}
        return {**config, **self.mng.pid2config.get(id(group["params"][pindex]), {})}

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                closure()
        self.initialized = True
        for gindex, group in enumerate(self.param_groups):
            for pindex, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    blocks_ = -(-p.numel() // BLOCK)
                    state.update(step=0, state1=torch.full_like(p, 128, dtype=torch.uint8),
                                 state2=torch.zeros_like(p, dtype=torch.uint8), qmap1=self.qmap1, qmap2=self.qmap2,
                                 absmax1=torch.zeros(blocks_), absmax2=torch.zeros(blocks_))
                state["step"] += 1
                config = self.get_config(gindex, pindex, group)
                self.update(self.optimizer_name, p.grad, p, state["state1"], state["state2"], *config["betas"], 0.0,
                            0.0, config["eps"], state["step"], config["lr"], state["qmap1"], state["qmap2"],
                            state["absmax1"], state["absmax2"], config["weight_decay"])


class Hooked(Optimizer2State):
    """The class the hooks are registered for (the global hooks see every optimizer: the plain one is not one)."""


@pytest.fixture
def hooked(backend_patches_undone_after):
    """The hooks registered for `Hooked`; the calls of the update they make."""
    calls = []
    Hooks(Hooked, blockwise_update(calls)).register()
    return calls


def pair(hooked_calls, **options):
    """A plain optimizer and a hooked one over equal tensors, each update recording its calls: the plain one's
    into the list returned."""
    plain_calls = []
    made = []
    for kind, calls in ((Optimizer2State, plain_calls), (Hooked, hooked_calls)):
        generator = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]
        made.append((params, kind(params, blockwise_update(calls), **options)))
    return made, plain_calls


def step_both(made, step, without=(), closure=False):
    """One step of both optimizers with equal gradients (none for the tensors of `without`); with `closure`, the
    gradients come from the step's closure."""
    generator = torch.Generator().manual_seed(100 + step)
    grads = [torch.randn(shape, generator=generator) for shape in SHAPES]
    for params, optimizer in made:
        def set_grads(params=params):
            for index, (p, grad) in enumerate(zip(params, grads)):
                p.grad = None if index in without else grad.clone()

        optimizer.param_groups[0]["lr"] = 2e-3 / step  # a scheduler's change between steps
        if closure:
            for p in params:
                p.grad = torch.ones_like(p)  # stale: the closure's are the step's
            optimizer.step(set_grads)
        else:
            set_grads()
            optimizer.step(None)  # as accelerate's AcceleratedOptimizer calls it: no closure, positionally


def assert_same(made):
    (params_a, optimizer_a), (params_b, optimizer_b) = made
    for a, b in zip(params_a, params_b):
        assert torch.equal(a, b)
        state_a, state_b = optimizer_a.state[a], optimizer_b.state[b]
        assert state_a["step"] == state_b["step"]
        for name in ("state1", "state2", "absmax1", "absmax2"):
            assert state_a[name].shape == state_b[name].shape and torch.equal(state_a[name], state_b[name])


def test_from_the_second_step_the_whole_blocks_are_one_update_with_the_same_result(hooked):
    made, plain_calls = pair(hooked)
    for step in range(1, 5):
        step_both(made, step)
        assert_same(made)
    whole = sum(rows * cols for rows, cols in SHAPES[:3])
    assert plain_calls == [1024, 512, 768, 15] * 4
    assert hooked == [1024, 512, 768, 15] + [whole, 15] * 3


def test_the_gradients_are_given_back_after_the_step(hooked):
    made, _ = pair(hooked)
    step_both(made, 1)
    params, optimizer = made[1]
    grads = [torch.full(shape, 0.5) for shape in SHAPES]
    for p, grad in zip(params, grads):
        p.grad = grad
    optimizer.step()
    assert all(p.grad is grad for p, grad in zip(params, grads))
    assert not hasattr(optimizer, "nbddp_hidden")


def test_a_tensor_without_a_gradient_keeps_its_value_and_state(hooked):
    made, _ = pair(hooked)
    for step in (1, 2):
        step_both(made, step)
    before = made[1][0][1].detach().clone()
    step_both(made, 3, without={1})
    assert torch.equal(made[1][0][1], before)
    assert_same(made)
    step_both(made, 4)
    assert_same(made)


def test_states_replaced_from_outside_are_taken_in(hooked):
    made, _ = pair(hooked)
    for step in (1, 2):
        step_both(made, step)
    params, optimizer = made[1]
    for p in params:  # what loading a checkpoint's optimizer state does: new tensors, equal values
        optimizer.state[p].update({name: optimizer.state[p][name].clone()
                                   for name in ("state1", "state2", "absmax1", "absmax2")})
    for step in (3, 4):
        step_both(made, step)
        assert_same(made)


def test_paged_optimizers_and_other_updates_are_stepped_as_ever(hooked):
    for options in ({"is_paged": True}, {"name": "ademamix"}):
        hooked.clear()
        made, plain_calls = pair(hooked, **options)
        for step in (1, 2, 3):
            step_both(made, step)
        assert_same(made)
        assert hooked == plain_calls


def test_the_run_setting(monkeypatch, backend_patches_undone_after):
    monkeypatch.setenv("NBDDP_ONE_LAUNCH_OPTIMIZER", "sometimes")
    with pytest.raises(UsageError, match="expected 1 or 0"):
        one_launch_optimizer.wanted()
    monkeypatch.setenv("NBDDP_ONE_LAUNCH_OPTIMIZER", "1")
    assert one_launch_optimizer.wanted()
    one_launch_optimizer.install()  # no CUDA here: nothing
    assert one_launch_optimizer.PATCH not in patches.active()
    monkeypatch.setenv("NBDDP_ONE_LAUNCH_OPTIMIZER", "0")
    assert not one_launch_optimizer.wanted()


def test_under_accelerate_as_the_trainer_steps(hooked):
    from accelerate import Accelerator

    from accelerate.state import AcceleratorState

    made, plain_calls = pair(hooked)
    accelerator = Accelerator(cpu=True)  # Trainer steps through the optimizer it prepares
    try:
        wrapped = [(params, accelerator.prepare_optimizer(optimizer)) for params, optimizer in made]
        for step in (1, 2, 3):
            step_both(wrapped, step)
            assert_same(made)
    finally:
        AcceleratorState._reset_state(True)  # process-wide: later tests build their own
    assert isinstance(made[1][1].nbddp_flat[0], one_launch_optimizer.Flat)
    assert len(hooked) < len(plain_calls)


def test_a_step_with_a_closure_is_bitsandbytes_own(hooked):
    made, plain_calls = pair(hooked)
    for step in (1, 2, 3):
        step_both(made, step, closure=True)
        assert_same(made)
    assert hooked == plain_calls


def test_a_tensor_with_settings_of_its_own_is_stepped_on_its_own(hooked):
    made, plain_calls = pair(hooked)
    step_both(made, 1)
    step_both(made, 2)
    for params, optimizer in made:  # an override made between steps (bitsandbytes' GlobalOptimManager)
        optimizer.mng.pid2config[id(params[1])] = {"lr": 1e-4}
    for step in (3, 4):
        step_both(made, step)
        assert_same(made)
    assert sorted(hooked[-3:]) == [15, 512, 1024 + 768]


def test_the_most_tensors_alike_share_the_launch_and_the_flat_holds_at_most_max_elements(hooked, monkeypatch):
    made, _ = pair(hooked)
    step_both(made, 1, without={0})  # the first tensor is a step behind the others from here
    for step in (2, 3):
        if step == 3:  # a rebuild, with the first tensor's state there by now
            params, optimizer = made[1]
            for p in params:
                optimizer.state[p].update({name: optimizer.state[p][name].clone()
                                           for name in ("state1", "state2", "absmax1", "absmax2")})
        step_both(made, step)
        assert_same(made)
    assert sorted(hooked[-3:]) == [15, 1024, 512 + 768]
    monkeypatch.setattr(one_launch_optimizer, "MAX_ELEMENTS", 1024 + 512)
    made, _ = pair(hooked)
    for step in (1, 2):
        step_both(made, step)
    assert_same(made)
    assert sorted(hooked[-3:]) == [15, 768, 1024 + 512]


def test_quantization_maps_equal_in_value_are_one(hooked):
    made, plain_calls = pair(hooked)
    step_both(made, 1)
    params, optimizer = made[1]
    for p in params:  # what loading a checkpoint gives: a copy of the maps for each tensor
        optimizer.state[p].update(qmap1=optimizer.qmap1.clone(), qmap2=optimizer.qmap2.clone())
    step_both(made, 2)
    assert_same(made)
    assert sorted(hooked[-2:]) == [15, 1024 + 512 + 768]


def test_rank_0_says_once_how_many_tensors_update_in_one_launch(hooked, caplog):
    caplog.set_level("INFO", logger="nbddp")
    made, _ = pair(hooked)
    for step in (1, 2, 3):
        step_both(made, step)
    said = [record.getMessage() for record in caplog.records if "one_launch_optimizer" in record.getMessage()]
    assert said[0] == (f"nbddp: one_launch_optimizer: the optimizer is {__name__}.Optimizer2State, not "
                       "bitsandbytes' 2-state one: its step is its own")  # the plain one's
    said = said[1:]
    assert said == ["nbddp: one_launch_optimizer: 3 of the 4 tensors stepped (2,304 elements) update in 1 launch a "
                    "step; bitsandbytes steps the others one by one"]
    caplog.clear()
    made, _ = pair(hooked, lr=1e-3)
    for params, optimizer in made:
        optimizer.mng.pid2config.update({id(p): {"lr": 1e-4 * (index + 1)} for index, p in enumerate(params)})
    step_both(made, 1)
    step_both(made, 2)
    assert "none of the 4 tensors stepped updates in one launch" in caplog.text
    caplog.clear()
    made, _ = pair(hooked, is_paged=True)
    for step in (1, 2):
        step_both(made, step)
    assert caplog.text.count("one_launch_optimizer: bitsandbytes' paged optimizers move their states") == 1
