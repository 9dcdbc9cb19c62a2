"""A researcher's own project: an Unsloth-style notebook that saves, writes notes with a shell command and pushes to
a hub. The smoke run leaves the project as it was but for what it names (the shell command's files), and pushes
nothing; the training run on 2 processes pushes once, from rank 0 (a fake hub client records the pushes)."""
import os
import shutil
from pathlib import Path

import nbformat
import pytest

import pipeline

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "tests" / "fixtures" / "e2e" / "sitecustomize.py"

pytestmark = pytest.mark.e2e


def listing(folder):
    """`{path: modification time}` of the files under `folder`, `{path: "folder"}` of its folders, runs/ left out."""
    return {str(path.relative_to(folder)): "folder" if path.is_dir() else path.stat().st_mtime_ns
            for path in Path(folder).rglob("*")
            if "runs" not in path.relative_to(folder).parts and "__pycache__" not in path.parts}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """notebooks/01_finetune.ipynb (the Unsloth-style fixture, pushing its adapters), models/, data/, and the fake
    hub client on the path of every process; the working directory is the project's root."""
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    shutil.copytree(REPO / "models" / "tiny-llama", root / "models" / "tiny-llama")
    shutil.copytree(REPO / "data", root / "data")
    notebook = nbformat.read(REPO / "tests" / "fixtures" / "unsloth_style" / "01_finetune.ipynb", as_version=4)
    for cell in notebook.cells:
        cell.source = (cell.source.replace('"models/tiny-llama"', '"../models/tiny-llama"')
                       .replace('"data/tiny_instructions.jsonl"', '"../data/tiny_instructions.jsonl"')
                       .replace('# model.push_to_hub("your_name/lora_model", token = "...")',
                                'model.push_to_hub("me/lora_model")'))
    nbformat.write(notebook, root / "notebooks" / "01_finetune.ipynb")
    hook = tmp_path / "hook"
    hook.mkdir()
    shutil.copy(HOOK, hook / "sitecustomize.py")
    log = tmp_path / "hub.log"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("NBDDP_E2E_SAVE_LOG", str(log))
    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.chdir(root)
    assert pipeline.main(["export", "--notebooks", "notebooks", "--out", "generated"]) == 0
    return root, log


def pushes(log):
    return [line for line in log.read_text().splitlines() if " push " in line] if log.exists() else []


def test_the_smoke_run_changes_only_what_it_names_and_pushes_nothing(project, capsys):
    root, log = project
    before = listing(root)
    assert pipeline.main(["smoke", "--script", "generated/train.py", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    after = listing(root)
    changed = sorted(path for path in after.keys() | before.keys() if before.get(path) != after.get(path))
    # the notebook's `!mkdir -p lora_model && echo ... >> lora_model/NOTES.txt`: a shell command runs where it says
    assert changed == ["notebooks/lora_model", "notebooks/lora_model/NOTES.txt"]
    assert ("outside runs/, which nbddp does not redirect (`!` commands, os.makedirs, Path.write_text): "
            "notebooks/lora_model (created), notebooks/lora_model/NOTES.txt (created).") in err  # a warning
    smoke_dir = next((root / "runs").iterdir())
    assert (smoke_dir / "notebooks" / "lora_model" / "adapter_config.json").is_file()  # the notebook's own save
    assert (smoke_dir / "notebooks" / "lora_model" / "TRAINING.md").is_file()  # its %%writefile cell
    cells_printed = (smoke_dir / "cells.stdout.log").read_text()
    assert "nbddp: smoke run: push_to_hub to me/lora_model skipped (the training run pushes)" in cells_printed
    assert pushes(log) == []


def test_the_training_run_pushes_once_from_rank_0(project, capsys):
    root, log = project
    assert pipeline.main(["run", "--script", "generated/train.py", "--nproc-per-node", "2", "--device", "cpu",
                          "-p", "max_steps", "2"]) == 0
    assert pushes(log) == ["0 push me/lora_model"]  # the smoke run pushed nothing, the training run once
    assert (root / "notebooks" / "lora_model" / "adapter_config.json").is_file()  # where the notebook says
