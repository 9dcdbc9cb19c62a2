"""The smoke, launch, run and regress subcommands of pipeline.py: flags in, one library call out."""

import importlib.util
from pathlib import Path

import pytest

from nbddp.orchestration.launch import LaunchOptions
from nbddp.orchestration.regress import RegressionFailed
from nbddp.orchestration.slurm import SlurmOptions

_spec = importlib.util.spec_from_file_location("pipeline", Path(__file__).parents[2] / "pipeline.py")
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


@pytest.fixture
def calls(monkeypatch):
    """Replace the library functions the subcommands call; record their arguments."""
    recorded = {}
    for name in ("smoke", "run", "regress"):
        monkeypatch.setattr(pipeline, name, lambda *args, _name=name: recorded.setdefault(_name, args))
    monkeypatch.setattr(pipeline, "launch", lambda *args, **kwargs: recorded.setdefault("launch", (args, kwargs)) and 7)
    monkeypatch.setattr(pipeline, "write_job_script", lambda *args: recorded.setdefault("slurm", args))
    return recorded


def test_smoke_passes_parameters_device_and_timeout(calls):
    status = pipeline.main(["smoke", "-p", "max_steps", "5", "-p", "lr", "1e-4", "-f", "p.yaml", "--device", "cpu",
                            "--timeout", "60"])
    assert status == 0
    assert calls["smoke"] == ("generated/train.py", [["max_steps", "5"], ["lr", "1e-4"]], "p.yaml", "cpu", 60)


def test_launch_passes_the_world_and_the_script_flags_and_returns_torchrun_status(calls):
    status = pipeline.main(["launch", "--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1",
                            "--rdzv-endpoint", "head:29500", "--dry-run", "--", "--max_steps", "3"])
    args, kwargs = calls["launch"]
    assert status == 7
    assert args == ("generated/train.py", ["--max_steps", "3"], LaunchOptions("4", 2, 1, "head:29500", "nbddp"))
    assert kwargs == {"dry_run": True}


def test_run_takes_launch_and_parameter_options(calls):
    assert pipeline.main(["run", "--nproc-per-node", "2", "-p", "seed", "1"]) == 0
    script, flags, params_file, options, device, timeout = calls["run"]
    assert (flags, options.nproc, device, timeout) == ([["seed", "1"]], "2", None, 1800)


def test_regress_passes_suite_only_and_update(calls):
    assert pipeline.main(["regress", "--suite", "s.yaml", "--only", "a", "--update-baseline"]) == 0
    assert calls["regress"] == ("s.yaml", "a", True)


def test_bad_launch_options_exit_2_naming_the_flag(capsys):
    assert pipeline.main(["launch", "--dry-run", "--nnodes", "2"]) == 2
    assert "--nnodes 2: several nodes need --rdzv-endpoint" in capsys.readouterr().err


def test_a_regression_exits_1_with_its_message(monkeypatch, capsys):
    def regressed(*args):
        raise RegressionFailed("regression:\n  case a: final_train_loss 1 -> 2 (WORSE, tolerance 1%)")

    monkeypatch.setattr(pipeline, "regress", regressed)
    assert pipeline.main(["regress"]) == 1
    assert "case a: final_train_loss" in capsys.readouterr().err


def test_launch_dry_run_prints_the_command_end_to_end(capsys):
    assert pipeline.main(["launch", "--dry-run", "--nproc-per-node", "2", "--", "--max_steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "-m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 generated/train.py --max_steps 3" in out


def test_max_restarts_reaches_torchrun_from_launch_and_run(calls):
    pipeline.main(["launch", "--max-restarts", "2", "--dry-run"])
    args, _ = calls["launch"]
    assert args[2].max_restarts == 2
    pipeline.main(["run", "--max-restarts", "1"])
    assert calls["run"][3].max_restarts == 1


def test_slurm_writes_a_job_script_instead_of_launching(calls):
    status = pipeline.main(["launch", "--slurm", "--nodes", "2", "--gpus-per-node", "8", "--cpus-per-node", "64",
                            "--job-name", "sft", "--time", "04:00:00", "--partition", "gpu", "--max-restarts", "1",
                            "-o", "jobs/sft.sbatch", "--", "--max_steps", "3"])
    assert status == 0 and "launch" not in calls
    assert calls["slurm"] == ("generated/train.py", ["--max_steps", "3"],
                              SlurmOptions(2, 8, "sft", "04:00:00", "gpu", 64, 1), "jobs/sft.sbatch")


def test_slurm_defaults(calls):
    assert pipeline.main(["launch", "--slurm"]) == 0
    assert calls["slurm"] == ("generated/train.py", [], SlurmOptions(), pipeline.DEFAULT_JOB_SCRIPT)


@pytest.mark.parametrize("argv, message", [
    (["--slurm", "--nproc-per-node", "4"], "--nproc-per-node: not used with --slurm (SLURM places the processes"),
    (["--slurm", "--nodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1"], "--node-rank, --rdzv-endpoint: not used with --slurm"),
    (["--slurm", "--dry-run"], "--dry-run: not used with --slurm"),
    (["--partition", "gpu", "-o", "x.sbatch"], "--partition, --output: not used without --slurm"),
])
def test_flags_of_the_other_mode_are_refused(calls, capsys, argv, message):
    assert pipeline.main(["launch", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not calls
