import json
import os
import sys

import nbddp
from nbddp.orchestration.kernel import KERNEL_NAME, child_environment, write_kernelspec


def test_the_kernelspec_runs_this_interpreter(tmp_path):
    data_dir = write_kernelspec(tmp_path / "jupyter")
    spec = json.loads((data_dir / "kernels" / KERNEL_NAME / "kernel.json").read_text())
    assert spec["argv"][:3] == [sys.executable, "-m", "ipykernel_launcher"]
    assert spec["language"] == "python"


def test_the_child_finds_our_kernelspec_first_and_sees_the_given_devices(tmp_path):
    environ = {"JUPYTER_PATH": "/elsewhere", "PYTHONPATH": "/lib", "CUDA_VISIBLE_DEVICES": "0,1"}
    env = child_environment("1", tmp_path, environ)
    assert env["JUPYTER_PATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(nbddp.__file__)))
    assert env["PYTHONPATH"].split(os.pathsep) == [package_root, "/lib"]
    assert environ["CUDA_VISIBLE_DEVICES"] == "0,1"  # the parent's own environment is untouched


def test_without_devices_the_inherited_value_stays():
    assert child_environment(environ={"CUDA_VISIBLE_DEVICES": "3"})["CUDA_VISIBLE_DEVICES"] == "3"
    assert "JUPYTER_PATH" not in child_environment(environ={})
