"""Paths a user gives: a relative path the cells would not find from the notebooks' folder, but that exists from
where the command started, is refused before anything runs, spelled as the cells need it; a folder that is no
project's gets told where it is and how to get one."""
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from nbddp import cli as pipeline
from nbddp.errors import UsageError
from nbddp.formats.parameters import SCRIPT_CELL_MARKER
from nbddp.orchestration import parameters

REPO = Path(__file__).resolve().parents[2]
DEFAULTS = {"data_path": "../data/rows.jsonl", "output_dir": "../outputs", "workdir": "../notebooks"}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """notebooks/, data/rows.jsonl and a generated/train.py whose cells run in notebooks/; the working directory."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.jsonl").write_text("{}\n")
    (tmp_path / "generated").mkdir()
    cell = "\n".join(f"{name} = {value!r}" for name, value in DEFAULTS.items())
    (tmp_path / "generated" / "train.py").write_text(f"{SCRIPT_CELL_MARKER}\n{cell}\n\n# %%\nraise SystemExit('ran')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refusal(values, labels=None):
    with pytest.raises(UsageError) as error:
        parameters.check_paths("generated/train.py", DEFAULTS, values, labels)
    return str(error.value)


def test_a_path_from_here_is_refused_with_its_spelling_from_the_notebooks_folder(project):
    assert refusal({"data_path": "data/rows.jsonl"}) == (
        f"-p data_path data/rows.jsonl: the cells run in {project / 'notebooks'} (the notebooks' folder) and read a "
        f"relative path from there, where data/rows.jsonl names nothing; the data/rows.jsonl in {project} is "
        "../data/rows.jsonl from there: use -p data_path ../data/rows.jsonl (or an absolute path)")


@pytest.mark.parametrize("values, labels, fix", [
    ({"data_path": "data/*.jsonl"}, None, "use -p data_path ../data/*.jsonl"),  # a glob the data loader expands
    ({"output_dir": "data"}, None, "use -p output_dir ../data"),  # it would write into notebooks/data
    ({"data_path": "./data/rows.jsonl"}, {"data_path": "-f p.yaml: data_path"},
     "write `data_path: ../data/rows.jsonl` in p.yaml"),
])
def test_every_way_of_giving_it_gets_its_fix(project, values, labels, fix):
    assert f": {fix} (or an absolute path)" in refusal(values, labels)


@pytest.mark.parametrize("value", ["../data/rows.jsonl", "data/missing.jsonl", "unsloth/Llama-3.2-1B", "", 3])
def test_what_the_cells_find_or_nobody_finds_is_left_to_them(project, value):
    parameters.check_paths("generated/train.py", DEFAULTS, {"data_path": value})  # the runtime names a missing file
    parameters.check_paths("generated/train.py", DEFAULTS, {"data_path": str(project / "data" / "rows.jsonl")})


@pytest.mark.parametrize("argv, label", [
    (["run", "-p", "data_path", "data/rows.jsonl"], "-p data_path"),
    (["smoke", "-p", "data_path", "data/rows.jsonl"], "-p data_path"),
    (["launch", "--dry-run", "--", "--data_path", "data/rows.jsonl"], "--data_path"),
    (["launch", "--dry-run", "--", "--data_path=data/rows.jsonl"], "--data_path"),
])
def test_each_command_refuses_it_before_anything_runs(project, capsys, argv, label):
    before = sorted(project.rglob("*"))
    assert pipeline.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {label} data/rows.jsonl: the cells run in ") and captured.err.count("\n") == 1
    assert f"use {label} ../data/rows.jsonl" in captured.err and "would run" not in captured.out
    assert sorted(project.rglob("*")) == before


@pytest.mark.parametrize("verb", ["run", "smoke", "launch"])
def test_a_folder_without_a_project_is_named_with_how_to_get_one(tmp_path, monkeypatch, capsys, verb):
    monkeypatch.chdir(tmp_path)
    assert pipeline.main([verb]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --script generated/train.py: no such file, and no notebooks/ folder either in {tmp_path}, "
                   "which is no nbddp project's folder: cd into yours, start one with `nbddp new my-project` (then cd "
                   "my-project && nbddp run), or export notebooks kept elsewhere: `nbddp export --notebooks PATH` "
                   "(then `nbddp run` here)\n")
    assert not list(tmp_path.iterdir())


def test_export_in_a_folder_without_notebooks_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert pipeline.main(["export"]) == 2
    assert capsys.readouterr().err == (
        f"error: notebooks: no such folder ({tmp_path / 'notebooks'})\n  hint: export reads the stage notebooks "
        "(01_name.ipynb, ...) from there: run nbddp in your project's folder, start a project with `nbddp new "
        "my-project`, or name the notebooks' folder: `nbddp export --notebooks PATH`\n")


def test_the_repositorys_run_refuses_a_path_from_its_root_within_3_s():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "pipeline.py", "run", "-p", "data_path", "data/tiny_instructions.jsonl"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall time, which the suite's parallel workers on a small machine stretch (alone: 0.8-1.6 s)
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 3
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.endswith("use -p data_path ../data/tiny_instructions.jsonl (or an absolute path)\n")
