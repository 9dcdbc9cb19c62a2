"""The smoke, launch, run and regress subcommands of pipeline.py: flags in, one library call out."""

import subprocess
import sys
from pathlib import Path

import pytest

from nbddp import cli as pipeline  # pipeline.py and `python -m nbddp` call its main
from nbddp.orchestration.launch.launch import LaunchOptions
from nbddp.orchestration.launch.slurm import SlurmOptions
from nbddp.orchestration.regress.regress import RegressionFailed

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def calls(monkeypatch):
    """Replace the library functions the subcommands call; record their arguments."""
    recorded = {}

    def record(name, args, kwargs):
        recorded[name] = args
        recorded[f"{name} keywords"] = kwargs

    for name in ("smoke", "run", "regress"):
        monkeypatch.setattr(pipeline, name, lambda *args, _name=name, **kwargs: record(_name, args, kwargs))
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
    assert kwargs == {"dry_run": True, "overrides": [], "batch_layout": None, "strategy": None}


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
    def regressed(*args, **kwargs):
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


SET = ["--set", "learning_rate=1e-4", "--set", "lr_scheduler_type=cosine"]


@pytest.mark.parametrize("verb", ["smoke", "run", "regress"])
def test_set_reaches_the_library_as_lines_in_order(calls, verb):
    assert pipeline.main([verb, *SET]) == 0
    assert calls[f"{verb} keywords"]["overrides"] == ["learning_rate=1e-4", "lr_scheduler_type=cosine"]


def test_set_and_batch_layout_reach_launch(calls):
    assert pipeline.main(["launch", "--dry-run", *SET, "--batch-layout", "per-device", "--", "--max_steps", "3"]) == 7
    args, kwargs = calls["launch"]
    assert args[1] == ["--max_steps", "3"]
    assert kwargs == {"dry_run": True, "overrides": ["learning_rate=1e-4", "lr_scheduler_type=cosine"],
                      "batch_layout": "per-device", "strategy": None}


@pytest.mark.parametrize("verb", ["smoke", "run"])
def test_batch_layout_reaches_smoke_and_run(calls, verb):
    assert pipeline.main([verb, "--batch-layout", "auto"]) == 0
    assert calls[f"{verb} keywords"]["batch_layout"] == "auto"
    pipeline.main([verb])
    assert calls[f"{verb} keywords"] == {"overrides": [], "batch_layout": None, "strategy": None}  # the script's own


def test_slurm_passes_set_and_batch_layout_as_script_flags(calls):
    # The job runs later, in SLURM's environment: the script's own --set and --batch_layout flags carry them.
    assert pipeline.main(["launch", "--slurm", "--set", "bf16=false", "--batch-layout", "per-device",
                          "--strategy", "fsdp", "--", "--max_steps", "3"]) == 0
    assert calls["slurm"][1] == ["--max_steps", "3", "--batch_layout", "per-device", "--strategy", "fsdp",
                                 "--set", "bf16=false"]


@pytest.mark.parametrize("argv, message", [
    (["launch", "--dry-run", "--set", "learnin_rate=1e-4"],
     "error: --set learnin_rate=1e-4: no training argument named learnin_rate (did you mean learning_rate?)\n"),
    (["launch", "--dry-run", "--set", "bf16=maybe"], "error: --set bf16=maybe: bf16 takes a bool (true or false), "
                                                       "not 'maybe'\n"),
    (["launch", "--dry-run", "--set", "bogus"], "error: --set bogus: expected NAME=VALUE, e.g. --set learning_rate=1e-4\n"),
    (["launch", "--dry-run", "--batch-layout", "sideways"], "error: --batch-layout sideways: expected one of notebook, "
                                                             "per-device, auto or a micro batch size"),
    (["launch", "--slurm", "--set", "max_steps=1.5"], "error: --set max_steps=1.5: max_steps takes an int, not '1.5'\n"),
])
def test_bad_set_or_batch_layout_exits_2_with_one_paragraph_before_anything_runs(capsys, tmp_path, monkeypatch, argv,
                                                                                  message):
    monkeypatch.chdir(tmp_path)
    assert pipeline.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(message.split("\n")[0]) and captured.err.count("\n") == 1
    assert "would run" not in captured.out and not list(tmp_path.iterdir())  # no job script, no run folder


def test_each_verb_teaches_set_and_batch_layout(capsys):
    for verb in ("smoke", "run", "launch", "regress"):
        with pytest.raises(SystemExit):
            pipeline.main([verb, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--set NAME=VALUE override a keyword of the training arguments" in text
        assert "e.g. --set learning_rate=1e-4" in text
        assert ("e.g. --batch-layout per-device" in text) is (verb != "regress")


def test_the_command_answers_as_nbddp_and_as_pipeline_py():
    for command, prog in (([sys.executable, "-m", "nbddp"], "nbddp"), ([sys.executable, "pipeline.py"], "pipeline.py")):
        version = subprocess.run([*command, "--version"], cwd=REPO, capture_output=True, text=True)
        assert version.returncode == 0 and version.stdout.startswith("nbddp 0."), version.stderr
        usage = subprocess.run([*command, "--help"], cwd=REPO, capture_output=True, text=True).stdout
        assert usage.startswith(f"usage: {prog} [-h] [--version] {{new,export,smoke,launch,run,regress}}")


def test_the_console_command_is_declared():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"nbddp": "nbddp.cli:main"}


def test_new_writes_a_project_that_is_fresh_and_refuses_to_write_over_one(tmp_path, capsys):
    assert pipeline.main(["new", str(tmp_path / "project")]) == 0
    assert f"next: cd {tmp_path / 'project'} && nbddp run" in capsys.readouterr().out
    assert (tmp_path / "project" / "generated" / "train.py").is_file()
    assert pipeline.main(["new", str(tmp_path / "project")]) == 2
    assert "is a folder that is not empty" in capsys.readouterr().err
