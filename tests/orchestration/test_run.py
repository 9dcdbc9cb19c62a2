import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import nbddp.export
from nbddp.formats import checkpoint_markers
from nbddp.formats import metrics as metrics_format
from nbddp.errors import NbddpError
from nbddp.orchestration import run as run_module
from nbddp.orchestration.launch import launch
from nbddp.orchestration.launch.launch import LaunchOptions
from nbddp.orchestration.run import LaunchFailed, check_export_fresh, run, saved_models, summarise
from nbddp.orchestration.smoke.notebook_run import NotebookRunFailed

from .conftest import REPO, metric_lines, needs_generated_script


@pytest.fixture
def fresh_export(monkeypatch):
    """The fixture scripts have no notebooks to be fresh against; the check itself is tested below."""
    monkeypatch.setattr(run_module, "check_export_fresh", lambda script: None)


@pytest.fixture
def launches(monkeypatch):
    """Record torchrun launches instead of running them."""
    calls = []
    monkeypatch.setattr(launch, "execute", lambda plan: calls.append(plan) or 0)
    return calls


def test_a_stale_export_stops_the_run_before_anything_runs(workdir, monkeypatch, launches):
    stale = SimpleNamespace(stale=["generated/train.py differs from what export writes"])
    monkeypatch.setattr(nbddp.export, "export", lambda notebooks, out, check: stale)
    hint = "hint: run `python pipeline.py export --notebooks notebooks --out .`"  # the script is not generated/'s
    with pytest.raises(NbddpError, match=f"out of date:\n  generated/train.py differs.*\n  {re.escape(hint)}"):
        run("train_fixture.py")
    assert launches == [] and not (workdir / "runs").exists()


def test_a_script_exported_from_another_folder_is_checked_against_that_folder(tmp_path):
    # `pipeline.py export --notebooks my_notebooks --out my_out`, then `pipeline.py run --script my_out/train.py`.
    from nbddp.export import export

    notebooks, out = tmp_path / "my_notebooks", tmp_path / "my_out"
    shutil.copytree(REPO / "tests" / "fixtures" / "unsloth_style", notebooks)
    export(notebooks=str(notebooks), out=str(out))
    check_export_fresh(out / "train.py")  # fresh: no error, although ./notebooks is another pipeline
    stage = notebooks / "01_finetune.ipynb"
    stage.write_text(stage.read_text().replace("max_steps = 60", "max_steps = 61"))
    with pytest.raises(NbddpError, match=f"(?s)out of date.*hint: run `python pipeline.py export --notebooks {notebooks} "
                                         f"--out {out}`"):
        check_export_fresh(out / "train.py")


@pytest.mark.e2e
def test_a_failed_smoke_never_starts_torchrun(workdir, fresh_export, launches):
    with pytest.raises(NotebookRunFailed, match="notebooks/01_prep.ipynb, cell 5, line 4: IndexError"):
        run("train_failing.py", options=LaunchOptions("2"), device="cpu")
    assert launches == []


@pytest.mark.e2e
def test_torchrun_failure_becomes_the_exit_status(workdir, fresh_export, monkeypatch):
    monkeypatch.setattr(launch, "execute", lambda plan: 3)
    with pytest.raises(LaunchFailed) as error:
        run("train_fixture.py", options=LaunchOptions("2"), device="cpu")
    assert error.value.exit_status == 3


@pytest.mark.e2e
def test_smoke_then_two_processes_then_a_summary(workdir, fresh_export, capsys):
    flags = [("learning_rate", "0.2"), ("max_steps", "5")]
    summary = run("train_fixture.py", flags=flags, options=LaunchOptions("2"), device="cpu")
    run_dir = next((workdir / "runs").iterdir())
    assert len(metric_lines(run_dir / "smoke" / "metrics.jsonl")) == 3  # the smoke keeps its own few steps
    assert len(metric_lines(run_dir / "train" / "metrics.jsonl")) == 5
    assert '"learning_rate": 0.2' in (run_dir / "smoke" / "metrics.jsonl").read_text()
    assert '"learning_rate": 0.2' in (run_dir / "train" / "metrics.jsonl").read_text()  # -p reached torchrun
    assert "train loss:" in summary and "held-out loss:" in summary and "n/a" not in summary
    assert (run_dir / "loss_curve.png").stat().st_size > 0
    assert len(list((run_dir / "logs").rglob("stdout.log"))) == 2


