"""patch_evaluation_loop: evaluation runs with average_tokens_across_devices off, training keeps it (unit); that the
held-out loss of 2 processes then equals 1 process's is tested end to end in tests/test_e2e_ddp.py."""
from types import SimpleNamespace

import pytest

from nbddp.runtime.trainer.eval_loss import patch_evaluation_loop


class RecordingTrainer:
    def __init__(self):
        self.args = SimpleNamespace(average_tokens_across_devices=True)
        self.seen = []

    def evaluation_loop(self, dataloader, description, fail=False):
        self.seen.append(self.args.average_tokens_across_devices)
        if fail:
            raise RuntimeError("evaluation failed")
        return f"{description} done"


@pytest.fixture
def trainer_class():
    cls = type("PatchedTrainer", (RecordingTrainer,), {})
    patch_evaluation_loop(cls)
    return cls


def test_evaluation_runs_without_cross_rank_token_averaging_and_training_keeps_it(trainer_class):
    trainer = trainer_class()
    assert trainer.evaluation_loop(None, "Evaluation") == "Evaluation done"
    assert trainer.seen == [False]
    assert trainer.args.average_tokens_across_devices is True


def test_the_setting_comes_back_when_evaluation_fails(trainer_class):
    trainer = trainer_class()
    with pytest.raises(RuntimeError, match="evaluation failed"):
        trainer.evaluation_loop(None, "Evaluation", fail=True)
    assert trainer.args.average_tokens_across_devices is True


def test_an_author_who_turned_averaging_off_keeps_it_off(trainer_class):
    trainer = trainer_class()
    trainer.args.average_tokens_across_devices = False
    trainer.evaluation_loop(None, "Evaluation")
    assert trainer.seen == [False] and trainer.args.average_tokens_across_devices is False


def test_patching_twice_wraps_once(trainer_class):
    patched = trainer_class.evaluation_loop
    patch_evaluation_loop(trainer_class)
    assert trainer_class.evaluation_loop is patched
