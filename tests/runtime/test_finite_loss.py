"""FiniteLossCallback: a training loss that is not finite stops the run at that step (exit 1, one paragraph), unless
fp16's loss scaler skipped the step for an overflow. End to end on 2 processes: tests/test_earlier_runs.py."""
import math
from types import SimpleNamespace

import pytest
import torch

from nbddp.formats.checkpoint_markers import Checkpoint
from nbddp.runtime.trainer.finite_loss import FiniteLossCallback, NonFiniteLoss


class Model(torch.nn.Module):
    def forward(self, loss):
        return {"loss": loss}


@pytest.fixture
def trained():
    """A callback whose train() began on a model that returns the loss it is given."""
    callback, model = FiniteLossCallback(), Model()
    callback.on_train_begin(SimpleNamespace(device=torch.device("cpu")), None, None, model=model)
    yield callback, model
    callback.on_train_end(None, None, None)


def step_end(callback, step=3, optimizer=None):
    callback.on_step_end(SimpleNamespace(learning_rate=2e-3), SimpleNamespace(global_step=step, max_steps=8), None,
                         optimizer=optimizer)


def test_finite_losses_go_on_and_a_nan_stops_the_step(trained):
    callback, model = trained
    with torch.enable_grad():
        model(torch.tensor(2.5))
        step_end(callback, 2)
        model(torch.tensor(math.nan))
        model(torch.tensor(1.0))  # a later micro batch of the same step does not clear it
        with pytest.raises(NonFiniteLoss) as stopped:
            step_end(callback, 3)
    assert stopped.value.exit_status == 1
    assert str(stopped.value).startswith("the training loss is not finite (NaN or infinite) at step 3 of 8: "
                                         "training stopped there, before saving it. Likely causes: a learning rate "
                                         "too high for this model (learning_rate 0.002)")


def test_evaluation_and_generation_are_not_checked(trained):
    callback, model = trained
    with torch.no_grad():
        model(torch.tensor(math.inf))
    model.eval()
    with torch.enable_grad():
        model(torch.tensor(math.inf))
    step_end(callback)


@pytest.mark.parametrize("scale, stops", [(1024.0, False), (0.5, True)])
def test_a_step_the_fp16_loss_scaler_skipped_goes_on_while_its_scale_can_still_help(trained, scale, stops):
    callback, model = trained
    optimizer = SimpleNamespace(step_was_skipped=True, scaler=SimpleNamespace(get_scale=lambda: scale))
    with torch.enable_grad():
        model(torch.tensor(math.inf))
    if stops:
        with pytest.raises(NonFiniteLoss):
            step_end(callback, optimizer=optimizer)
    else:
        step_end(callback, optimizer=optimizer)


def checkpoint(step):
    return Checkpoint(f"out/checkpoint-{step}", step, 2, float(step))


def test_the_paragraph_names_the_last_checkpoint_before_the_weights_that_gave_the_loss():
    error = NonFiniteLoss(5, 8, 1e30)
    text = str(error.resumable_from([checkpoint(2), checkpoint(4)], "out"))
    assert error.suspect([checkpoint(2), checkpoint(4)]).step == 4
    assert text.endswith("out/checkpoint-4 holds the weights that gave that loss: moved into nbddp-damaged/. Last "
                         "complete checkpoint before it: out/checkpoint-2 (step 2); once fixed, rerun with --resume "
                         "true to continue from it")
    assert str(error.resumable_from([], "out")).endswith("No complete checkpoint from before it in out: once fixed, "
                                                          "train afresh")
