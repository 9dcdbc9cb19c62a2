from types import SimpleNamespace

from transformers import TrainerControl, TrainerState

from nbddp.formats import checkpoint_markers
from nbddp.runtime.trainer.training_checkpoints import CompleteCheckpointsCallback, register


def save(callback, args, step, is_world_process_zero=True):
    """What Trainer does at a save step: write checkpoint-<step> (here: one file), then call on_save."""
    path = args.output_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text("{}")
    state = TrainerState(is_world_process_zero=is_world_process_zero, global_step=step)
    callback.on_save(args, state, TrainerControl())
    return path


def test_rank_zero_marks_each_saved_checkpoint_complete_and_keeps_the_limit(tmp_path):
    args = SimpleNamespace(output_dir=tmp_path, save_total_limit=2)
    callback = CompleteCheckpointsCallback()
    callback.on_init_end(args, TrainerState(), TrainerControl())
    assert args.save_total_limit is None  # Trainer's own rotation, which counts incomplete checkpoints, is off
    for step in (2, 4, 6):
        path = save(callback, args, step)
        assert checkpoint_markers.read_marker(path).step == step
    assert [c.step for c in checkpoint_markers.complete_checkpoints(tmp_path)] == [4, 6]


def test_other_ranks_mark_nothing(tmp_path):
    args = SimpleNamespace(output_dir=tmp_path, save_total_limit=None)
    callback = CompleteCheckpointsCallback()
    path = save(callback, args, 2, is_world_process_zero=False)
    assert checkpoint_markers.read_marker(path) is None


def test_every_trainer_gets_the_callback_once(monkeypatch):
    from transformers import trainer

    monkeypatch.setattr(trainer, "DEFAULT_CALLBACKS", list(trainer.DEFAULT_CALLBACKS))
    register()
    register()
    assert trainer.DEFAULT_CALLBACKS.count(CompleteCheckpointsCallback) == 1
