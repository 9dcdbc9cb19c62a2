"""Checkpoints never mix runs or trainers: a real Trainer (the tiny Llama, on the CPU) with the wrapped methods of
nbddp.runtime.trainer.training_checkpoints. A save cut short is an exception raised after its first file (the
model), the deterministic stand-in for a kill -9 between two files; "a new process" forgets which trainers took
which folder, as a new run of the script starts."""
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import TrainerCallback

from nbddp.formats import checkpoint_markers
from nbddp.formats.checkpoint_markers import MARKER
from nbddp.runtime.trainer import training_checkpoints
from nbddp.runtime.context import DistributedContext


@pytest.fixture
def markers(monkeypatch):
    """Every Trainer built in the test gets the markers; Trainer and its default callbacks are put back after."""
    from transformers import Trainer, trainer

    monkeypatch.setattr(trainer, "DEFAULT_CALLBACKS", list(trainer.DEFAULT_CALLBACKS))
    for name in ("train", "_save_checkpoint", "_get_output_dir", "_save_optimizer_and_scheduler", "save_model"):
        monkeypatch.setattr(Trainer, name, vars(Trainer)[name])
    monkeypatch.setattr(training_checkpoints, "_trainers_per_output_dir", {})
    training_checkpoints.register()


def new_process():
    training_checkpoints._trainers_per_output_dir.clear()


def tiny_trainer(model_path, output_dir, max_steps=2, learning_rate=1e-3):
    """A Trainer that saves every 2 steps into `output_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    torch.manual_seed(0)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_path), AutoTokenizer.from_pretrained(model_path)
    ids = torch.tensor(tokenizer("the cat sat on the mat")["input_ids"])
    args = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=2,
                             learning_rate=learning_rate, save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=[{"input_ids": ids, "labels": ids}] * 8)


def cut_short_after_the_model(monkeypatch):
    """The next checkpoint save stops after its model file, before the optimizer's."""
    from transformers import Trainer

    def killed(self, output_dir):
        raise RuntimeError("killed while saving")

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", killed)


def digest(directory):
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


def test_a_fresh_run_never_rewrites_an_earlier_runs_checkpoint(markers, tiny_model_path, tmp_path, monkeypatch, capsys):
    outputs = tmp_path / "outputs"
    tiny_trainer(tiny_model_path, outputs).train()  # run 1: checkpoint-2, complete
    first = checkpoint_markers.read_marker(outputs / "checkpoint-2")
    files = digest(outputs / "checkpoint-2")

    new_process()  # run 2, fresh, into the same output_dir, killed while writing its checkpoint-2
    cut_short_after_the_model(monkeypatch)
    with pytest.raises(RuntimeError, match="killed while saving"):
        tiny_trainer(tiny_model_path, outputs, learning_rate=5e-3).train()

    assert checkpoint_markers.read_marker(outputs / "checkpoint-2") is None  # run 2's half, never run 1's marker
    moved = outputs / checkpoint_markers.PREVIOUS_RUNS / first.run
    assert checkpoint_markers.read_marker(moved / "checkpoint-2").run == first.run
    assert digest(moved / "checkpoint-2") == files  # run 1's checkpoint, whole and untouched
    assert f"held the checkpoints of an earlier run (checkpoint-2): moved them to {moved}" in capsys.readouterr().out

    new_process()  # --resume true finds nothing of run 2 to continue
    monkeypatch.undo()
    trainer = tiny_trainer(tiny_model_path, outputs)
    assert DistributedContext(resume=True).checkpoint_to_resume(trainer) is None
    assert checkpoint_markers.checkpoint_dirs(outputs) == []  # the half-written checkpoint-2 is gone


