import os
import stat

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration.devices import single_device, visible_gpus


@pytest.mark.parametrize("value, expected", [
    ("0,1", ["0", "1"]),
    (" 2 , 3 ", ["2", "3"]),
    ("", []),
    ("-1", []),
    ("1,-1,2", ["1"]),
    ("GPU-abc", ["GPU-abc"]),
])
def test_cuda_visible_devices_decides_when_set(value, expected):
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}) == expected


def fake_nvidia_smi(directory, listing):
    path = directory / "nvidia-smi"
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{listing}\nEND\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{directory}{os.pathsep}{os.environ['PATH']}"}


def test_nvidia_smi_lists_the_gpus_otherwise(tmp_path, monkeypatch):
    listing = ("GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"
               "  MIG 1g.18gb Device 0: (UUID: MIG-3)")
    for name, value in fake_nvidia_smi(tmp_path, listing).items():
        monkeypatch.setenv(name, value)
    assert visible_gpus({}) == ["0", "1"]


def test_no_nvidia_smi_means_no_gpus(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert visible_gpus({}) == []


def test_one_device_stays_visible():
    environ = {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert single_device(None, environ) == "4"
    assert single_device("1", environ) == "5"
    assert single_device("cpu", environ) == ""
    assert single_device(None, {"CUDA_VISIBLE_DEVICES": ""}) == ""


@pytest.mark.parametrize("device, environ, message", [
    ("2", {"CUDA_VISIBLE_DEVICES": "0,1"}, "--device 2: only 2 GPU"),
    ("0", {"CUDA_VISIBLE_DEVICES": ""}, "--device 0: no GPU is visible"),
    ("gpu", {"CUDA_VISIBLE_DEVICES": "0"}, "--device gpu: expected a GPU index or 'cpu'"),
])
def test_a_bad_device_names_the_flag(device, environ, message):
    with pytest.raises(UsageError, match=message):
        single_device(device, environ)
