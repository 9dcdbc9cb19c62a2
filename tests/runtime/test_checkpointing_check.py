"""The first-step memory check: measured peak next to the estimate, and a warning near the GPU's limit."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nbddp.runtime.memory import batch_plan
from nbddp.runtime.memory.gradient_checkpointing import CheckpointingChoice
from nbddp.runtime.memory.gradient_checkpointing_check import (FirstStepMemoryCheck, first_step_report,
                                                               larger_micro_batch_tip)
from nbddp.runtime.memory.memory_estimate import GIB, estimate_peak, shape_from_config

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"
SHAPE = shape_from_config(json.loads((CONFIGS / "llama3-8b" / "config.json").read_text()), False, 16)
SHAPE_1B = shape_from_config(json.loads((CONFIGS / "llama-1.1b" / "config.json").read_text()), False, 16)


def choice(mode="off", micro_batch=2, seq_len=2048, shape=SHAPE, budget_gib=118.2):
    estimates = {m: estimate_peak(shape, seq_len, micro_batch, m) for m in ("off", "true", "unsloth")}
    return CheckpointingChoice("auto", mode, "auto: the cheapest mode that fits", seq_len, micro_batch, shape,
                               estimates=estimates, capacity_gib=139.0, budget_gib=budget_gib)


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


def test_the_tip_doubles_the_micro_batch_and_halves_the_accumulation():
    # batch_1b's shape and budget: micro batch 8 measured 20.5 GiB there.
    tip = larger_micro_batch_tip(choice(micro_batch=4, shape=SHAPE_1B, budget_gib=119.34), 4, 4, 2048, 11.9)
    assert tip == ("micro batch 8 is estimated at 20.2 GiB, within the 119.3 GiB budget: "
                   "per_device_train_batch_size=8 with gradient_accumulation_steps=2 (--set NAME=VALUE, or "
                   "--batch_layout auto, which chooses for you) keeps the global batch (16 rows per rank and "
                   "optimizer step) in "
                   "fewer, fuller micro batches; on a 1.1B model on an H200, micro batch 8 instead of 4 ran 1.39x the "
                   "tokens/s (docs/performance.md)")


def test_the_tip_estimates_the_batch_and_length_the_trainer_runs():
    # Unsloth's notebook defaults (batch 2, accumulation 4) at 8B, estimated in the chosen mode (unsloth), not off.
    tip = larger_micro_batch_tip(choice(mode="unsloth"), 2, 4, 2048, 9.0)
    assert tip.startswith("micro batch 4 is estimated at 18.2 GiB, within the 118.2 GiB budget: "
                          "per_device_train_batch_size=4 with gradient_accumulation_steps=2 (--set NAME=VALUE, or "
                          "--batch_layout auto, which chooses for you) keeps the global batch (8 rows per rank")
    # 4 x 4096 tokens, as many as 8 x 2048 (76.5 GiB off), not the chosen 2048's 46.8 GiB.
    tip = larger_micro_batch_tip(choice(), 2, 8, 4096, 50.0)
    assert tip.startswith("micro batch 4 is estimated at 76.5 GiB")
    assert "gradient_accumulation_steps=4 (--set" in tip and "keeps the global batch (16 rows" in tip


@pytest.mark.parametrize("accumulation", [1, 3, 5])
def test_no_tip_when_halving_the_accumulation_would_change_the_global_batch(accumulation):
    assert larger_micro_batch_tip(choice(), 2, accumulation, 2048, 33.0) is None


def test_no_tip_when_the_doubled_batch_does_not_fit():
    # 8B without checkpointing: batch 8 is 76.5 GiB, batch 16 135.9 GiB against a 118.2 GiB budget.
    assert larger_micro_batch_tip(choice(), 4, 2, 2048, 50.0) is not None
    assert larger_micro_batch_tip(choice(), 8, 2, 2048, 80.0) is None


def test_no_tip_when_what_step_1_reserved_leaves_no_room_for_the_growth():
    # 8B off, batch 2 -> 4: estimated 32.0 -> 46.8 GiB (+14.8) against a 118.2 GiB budget.
    assert larger_micro_batch_tip(choice(), 2, 4, 2048, 103.0) is not None
    assert larger_micro_batch_tip(choice(), 2, 4, 2048, 104.0) is None
    assert larger_micro_batch_tip(choice(), 2, 4, 2048, 133.0) is None  # where the step-1 warning fires


def test_no_tip_without_a_shape_or_a_budget():
    shapeless = CheckpointingChoice("auto", "unsloth", "auto: no widths", 2048, 2, budget_gib=118.2)
    assert larger_micro_batch_tip(shapeless, 2, 4, 2048, 9.0) is None
    on_cpu = CheckpointingChoice("auto", "off", "auto: no GPU", 2048, 2)
    assert larger_micro_batch_tip(on_cpu, 2, 4, 2048, 0.5) is None


def args(batch=2, max_length=2048, device="cuda:0", accumulation=1):
    return SimpleNamespace(per_device_train_batch_size=batch, max_length=max_length, device=torch.device(device),
                           process_index=0, gradient_accumulation_steps=accumulation)


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


@pytest.fixture(autouse=True)
def no_plans_of_earlier_tests(monkeypatch):
    """batch_plan.of finds plans other tests built in this process by their layout; these tests build none."""
    monkeypatch.setattr(batch_plan, "_built", [])


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


def test_rank_0_adds_the_tip_after_the_first_step(measured, capsys):
    measured(30.0, 33.0, 139.8)
    check = FirstStepMemoryCheck(choice())
    check.on_train_begin(args(accumulation=4), STATE, None)
    check.on_step_end(args(accumulation=4), STATE, None)
    check.on_step_end(args(accumulation=4), STATE, None)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("nbddp: tip: micro batch 4 is estimated at 46.8 GiB, within the 118.2 GiB budget: "
                               "per_device_train_batch_size=4 with gradient_accumulation_steps=2 ")


def test_the_tip_follows_the_trainers_length(measured, capsys):
    # Chosen for 2 x 2048; the trainer runs 4 x 4096, whose doubled batch (8 x 4096) is over the budget.
    measured(60.0, 64.0, 139.8)
    check = FirstStepMemoryCheck(choice())
    check.on_train_begin(args(batch=4, max_length=4096, accumulation=2), STATE, None)
    capsys.readouterr()
    check.on_step_end(args(batch=4, max_length=4096, accumulation=2), STATE, None)
    assert [line for line in capsys.readouterr().out.splitlines() if "tip" in line] == []
    assert larger_micro_batch_tip(choice(), 4, 2, 2048, 64.0) is not None  # at the chosen length it would fit


def test_other_ranks_give_no_tip(measured, capsys):
    measured(30.0, 33.0, 139.8)
    FirstStepMemoryCheck(choice()).on_step_end(args(accumulation=4), SimpleNamespace(is_world_process_zero=False),
                                               None)
    assert capsys.readouterr().out == ""


class Layerless(torch.nn.Module):
    def forward(self, input_ids=None):
        return input_ids


@pytest.mark.parametrize("added_gib, warned", [(6.5, False), (0.8, True)])
def test_step_one_says_when_its_memory_shows_another_mode(measured, monkeypatch, capsys, added_gib, warned):
    """At 8B, 1,900 tokens in one micro batch keep about 6.3 GiB of activations with checkpointing off; a step that
    adds 0.8 GiB recomputed or offloaded its layers whatever the flags say (seen under Unsloth on an H100)."""
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 10 * GIB)
    measured(10 + added_gib, 30.0, 80.0)
    check, model = FirstStepMemoryCheck(choice("off", micro_batch=8, seq_len=2048)), Layerless()
    check.on_train_begin(args(batch=8), STATE, None, model=model)
    model(input_ids=torch.ones(1, 1900, dtype=torch.long))
    model.eval()
    model(input_ids=torch.ones(1, 4000, dtype=torch.long))  # an evaluation batch: not training
    check.on_step_end(args(batch=8), STATE, None)
    out = capsys.readouterr().out
    assert ("step 1 (its largest micro batch 1900 tokens) added 0.8 GiB, under 50% of the 6.3 GiB of activations "
            "estimated with gradient checkpointing off: the layers still recompute or offload" in out) == warned
