import sys

import pytest

from nbddp.errors import NotebookError
from nbddp.export import cells as cells_module
from nbddp.export.cells import export_code_cell, export_text_cell
from nbddp.export.notebooks import SourceCell
from nbddp.export.report import CellNote
from nbddp.export.rewrites.base import CellLocation

STAGES = frozenset({"01_data.ipynb", "02_train.ipynb"})


def cell(source, *tags, cell_type="code", number=3):
    return SourceCell(CellLocation("notebooks/02_train.ipynb", number), cell_type, source, frozenset(tags))


def test_plain_cell_keeps_its_code_title_and_lines():
    generated, entries = export_code_cell(cell("\nx = 1\ny = x + 1\n\n"), STAGES)
    assert generated.source == "x = 1\ny = x + 1"
    assert generated.title == "02_train.ipynb cell 3"
    assert generated.origin == [["notebooks/02_train.ipynb", 3, 2], ["notebooks/02_train.ipynb", 3, 3]]
    assert entries == []


def test_rank0_cell_is_guarded_then_followed_by_a_barrier():
    source = "import json\n\nwith open('out.json', 'w') as f:\n    json.dump({}, f)  # save\n# done"
    generated, entries = export_code_cell(cell(source, "rank0"), STAGES)
    assert generated.source == (
        "if ddp.is_main_process:\n"
        "    import json\n"
        "\n"
        "    with open('out.json', 'w') as f:\n"
        "        json.dump({}, f)  # save\n"
        "    # done\n"
        "ddp.barrier()"
    )
    assert [origin[2] if origin else None for origin in generated.origin] == [None, 1, 2, 3, 4, 5, 5]
    assert entries == [CellNote(cell("").location, cells_module.RANK0_NOTE)]
    compile(generated.source, "cell", "exec")


@pytest.mark.parametrize("tag", ["rank0", "main-process-first"])
def test_a_guarded_cell_that_a_rewrite_changed_throughout_keeps_its_lines(tag):
    # %%writefile turns every line into a string literal: nothing is left for the alignment to anchor on.
    source = "%%writefile out/cfg.py\na = 1\nb = 2\nc = 3"
    generated, _ = export_code_cell(cell(source, tag), STAGES)
    lines = generated.source.splitlines()
    assert lines[1].strip().startswith('ddp.write_file("out/cfg.py", (')
    assert [origin[2] if origin else None for origin in generated.origin][:5] == [None, 1, 2, 3, 4]


def test_main_process_first_cell_runs_inside_the_context_manager():
    source = "import os\nos.makedirs('cache', exist_ok=True)\n"
    generated, entries = export_code_cell(cell(source, "main-process-first"), STAGES)
    assert generated.source == (
        "with ddp.main_process_first():\n    import os\n    ddp.show(os.makedirs('cache', exist_ok=True))")
    assert [str(entry) for entry in entries] == [
        # the cell's last value: None here, so nothing shows, as in Jupyter
        "notebooks/02_train.ipynb, cell 3, line 2: [show-cell-result] os.makedirs('cache', exist_ok=True) "
        "is shown once unless None, as Jupyter shows a cell's last value",
        f"notebooks/02_train.ipynb, cell 3: {cells_module.MAIN_PROCESS_FIRST_NOTE}"]


def test_a_cell_of_only_comments_is_not_guarded():
    generated, entries = export_code_cell(cell("# nothing to run", "rank0"), STAGES)
    assert generated.source == "# nothing to run"
    assert entries == []


def test_an_empty_cell_is_dropped():
    assert export_code_cell(cell("\n  \n"), STAGES) == (None, [])
    assert export_text_cell(cell("\n", cell_type="markdown")) is None


@pytest.mark.parametrize(
    "source, line, message",
    [
        ("x = 1\n\ny = (1,\nz = 2\n", 3, r"'\(' was never closed"),
        ("\n\ndef f(:\n    pass\n", 3, "syntax error"),
        ("if x:\nprint(x)\n", 2, "expected an indented block"),
    ],
)
def test_syntax_error_names_notebook_cell_and_cell_line(source, line, message):
    with pytest.raises(NotebookError, match=message) as error:
        export_code_cell(cell(source, number=5), STAGES)
    assert (error.value.notebook, error.value.cell, error.value.line) == ("notebooks/02_train.ipynb", 5, line)
    assert str(error.value).startswith(f"notebooks/02_train.ipynb, cell 5, line {line}: ")


