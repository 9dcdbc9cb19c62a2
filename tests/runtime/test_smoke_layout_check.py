"""The smoke run's layout check in one process: train() trains the smoke steps in the notebook's layout, then
from the same start in the fuller one (nbddp.runtime.memory.smoke_layout_check)."""
import pytest
import torch

from nbddp.formats import metrics
from nbddp.runtime.memory import fuller_batch, smoke_layout_check
from nbddp.runtime.reporting.metrics import MetricsCallback

from .test_fuller_batch import losses, tiny_trainer


@pytest.fixture
def patched_train(monkeypatch):
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "train", Trainer.train)  # restored after the test
    fuller_batch.patch_trainer(Trainer)
    smoke_layout_check.patch_trainer(Trainer)
    return Trainer


def trainer_with_metrics(trainer_class, model_path, output_dir, layout):
    trainer = tiny_trainer(trainer_class, model_path, output_dir, layout)
    trainer.add_callback(MetricsCallback())
    return trainer


def file_losses(path):
    return [record["loss"] for record in metrics.steps(metrics.read(path))]


def test_both_layouts_train_from_the_same_start(patched_train, tiny_model_path, tmp_path, monkeypatch):
    """Each of the two trainings in one process logs the losses of a trainer of its own layout built afresh: the
    weights, the random state (data order) and the optimizer are those of the start."""
    alone = {}
    for layout in ("notebook", "auto"):
        trainer = trainer_with_metrics(patched_train, tiny_model_path, tmp_path / layout, layout)
        trainer.train()
        alone[layout] = losses(trainer)
    target = tmp_path / "smoke" / "metrics-notebook-layout.jsonl"
    target.parent.mkdir()
    monkeypatch.setenv(smoke_layout_check.ENV, str(target))
    checked = trainer_with_metrics(patched_train, tiny_model_path, tmp_path / "checked", "auto")
    checked.train()

    assert (checked.args.per_device_train_batch_size, checked.args.gradient_accumulation_steps) == (4, 1)
    first, second = metrics.read(target), metrics.read(tmp_path / "checked" / metrics.METRICS_FILE)
    assert [(plan["micro_batch"], plan["accumulation"]) for plan in metrics.events(first, "batch_plan")] == [(2, 2)]
    assert [(plan["micro_batch"], plan["accumulation"]) for plan in metrics.events(second, "batch_plan")] == [(4, 1)]
    assert len(set(alone["notebook"])) == 3  # three steps, each on other rows and weights
    torch.testing.assert_close(file_losses(target), alone["notebook"], rtol=0, atol=0)
    torch.testing.assert_close(file_losses(tmp_path / "checked" / metrics.METRICS_FILE), alone["auto"], rtol=0, atol=0)
    [timed] = metrics.events(first, "layout_check")
    assert timed["wall_s"] > 0


def test_without_the_variable_train_trains_once(patched_train, tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.delenv(smoke_layout_check.ENV, raising=False)
    trainer = trainer_with_metrics(patched_train, tiny_model_path, tmp_path, "auto")
    trainer.train()
    assert len(losses(trainer)) == 3 and sorted(path.name for path in tmp_path.glob("*.jsonl")) == ["metrics.jsonl"]


def test_the_notebook_layout_trains_once(patched_train, tiny_model_path, tmp_path, monkeypatch):
    """Nothing to check against without a fuller plan (`--batch_layout notebook`)."""
    monkeypatch.setenv(smoke_layout_check.ENV, str(tmp_path / "aside.jsonl"))
    trainer_with_metrics(patched_train, tiny_model_path, tmp_path, "notebook").train()
    assert not (tmp_path / "aside.jsonl").exists()
