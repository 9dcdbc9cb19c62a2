import pytest

from nbddp.orchestration.project.files import replacing, write_json


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with replacing(target) as temp:
            temp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [path.name for path in tmp_path.iterdir()] == ["report.md"]


def test_json_is_written_whole(tmp_path):
    write_json(tmp_path / "params.json", {"max_steps": 3})
    assert (tmp_path / "params.json").read_text() == '{\n  "max_steps": 3\n}\n'