def test_a_syntax_error_that_only_this_python_makes_says_so():
    # Colab runs Python 3.12, whose f-strings may reuse the outer quotes; respell-fstrings cannot respell one whose
    # inner string holds both quotes
    source = 'row = {"it\'s": "a.png"}\nprint(f"{row["it\'s"]}")\n'
    if sys.version_info >= (3, 12):
        assert export_code_cell(cell(source), STAGES) is not None
        return
    with pytest.raises(NotebookError) as error:
        export_code_cell(cell(source), STAGES)
    assert error.value.line == 2
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert error.value.hint.startswith(f"a newer Python's grammar accepts this cell, Python {running}'s does not")


def test_a_plain_syntax_error_has_no_newer_python_hint():
    with pytest.raises(NotebookError) as error:
        export_code_cell(cell("def f(:\n    pass\n"), STAGES)
    assert error.value.hint is None


def test_rewrites_get_the_stage_notebooks_and_the_cell_tags(monkeypatch):
    seen = {}

    def apply(source, location, context):
        seen.update(source=source, location=location, context=context)
        return source.replace("1", "2"), []

    monkeypatch.setattr(cells_module.rewrites, "apply", apply)
    generated, _ = export_code_cell(cell("x = 1", "rank0"), STAGES)
    assert seen["location"] == CellLocation("notebooks/02_train.ipynb", 3)
    assert seen["context"].stage_notebooks == STAGES
    assert seen["context"].cell_tags == frozenset({"rank0"})
    assert "    x = 2" in generated.source


def test_markdown_cell_is_kept_as_markdown():
    generated = export_text_cell(cell("# Title\n\nSome text.\n", cell_type="markdown", number=1))
    assert (generated.cell_type, generated.source, generated.title) == ("markdown", "# Title\n\nSome text.", "02_train.ipynb cell 1")
    assert [origin[2] for origin in generated.origin] == [1, 2, 3]


def test_a_markdown_cell_over_dropped_cells_only_is_dropped_with_them():
    from nbddp.export.exporter import ORPHAN_NOTE, assemble_cells
    from nbddp.export.notebooks import Stage

    def stage_cell(number, source, *tags, cell_type="code"):
        return SourceCell(CellLocation("notebooks/01_data.ipynb", number), cell_type, source, frozenset(tags))

    cells = (
        stage_cell(1, "# Intro", cell_type="markdown"),  # over a notebook-only cell and the parameters: kept
        stage_cell(2, "from nbddp import runtime", "notebook-only"),
        stage_cell(3, "rows = 1", "parameters"),
        stage_cell(4, "## Plot", cell_type="markdown"),  # over a notebook-only cell only: dropped
        stage_cell(5, "plot()", "notebook-only"),
        stage_cell(6, "## Train", cell_type="markdown"),  # nothing between it and the next heading: kept
        stage_cell(7, "### Steps", cell_type="markdown"),
        stage_cell(8, "x = rows"),
        stage_cell(9, "## Parameters", cell_type="markdown"),  # over papermill's cell only: dropped
        stage_cell(10, "rows = 2", "injected-parameters"),
    )
    generated, report = assemble_cells([Stage("notebooks/01_data.ipynb", cells, "a" * 64)])
    titles = [cell.title for cell in generated]
    assert titles == [None, "nbddp setup", *(f"01_data.ipynb cell {n}" for n in (1, 6, 7, 8)), "nbddp teardown"]
    assert [str(entry) for entry in report.entries if "cell 4" in str(entry) or "cell 9" in str(entry)] == [
        f"notebooks/01_data.ipynb, cell 4: {ORPHAN_NOTE}",
        f"notebooks/01_data.ipynb, cell 9: {ORPHAN_NOTE}",
    ]
    assert [entry.location.cell for entry in report.entries] == sorted(entry.location.cell for entry in report.entries)
    assert report.cells == 4


def test_a_dropped_comment_is_cut_short_at_its_final_indentation():
    pip = "!pip install --no-deps bitsandbytes accelerate xformers==0.0.29.post3 peft trl triton"
    generated, _ = export_code_cell(cell(f"if x:\n    {pip}\nelse:\n    {pip}\n    !pip install unsloth", "rank0"),
                                    STAGES)
    lines = generated.source.splitlines()
    assert lines[:2] == ["if ddp.is_main_process:", "    if x:"]
    assert lines[2] == f"        pass  # nbddp: dropped {pip}"  # 115 characters: as it is
    assert lines[3:5] == ["    else:", "        pass  # nbddp: dropped 2 lines: !pip install --no-deps bitsandbytes "
                                        "accelerate xformers==0.0.29.post3 peft …"]
    assert all(len(line) <= 120 for line in lines) and len(lines) == len(generated.origin)
