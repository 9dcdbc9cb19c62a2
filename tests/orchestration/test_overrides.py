"""`--set NAME=VALUE` and `--batch-layout` in smoke, run, launch and regress: checked in the parent before any work,
then handed to the children (papermill's kernel, torchrun's workers) as NBDDP_SET and the `batch_layout` parameter."""

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nbddp import cli
from nbddp.errors import NbddpError, UsageError
from nbddp.orchestration import parameters
from nbddp.orchestration import run as run_module
from nbddp.orchestration.launch import launch
from nbddp.orchestration.launch.launch import LaunchOptions
from nbddp.orchestration.regress.regress import regress
from nbddp.orchestration.regress.suite import load_suite
from nbddp.orchestration.run import run
from nbddp.orchestration.smoke import notebook_run
from nbddp.orchestration.smoke.smoke import smoke
from nbddp.runtime.inputs.training_overrides import ENV

REPO = Path(__file__).resolve().parents[2]

# Shaped like a script exported by an nbddp that has the batch_layout parameter; it records what it was given.
SCRIPT = textwrap.dedent("""\
    # %% tags=["parameters"]
    max_steps = 10
    output_dir = "outputs"
    # nbddp
    backend = "auto"
    batch_layout = "notebook"

    # %%
    import json, os, sys
    from nbddp import runtime
    runtime.apply_flags(globals(), defined_in={"max_steps": "01_x.ipynb", "output_dir": "01_x.ipynb",
                                               "backend": "nbddp", "batch_layout": "nbddp"})
    os.makedirs(output_dir, exist_ok=True)
    seen = {"NBDDP_SET": os.environ.get("NBDDP_SET"), "batch_layout": batch_layout, "max_steps": max_steps}
    with open(os.path.join(output_dir, f"seen-{os.environ.get('RANK', 'kernel')}.json"), "w") as file:
        json.dump(seen, file)
    """)


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV, "")  # put back as it was after the test
    monkeypatch.delenv(ENV)
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def notebook_runs(monkeypatch):
    """Record papermill runs instead of starting them."""
    calls = []

    def run_notebook(notebook, script, params, out_dir, visible, timeout=None, progress=True, extra_env=None):
        calls.append({"parameters": params, "extra_env": extra_env or {}})
        return notebook_run.NotebookRun(Path(out_dir) / "train.ipynb", None, 0.1)

    monkeypatch.setattr(notebook_run, "run_notebook", run_notebook)
    return calls


@pytest.fixture
def launches(monkeypatch):
    """Record torchrun launches instead of running them."""
    plans = []
    monkeypatch.setattr(launch, "execute", lambda plan: plans.append(plan) or 0)
    return plans


SET = ["learning_rate=1e-4", "lr_scheduler_type=cosine"]


# smoke


def test_smoke_gives_the_kernel_nbddp_set_and_the_batch_layout_parameter(script, notebook_runs, capsys):
    smoke(script, device="cpu", overrides=SET, batch_layout="per-device")
    [call] = notebook_runs
    assert call["extra_env"][ENV] == "learning_rate=1e-4\nlr_scheduler_type=cosine"
    assert call["parameters"]["batch_layout"] == "per-device" and call["parameters"]["max_steps"] == 3
    assert "NBDDP_SET='learning_rate=1e-4\\nlr_scheduler_type=cosine'" in capsys.readouterr().out


def test_smoke_without_them_passes_neither(script, notebook_runs):
    smoke(script, device="cpu")
    [call] = notebook_runs
    assert ENV not in call["extra_env"] and "batch_layout" not in call["parameters"]


