"""`--strategy ddp|fsdp|auto` on `pipeline.py launch` and `run`: checked in the parent, then the script's own
`--strategy` flag (launch) or `strategy` parameter (run: the smoke run and torchrun)."""
import textwrap

import pytest

from nbddp import cli as pipeline
from nbddp.errors import UsageError
from nbddp.orchestration import run as run_module
from nbddp.orchestration.launch import launch
from nbddp.orchestration.launch.launch import LaunchOptions
from nbddp.orchestration.run import run
from nbddp.orchestration.smoke import notebook_run

SCRIPT = textwrap.dedent("""\
    # %% tags=["parameters"]
    max_steps = 10
    output_dir = "outputs"
    # nbddp
    backend = "auto"
    strategy = "auto"

    # %%
    print(strategy)
    """)


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


@pytest.fixture
def recorded(monkeypatch):
    """Papermill runs and torchrun launches recorded instead of started."""
    calls = {"smoke": [], "launch": []}

    def run_notebook(notebook, script, params, out_dir, visible, timeout=None, progress=True, extra_env=None):
        calls["smoke"].append(params)
        return notebook_run.NotebookRun(out_dir / "train.ipynb", None, 0.1)

    monkeypatch.setattr(notebook_run, "run_notebook", run_notebook)
    monkeypatch.setattr(launch, "execute", lambda plan: calls["launch"].append(plan) or 0)
    monkeypatch.setattr(run_module, "check_export_fresh", lambda script: None)
    return calls


def test_run_gives_the_smoke_run_and_torchrun_the_strategy(script, recorded):
    run(script, options=LaunchOptions("2"), device="cpu", strategy="fsdp")
    [smoke_parameters], [plan] = recorded["smoke"], recorded["launch"]
    assert smoke_parameters["strategy"] == "fsdp"
    flags = plan.command[plan.command.index(str(script)) + 1:]
    assert flags[flags.index("--strategy") + 1] == "fsdp"


def test_launch_passes_it_as_the_scripts_flag(script, recorded):
    assert launch.launch(script, ["--max_steps", "3"], LaunchOptions("2"), strategy="ddp") == 0
    assert recorded["launch"][0].command[-5:] == [str(script), "--max_steps", "3", "--strategy", "ddp"]
    assert launch.job_script_args(["--max_steps", "3"], strategy="auto") == ["--max_steps", "3", "--strategy", "auto"]


def test_a_script_without_the_parameter_says_to_export_again(script, recorded):
    script.write_text(SCRIPT.replace('strategy = "auto"\n', ""))
    with pytest.raises(UsageError, match=r"^--strategy fsdp: the script has no `strategy` parameter \(exported by an "
                                         r"older nbddp: run `python pipeline.py export`\)$"):
        run(script, device="cpu", strategy="fsdp")


@pytest.mark.parametrize("verb", ["launch", "run"])
def test_a_bad_value_exits_2_with_one_line_naming_the_flag(script, recorded, capsys, verb):
    argv = [verb, "--script", str(script), "--strategy", "zero3"] + (["--dry-run"] if verb == "launch" else [])
    assert pipeline.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: --strategy zero3: expected one of ddp, fsdp, auto (ddp: a whole model on every "
                            "GPU; fsdp: the model sharded across them; auto: ") and error.count("\n") == 1
    assert recorded == {"smoke": [], "launch": []} and not (script.parent / "runs").exists()


def test_launch_and_run_teach_it(capsys):
    for verb in ("launch", "run"):
        with pytest.raises(SystemExit):
            pipeline.main([verb, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--strategy {ddp,fsdp,auto} how the model lies on the GPUs: ddp keeps a whole model on every GPU" in text
        assert "auto (the script's default) takes ddp when the memory estimate says one process fits" in text
        assert "e.g. --strategy fsdp" in text