def test_a_checkpoint_saved_again_loses_its_marker_before_its_first_file(markers, tiny_model_path, tmp_path,
                                                                         monkeypatch):
    from transformers import Trainer

    outputs = tmp_path / "outputs"
    tiny_trainer(tiny_model_path, outputs, max_steps=4).train()  # checkpoint-2 and checkpoint-4, complete
    run = checkpoint_markers.read_marker(outputs / "checkpoint-4").run

    new_process()  # resumed from checkpoint-2, it writes checkpoint-4 again, and is killed doing so
    marked_when_written = []
    save_model = Trainer.save_model

    def first_file(self, output_dir=None, _internal_call=False):
        marked_when_written.append((outputs / "checkpoint-4" / MARKER).exists())
        return save_model(self, output_dir, _internal_call)

    monkeypatch.setattr(Trainer, "save_model", first_file)
    cut_short_after_the_model(monkeypatch)
    with pytest.raises(RuntimeError, match="killed while saving"):
        tiny_trainer(tiny_model_path, outputs, max_steps=4).train(resume_from_checkpoint=str(outputs / "checkpoint-2"))

    assert marked_when_written == [False]
    assert checkpoint_markers.read_marker(outputs / "checkpoint-4") is None
    assert checkpoint_markers.latest_complete(outputs).path == outputs / "checkpoint-2"
    assert checkpoint_markers.read_marker(outputs / "checkpoint-2").run == run  # a resumed run keeps its id


def test_two_trainers_with_one_output_dir_keep_and_resume_their_own_checkpoints(markers, tiny_model_path, tmp_path,
                                                                                capsys):
    outputs = tmp_path / "outputs"
    tiny_trainer(tiny_model_path, outputs, max_steps=2).train()  # continued pretraining, say
    tiny_trainer(tiny_model_path, outputs, max_steps=4).train()  # then instructions, into the same "outputs"
    assert f"is trainer 2 of this script with output_dir {outputs}: its checkpoints go to {outputs / 'trainer-2'}" \
           in capsys.readouterr().out
    assert [c.step for c in checkpoint_markers.complete_checkpoints(outputs)] == [2]
    assert [c.step for c in checkpoint_markers.complete_checkpoints(outputs / "trainer-2")] == [2, 4]

    new_process()  # the script again, with --resume true: each trainer continues from its own
    ddp = DistributedContext(resume=True)
    first, second = tiny_trainer(tiny_model_path, outputs, max_steps=2), tiny_trainer(tiny_model_path, outputs, 4)
    assert ddp.checkpoint_to_resume(first) == str(outputs / "checkpoint-2")
    assert ddp.checkpoint_to_resume(second) == str(outputs / "trainer-2" / "checkpoint-4")


def test_two_trainers_with_one_output_dir_keep_their_own_metrics(markers, tiny_model_path, tmp_path, capsys):
    from nbddp.formats import metrics
    from nbddp.runtime.reporting.metrics import MetricsCallback

    outputs = tmp_path / "outputs"
    for max_steps, callback in ((2, MetricsCallback(outputs / "metrics.jsonl")), (4, MetricsCallback())):
        trainer = tiny_trainer(tiny_model_path, outputs, max_steps=max_steps)
        trainer.args.logging_steps = 1
        trainer.add_callback(callback)  # as the notebook passes it; or as record-metrics adds it, without a path
        trainer.train()
    assert f"its checkpoints go to {outputs / 'trainer-2'}, its metrics.jsonl beside them" in capsys.readouterr().out
    first, second = (metrics.read(folder / "metrics.jsonl") for folder in (outputs, outputs / "trainer-2"))
    assert [r["step"] for r in metrics.steps(first)] == [1, 2]  # not started afresh by the second trainer
    assert [r["step"] for r in metrics.steps(second)] == [1, 2, 3, 4]


