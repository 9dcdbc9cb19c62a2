"""check_output_dir, and apply_flags running it: an output_dir the run cannot use stops it before any work."""
import os
import sys
import tempfile

import pytest

from nbddp.errors import UsageError
from nbddp.runtime.inputs import flags
from nbddp.runtime.inputs.flags import apply_flags
from nbddp.runtime.inputs.preflight import check_output_dir


def snapshot(directory):
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def test_a_missing_output_dir_under_a_writable_folder_passes_and_is_not_created(tmp_path):
    check_output_dir(tmp_path / "runs" / "train")
    assert snapshot(tmp_path) == []  # the probe file left nothing behind


def test_an_existing_file_is_no_output_dir(tmp_path):
    (tmp_path / "out").write_text("")
    with pytest.raises(UsageError, match=r"^output_dir '.*out': exists and is not a directory$"):
        check_output_dir(tmp_path / "out")
    with pytest.raises(UsageError, match=r"out/train': .*out is a file, not a directory$"):
        check_output_dir(tmp_path / "out" / "train")


def test_a_dangling_symbolic_link_is_no_output_dir(tmp_path):
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    message = f"{tmp_path / 'out'} is a symbolic link to {tmp_path / 'gone'}, which does not exist; create"
    for output_dir in (tmp_path / "out", tmp_path / "out" / "train"):
        with pytest.raises(UsageError, match=f"^output_dir '{output_dir}': {message}"):
            check_output_dir(output_dir)
    (tmp_path / "gone").mkdir()
    check_output_dir(tmp_path / "out" / "train")  # a link to a folder is a folder


def _writable(folder):
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/sys") or _writable("/sys"), reason="needs a folder no one may write in")
def test_a_folder_no_one_may_write_in():
    # /sys refuses new files even to root, where permission bits would not.
    with pytest.raises(UsageError, match=r"^output_dir '/sys/nbddp-out': cannot write in /sys \(.+\)$"):
        check_output_dir("/sys/nbddp-out")


def test_too_little_free_space(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDDP_MIN_FREE_GIB", "1e12")  # more than any disk has: the check must fail
    with pytest.raises(UsageError, match=r"GiB free on the disk of .*, less than 1e\+12 GiB \(NBDDP_MIN_FREE_GIB\)"):
        check_output_dir(tmp_path / "out")
    monkeypatch.setenv("NBDDP_MIN_FREE_GIB", "0")
    check_output_dir(tmp_path / "out")
    monkeypatch.setenv("NBDDP_MIN_FREE_GIB", "lots")
    with pytest.raises(UsageError, match="NBDDP_MIN_FREE_GIB='lots': expected a number of GiB"):
        check_output_dir(tmp_path / "out")


def apply(monkeypatch, argv, namespace, defined_in):
    monkeypatch.setattr(sys, "argv", ["generated/train.py", *argv])
    apply_flags(namespace, defined_in)
    return namespace


def test_a_script_exits_2_naming_the_output_dir(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        apply(monkeypatch, ["--output_dir", str(tmp_path / "file" / "out")], {"output_dir": "outputs"},
              {"output_dir": "03_train.ipynb"})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nbddp: error: output_dir '{tmp_path / 'file' / 'out'}': ") and "Traceback" not in err


def test_the_final_value_is_checked_and_a_good_one_passes(tmp_path, monkeypatch):
    namespace = apply(monkeypatch, ["--output_dir", str(tmp_path / "out")], {"output_dir": "/sys/x"},
                      {"output_dir": "03_train.ipynb"})
    assert namespace["output_dir"] == str(tmp_path / "out")


def test_only_a_parameter_named_output_dir_is_checked(monkeypatch):
    apply(monkeypatch, [], {"save_to": "/sys/x"}, {"save_to": "03_train.ipynb"})


def test_a_kernel_raises_instead_of_exiting(tmp_path, monkeypatch):
    monkeypatch.setattr(flags, "running_in_kernel", lambda: True)
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        apply(monkeypatch, ["-f", "kernel.json"], {"output_dir": str(tmp_path / "file")}, {"output_dir": "03_train.ipynb"})