@pytest.mark.parametrize("overrides, batch_layout, message", [
    (["learnin_rate=1e-4"], None, "--set learnin_rate=1e-4: no training argument named learnin_rate "
                                  "(did you mean learning_rate?)"),
    (["bf16=maybe"], None, "--set bf16=maybe: bf16 takes a bool (true or false), not 'maybe'"),
    (["bogus"], None, "--set bogus: expected NAME=VALUE"),
    ([], "sideways", "--batch-layout sideways: expected one of notebook, per-device, auto or a micro batch size"),
])
def test_smoke_refuses_bad_input_before_any_run_folder(script, notebook_runs, overrides, batch_layout, message):
    with pytest.raises(UsageError) as error:
        smoke(script, device="cpu", overrides=overrides, batch_layout=batch_layout)
    assert str(error.value).startswith(message) and error.value.exit_status == 2
    assert notebook_runs == [] and not (script.parent / "runs").exists()


def test_batch_layout_needs_a_script_that_has_the_parameter(script, notebook_runs):
    script.write_text(SCRIPT.replace('batch_layout = "notebook"\n', ""))
    with pytest.raises(UsageError, match=r"^--batch-layout auto: the script has no `batch_layout` parameter "
                                         r"\(exported by an older nbddp: run `python pipeline.py export`\)$"):
        smoke(script, device="cpu", batch_layout="auto")


def test_a_bad_line_already_in_the_environment_is_refused_too(script, notebook_runs, monkeypatch):
    monkeypatch.setenv(ENV, "learnin_rate=1")
    with pytest.raises(UsageError, match=r"^NBDDP_SET line learnin_rate=1: no training argument named learnin_rate"):
        smoke(script, device="cpu")


def test_the_flags_lines_follow_the_environments(script, notebook_runs, monkeypatch):
    monkeypatch.setenv(ENV, "seed=3\nlearning_rate=5e-4")
    smoke(script, device="cpu", overrides=["learning_rate=1e-4"])
    assert notebook_runs[0]["extra_env"][ENV] == "seed=3\nlearning_rate=5e-4\nlearning_rate=1e-4"  # the last one wins


def test_smoke_takes_the_strategy_as_run_and_launch_do(script, notebook_runs, capsys):
    script.write_text(SCRIPT.replace('batch_layout = "notebook"\n', 'batch_layout = "notebook"\nstrategy = "auto"\n'))
    assert cli.main(["smoke", "--script", str(script), "--device", "cpu", "--strategy", "ddp"]) == 0
    assert notebook_runs[0]["parameters"]["strategy"] == "ddp"
    assert cli.main(["smoke", "--script", str(script), "--device", "cpu", "--strategy", "sideways"]) == 2
    assert capsys.readouterr().err.startswith("error: --strategy sideways: expected one of ddp, fsdp, auto")
    assert len(notebook_runs) == 1


# run


def test_run_gives_both_the_smoke_and_torchrun_the_overrides(script, notebook_runs, launches, monkeypatch):
    monkeypatch.setattr(run_module, "check_export_fresh", lambda script: None)
    run(script, options=LaunchOptions("2"), device="cpu", overrides=SET, batch_layout="per-device")
    [smoke_call], [plan] = notebook_runs, launches
    assert smoke_call["extra_env"][ENV] == plan.env_additions[ENV] == "learning_rate=1e-4\nlr_scheduler_type=cosine"
    assert smoke_call["parameters"]["batch_layout"] == "per-device"
    flags = plan.command[plan.command.index(str(script)) + 1:]
    assert flags[flags.index("--batch_layout") + 1] == "per-device"


