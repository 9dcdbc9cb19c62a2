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


@pytest.fixture
def named_bad_lines(monkeypatch):
    """`datasets.load_dataset` wrapped as runtime.setup wraps it, unwrapped afterwards."""
    import datasets
    import datasets.load

    from nbddp import patches
    from nbddp.runtime.inputs import data

    for owner in (datasets, datasets.load):
        monkeypatch.setattr(owner, "load_dataset", owner.load_dataset)
    data.register()
    yield datasets.load_dataset
    patches.undo()


def lines_file(tmp_path, bad, at=4):
    rows = [json.dumps(row()).encode() for _ in range(6)]
    rows.insert(at - 1, bad)
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


@pytest.mark.parametrize("bad, why", [
    (b'{"instruction": "copy", "input": "a b", "out', "not JSON (Unterminated string starting at: column 41)"),
    (b"[1, 2, 3]", "a JSON list, not an object"),
    (b'"text"', "a JSON str, not an object"),
])
def test_a_line_that_is_no_json_object_is_named_with_its_file_and_line(tmp_path, named_bad_lines, bad, why):
    path = lines_file(tmp_path, bad)
    with pytest.raises(DataError) as raised:
        named_bad_lines("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    begins = bad.decode("utf-8", errors="replace")[:60]
    assert str(raised.value).startswith(f"{path}, line 4: {why}; the line begins {begins!r}. Each line of a JSON-lines")


def test_a_bad_line_is_found_through_patterns_and_splits(tmp_path):
    from nbddp.runtime.inputs.data import bad_json_line

    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps(row()) + "\n")
    bad = lines_file(tmp_path, b"[1]", at=2)
    assert bad_json_line([good, bad]).startswith(f"{bad}, line 2: a JSON list")
    assert bad_json_line([good]) is None
    assert bad_json_line([lines_file(tmp_path, b'{"instruction": "\xff"}')]).startswith(
        f"{tmp_path / 'rows.jsonl'}, line 4: not UTF-8 text (invalid start byte at byte 18); the line begins "
        "'{\"instruction\": \"\ufffd\"}'")
    from nbddp.runtime.inputs.data import _local_files
    assert _local_files({"train": str(tmp_path / "*.jsonl"), "test": [str(good), "missing.jsonl"]}) == [
        str(good), str(bad), str(good)]


def test_a_json_document_and_good_lines_load_as_before(tmp_path, named_bad_lines):
    document = tmp_path / "rows.json"
    document.write_text(json.dumps([row(), row("y")], indent=1))
    assert named_bad_lines("json", data_files=str(document), split="train",
                           cache_dir=str(tmp_path / "cache"))["output"] == ["x", "y"]
    lines = lines_file(tmp_path, json.dumps(row("z")).encode())
    assert len(named_bad_lines("json", data_files=str(lines), split="train", cache_dir=str(tmp_path / "c2"))) == 7