def test_the_summary_finds_the_adapter_and_tensorboard_logs(tmp_path):
    output_dir = tmp_path / "train"
    for adapter in ("checkpoint-10/adapter", "adapter"):
        (output_dir / adapter).mkdir(parents=True)
        (output_dir / adapter / "adapter_config.json").write_text("{}")
    (output_dir / "runs" / "Nov29").mkdir(parents=True)
    (output_dir / "runs" / "Nov29" / "events.out.tfevents.1.host").write_text("")
    summary = summarise(tmp_path, output_dir, tmp_path / "logs")
    assert f"adapter:       {output_dir / 'adapter'}\n" in summary
    assert f"tensorboard --logdir {output_dir / 'runs' / 'Nov29'}" in summary
    assert "metrics:       none" in summary


def test_the_summary_reads_every_trainers_record(tmp_path):
    # Two trainers of the script with output_dir "train": the second's record is beside its checkpoints.
    output_dir = tmp_path / "train"
    for folder, losses in ((output_dir, [3.0, 2.5]), (output_dir / "trainer-2", [2.0, 1.5, 1.25])):
        folder.mkdir(parents=True)
        records = [{"step": step, "loss": loss} for step, loss in enumerate(losses, start=1)]
        records.append({"event": "eval", "step": len(losses), "eval_loss": losses[-1] + 0.5})
        (folder / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    summary = summarise(tmp_path, output_dir, tmp_path / "logs")
    assert "train loss:    2.5000 (final step)" in summary and "held-out loss: 3.0000" in summary
    assert (f"  trainer-2:     3 steps, train loss 1.2500 (final step), held-out loss 1.7500 "
            f"({output_dir / 'trainer-2' / 'metrics.jsonl'})") in summary
    assert (tmp_path / "loss_curve.png").is_file()


def test_without_metrics_jsonl_the_summary_reads_the_last_checkpoints_trainer_state(tmp_path):
    # A notebook not written for nbddp has no MetricsCallback; Trainer's own log_history still has the losses.
    for step, loss in ((3, 9.0), (60, 5.5)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        history = [{"step": 1, "loss": 6.4}, {"step": step, "loss": loss}, {"step": step, "eval_loss": loss + 0.25}]
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        checkpoint_markers.mark_complete(tmp_path / f"checkpoint-{step}", step, world_size=2)  # as the runtime does
    summary = summarise(tmp_path, tmp_path, tmp_path / "logs")
    assert f"metrics:       {tmp_path / 'checkpoint-60' / 'trainer_state.json'} (no metrics.jsonl: losses only)" in summary
    assert "train loss:    5.5000 (final step)" in summary and "held-out loss: 5.7500" in summary
    assert "tokens/s:      n/a" in summary and (tmp_path / "loss_curve.png").is_file()


def test_the_summary_lists_the_models_the_notebook_saved_since_the_run_began(tmp_path):
    import os
    import time

    project = tmp_path / "project"
    for folder in ("lora_model", "models/tiny-llama", "runs/x-run/train/adapter", ".venv/m", "outputs/checkpoint-3"):
        (project / folder).mkdir(parents=True)
        (project / folder / "adapter_config.json").write_text("{}")
    began = time.time()
    old = began - 3600
    os.utime(project / "models" / "tiny-llama" / "adapter_config.json", (old, old))  # there before the run
    (project / "lora_model" / "adapter_config.json").write_text('{"r": 16}')  # rewritten in place by this run
    os.utime(project / "lora_model" / "adapter_config.json", (began + 1, began + 1))
    assert saved_models(project, began, project / "runs") == [Path("lora_model")]
    output_dir = project / "runs" / "x-run" / "train"
    (output_dir / "checkpoint-9" / "adapter").mkdir(parents=True)
    (output_dir / "checkpoint-9" / "adapter" / "adapter_config.json").write_text("{}")
    summary = summarise(tmp_path, output_dir, tmp_path / "logs", saved=[Path("lora_model")])
    assert "  saved by the notebook: lora_model\n" in summary


def test_the_summary_calls_a_checkpoints_adapter_so(tmp_path):
    (tmp_path / "checkpoint-60").mkdir()
    (tmp_path / "checkpoint-60" / "adapter_config.json").write_text("{}")
    summary = summarise(tmp_path, tmp_path, tmp_path / "logs")
    assert f"adapter:       {tmp_path / 'checkpoint-60'} (the last checkpoint's)" in summary


def test_the_summary_says_when_nothing_was_saved(tmp_path):
    summary = summarise(tmp_path, Path(tmp_path / "missing"), tmp_path / "logs")
    assert "adapter:       none found" in summary


def test_the_summary_splits_the_wall_time_at_the_training_runs_end(tmp_path):
    """torchrun's time is split where its `end` record says training ran; with a layout check, the smoke run's
    second training is its own phase."""
    from nbddp.orchestration.smoke.layout_check import LayoutCheck

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"event": "end", "step": 4, "train_runtime": 20.0,
                                                        "ended_at": 1070.0}) + "\n")
    times = {"began": 1000.0, "smoke": 1002.0, "launched": 1030.0, "finished": 1075.0}
    check = LayoutCheck(None, None, 0, None, 1e-4, "kept", wall_s=8.0)
    summary = summarise(tmp_path, tmp_path, tmp_path / "logs", check, wall_s=76.0, times=times)
    assert ("wall time:     76.0 s: export and checks 2.0 s, smoke 20.0 s, layout check 8.0 s, torchrun start "
            "20.0 s, training 20.0 s, saves 5.0 s\n") in summary
    (tmp_path / "metrics.jsonl").unlink()  # no end record: torchrun's time in one
    summary = summarise(tmp_path, tmp_path, tmp_path / "logs", wall_s=76.0, times=times)
    assert "wall time:     76.0 s: export and checks 2.0 s, smoke 28.0 s, torchrun 45.0 s\n" in summary


