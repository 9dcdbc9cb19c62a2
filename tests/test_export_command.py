"""`python pipeline.py export` end to end on a small 2-stage pipeline built in tmp_path."""
import hashlib
import importlib.util
import json
from pathlib import Path

import jupytext
import nbformat
import pytest

from fixtures.export.stages import code, markdown, two_stage_pipeline, write_stage

_spec = importlib.util.spec_from_file_location("pipeline", Path(__file__).parents[1] / "pipeline.py")
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    two_stage_pipeline(tmp_path)
    return tmp_path


def export(*flags):
    return pipeline.main(["export", *flags])


def test_export_writes_the_script_and_reports_what_it_did(project, capsys):
    assert export() == 0
    report = capsys.readouterr().out.splitlines()
    assert "notebooks/01_data.ipynb, cell 4: dropped (notebook-only)" in report
    assert any(line.startswith("notebooks/01_data.ipynb, cell 5: wrapped in `if ddp.is_main_process:`") for line in report)
    assert any(line.startswith("notebooks/02_train.ipynb, cell 2: wrapped in `with ddp.main_process_first():`") for line in report)
    assert report[-1].startswith("wrote generated/train.py from 2 notebooks: 5 cells, ")

    text = (project / "generated" / "train.py").read_text()
    compile(text, "generated/train.py", "exec")
    assert "print(records[:2])" not in text  # notebook-only
    assert '# %% tags=["parameters"]\n# 01_data.ipynb\nrows = 8  # how many examples\n' in text
    assert "\n# %% nbddp setup\nfrom nbddp import runtime\nddp = runtime.setup(globals())\n\n# %% 01_data.ipynb" in text
    assert text.endswith("# %% nbddp teardown\nddp.shutdown()\n")


def test_export_is_deterministic(project):
    assert export() == 0
    first = {path.name: path.read_bytes() for path in (project / "generated").iterdir()}
    for path in (project / "generated").iterdir():
        path.unlink()
    assert export() == 0
    assert {path.name: path.read_bytes() for path in (project / "generated").iterdir()} == first
    assert sorted(first) == ["train.py", "train.sourcemap.json"]


def test_script_round_trips_through_jupytext_and_matches_the_source_map(project):
    assert export() == 0
    text = (project / "generated" / "train.py").read_text()
    notebook = jupytext.reads(text, "py:percent")
    assert jupytext.writes(notebook, "py:percent") == text

    sourcemap = json.loads((project / "generated" / "train.sourcemap.json").read_text())
    assert sourcemap["script"] == "train.py"
    assert len(sourcemap["cells"]) == len(notebook.cells)
    lines = text.splitlines()
    titles = [cell.metadata.get("title") for cell in notebook.cells]
    assert [entry["title"] for entry in sourcemap["cells"]] == ["nbddp header", "parameters", *titles[2:]]
    for entry, cell in zip(sourcemap["cells"], notebook.cells):
        source = cell.source.splitlines()
        assert len(entry["origin"]) == len(source)
        if cell.cell_type == "code":
            assert lines[entry["first_line"] - 1 : entry["first_line"] - 1 + len(source)] == source


def test_source_map_follows_the_lines_a_guard_shifted(project):
    assert export() == 0
    lines = (project / "generated" / "train.py").read_text().splitlines()
    sourcemap = json.loads((project / "generated" / "train.sourcemap.json").read_text())
    entry = next(cell for cell in sourcemap["cells"] if cell["title"] == "01_data.ipynb cell 5")
    notebook = nbformat.read(project / "notebooks" / "01_data.ipynb", as_version=4)
    cell_lines = notebook.cells[4].source.splitlines()

    assert lines[entry["first_line"] - 1] == "if ddp.is_main_process:"
    assert entry["origin"][0] is None
    for offset, origin in enumerate(entry["origin"][1:-1], start=1):
        assert origin[:2] == ["notebooks/01_data.ipynb", 5]
        assert lines[entry["first_line"] - 1 + offset].strip() == cell_lines[origin[2] - 1].strip()
    assert lines[entry["first_line"] - 1 + len(entry["origin"]) - 1] == "ddp.barrier()"
    assert entry["origin"][-1] == ["notebooks/01_data.ipynb", 5, len(cell_lines)]


def test_check_is_clean_after_export_and_writes_nothing(project, capsys):
    assert export("--check") == 1  # nothing exported yet
    assert "generated/train.py is missing" in capsys.readouterr().err
    assert not (project / "generated").exists()

    assert export() == 0
    assert export("--check") == 0


def test_check_lists_stale_files_after_a_notebook_changes(project, capsys):
    assert export() == 0
    before = (project / "generated" / "train.py").read_text()
    write_stage(project / "notebooks", "02_train.ipynb", [code("lr = 0.5", "parameters")])
    capsys.readouterr()

    assert export("--check") == 1
    err = capsys.readouterr().err
    assert "generated/train.py differs from what export writes" in err
    assert "generated/train.sourcemap.json differs from what export writes" in err
    assert (project / "generated" / "train.py").read_text() == before


def test_hand_edited_script_is_refused_unless_forced(project, capsys):
    assert export() == 0
    script = project / "generated" / "train.py"
    edited = script.read_text().replace("total = 0", "total = 100")
    script.write_text(edited)
    capsys.readouterr()

    assert export() == 2
    err = capsys.readouterr().err
    assert "generated/train.py was edited by hand" in err
    assert "use --force to overwrite (your edits will be lost; move them into the notebooks)" in err
    assert script.read_text() == edited
    assert export("--check") == 1

    assert export("--force") == 0
    assert "total = 0" in script.read_text()
    assert export("--check") == 0


