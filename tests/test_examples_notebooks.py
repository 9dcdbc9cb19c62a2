"""The example stage notebooks (notebooks/) and the Unsloth-style fixture: paired, annotated, exportable."""
import ast
from pathlib import Path

import jupytext
import nbformat
import pytest

from nbddp.export import export

REPO = Path(__file__).resolve().parent.parent
STAGES = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
UNSLOTH_STYLE = REPO / "tests" / "fixtures" / "unsloth_style"
NOTEBOOKS = STAGES + sorted(UNSLOTH_STYLE.glob("*.ipynb"))
DESIGN_TAGS = {"parameters", "notebook-only", "rank0", "main-process-first"}  # docs/design.md


def ids(paths):
    return [path.relative_to(REPO).as_posix() for path in paths]


def code_cells(path):
    return [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


def parameter_defaults(path):
    """{name: default} of the notebook's `parameters` cells."""
    defaults = {}
    for cell in code_cells(path):
        if "parameters" in cell.metadata.get("tags", []):
            for statement in ast.parse(cell.source).body:
                target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
                defaults[target.id] = ast.literal_eval(statement.value)
    return defaults


def test_the_example_pipeline_has_three_stages():
    assert [path.name for path in STAGES] == ["01_data_prep.ipynb", "02_lora_setup.ipynb", "03_train.ipynb"]
    assert [path.name for path in UNSLOTH_STYLE.glob("*.ipynb")] == ["01_finetune.ipynb"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_paired_percent_script_is_in_sync(notebook):
    paired = notebook.with_suffix(".py")
    assert paired.is_file(), f"missing {paired.name}: jupytext --set-formats ipynb,py:percent {notebook.name}"
    expected = jupytext.writes(jupytext.read(notebook), fmt="py:percent")
    assert paired.read_text(encoding="utf-8") == expected, f"run: jupytext --sync {notebook.relative_to(REPO)}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_pairing_and_kernelspec_metadata(notebook):
    metadata = nbformat.read(notebook, as_version=4).metadata
    assert metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert metadata["kernelspec"]["name"] == "python3"
    assert metadata["kernelspec"]["language"] == "python"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_only_known_tags_and_no_outputs(notebook):
    cells = nbformat.read(notebook, as_version=4).cells
    used = {tag for cell in cells for tag in cell.metadata.get("tags", [])}
    assert used <= DESIGN_TAGS
    assert "parameters" in used
    assert all(not cell.get("outputs") and cell.get("execution_count") is None for cell in code_cells(notebook))


def test_each_stage_runs_alone_in_jupyter():
    """01 sets the runtime up; each later stage first runs the one before it (notebook-only cells)."""
    first_cells = [code_cells(path)[0] for path in STAGES]
    assert all(cell.metadata.get("tags") == ["notebook-only"] for cell in first_cells)
    assert "runtime.setup(" in first_cells[0].source
    for previous, cell in zip(STAGES, first_cells[1:]):
        assert f"%run {previous.name}" in cell.source.splitlines()


def test_parameters_cover_what_orchestration_and_benchmarks_set():
    defaults = {}
    for path in STAGES:
        names = parameter_defaults(path)
        assert not names.keys() & defaults.keys(), f"{path.name} redefines a parameter of an earlier stage"
        defaults.update(names)
    assert defaults["model_name"] == "../models/tiny-llama"  # from notebooks/, where the cells run
    assert defaults["data_path"] == "../data/tiny_instructions.jsonl"
    assert (REPO / "notebooks" / defaults["model_name"] / "config.json").is_file()
    assert (REPO / "notebooks" / defaults["data_path"]).is_file()
    assert defaults["load_in_4bit"] is False  # QLoRA only where bitsandbytes runs: set it on a GPU
    assert defaults["output_dir"] == "../outputs"
    for name in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "seed", "eval_rows"):
        assert isinstance(defaults[name], int) and defaults[name] > 0, name


def test_unsloth_style_fixture_parameters():
    assert parameter_defaults(UNSLOTH_STYLE / "01_finetune.ipynb") == {
        "model_name": "models/tiny-llama",
        "data_path": "data/tiny_instructions.jsonl",
        "max_steps": 60,
    }


@pytest.mark.parametrize("notebooks", ["notebooks", "tests/fixtures/unsloth_style"])
def test_exports_without_errors(notebooks, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    result = export(notebooks, tmp_path / "generated")

    script = result.script_path.read_text(encoding="utf-8")
    assert "%run" not in script and "get_ipython" not in script
    assert 'runtime.setup(backend="auto", script=None)' not in script  # the notebook-only setup cell
    assert "with ddp.main_process_first():" in script
    assert "ensure_weights(model_name)" in script
