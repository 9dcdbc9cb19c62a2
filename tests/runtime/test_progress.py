"""TrainingProgress shows a run in a few lines away from a terminal, and MetricsCallback's figures reach the
callbacks after it (TensorBoard's, the progress) once `register_callbacks` has put it first."""
import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import DefaultFlowCallback, TrainerControl, TrainerState
from transformers import trainer as transformers_trainer
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import CallbackHandler, PrinterCallback, ProgressCallback

from nbddp import log
from nbddp.runtime.reporting import progress
from nbddp.runtime.trainer import trainer_patches
from nbddp.runtime.reporting.metrics import MetricsCallback
from nbddp.runtime.reporting.progress import TrainingProgress


@pytest.fixture
def level():
    """Set the nbddp logger's level for one test."""
    before = log.logger.level
    yield log.set_level
    log.set_level(before)


@pytest.fixture
def transformers_defaults(monkeypatch):
    """Transformers' callback registries and CallbackHandler.add_callback, restored after the test."""
    monkeypatch.setattr(transformers_trainer, "DEFAULT_PROGRESS_CALLBACK", ProgressCallback)
    monkeypatch.setattr(transformers_trainer, "PrinterCallback", PrinterCallback)
    monkeypatch.setattr(transformers_trainer, "DEFAULT_CALLBACKS", [DefaultFlowCallback])
    monkeypatch.setattr(CallbackHandler, "add_callback", CallbackHandler.add_callback)
    monkeypatch.delenv(log.PROGRESS_FILE_ENV, raising=False)


def train(callback, steps, rank_zero=True, logged=lambda step: True, evaluate_every=None):
    """Drive `callback` through `steps` optimizer steps as Trainer does: on_step_end, then on_log for a logged step."""
    args = SimpleNamespace(disable_tqdm=False)
    state = TrainerState(is_world_process_zero=rank_zero, max_steps=steps)
    callback.on_train_begin(args, state, TrainerControl())
    callback.on_log(args, state, TrainerControl(), logs={"eval_loss": 3.0})
    for step in range(1, steps + 1):
        state.global_step = step
        control = TrainerControl(should_log=logged(step))
        callback.on_step_end(args, state, control)
        if control.should_log:
            callback.on_log(args, state, control, logs={"loss": 10.0 / step, "tokens_per_s": 1234.5})
        if evaluate_every and step % evaluate_every == 0:
            callback.on_log(args, state, control, logs={"eval_loss": 2.0})
    callback.on_train_end(args, state, TrainerControl())
    callback.on_log(args, state, TrainerControl(), logs={"eval_loss": 2.0})  # the notebook's trainer.evaluate()


def test_away_from_a_terminal_a_run_of_300_steps_is_a_dozen_lines(capsys):
    train(TrainingProgress(), 300, evaluate_every=100)
    lines = capsys.readouterr().out.splitlines()
    steps = [line for line in lines if "held-out" not in line]
    assert [int(line.split()[2].split("/")[0]) for line in steps] == [1, *range(30, 301, 30)]
    assert steps[1].startswith("nbddp: step 30/300 (10%): loss 0.3333, 1,234 tokens/s, ETA ")
    assert lines[0] == "nbddp: step 0/300: held-out loss 3.0000"
    assert sum("held-out" in line for line in lines) == 4  # at 0, 100, 200, 300; not the evaluate() after training


def test_steps_that_do_not_log_are_shown_with_the_last_loss(capsys):
    train(TrainingProgress(), 20, logged=lambda step: step % 3 == 0)
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [line.split(":")[1].strip() for line in lines] == [f"step {n}/20 ({n * 5}%)" for n in (1, *range(2, 21, 2))]
    assert "step 4/20 (20%): loss 3.3333" in lines[2]  # step 3's


def test_other_ranks_and_quiet_runs_show_nothing(capsys, level):
    train(TrainingProgress(), 30, rank_zero=False)
    level(logging.WARNING)
    train(TrainingProgress(), 30)
    assert capsys.readouterr().out == ""


def test_verbose_shows_every_logged_step(capsys, level):
    level(logging.DEBUG)
    train(TrainingProgress(), 30)
    assert len(capsys.readouterr().out.splitlines()) == 1 + 30


