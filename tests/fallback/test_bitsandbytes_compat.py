"""bitsandbytes' step without a device sync per parameter on the fallback (fallback.bitsandbytes_compat), on a
stand-in for bitsandbytes' optimizer module: the real one needs CUDA to take the path that changes."""
import importlib.util
import inspect
import sys
import types

import pytest
import torch

from nbddp import patches
from nbddp.fallback import bitsandbytes_compat

# bitsandbytes 0.50's Optimizer8bit.step, cut to what the patch depends on: a module-level sync_gpu after each update
STEP = '''
def sync_gpu(t):
    synced.append(t)


class Optimizer8bit(torch.optim.Optimizer):
    def __init__(self, params, is_paged=False):
        super().__init__(params, {})
        self.is_paged = is_paged

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                updated.append(p)
                sync_gpu(p)
        return "stepped"
'''


@pytest.fixture
def library(monkeypatch, backend_patches_undone_after):
    """A `bitsandbytes.optim.optimizer` module in sys.modules, CUDA said to be there, default streams throughout."""
    module = types.ModuleType("bitsandbytes.optim.optimizer")
    module.__dict__.update(torch=torch, synced=[], updated=[])
    exec(STEP, module.__dict__)
    package = types.ModuleType("bitsandbytes")
    package.optim = types.ModuleType("bitsandbytes.optim")
    package.optim.optimizer = module
    monkeypatch.setitem(sys.modules, "bitsandbytes", package)
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim", package.optim)
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim.optimizer", module)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "bitsandbytes"
                        else find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bitsandbytes_compat, "_steps_on_default_streams", lambda optimizer: True)
    return module


def parameters(count=3):
    return [torch.nn.Parameter(torch.zeros(2)) for _ in range(count)]


def test_a_step_on_the_default_stream_updates_every_parameter_without_a_sync(library):
    optimizer = library.Optimizer8bit(parameters())  # built first: torch has frozen its class's step already
    bitsandbytes_compat.patch_optimizer_step()
    assert optimizer.step() == "stepped"
    assert len(library.updated) == 3 and library.synced == []


def test_without_the_patch_every_parameter_syncs(library):
    library.Optimizer8bit(parameters()).step()
    assert len(library.synced) == 3


def test_paged_optimizers_and_other_streams_keep_their_syncs(library, monkeypatch):
    bitsandbytes_compat.patch_optimizer_step()
    library.Optimizer8bit(parameters(), is_paged=True).step()
    assert len(library.synced) == 3
    monkeypatch.setattr(bitsandbytes_compat, "_steps_on_default_streams", lambda optimizer: False)
    library.Optimizer8bit(parameters()).step()
    assert len(library.synced) == 6


def test_after_a_step_without_syncs_a_paged_one_syncs_again(library):
    bitsandbytes_compat.patch_optimizer_step()
    library.Optimizer8bit(parameters()).step()
    assert library.synced == []
    library.Optimizer8bit(parameters(), is_paged=True).step()
    assert len(library.synced) == 3


def test_other_optimizers_leave_the_choice_alone(library):
    bitsandbytes_compat.patch_optimizer_step()
    library.Optimizer8bit(parameters(), is_paged=True).step()
    torch.optim.SGD(parameters(), lr=0.1).step()
    library.sync_gpu(None)
    assert len(library.synced) == 4


def test_patching_twice_is_once_and_undo_restores(library):
    original = library.sync_gpu
    bitsandbytes_compat.patch_optimizer_step()
    bitsandbytes_compat.patch_optimizer_step()
    assert patches.active().count("bitsandbytes-step-syncs") == 1
    library.Optimizer8bit(parameters()).step()
    assert library.synced == []
    patches.undo()
    assert library.sync_gpu is original
    library.Optimizer8bit(parameters()).step()
    assert len(library.synced) == 3


def test_nothing_changes_without_cuda(library, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    bitsandbytes_compat.patch_optimizer_step()
    library.Optimizer8bit(parameters()).step()
    assert len(library.synced) == 3 and patches.active() == ()


def test_parameters_off_the_gpu_are_not_on_a_default_stream():
    assert not bitsandbytes_compat._steps_on_default_streams(torch.optim.SGD(parameters(), lr=0.1))


def test_the_installed_step_still_syncs_per_parameter():
    """What the patch relies on, in the installed bitsandbytes's source (the GPU image's; absent on CPU hosts)."""
    module = pytest.importorskip("bitsandbytes.optim.optimizer")
    assert "sync_gpu(p)" in inspect.getsource(module.Optimizer8bit.step)


def test_a_bitsandbytes_that_cannot_load_is_left_alone(library, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes.optim.optimizer", None)  # import raises ImportError
    bitsandbytes_compat.patch_optimizer_step()
    assert patches.active() == ()