def test_resume_from_checkpoint_true_takes_the_last_marked_checkpoint(markers, tiny_model_path, tmp_path, capsys):
    outputs = tmp_path / "outputs"
    tiny_trainer(tiny_model_path, outputs).train()
    half = outputs / "checkpoint-9"  # a run stopped while writing it: the model, no trainer state, no marker
    half.mkdir()
    shutil.copy(outputs / "checkpoint-2" / "model.safetensors", half)

    new_process()
    trainer, started_at = tiny_trainer(tiny_model_path, outputs, max_steps=4), []
    trainer.add_callback(type("StartStep", (TrainerCallback,), {
        "on_train_begin": lambda self, args, state, control, **kwargs: started_at.append(state.global_step)})())
    trainer.train(resume_from_checkpoint=True)  # as a notebook writes it; Transformers alone picks checkpoint-9
    out = capsys.readouterr().out
    assert f"nbddp: resume_from_checkpoint=True: resuming from {outputs / 'checkpoint-2'} (step 2)" in out
    assert started_at == [2] and not half.exists()
    assert checkpoint_markers.latest_complete(outputs).step == 4


def test_resume_from_checkpoint_true_without_a_complete_one_trains_afresh(markers, tiny_model_path, tmp_path, capsys):
    outputs = tmp_path / "outputs"
    trainer = tiny_trainer(tiny_model_path, outputs)
    trainer.train(resume_from_checkpoint=True)  # Transformers alone: "No valid checkpoint found"
    assert (f"nbddp: resume_from_checkpoint=True: no complete checkpoint in {outputs}; training from the start"
            in capsys.readouterr().out)
    assert checkpoint_markers.latest_complete(outputs).step == 2


GLOO_WORKER = textwrap.dedent(
    """\
    import os, sys
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments
    from nbddp.runtime.trainer import training_checkpoints
    from nbddp.runtime.context import init_distributed

    model_path, outputs, phase = sys.argv[1:4]
    ddp = init_distributed()
    training_checkpoints.register()

    def train(max_steps, learning_rate):
        torch.manual_seed(0)
        model, tokenizer = AutoModelForCausalLM.from_pretrained(model_path), AutoTokenizer.from_pretrained(model_path)
        ids = torch.tensor(tokenizer("the cat sat on the mat")["input_ids"])
        args = TrainingArguments(output_dir=outputs, max_steps=max_steps, per_device_train_batch_size=2, save_steps=2,
                                 learning_rate=learning_rate, report_to=[], use_cpu=True, disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=[{"input_ids": ids, "labels": ids}] * 8).train()

    if phase == "two trainers":
        train(2, 1e-3)
        train(4, 1e-3)
    else:  # a fresh run whose rank 0 dies, as under kill -9, once it has written checkpoint-2's model file
        def killed(self, output_dir):
            if ddp.rank == 0:
                os._exit(9)

        Trainer._save_optimizer_and_scheduler = killed
        train(2, 5e-3)
    ddp.shutdown()
    """
)


def launch_two(worker, *arguments):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(worker), *arguments], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.e2e
def test_two_gloo_processes_keep_trainers_and_runs_apart(tiny_model_path, tmp_path):
    worker, outputs = tmp_path / "worker.py", tmp_path / "outputs"
    worker.write_text(GLOO_WORKER)
    result = launch_two(worker, tiny_model_path, str(outputs), "two trainers")
    assert result.returncode == 0, result.stderr[-3000:]
    for folder, steps in ((outputs, [2]), (outputs / "trainer-2", [2, 4])):
        checkpoints = checkpoint_markers.complete_checkpoints(folder)
        assert [(c.step, c.world_size) for c in checkpoints] == [(step, 2) for step in steps]
        assert all((c.path / "rng_state_1.pth").exists() for c in checkpoints)  # rank 1's part, before the marker
    run, files = checkpoint_markers.read_marker(outputs / "checkpoint-2").run, digest(outputs / "checkpoint-2")

    result = launch_two(worker, tiny_model_path, str(outputs), "killed")
    assert result.returncode != 0
    assert checkpoint_markers.read_marker(outputs / "checkpoint-2") is None
    assert digest(outputs / checkpoint_markers.PREVIOUS_RUNS / run / "checkpoint-2") == files