def test_run_with_auto_smokes_both_layouts_and_launches_the_notebooks_without_proof(script, notebook_runs, launches,
                                                                                 monkeypatch):
    """One smoke process trains both layouts (the runtime's smoke_layout_check, told by NBDDP_LAYOUT_CHECK where
    the notebook layout's metrics go); a fake one writes none, so nothing is proven."""
    monkeypatch.setattr(run_module, "check_export_fresh", lambda script: None)
    run(script, options=LaunchOptions("2"), device="cpu", overrides=SET, batch_layout="auto")
    [smoke_call], [plan] = notebook_runs, launches
    assert smoke_call["parameters"]["batch_layout"] == "auto"
    assert smoke_call["extra_env"]["NBDDP_PLAN_PROCESSES"] == "2" and smoke_call["extra_env"][ENV] == plan.env_additions[ENV]
    assert smoke_call["extra_env"]["NBDDP_LAYOUT_CHECK"].endswith("metrics-notebook-layout.jsonl")
    flags = plan.command[plan.command.index(str(script)) + 1:]
    assert flags[flags.index("--batch_layout") + 1] == "notebook"  # these fake runs wrote no metrics: nothing proven


def test_run_checks_before_the_smoke(script, notebook_runs, launches, monkeypatch):
    monkeypatch.setattr(run_module, "check_export_fresh", lambda script: None)
    with pytest.raises(UsageError, match="max_steps takes an int"):
        run(script, device="cpu", overrides=["max_steps=ten"])
    assert notebook_runs == [] and launches == [] and not (script.parent / "runs").exists()


# launch


def test_launch_gives_the_workers_nbddp_set_and_the_script_batch_layout(script, launches):
    assert launch.launch(script, ["--max_steps", "3"], LaunchOptions("2"), overrides=SET, batch_layout="per-device") == 0
    [plan] = launches
    assert plan.env_additions[ENV] == "learning_rate=1e-4\nlr_scheduler_type=cosine"
    assert plan.command[-5:] == [str(script), "--max_steps", "3", "--batch_layout", "per-device"]


def test_launch_dry_run_shows_the_variable(script, capsys):
    assert launch.launch(script, [], LaunchOptions("2"), dry_run=True, overrides=["bf16=false"]) == 0
    assert "NBDDP_SET=bf16=false " in capsys.readouterr().out


def test_a_slurm_job_passes_them_as_the_scripts_own_flags():
    assert launch.job_script_args(["--max_steps", "3"], ["bf16=false", "seed=2"], "4") == [
        "--max_steps", "3", "--batch_layout", "4", "--set", "bf16=false", "--set", "seed=2"]
    with pytest.raises(UsageError, match="--set seed=two: seed takes an int"):
        launch.job_script_args([], ["seed=two"])


# regress

SUITE = textwrap.dedent("""\
    script: train.py
    cases:
      - name: tuned
        mode: torchrun
        nproc: 2
        params: {max_steps: 2}
        set: {learning_rate: 1.0e-4, bf16: false, label_names: [labels, ids]}
      - name: plain
        mode: torchrun
        nproc: 2
        params: {max_steps: 2}
""")


