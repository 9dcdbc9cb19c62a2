import jupytext
import pytest

from nbddp.errors import NotebookError
from nbddp.export.cells import GeneratedCell
from nbddp.export.notebooks import Stage
from nbddp.export.script import body_sha256, edited_by_hand, header_cell, render_script, split_body

STAGES = [Stage("notebooks/01_data.ipynb", (), "a" * 64), Stage("notebooks/02_train.ipynb", (), "b" * 64)]
ORIGIN = ["notebooks/01_data.ipynb", 3, 1]


def script_of(*cells):
    return render_script([header_cell(STAGES, "generated/train.py"), *cells])


def test_header_names_each_notebook_with_its_hash_and_the_body_hash():
    text = script_of(GeneratedCell("code", "x = 1", [ORIGIN], "01_data.ipynb cell 3"))
    head, body, recorded = split_body(text)
    assert "notebooks/01_data.ipynb (sha256 " + "a" * 64 + ")" in head
    assert "notebooks/02_train.ipynb (sha256 " + "b" * 64 + ")" in head
    assert "Run: torchrun --nproc_per_node N generated/train.py --help" in head
    assert body.startswith("# %% 01_data.ipynb cell 3\nx = 1\n")
    assert recorded == body_sha256(body)
    assert "kernelspec:" in head and "name: python3" in head


def test_script_reads_back_through_jupytext_unchanged():
    cells = [
        GeneratedCell("code", "rows = 2  # c\nbackend = 'auto'", [ORIGIN, None], tags=("parameters",)),
        GeneratedCell("code", "def f():\n    return 1\n\n\nclass A:\n    pass", [ORIGIN] * 6, "01_data.ipynb cell 3"),
        GeneratedCell("markdown", "# Title\n\ntext", [ORIGIN] * 3, "01_data.ipynb cell 4"),
    ]
    text = script_of(*cells)
    notebook = jupytext.reads(text, "py:percent")
    assert jupytext.writes(notebook, "py:percent") == text
    assert [(cell.cell_type, cell.source) for cell in notebook.cells[1:]] == [(c.cell_type, c.source) for c in cells]
    assert notebook.cells[1].metadata["tags"] == ["parameters"]
    assert notebook.metadata["kernelspec"]["name"] == "python3"


def test_a_line_that_looks_like_a_cell_marker_is_an_error_at_its_cell():
    with pytest.raises(NotebookError, match="does not survive") as error:
        script_of(GeneratedCell("code", "x = 1\n# %% not a new cell\ny = 2", [ORIGIN] * 3, "01_data.ipynb cell 3"))
    assert (error.value.notebook, error.value.cell) == ("notebooks/01_data.ipynb", 3)


def test_an_edit_below_the_header_is_detected():
    text = script_of(GeneratedCell("code", "x = 1", [ORIGIN], "01_data.ipynb cell 3"))
    assert not edited_by_hand(text)
    assert edited_by_hand(text.replace("x = 1", "x = 2"))
    assert edited_by_hand(text.replace("# nbddp-body-sha256:", "# sha:"))