def test_the_source_map_records_the_hashes_the_header_no_longer_holds(project, capsys):
    assert export() == 0
    script, sourcemap = project / "generated" / "train.py", project / "generated" / "train.sourcemap.json"
    recorded = json.loads(sourcemap.read_text())
    assert recorded["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert sorted(recorded["notebooks"]) == ["notebooks/01_data.ipynb", "notebooks/02_train.ipynb"]
    assert "sha256" not in script.read_text()

    # a change to a cell the script leaves out changes no line of it, but the map: export --check sees it
    write_stage(project / "notebooks", "01_data.ipynb", [
        *nbformat.read(project / "notebooks" / "01_data.ipynb", as_version=4).cells[:3],
        code("print(records[:3])", "notebook-only"),
        *nbformat.read(project / "notebooks" / "01_data.ipynb", as_version=4).cells[4:],
    ])
    capsys.readouterr()
    assert export("--check") == 1
    stale = capsys.readouterr().err.splitlines()[1:]
    assert stale == ["  generated/train.sourcemap.json differs from what export writes"]

    # an edit of the header is an edit too, and so is a script whose map is gone
    assert export() == 0
    script.write_text(script.read_text().replace("Do not edit", "Edit"))
    assert export() == 2
    assert export("--force") == 0
    sourcemap.unlink()
    assert export() == 2
    assert "generated/train.py was edited by hand" in capsys.readouterr().err


def _break(notebooks, how):
    if how == "malformed JSON":
        (notebooks / "02_train.ipynb").write_text('{"cells": [\n  {"cell_type": "code",}\n]}\n')
    elif how == "syntax error":
        write_stage(notebooks, "02_train.ipynb", [markdown("# Train"), code("x = 1\nfor i in range(3)\n    x += i")])
    elif how == "unknown tag":
        write_stage(notebooks, "02_train.ipynb", [code("x = 1", "notebook_only")])
    elif how == "conflicting defaults":
        write_stage(notebooks, "02_train.ipynb", [code("rows = 16", "parameters")])
    elif how == "non-literal parameter":
        write_stage(notebooks, "02_train.ipynb", [code("lr = 1e-3\nsteps = rows // 2", "parameters")])
    elif how == "empty pipeline":
        for path in notebooks.iterdir():
            path.unlink()
    elif how == "dangling stage link":
        (notebooks / "03_eval.ipynb").symlink_to("../elsewhere/eval.ipynb")
    elif how == "misnamed stages":
        for name in ("03-train.ipynb", "4_eval.ipynb", "100_report.ipynb"):
            write_stage(notebooks, name, [code("x = 1")])


@pytest.mark.parametrize(
    "how, expected",
    [
        ("malformed JSON", ["notebooks/02_train.ipynb: not valid JSON", "line 2"]),
        ("syntax error", ["notebooks/02_train.ipynb, cell 2, line 2: syntax error"]),
        ("unknown tag", ["notebooks/02_train.ipynb, cell 1: unknown cell tag 'notebook_only'", "did you mean 'notebook-only'?"]),
        (
            "conflicting defaults",
            ["notebooks/02_train.ipynb, cell 1, line 1: parameter 'rows' defaults to 16", "notebooks/01_data.ipynb, cell 2, line 1"],
        ),
        ("non-literal parameter", ["notebooks/02_train.ipynb, cell 1, line 2: parameter 'steps' is not a literal"]),
        ("empty pipeline", ["notebooks: no stage notebooks found"]),
        ("dangling stage link", ["notebooks/03_eval.ipynb: a symbolic link to ../elsewhere/eval.ipynb, which does "
                                 "not exist: export cannot read this stage"]),
        ("misnamed stages", ["notebooks: 03-train.ipynb, 100_report.ipynb, 4_eval.ipynb: named like a stage but not "
                             "NN_name.ipynb, so export would leave them out", "hint: a stage's name is two digits"]),
    ],
)
def test_bad_input_exits_2_naming_the_place_and_writes_nothing(project, capsys, how, expected):
    _break(project / "notebooks", how)
    assert export() == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err
    assert not (project / "generated").exists()


@pytest.mark.parametrize("out, expected", [
    ("afile", "--out afile: a file, not a folder"),
    ("afile/generated", "--out afile/generated: {project}/afile is a file, not a folder"),
    ("/proc/generated", "--out /proc/generated: cannot write in /proc ("),  # the reason: root's, or another user's
])
def test_an_out_that_cannot_be_written_exits_2_and_writes_nothing(project, capsys, out, expected):
    (project / "afile").write_text("mine\n")
    before = sorted(project.rglob("*"))
    assert export("--out", out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {expected.format(project=project)}") and err.count("\n") == 1
    assert sorted(project.rglob("*")) == before and (project / "afile").read_text() == "mine\n"


def test_help_lists_the_cell_tags_and_every_rewrite_in_the_order_export_applies_them(capsys):
    from nbddp.export.notebooks import TAG_MEANINGS
    from nbddp.export.rewrites import REWRITES

    with pytest.raises(SystemExit) as exited:
        export("--help")
    assert exited.value.code == 0
    text = capsys.readouterr().out
    names = ["convert-magics", *(rewrite.NAME for rewrite in REWRITES)]
    positions = [text.index(f"\n  {name} ") for name in names]
    assert positions == sorted(positions)
    assert "run shell commands and %%writefile once per machine" in " ".join(text.split())
    for tag, meaning in TAG_MEANINGS.items():
        assert f"  {tag}" in text and meaning in " ".join(text.split())
    assert "injected-parameters" not in text  # papermill's tag, not one an author sets
