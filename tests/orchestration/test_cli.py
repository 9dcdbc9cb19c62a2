"""The smoke, launch, run and regress subcommands of pipeline.py: flags in, one library call out."""

import importlib.util
from pathlib import Path

import pytest

from nbddp.orchestration.launch import LaunchOptions
from nbddp.orchestration.regress import RegressionFailed

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
