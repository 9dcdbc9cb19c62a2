"""Unsloth issue #3452 reproduced on CPU: a loss that is a view made inside a custom autograd Function, and
the real `transformers.Trainer.compute_loss` scaling it in place as it does with more than one process."""
import inspect
from types import SimpleNamespace

import pytest
import torch
from transformers import Trainer
from transformers.modeling_outputs import CausalLMOutput

from nbddp.runtime.trainer.trainer_patches import patch_compute_loss


class ViewLoss(torch.autograd.Function):
    """Like UnslothFusedLoss: sum of squares, returned as a view of a tensor made inside `forward`."""

    @staticmethod
    def forward(ctx, weights):
        ctx.save_for_backward(weights)
        return (weights * weights).sum().view(())

    @staticmethod
    def backward(ctx, grad):
        (weights,) = ctx.saved_tensors
        return 2 * weights * grad


class FusedLossModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = torch.nn.Parameter(torch.tensor([1.0, 2.0]))

    def forward(self, input_ids=None, num_items_in_batch=None):
        return CausalLMOutput(loss=ViewLoss.apply(self.weights))


def two_process_trainer():
    """Just what `Trainer.compute_loss` reads when two DDP processes average tokens across devices (and, on
    transformers 4.x, `past_index`: -1, no past state kept)."""
    return SimpleNamespace(
        accelerator=SimpleNamespace(num_processes=2),
        args=SimpleNamespace(average_tokens_across_devices=True, n_gpu=1, past_index=-1),
        model_accepts_loss_kwargs=True,
        label_smoother=None,
        compute_loss_func=None,
    )


@pytest.fixture
def trainer_class():
    """A subclass, so patching it leaves transformers.Trainer itself alone."""
    return type("PatchedTrainer", (Trainer,), {})


def test_unpatched_trainer_fails_as_in_the_issue():
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        Trainer.compute_loss(two_process_trainer(), FusedLossModel(), {"input_ids": None}, num_items_in_batch=4)


def test_patched_trainer_scales_a_clone_and_keeps_the_gradient(trainer_class):
    patch_compute_loss(trainer_class)
    model = FusedLossModel()
    loss = trainer_class.compute_loss(two_process_trainer(), model, {"input_ids": None}, num_items_in_batch=4)
    assert loss.item() == pytest.approx(2 * (1.0 + 4.0))
    loss.backward()
    torch.testing.assert_close(model.weights.grad, 2 * 2 * torch.tensor([1.0, 2.0]))
    assert not model._forward_hooks  # the hook lives only while compute_loss runs


def test_outputs_come_back_when_asked(trainer_class):
    patch_compute_loss(trainer_class)
    loss, outputs = trainer_class.compute_loss(
        two_process_trainer(), FusedLossModel(), {"input_ids": None}, return_outputs=True, num_items_in_batch=4
    )
    assert isinstance(outputs, CausalLMOutput)
    assert loss.item() == pytest.approx(10.0)


def test_patching_twice_wraps_once(trainer_class):
    patch_compute_loss(trainer_class)
    patched = trainer_class.compute_loss
    patch_compute_loss(trainer_class)
    assert trainer_class.compute_loss is patched


def test_unsloth_source_rewrite_sees_no_inplace_scaling(trainer_class):
    # Unsloth rewrites `loss *=` in inspect.getsource(Trainer.compute_loss); it must not find (and drop) ours.
    patch_compute_loss(trainer_class)
    assert "loss *=" not in inspect.getsource(trainer_class.compute_loss)
    assert list(inspect.signature(trainer_class.compute_loss).parameters) == list(
        inspect.signature(Trainer.compute_loss).parameters
    )