@pytest.mark.e2e
@needs_generated_script
def test_the_example_pipeline_runs_on_two_cpu_processes(repo_root, tmp_path):
    flags = [("max_steps", "4"), ("eval_steps", "2")]
    summary = run(flags=flags, options=LaunchOptions("2"), device="cpu", timeout=900, runs_root=tmp_path)
    run_dir = next(tmp_path.iterdir())
    assert len(metric_lines(run_dir / "train" / "metrics.jsonl")) == 4
    assert f"adapter:       {run_dir / 'train' / 'lora_adapter'}" in summary
    assert "tensorboard --logdir" in summary and "n/a" not in summary


def test_the_summary_shows_the_gpus_use_where_it_was_measured(tmp_path):
    steps = [{"step": s, "loss": 2.0, "tokens": 100, "tokens_per_s": 1e3, "peak_mem_gib": 1.0, "time_s": s, "mfu": m}
             for s, m in ((1, 0.10), (2, 0.30), (3, 0.32))]
    basis = {"event": "utilization", "device": "NVIDIA H100 80GB HBM3", "peak_flops_per_s": 7.5e14,
             "convention": "model FLOPs (...)"}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [basis, *steps]))
    summary = summarise(tmp_path, tmp_path, tmp_path / "logs")
    assert ("GPU use (MFU): 30.0% (median over steps) of 750 TFLOP/s, the bf16 matmul rate measured on NVIDIA H100 "
            "80GB HBM3; model FLOPs (...)\n") in summary
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({**r, "mfu": None}) + "\n" for r in steps))
    assert "MFU" not in summarise(tmp_path, tmp_path, tmp_path / "logs")  # on a CPU


def test_the_summary_shows_where_a_step_went(tmp_path):
    phases = {"between_steps_s": 0.02, "forward_backward_s": 0.3, "optimizer_s": 0.08}
    steps = [{"step": s, "loss": 2.0, "tokens": 100, "tokens_per_s": 1e3, "peak_mem_gib": 1.0, "time_s": s,
              "step_split": {"steps": 2, **phases}} for s in (2, 4, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    summary = summarise(tmp_path, tmp_path, tmp_path / "logs")
    assert ("  step time:     200 ms a step over 4 steps: forward and backward 75%, optimizer 20%, between steps "
            "(batches, logging, saves, evaluation) 5%\n") in summary
    assert set(run_module.STEP_PHASE_LABELS) == set(metrics_format.STEP_PHASES)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({**r, "step_split": None}) + "\n" for r in steps))
    assert "step time" not in summarise(tmp_path, tmp_path, tmp_path / "logs")
