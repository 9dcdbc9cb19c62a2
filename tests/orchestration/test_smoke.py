import json
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from nbddp.errors import UsageError
from nbddp.orchestration.smoke.notebook_run import NotebookRunFailed
from nbddp.orchestration.smoke.smoke import smoke
from nbddp.orchestration.smoke.smoke_run import smoke_environment, smoke_steps

from .conftest import metric_lines, needs_generated_script

pytestmark = pytest.mark.e2e


def test_a_smoke_run_keeps_notebook_html_params_and_metrics(workdir):
    result = smoke("train_fixture.py", flags=[("learning_rate", "0.5")], device="cpu", timeout=120)
    assert result.run_dir.parent == workdir / "runs" and result.run_dir.name.endswith("-smoke")
    assert {path.name for path in result.run_dir.iterdir()} >= {
        "train_fixture.ipynb", "train_fixture.html", "params.json", "metrics.jsonl"}
    params = json.loads((result.run_dir / "params.json").read_text())
    assert params == {"max_steps": 3, "output_dir": str(result.run_dir), "learning_rate": 0.5}
    assert [record["step"] for record in metric_lines(result.metrics)] == [1, 2, 3]  # the smoke's few steps
    executed = nbformat.read(result.executed, as_version=4)
    injected = [cell for cell in executed.cells if "injected-parameters" in cell.metadata.get("tags", [])]
    assert "learning_rate = 0.5" in injected[0].source
    assert "train_fixture" in result.html.read_text()
    # The kernel ran this interpreter and saw no GPU.
    seen = json.loads((result.run_dir / "env.json").read_text())
    assert seen["python"] == sys.executable and seen["cuda_visible_devices"] == ""


def test_the_users_values_win_over_the_smoke_defaults(workdir):
    (workdir / "params.yaml").write_text("max_steps: 5\nlearning_rate: 0.1\n")
    result = smoke("train_fixture.py", flags=[("max_steps", "2")], params_file="params.yaml", device="cpu")
    assert result.parameters["max_steps"] == 2 and result.parameters["learning_rate"] == 0.1
    assert len(metric_lines(result.metrics)) == 2


def test_a_script_without_max_steps_and_output_dir_parameters_gets_them_through_the_environment(workdir, capsys):
    # A notebook not written for nbddp: `max_steps = 60` (or epochs) and `output_dir = "outputs"` sit in SFTConfig,
    # which export turns into ddp.max_steps(60) and ddp.output_dir("outputs"); the smoke run must take a few steps,
    # not the notebook's whole training, and write into its run folder, not beside the training run's checkpoints.
    (workdir / "unsloth_notebook.py").write_text(textwrap.dedent("""\
        # %% tags=["parameters"]
        backend = "auto"  # what export gives every script

        # %%
        from nbddp.runtime.context import DistributedContext
        ddp = DistributedContext()
        print("steps:", ddp.max_steps(60), ddp.max_steps(-1), "into:", ddp.output_dir("outputs"))
        """))
    result = smoke("unsloth_notebook.py", device="cpu", timeout=60)
    assert f"parameters {{}}; NBDDP_MAX_STEPS=3; NBDDP_OUTPUT_DIR={result.run_dir}\n" in capsys.readouterr().out
    outputs = [output for cell in nbformat.read(result.executed, as_version=4).cells for output in cell.get("outputs", [])]
    assert f"steps: 3 3 into: {result.run_dir}\n" in [output.get("text") for output in outputs]


def test_what_the_notebook_saves_lands_in_the_smoke_folder_and_what_else_it_changes_is_named(workdir, capsys):
    # NBDDP_SMOKE_DIR (run_smoke sets it to the run folder) makes the runtime redirect saves (smoke_sandbox); what
    # it cannot redirect (a shell command) the smoke run names afterwards.
    tiny_llama = Path(__file__).parents[2] / "models" / "tiny-llama"
    (workdir / "notes.txt").write_text("the user's\n")
    (workdir / "saves.py").write_text(textwrap.dedent(f"""\
        # %% tags=["parameters"]
        backend = "hf"

        # %%
        from nbddp import runtime
        ddp = runtime.setup(globals(), backend=backend, script=None)
        import torch
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained({str(tiny_llama)!r}).save_pretrained("lora_model")
        ddp.write_file("lora_model/TRAINING.md", "adapters\\n")
        torch.save({{"step": 3}}, "state.pt")
        with open("notes.txt", "a") as notes:
            notes.write("smoke\\n")
        with open("lora_model/TRAINING.md") as readme:  # what this run wrote, read back
            assert readme.read() == "adapters\\n"
        assert AutoTokenizer.from_pretrained("lora_model").vocab_size > 0 and torch.load("state.pt") == {{"step": 3}}
        ddp.shell("mkdir -p made && echo x >> made/NOTES.txt")
        """))
    before = sorted(path.name for path in workdir.iterdir())
    result = smoke("saves.py", device="cpu", timeout=120)
    assert sorted(path.name for path in workdir.iterdir()) == sorted([*before, "runs", "made"])
    assert (workdir / "notes.txt").read_text() == "the user's\n"
    assert (result.run_dir / "lora_model" / "tokenizer.json").is_file()
    assert (result.run_dir / "lora_model" / "TRAINING.md").read_text() == "adapters\n"
    assert (result.run_dir / "notes.txt").read_text() == "the user's\nsmoke\n"
    assert (result.run_dir / "state.pt").is_file()
    assert (f"smoke: the notebook changed 2 path(s) in {workdir} outside runs/, which nbddp does not redirect (`!` "
            "commands, os.makedirs, Path.write_text): made (created), made/NOTES.txt (created). The training run "
            "will do it again.") in capsys.readouterr().err


