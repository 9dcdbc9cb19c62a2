"""require_file and require_fields: a data path that is no file, and a dataset row that lacks a field the formatting
needs, are named by file (and row)."""
import json

import pytest

from nbddp.errors import DataError, NbddpError
from nbddp.runtime.inputs.data import require_fields, require_file

FIELDS = ["instruction", "input", "output"]


def load_rows(tmp_path, rows):
    """The rows written as a JSON-lines file and loaded the way the example notebook loads its data."""
    from datasets import load_dataset

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))


def row(output="x"):
    return {"instruction": "copy", "input": "a b", "output": output}


def test_complete_rows_pass(tmp_path):
    require_fields(load_rows(tmp_path, [row(), row("")]), FIELDS, "data/x.jsonl")  # "" is a value, not missing


def test_the_first_row_without_the_field_is_named(tmp_path):
    rows = [row() for _ in range(20)]
    del rows[16]["output"]  # row 17
    rows[18]["output"] = None  # a null is missing too
    with pytest.raises(DataError) as error:
        require_fields(load_rows(tmp_path, rows), FIELDS, "data/x.jsonl")
    assert str(error.value) == 'data/x.jsonl row 17: missing "output" (2 of 20 rows lack it)'
    assert isinstance(error.value, NbddpError) and error.value.exit_status == 2


def test_a_field_no_row_has(tmp_path):
    rows = [{"instruction": "copy", "input": "a"}]
    with pytest.raises(DataError, match=r'data/x.jsonl: no row has "output" \(the rows\' fields: "instruction", "input"\)'):
        require_fields(load_rows(tmp_path, rows), FIELDS, "data/x.jsonl")


def test_rows_are_counted_in_the_dataset_as_given(tmp_path):
    dataset = load_rows(tmp_path, [row(), row(None), row()]).select([2, 0, 1])
    with pytest.raises(DataError, match="data/x.jsonl row 3: missing"):
        require_fields(dataset, FIELDS, "data/x.jsonl")


def test_an_existing_file_or_a_pattern_that_matches_one_passes(tmp_path):
    (tmp_path / "rows.jsonl").write_text("{}\n")
    require_file(str(tmp_path / "rows.jsonl"))
    require_file(str(tmp_path / "*.jsonl"))


def test_a_missing_file_is_named_with_its_nearest_sibling(tmp_path):
    (tmp_path / "tiny_instructions.jsonl").write_text("{}\n")
    with pytest.raises(DataError) as raised:
        require_file(str(tmp_path / "tiny_instruction.jsonl"))
    assert str(raised.value) == (f"data file {str(tmp_path / 'tiny_instruction.jsonl')!r}: no such file "
                                 f"(did you mean {str(tmp_path / 'tiny_instructions.jsonl')!r}?)")
    assert raised.value.exit_status == 2


@pytest.mark.parametrize("path, message", [
    # a relative path also says where it was read from: in a generated script, the notebooks' folder
    ("nowhere/rows.jsonl", "data file 'nowhere/rows.jsonl': no such file (nowhere does not exist either; relative "
                           "paths are read from {cwd}, where the cells run)"),
    (".", "data file '.': a directory, not a file"),
])
def test_a_path_that_is_no_file(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as raised:
        require_file(path)
    assert str(raised.value) == message.format(cwd=tmp_path)


def test_a_pattern_that_matches_nothing(tmp_path):
    with pytest.raises(DataError, match="the pattern matches no file"):
        require_file(str(tmp_path / "*.jsonl"))
