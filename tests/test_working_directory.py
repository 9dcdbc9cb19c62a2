"""The cells run in the notebooks' folder, as in Jupyter, wherever the script or the command was started: the
example pipeline's `../data/...` paths work from the project root and from another folder; `--workdir ''` stays;
a workdir that is no folder is one paragraph and exit 2; orchestration passes it absolute to a kernel."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration.parameters import with_absolute_paths
from nbddp.runtime import working_directory

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "generated" / "train.py"


def train(cwd, *flags):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(SCRIPT), "--max_steps", "2", "--eval_steps", "2", *flags], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.e2e
def test_the_example_pipeline_runs_from_another_folder(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = train(elsewhere, "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "out" / "lora_adapter" / "adapter_config.json").is_file()
    assert list(elsewhere.iterdir()) == []  # the cells ran in notebooks/, and wrote to the output_dir given


def test_a_workdir_that_is_no_folder_is_one_paragraph_and_exit_2(tmp_path):
    result = train(tmp_path, "--workdir", "../no-such-folder")
    assert result.returncode == 2
    assert result.stderr.startswith("nbddp: error: --workdir ../no-such-folder: ")
    assert f"{REPO / 'no-such-folder'} is no folder" in result.stderr and "--workdir ''" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_relative_workdir_is_read_from_the_script_folder_and_empty_stays(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "generated").mkdir()
    monkeypatch.chdir(REPO)
    started = working_directory.enter("", str(tmp_path / "generated" / "train.py"))
    assert started == os.getcwd() == str(REPO) == working_directory.folder("", str(tmp_path / "generated" / "x.py"))
    assert working_directory.enter("../notebooks", str(tmp_path / "generated" / "train.py")) == str(REPO)
    assert os.getcwd() == str(tmp_path / "notebooks")


def test_output_dir_variable_is_made_absolute_before_changing_folder(tmp_path, monkeypatch):
    (tmp_path / "cells").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NBDDP_OUTPUT_DIR", "runs/x/train")
    working_directory.enter("cells", None)  # in a kernel: from its working directory
    assert os.environ["NBDDP_OUTPUT_DIR"] == str(tmp_path / "runs" / "x" / "train")


def test_no_folder_raises_usage_error_naming_the_flag(tmp_path):
    with pytest.raises(UsageError, match="--workdir missing: .* is no folder"):
        working_directory.enter("missing", str(tmp_path / "train.py"))


def test_orchestration_gives_a_kernel_the_absolute_workdir_and_output_dir(tmp_path):
    script = tmp_path / "generated" / "train.py"
    defaults = {"workdir": "../notebooks", "output_dir": "../outputs"}
    values = with_absolute_paths(script, defaults, {"output_dir": "../mine"})
    assert values == {"workdir": str(tmp_path / "notebooks"), "output_dir": str(tmp_path / "mine")}
    assert with_absolute_paths(script, {"workdir": ""}, {}) == {}
