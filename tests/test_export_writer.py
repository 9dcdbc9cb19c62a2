import pytest

from nbddp.errors import NbddpError
from nbddp.export.writer import refuse_hand_edited, stale_files, write_files


def test_writes_every_file_and_leaves_no_temporary_files(tmp_path):
    files = {tmp_path / "out" / "a.py": "a\n", tmp_path / "out" / "b.json": "{}\n"}
    write_files(files)
    assert {path.name: path.read_text() for path in (tmp_path / "out").iterdir()} == {"a.py": "a\n", "b.json": "{}\n"}


def test_a_failed_write_leaves_the_old_files_and_no_temporary_files(tmp_path):
    first = tmp_path / "a.py"
    first.write_text("old\n")
    blocked = tmp_path / "not_a_directory"
    blocked.write_text("")
    with pytest.raises(OSError):
        write_files({first: "new\n", blocked / "b.json": "{}\n"})
    assert first.read_text() == "old\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.py", "not_a_directory"]


def test_stale_files_say_which_file_and_why(tmp_path):
    script, sourcemap = tmp_path / "train.py", tmp_path / "train.sourcemap.json"
    sourcemap.write_text("{}\n")
    assert stale_files({script: "x\n", sourcemap: "{}\n"}, script) == [f"{script.as_posix()} is missing"]
    script.write_text("y\n")
    assert stale_files({script: "x\n", sourcemap: "{}\n"}, script) == [
        f"{script.as_posix()} was edited by hand (export needs --force to overwrite it)"
    ]
    script.write_text("x\n")
    assert stale_files({script: "x\n", sourcemap: "[]\n"}, script) == [f"{sourcemap.as_posix()} differs from what export writes"]


def test_a_script_without_a_body_hash_is_refused(tmp_path):
    script = tmp_path / "train.py"
    refuse_hand_edited(script)  # no script yet: nothing to protect
    script.write_text("print('mine')\n")
    with pytest.raises(NbddpError, match="edited by hand.*use --force"):
        refuse_hand_edited(script)
