"""The first-step memory check: measured peak next to the estimate, and a warning near the GPU's limit."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nbddp.runtime.checkpointing import CheckpointingChoice
from nbddp.runtime.checkpointing_check import FirstStepMemoryCheck, first_step_report
from nbddp.runtime.memory_estimate import GIB, estimate_peak, shape_from_config

LLAMA_8B = json.loads((Path(__file__).resolve().parents[2] / "bench" / "configs" / "llama3-8b" / "config.json").read_text())
SHAPE = shape_from_config(LLAMA_8B, False, 16)


def choice(mode="off", micro_batch=2, seq_len=2048):
    estimates = {m: estimate_peak(SHAPE, seq_len, micro_batch, m) for m in ("off", "true", "unsloth")}
    return CheckpointingChoice("auto", mode, "auto: the cheapest mode that fits", seq_len, micro_batch, SHAPE,
                               estimates=estimates, capacity_gib=139.0, budget_gib=118.2)


def test_report_puts_measured_next_to_estimated():
    report, warning = first_step_report("off", 32.0, 30.1, 33.0, 139.8, "cuda:0")
    assert report == ("after step 1: peak 30.1 GiB allocated (estimated 32.0 GiB with gradient checkpointing off), "
                      "33.0 GiB reserved of 139.8 GiB on cuda:0")
    assert warning is None


def test_a_tiny_models_memory_keeps_two_significant_digits():
    # The default job on an H200 printed "peak 0.1 GiB allocated (estimated 0.0 GiB ...)", as if the estimate failed.
    report, _ = first_step_report("off", 0.0031, 0.0839844, 0.09375, 139.8, "cuda:0")
    assert report == ("after step 1: peak 0.084 GiB allocated (estimated 0.0031 GiB with gradient checkpointing "
                      "off), 0.094 GiB reserved of 139.8 GiB on cuda:0")


@pytest.mark.parametrize("mode, advice", [("off", "use --use_gradient_checkpointing true or unsloth"),
                                          ("unsloth", "lower --per_device_train_batch_size")])
def test_report_warns_near_the_limit(mode, advice):
    _, warning = first_step_report(mode, 70.0, 71.0, 76.0, 80.0, "cuda:1")
    assert "cuda:1 holds 76.0 of 80.0 GiB after step 1, within 10% of its memory" in warning
    assert advice in warning


def test_report_without_an_estimate():
    report, _ = first_step_report("true", None, 1.0, 2.0, 80.0, "cuda:0")
    assert "(no estimate with gradient checkpointing true)" in report


def args(batch=2, max_length=2048, device="cuda:0"):
    return SimpleNamespace(per_device_train_batch_size=batch, max_length=max_length, device=torch.device(device),
                           process_index=0)


STATE = SimpleNamespace(is_world_process_zero=True)


def test_a_trainer_with_the_assumed_batch_keeps_the_estimate(capsys):
    check = FirstStepMemoryCheck(choice())
    check.on_train_begin(args(), STATE, None)
    assert capsys.readouterr().out == ""
    assert check.estimate_gib == pytest.approx(32.0, abs=0.05)


def test_a_trainer_with_another_batch_is_estimated_again(capsys):
    check = FirstStepMemoryCheck(choice())
    check.on_train_begin(args(batch=8), STATE, None)
    assert check.estimate_gib == pytest.approx(estimate_peak(SHAPE, 2048, 8, "off")["total_gib"])
    assert "was chosen for batch 2 x 2048 tokens, the trainer runs 8 x 2048" in capsys.readouterr().out


@pytest.fixture
def measured(monkeypatch):
    def make(allocated_gib, reserved_gib, total_gib):
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: allocated_gib * GIB)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: reserved_gib * GIB)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda device: SimpleNamespace(total_memory=total_gib * GIB))

    return make


def test_the_first_step_only_is_reported(measured, capsys):
    measured(30.0, 33.0, 139.8)
    check = FirstStepMemoryCheck(choice())
    check.on_step_end(args(), STATE, None)
    check.on_step_end(args(), STATE, None)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["nbddp: after step 1: peak 30.0 GiB allocated (estimated 32.0 GiB with gradient checkpointing "
                     "off), 33.0 GiB reserved of 139.8 GiB on cuda:0"]


def test_other_ranks_only_warn(measured, capsys):
    measured(70.0, 78.0, 80.0)
    check = FirstStepMemoryCheck(choice())
    check.on_step_end(SimpleNamespace(**{**vars(args()), "process_index": 3}),
                      SimpleNamespace(is_world_process_zero=False), None)
    assert capsys.readouterr().out.startswith("nbddp: warning: rank 3: cuda:0 holds 78.0 of 80.0 GiB")


def test_nothing_to_check_on_a_cpu(measured, capsys):
    measured(30.0, 33.0, 139.8)
    FirstStepMemoryCheck(choice()).on_step_end(args(device="cpu"), STATE, None)
    assert capsys.readouterr().out == ""