def fake_torchrun_cases(monkeypatch):
    """Each torchrun case's plan recorded, and metrics written where its output_dir points."""
    plans = []

    def execute(plan):
        plans.append(plan)
        output_dir = Path(plan.script_args[plan.script_args.index("--output_dir") + 1])
        (output_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n')
        return 0

    monkeypatch.setattr(launch, "execute", execute)
    return plans


def test_a_case_takes_its_own_set_and_the_command_lines_on_top(script, monkeypatch):
    plans = fake_torchrun_cases(monkeypatch)
    (script.parent / "suite.yaml").write_text(SUITE)
    regress("suite.yaml", update_baseline=True, overrides=["learning_rate=3e-4"])
    tuned, plain = (plan.env_additions.get(ENV) for plan in plans)
    assert tuned == "learning_rate=0.0001\nbf16=false\nlabel_names=labels ids\nlearning_rate=3e-4"
    assert plain == "learning_rate=3e-4"


def test_a_bad_case_set_stops_before_any_run(script, monkeypatch):
    plans = fake_torchrun_cases(monkeypatch)
    (script.parent / "suite.yaml").write_text(SUITE.replace("bf16: false", "bf16: maybe"))
    with pytest.raises(UsageError, match=r"^--suite suite.yaml: case tuned: set bf16=maybe: bf16 takes a bool "
                                         r"\(true or false\), not 'maybe'$"):
        regress("suite.yaml")
    assert plans == [] and not (script.parent / "runs").exists()


def test_a_bad_command_line_set_stops_regress_before_any_run(script, monkeypatch):
    plans = fake_torchrun_cases(monkeypatch)
    (script.parent / "suite.yaml").write_text(SUITE)
    with pytest.raises(UsageError, match="^--set learnin_rate=1: no training argument named learnin_rate"):
        regress("suite.yaml", overrides=["learnin_rate=1"])
    assert plans == [] and not (script.parent / "runs").exists()


def test_the_suite_reads_set_as_a_mapping(tmp_path):
    (tmp_path / "suite.yaml").write_text(SUITE)
    tuned, plain = load_suite(tmp_path / "suite.yaml").cases
    assert tuned.overrides == {"learning_rate": 1e-4, "bf16": False, "label_names": ["labels", "ids"]}
    assert plain.overrides == {}
    assert parameters.suite_override_lines(tuned.overrides) == [
        "learning_rate=0.0001", "bf16=false", "label_names=labels ids"]
    (tmp_path / "suite.yaml").write_text(SUITE.replace("set: {learning_rate: 1.0e-4, bf16: false, label_names: "
                                                       "[labels, ids]}", "set: [learning_rate]"))
    with pytest.raises(UsageError, match=r"case tuned: `set` must map training argument names to values"):
        load_suite(tmp_path / "suite.yaml")


# the parameters helpers


@pytest.mark.parametrize("text, word", [("notebook", "notebook"), ("Per-Device", "per-device"), ("auto", "auto"),
                                        ("4", "4")])
def test_batch_layouts(text, word):
    assert parameters.checked_batch_layout(text) == word
    assert parameters.batch_layout_flags(text) == ["--batch_layout", word]
    assert parameters.with_batch_layout({"batch_layout": "notebook"}, {"seed": 1}, text) == {"seed": 1,
                                                                                           "batch_layout": word}


@pytest.mark.parametrize("text", ["per_device", "0", "-1", "fast"])
def test_bad_batch_layouts(text):
    with pytest.raises(UsageError, match=f"^--batch-layout {text}: expected one of notebook, per-device, auto"):
        parameters.checked_batch_layout(text)


def test_no_overrides_no_variable():
    assert parameters.training_overrides_environment([], environ={}) == {}
    assert parameters.training_overrides_environment([], environ={ENV: "seed=1"}) == {ENV: "seed=1"}
    assert parameters.training_overrides_environment(["seed=2"], ["seed=3"], environ={ENV: "seed=1"}) == {
        ENV: "seed=1\nseed=2\nseed=3"}


# through the real children


@pytest.mark.e2e
def test_the_kernel_and_the_workers_see_the_overrides(script, monkeypatch):
    monkeypatch.setattr(run_module, "check_export_fresh", lambda script: None)
    run(script, options=LaunchOptions("2"), device="cpu", overrides=SET, batch_layout="per-device", timeout=120)
    run_dir = next((script.parent / "runs").iterdir())
    expected = "learning_rate=1e-4\nlr_scheduler_type=cosine"
    kernel = json.loads((run_dir / "smoke" / "seen-kernel.json").read_text())
    assert kernel == {"NBDDP_SET": expected, "batch_layout": "per-device", "max_steps": 3}
    for rank in (0, 1):
        worker = json.loads((run_dir / "train" / f"seen-{rank}.json").read_text())
        assert worker == {"NBDDP_SET": expected, "batch_layout": "per-device", "max_steps": 10}


@pytest.mark.e2e
def test_the_scripts_own_set_joins_the_environments_under_torchrun(script):
    # The path a SLURM job takes: `--set` on the script itself, after torchrun.
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                             str(script), "--set", "bf16=false", "--batch_layout", "auto", "--output_dir", "out"],
                            env={**os.environ, ENV: "seed=4", "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads((script.parent / "out" / "seen-0.json").read_text())
    assert seen == {"NBDDP_SET": "seed=4\nbf16=false", "batch_layout": "auto", "max_steps": 10}


def test_the_parent_checks_without_importing_transformers(tmp_path):
    # On a GPU host importing transformers' TrainingArguments initialises CUDA (seen on an H200): on a stack the
    # package ships no schema for, the first check runs in a child that sees no GPU and writes the training arguments'
    # schema into the cache; the parent imports neither torch's CUDA nor transformers for it. The next check reads
    # that schema: the same message, and no child.
    code = ("import resource, sys; from nbddp.orchestration import parameters\n"
            f"import pathlib; parameters.training_overrides.SHIPPED = pathlib.Path({str(tmp_path / 'shipped')!r})\n"
            "try:\n"
            "    parameters.check_overrides([('--set', ['learning_rate=1e-4', 'bf16=true']), ('--set', ['seed=-1'])],\n"
            "                               environ={})\n"
            "except parameters.UsageError as error:\n"
            "    print(error)\n"
            "children = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "seconds = children.ru_utime + children.ru_stime\n"
            "print(sorted(m for m in ('transformers', 'trl') if m in sys.modules), seconds)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    for result in runs:
        assert result.returncode == 0, result.stderr
        message, imported = result.stdout.splitlines()
        assert message == "--set seed=-1: seed takes a whole number from 0 to 4294967295, not '-1'"
        assert imported.startswith("[] ")
    assert [path.parent.name for path in tmp_path.rglob("*.json")] == ["training-arguments"]
    # The first started a child that imported transformers; the second read the schema and started none (the CPU
    # time of children, not wall time: a busy machine cannot make it fail).
    assert float(runs[0].stdout.split()[-1]) > 0 and float(runs[1].stdout.split()[-1]) == 0


def test_a_pinned_stacks_first_check_reads_the_shipped_schema(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached yet
    monkeypatch.setattr(parameters.subprocess, "run", lambda *args, **kwargs: pytest.fail("a child was started"))
    with pytest.raises(UsageError, match=r"^--set learnin_rate=1e-4: no training argument named learnin_rate \(did "
                                         r"you mean learning_rate\?\)$"):
        parameters.check_overrides([("--set", ["learning_rate=1e-4", "learnin_rate=1e-4"])], environ={})


def test_a_set_typo_on_a_new_machine_is_refused_within_3_s(tmp_path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "pipeline.py", "run", "--set", "learnin_rate=1e-4"], cwd=REPO,
                            env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}, capture_output=True, text=True,
                            timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds (its children's too), not wall time, which the suite's parallel workers stretch; a child importing
    # transformers for the check takes 6 s of them
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 3
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("error: --set learnin_rate=1e-4: no training argument named learnin_rate (did you mean "
                             "learning_rate?)\n")
    assert not list(tmp_path.rglob("*"))  # no child wrote a schema into the cache


def test_a_check_that_cannot_run_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no schema cached or shipped: the child runs
    monkeypatch.setattr(parameters.training_overrides, "SHIPPED", tmp_path / "shipped")
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr="Traceback ...\nImportError: no module named trl\n")
    monkeypatch.setattr(parameters.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(NbddpError, match=r"^checking the --set overrides failed \(exit status 1\): ImportError: no "
                                         r"module named trl$") as error:
        parameters.check_overrides([("--set", ["seed=1"])], environ={})
    assert not isinstance(error.value, UsageError)


def test_nothing_to_check_starts_no_child(monkeypatch):
    monkeypatch.setattr(parameters.subprocess, "run", lambda *args, **kwargs: pytest.fail("a child was started"))
    parameters.check_overrides([("--set", [])], environ={})
    assert parameters.checked_overrides_environment([], environ={}) == {}