def test_in_a_smoke_kernel_the_lines_go_to_the_progress_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "progress.log"
    monkeypatch.setenv(log.PROGRESS_FILE_ENV, str(path))
    train(TrainingProgress(), 3)
    assert capsys.readouterr().out == ""
    assert [line.split(":")[1] for line in path.read_text().splitlines()] == [
        " step 0/3", " step 1/3 (33%)", " step 2/3 (66%)", " step 3/3 (100%)"]


def test_register_replaces_transformers_progress_and_printer_callbacks(transformers_defaults):
    progress.register()
    progress.register()
    assert transformers_trainer.DEFAULT_PROGRESS_CALLBACK is TrainingProgress
    assert transformers_trainer.PrinterCallback is TrainingProgress  # what disable_tqdm=True takes
    assert transformers_trainer.DEFAULT_CALLBACKS == [DefaultFlowCallback]


def test_in_a_kernel_the_notebook_display_stays_and_a_smoke_run_adds_the_lines(transformers_defaults, monkeypatch):
    notebook_display = type("NotebookProgressCallback", (ProgressCallback,), {})
    monkeypatch.setattr(transformers_trainer, "DEFAULT_PROGRESS_CALLBACK", notebook_display)
    progress.register()
    assert transformers_trainer.DEFAULT_CALLBACKS == [DefaultFlowCallback]  # Jupyter, not a smoke run
    monkeypatch.setenv(log.PROGRESS_FILE_ENV, "progress.log")
    progress.register()
    progress.register()
    assert transformers_trainer.DEFAULT_PROGRESS_CALLBACK is notebook_display
    assert transformers_trainer.DEFAULT_CALLBACKS == [DefaultFlowCallback, TrainingProgress]


class Writer:
    """A SummaryWriter that keeps the scalars."""

    def __init__(self):
        self.scalars = {}

    def add_scalar(self, name, value, step):
        self.scalars[name] = (value, step)

    def add_text(self, *args):
        pass

    def flush(self):
        pass


def test_metrics_figures_reach_tensorboard_and_the_progress(transformers_defaults, tmp_path, capsys):
    trainer_patches.register_callbacks()
    writer, metrics = Writer(), MetricsCallback(tmp_path / "metrics.jsonl")
    model = torch.nn.Linear(2, 2)
    # as Trainer.__init__ builds it: the defaults and reporting callbacks, then the notebook's, then the progress
    handler = CallbackHandler([DefaultFlowCallback, TensorBoardCallback(writer), metrics], model, None, None, None)
    handler.add_callback(transformers_trainer.DEFAULT_PROGRESS_CALLBACK)
    assert handler.callbacks[0] is metrics
    plan = SimpleNamespace(global_batch=8, as_record=lambda: {}, describe=lambda: "global batch 8 rows")
    args = SimpleNamespace(device=torch.device("cpu"), disable_tqdm=False, output_dir=str(tmp_path),
                           nbddp_batch_plan=plan, to_json_string=lambda: "{}")
    state = TrainerState(is_world_process_zero=True, max_steps=10)
    handler.on_train_begin(args, state, TrainerControl())
    model.train()
    model(torch.ones(4, 2))  # no attention mask: its 8 numbers are counted as tokens
    state.global_step = 1
    handler.on_log(args, state, TrainerControl(), logs={"loss": 2.5, "learning_rate": 1e-4})
    assert {"train/loss", "train/tokens_per_s", "train/peak_mem_gib", "train/global_batch"} <= set(writer.scalars)
    assert writer.scalars["train/tokens_per_s"][0] > 0 and writer.scalars["train/global_batch"] == (8, 1)
    assert capsys.readouterr().out.startswith("nbddp: step 1/10 (10%): loss 2.5000, ")


def test_on_a_terminal_it_is_transformers_bar_with_the_loss_on_it(monkeypatch, capsys):
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    train(TrainingProgress(), 30)
    captured = capsys.readouterr()
    assert "30/30" in captured.err and "loss 0.3333, 1,234 tokens/s" in captured.err
    assert captured.out == "nbddp: step 0/30: held-out loss 3.0000\n"  # tqdm.write's, as Transformers' dicts were
