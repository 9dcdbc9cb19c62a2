import json

import pytest

from fixtures.export.stages import code, markdown, write_stage
from nbddp.errors import NotebookError
from nbddp.export.notebooks import read_stage, read_stages


def test_stages_are_read_in_file_name_order_without_checkpoints(tmp_path):
    write_stage(tmp_path, "02_train.ipynb", [code("b = 2")])
    write_stage(tmp_path, "01_data.ipynb", [markdown("# Data"), code("a = 1")])
    write_stage(tmp_path, "notes.ipynb", [code("not a stage")])
    write_stage(tmp_path / ".ipynb_checkpoints", "01_data-checkpoint.ipynb", [code("old")])

    stages = read_stages(tmp_path)

    assert [stage.name for stage in stages] == ["01_data.ipynb", "02_train.ipynb"]
    data = stages[0]
    assert data.path == f"{tmp_path.as_posix()}/01_data.ipynb"
    assert [(cell.location.cell, cell.cell_type, cell.source) for cell in data.cells] == [
        (1, "markdown", "# Data"),
        (2, "code", "a = 1"),
    ]


def test_empty_pipeline_is_an_error(tmp_path):
    write_stage(tmp_path, "notes.ipynb", [code("x = 1")])
    with pytest.raises(NotebookError, match="no stage notebooks found") as error:
        read_stages(tmp_path)
    assert "NN_name.ipynb" in str(error.value)


def test_notebooks_not_named_as_stages_are_named_in_the_hint(tmp_path):
    write_stage(tmp_path, "Llama3.1_(8B)-Alpaca.ipynb", [code("x = 1")])
    with pytest.raises(NotebookError, match="no stage notebooks found") as error:
        read_stages(tmp_path)
    assert "found Llama3.1_(8B)-Alpaca.ipynb, not named so" in str(error.value)


def test_a_notebook_given_for_the_folder_says_how_to_make_it_a_stage(tmp_path):
    path = write_stage(tmp_path, "Llama3.1_(8B)-Alpaca.ipynb", [code("x = 1")])
    with pytest.raises(NotebookError, match="a notebook, where a folder of stage notebooks was expected") as error:
        read_stages(path)
    assert "my_notebooks/01_finetune.ipynb" in str(error.value)


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(NotebookError, match=r"(?s)no such folder \(/.*missing\).*nbddp new my-project.*--notebooks PATH"):
        read_stages(tmp_path / "missing")


def test_malformed_json_names_the_file_and_line(tmp_path):
    path = tmp_path / "01_data.ipynb"
    path.write_text('{\n "cells": [],\n "metadata": {},,\n "nbformat": 4\n}\n')
    with pytest.raises(NotebookError) as error:
        read_stage(path)
    assert error.value.notebook == path.as_posix()
    assert "not valid JSON" in str(error.value)
    assert "line 3" in str(error.value)


def test_invalid_notebook_names_the_cell(tmp_path):
    path = write_stage(tmp_path, "01_data.ipynb", [code("a = 1"), code("b = 2")])
    notebook = json.loads(path.read_text())
    del notebook["cells"][1]["source"]
    path.write_text(json.dumps(notebook))
    with pytest.raises(NotebookError, match="not a valid notebook") as error:
        read_stage(path)
    assert error.value.cell == 2


def mark_as_nbformat_4_0_with_cell_ids(path, ids):
    """What Colab saves: cell ids (nbformat 4.5) in a notebook that says nbformat 4.0."""
    notebook = json.loads(path.read_text())
    notebook["nbformat_minor"] = 0
    for cell, cell_id in zip(notebook["cells"], ids):
        cell["id"] = cell_id
    path.write_text(json.dumps(notebook))


def test_cell_ids_in_an_older_minor_version_are_read_as_jupyter_reads_them(tmp_path):
    path = write_stage(tmp_path, "01_data.ipynb", [markdown("# Data"), code("a = 1")])
    mark_as_nbformat_4_0_with_cell_ids(path, ["IqM-T1RTzY6C", "2eSvM9zX_2d3"])
    assert [cell.source for cell in read_stage(path).cells] == ["# Data", "a = 1"]


def test_a_malformed_cell_id_is_still_an_error_naming_the_cell(tmp_path):
    path = write_stage(tmp_path, "01_data.ipynb", [markdown("# Data"), code("a = 1")])
    mark_as_nbformat_4_0_with_cell_ids(path, ["fine", "not an id!"])
    with pytest.raises(NotebookError, match="not a valid notebook") as error:
        read_stage(path)
    assert error.value.cell == 2


def test_a_4_5_notebook_with_cells_missing_ids_is_read_without_nbformats_warning(tmp_path, recwarn):
    # 4 of unslothai/notebooks' notebooks: nbformat warned "Cell is missing an id field" on every export.
    path = write_stage(tmp_path, "01_data.ipynb", [markdown("# Data"), code("a = 1")])
    notebook = json.loads(path.read_text())
    notebook["nbformat_minor"] = 5
    for cell in notebook["cells"]:
        cell.pop("id", None)
    path.write_text(json.dumps(notebook))
    assert [cell.source for cell in read_stage(path).cells] == ["# Data", "a = 1"]
    assert not [w for w in recwarn if "missing an id" in str(w.message)]


def test_outputs_the_schema_refuses_do_not_matter(tmp_path):
    path = write_stage(tmp_path, "01_data.ipynb", [code("print(1)")])
    notebook = json.loads(path.read_text())
    notebook["cells"][0]["outputs"] = [  # as Colab saves it: stream outputs carry no metadata in nbformat 4
        {"metadata": {"tags": None}, "name": "stdout", "output_type": "stream", "text": ["1\n"]}]
    path.write_text(json.dumps(notebook))
    assert [cell.source for cell in read_stage(path).cells] == ["print(1)"]


def test_unknown_tag_suggests_the_closest_known_tag(tmp_path):
    path = write_stage(tmp_path, "01_data.ipynb", [markdown("# Data"), code("a = 1", "rank-0")])
    with pytest.raises(NotebookError, match="unknown cell tag 'rank-0'") as error:
        read_stage(path)
    assert (error.value.notebook, error.value.cell) == (path.as_posix(), 2)
    assert "did you mean 'rank0'?" in str(error.value)


def test_unknown_tag_without_a_close_one_lists_the_known_tags(tmp_path):
    path = write_stage(tmp_path, "01_data.ipynb", [code("a = 1", "zzz")])
    with pytest.raises(NotebookError, match="known tags: parameters, notebook-only"):
        read_stage(path)


@pytest.mark.parametrize("tags", [("rank0", "main-process-first"), ("parameters", "rank0")])
def test_contradictory_tags_are_an_error(tmp_path, tags):
    path = write_stage(tmp_path, "01_data.ipynb", [code("a = 1", *tags)])
    with pytest.raises(NotebookError, match="cannot be tagged both"):
        read_stage(path)


def test_content_hash_ignores_outputs_but_not_sources(tmp_path):
    path = write_stage(tmp_path, "01_data.ipynb", [code("a = 1")])
    before = read_stage(path).content_sha256
    notebook = json.loads(path.read_text())
    notebook["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    notebook["cells"][0]["execution_count"] = 7
    path.write_text(json.dumps(notebook))
    assert read_stage(path).content_sha256 == before

    write_stage(tmp_path, "01_data.ipynb", [code("a = 2")])
    assert read_stage(path).content_sha256 != before