def test_the_environment_caps_the_steps_and_leaves_output_dir_to_the_scripts_parameter_or_the_users_setting():
    run_dir = Path("runs/x-smoke")
    assert smoke_environment({"backend": "auto"}, run_dir, environ={}) == {
        "NBDDP_MAX_STEPS": "3", "NBDDP_OUTPUT_DIR": "runs/x-smoke"}
    # the cap holds with a max_steps parameter too: the notebook may train by epochs whatever it says
    assert smoke_environment({"max_steps": 60, "output_dir": "out"}, run_dir, environ={}, steps=5) == {
        "NBDDP_MAX_STEPS": "5"}
    assert smoke_environment({}, run_dir, environ={"NBDDP_MAX_STEPS": "10", "NBDDP_OUTPUT_DIR": "mine"}) == {}


@pytest.mark.parametrize("injected, steps", [({"max_steps": 3}, 3), ({"max_steps": 7}, 7), ({"max_steps": -1}, 3),
                                             ({}, 3)])
def test_a_smoke_run_trains_its_max_steps_when_that_is_a_count_else_three(injected, steps):
    assert smoke_steps(injected) == steps


def test_a_smoke_run_by_epochs_is_capped_and_says_so(workdir, capsys):
    (workdir / "by_epochs.py").write_text(textwrap.dedent("""\
        # %% tags=["parameters"]
        max_steps = 300

        # %%
        from nbddp.runtime.context import DistributedContext
        print("steps:", DistributedContext().max_steps(max_steps))
        """))
    result = smoke("by_epochs.py", flags=[("max_steps", "-1")], device="cpu", timeout=60)
    captured = capsys.readouterr()
    assert ("smoke: training stops after 3 steps, whatever max_steps (-1) or the notebook's epochs say: a smoke run "
            "is short; the training run takes them\n") in captured.out
    outputs = [output for cell in nbformat.read(result.executed, as_version=4).cells for output in cell.get("outputs", [])]
    assert "steps: 3\n" in [output.get("text") for output in outputs]


def test_a_smoke_run_refuses_max_steps_below_one_before_it_starts(workdir):
    with pytest.raises(UsageError, match="-p max_steps: expected 1 or more optimizer steps, or -1 to train for "
                                         "num_train_epochs, not -5"):
        smoke("train_fixture.py", flags=[("max_steps", "-5")], device="cpu")
    assert not (workdir / "runs").exists()


def test_a_failing_cell_is_reported_at_its_source_notebook_line(workdir):
    with pytest.raises(NotebookRunFailed) as error:
        smoke("train_failing.py", device="cpu")
    failure = error.value
    # train_failing.sourcemap.json maps the script's `return table[n]` to notebooks/01_prep.ipynb cell 5 line 4.
    assert (failure.notebook, failure.cell, failure.line) == ("notebooks/01_prep.ipynb", 5, 4)
    assert failure.message == "IndexError: list index out of range"
    assert failure.exit_status == 1
    executed, log = failure.hint.removeprefix("executed notebook: ").split("; papermill's output: ")
    assert executed.endswith("train_failing.ipynb") and (workdir / executed).exists()
    assert "IndexError" in (workdir / log).read_text()


def test_bad_parameters_stop_before_any_run(workdir):
    with pytest.raises(UsageError, match="-p max_step: unknown parameter `max_step`"):
        smoke("train_fixture.py", flags=[("max_step", "3")])
    with pytest.raises(UsageError, match=r"-p max_steps: invalid int value: 'three'"):
        smoke("train_fixture.py", flags=[("max_steps", "three")])
    assert not (workdir / "runs").exists()


@needs_generated_script
def test_the_example_pipeline_smokes_on_cpu(repo_root, tmp_path):
    result = smoke(flags=[("eval_steps", "2")], device="cpu", timeout=900, runs_root=tmp_path)
    assert [record["step"] for record in metric_lines(result.metrics)] == [1, 2, 3]
    assert (result.run_dir / "lora_adapter" / "adapter_config.json").exists()


@needs_generated_script
def test_a_bad_data_path_is_reported_in_the_data_prep_notebook(repo_root, tmp_path):
    with pytest.raises(NotebookRunFailed) as error:
        smoke(flags=[("data_path", "../data/missing.jsonl")], device="cpu", timeout=900, runs_root=tmp_path)
    failure = error.value
    # The source cell imports, leaves a blank line, then checks the path; the generated script wrapped the
    # cell in `with ddp.main_process_first():`, so the line numbers differ there.
    assert failure.notebook == "notebooks/01_data_prep.ipynb"
    assert failure.message == "DataError: data file '../data/missing.jsonl': no such file"
    assert failure.exit_status == 2  # nbddp's own bad-input error, raised in a cell: still bad input
    notebook = nbformat.read(repo_root / failure.notebook, as_version=4)
    failing_line = notebook.cells[failure.cell - 1].source.splitlines()[failure.line - 1]
    assert failing_line == "require_file(data_path)"
