import os

import nbddp
from nbddp.orchestration.environment import child_environment


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
