"""The `use_gradient_checkpointing` parameter: its values, the choice from memory, and what trainers make of it."""
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.fallback import models as hf_backend
from nbddp.gradient_checkpointing_modes import parse_mode, peft_mode
from nbddp.runtime.memory import gradient_checkpointing
from nbddp.runtime.memory.gradient_checkpointing import (
    CheckpointingChoice,
    choose_gradient_checkpointing,
    decide,
)
from nbddp.runtime.memory.memory_estimate import MODES, estimate_peak, shape_from_config

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"
LLAMA_8B = json.loads((CONFIGS / "llama3-8b" / "config.json").read_text())
WITHOUT_OFFLOAD = ("off", "true")


# --- the parameter's values ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "value, mode",
    [("auto", "auto"), ("unsloth", "unsloth"), ("true", "true"), ("false", "off"), ("False", "off"),
     (" TRUE ", "true"), (True, "true"), (False, "off")],
)
def test_parameter_values(value, mode):
    assert parse_mode(value) == mode


@pytest.mark.parametrize("value", ["maybe", "", "0", None, 1])
def test_other_values_name_the_flag(value):
    with pytest.raises(UsageError, match="--use_gradient_checkpointing must be one of auto, unsloth, true, false"):
        parse_mode(value)


@pytest.mark.parametrize("mode, value", [("off", False), ("true", True), ("unsloth", "unsloth")])
def test_modes_become_what_unsloth_takes(mode, value):
    choice = CheckpointingChoice("auto", mode, "", 2048, 2)
    assert choice.value == value and type(choice.value) is type(value)


def test_get_peft_model_cannot_take_auto():
    assert peft_mode("false") == "off"
    with pytest.raises(UsageError, match="choose_gradient_checkpointing"):
        peft_mode("auto")


# --- the choice, against fake budgets -----------------------------------------------------------------------

def estimates_8b(modes=MODES, transformers_peft=False):
    shape = shape_from_config(LLAMA_8B, False, 16)
    return {mode: estimate_peak(shape, 2048, 2, mode, transformers_peft) for mode in modes}  # off 32.0, true 18.7, unsloth 17.7


@pytest.mark.parametrize(
    "free_gib, mode",
    [(139, "off"), (40, "off"), (24, "true"), (21.5, "unsloth")],
)
def test_auto_takes_the_cheapest_mode_that_fits(free_gib, mode):
    assert decide("auto", MODES, estimates_8b(), 0.85 * free_gib) == (mode, "auto: the cheapest mode that fits")


def test_auto_takes_the_most_saving_mode_when_none_fits():
    assert decide("auto", MODES, estimates_8b(), 0.85 * 16) == ("unsloth", "auto: no mode fits the budget: the most saving one")
    hf = estimates_8b(WITHOUT_OFFLOAD, transformers_peft=True)
    assert decide("auto", WITHOUT_OFFLOAD, hf, 0.85 * 24)[0] == "true"


def test_auto_without_a_gpu_is_off():
    mode, reason = decide("auto", WITHOUT_OFFLOAD, {}, None)
    assert mode == "off" and "no GPU" in reason


def test_auto_for_a_model_it_cannot_estimate_saves_memory():
    assert decide("auto", MODES, {}, 100.0)[0] == "unsloth"


@pytest.mark.parametrize("requested", ["off", "true", "unsloth"])
def test_a_requested_mode_is_kept_even_when_it_does_not_fit(requested):
    assert decide(requested, MODES, estimates_8b(), 10.0) == (requested, "requested")


def test_unsloth_without_offloading_recomputes():
    mode, reason = decide("unsloth", WITHOUT_OFFLOAD, {}, None)
    assert mode == "true" and "plain recompute" in reason


# --- choose_gradient_checkpointing on a model -------------------------------------------------------------

@pytest.fixture
def tiny_model(tiny_model_path):
    return hf_backend.FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=64, load_in_4bit=False)[0]


def test_auto_on_cpu_is_off_and_says_so(tiny_model, capsys):
    assert choose_gradient_checkpointing("auto", tiny_model, 64, 4, lora_r=8) is False
    assert "nbddp: gradient checkpointing off (auto: no GPU" in capsys.readouterr().out
    assert tiny_model.nbddp_checkpointing.mode == "off"


@pytest.mark.parametrize("requested, value", [("false", False), ("true", True), ("unsloth", True)])
def test_requested_modes_on_the_fallback(tiny_model, requested, value):
    # The fallback has no offloading: "unsloth" recomputes as "true".
    assert choose_gradient_checkpointing(requested, tiny_model, 64, 4) is value


@pytest.fixture
def fake_gpu(monkeypatch):
    """An 8B Llama on the meta device that says it is on a GPU with `free_gib` free; unsloth imported or not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_8B)).to(torch.bfloat16)
    monkeypatch.setattr(LlamaForCausalLM, "device", property(lambda self: torch.device("cuda", 0)))

    def make(free_gib, unsloth):
        monkeypatch.setattr(gradient_checkpointing, "capacity_gib", lambda device: free_gib)
        if unsloth:
            monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
        else:
            monkeypatch.setitem(sys.modules, "unsloth", hf_backend)
        return model

    return make


@pytest.mark.parametrize("free_gib, value", [(139, False), (24, True), (21.5, "unsloth")])
def test_auto_on_a_gpu_under_unsloth(fake_gpu, capsys, free_gib, value):
    model = fake_gpu(free_gib, unsloth=True)
    assert choose_gradient_checkpointing("auto", model, 2048, 2, lora_r=16) == value
    out = capsys.readouterr().out
    assert "estimated peak per GPU for batch 2 x 2048 tokens: off 32.0, true 18.7, unsloth 17.7 GiB" in out
    assert f"({gradient_checkpointing.HEADROOM:.0%} of {free_gib:.1f} GiB free)" in out


def test_auto_under_unsloth_below_512_tokens_never_offloads(fake_gpu):
    model = fake_gpu(10, unsloth=True)
    assert choose_gradient_checkpointing("auto", model, 256, 2) is True
    assert set(model.nbddp_checkpointing.estimates) == {"off", "true"}


def test_auto_on_a_gpu_with_the_fallback_counts_logits_and_warns_when_nothing_fits(fake_gpu, capsys):
    model = fake_gpu(24, unsloth=False)
    assert choose_gradient_checkpointing("auto", model, 2048, 2) is True
    choice = model.nbddp_checkpointing
    assert choice.transformers_peft and set(choice.estimates) == {"off", "true"}
    assert "nbddp: warning: gradient checkpointing true is estimated at 22.2 GiB, over the 20.4 GiB budget" in (
        capsys.readouterr().out)


# --- the fallback and trainers ----------------------------------------------------------------------------

def lora(model, use_gradient_checkpointing):
    return hf_backend.FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8,
                                                       use_gradient_checkpointing=use_gradient_checkpointing)


@pytest.mark.parametrize("value, enabled", [("false", False), (False, False), ("true", True), ("unsloth", True)])
def test_the_fallback_reads_strings_as_unsloth_would_read_bools(tiny_model, value, enabled):
    assert lora(tiny_model, value).base_model.model.is_gradient_checkpointing is enabled


def test_the_fallback_passes_a_real_false_to_kbit_preparation(tiny_model, monkeypatch):
    import peft

    seen = {}

    def prepare(model, use_gradient_checkpointing, gradient_checkpointing_kwargs):
        seen["use_gradient_checkpointing"] = use_gradient_checkpointing
        return model

    monkeypatch.setattr(peft, "prepare_model_for_kbit_training", prepare)
    monkeypatch.setattr(tiny_model, "hf_quantizer", object(), raising=False)  # as if loaded in 4 bits
    lora(tiny_model, "false")
    assert seen["use_gradient_checkpointing"] is False


@pytest.fixture
def patched_trainer(monkeypatch):
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "__init__", Trainer.__init__)  # restored after the test
    gradient_checkpointing.patch_trainer(Trainer)
    gradient_checkpointing.patch_trainer(Trainer)  # twice is once
    return Trainer


def trainer_on(trainer_class, model, tmp_path):
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=True, max_steps=1, use_cpu=True,
                             report_to="none", per_device_train_batch_size=2)
    rows = [{"input_ids": [1, 3, 4, 5, 2], "labels": [1, 3, 4, 5, 2]}] * 4
    return trainer_class(model=model, args=args, train_dataset=rows)


def test_a_trainer_keeps_checkpointing_off_when_the_choice_is_off(patched_trainer, tiny_model, tmp_path, capsys):
    choose_gradient_checkpointing("auto", tiny_model, 64, 2)
    trainer = trainer_on(patched_trainer, lora(tiny_model, False), tmp_path)
    assert trainer.args.gradient_checkpointing is False
    assert "the trainer's gradient_checkpointing turned off" in capsys.readouterr().out
    trainer.train()
    assert not trainer.model.base_model.model.is_gradient_checkpointing
    assert any(type(callback).__name__ == "FirstStepMemoryCheck" for callback in trainer.callback_handler.callbacks)


def test_an_sft_trainer_keeps_checkpointing_off_when_the_choice_is_off(patched_trainer, tiny_model, tmp_path):
    # TRL 0.x's SFTTrainer turns checkpointing on in its __init__ (SFTConfig's default), before Trainer's runs.
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    choose_gradient_checkpointing("auto", tiny_model, 64, 2)
    args = SFTConfig(output_dir=str(tmp_path), max_steps=1, use_cpu=True, bf16=False, report_to="none",
                     per_device_train_batch_size=2)
    assert args.gradient_checkpointing is True
    rows = Dataset.from_dict({"input_ids": [[1, 3, 4, 5, 2]] * 4})
    trainer = SFTTrainer(model=lora(tiny_model, False), args=args, train_dataset=rows)
    assert not trainer.model.base_model.model.is_gradient_checkpointing
    trainer.train()  # a checkpointed layer without the input-gradient hook would have no gradient here
    assert trainer.state.global_step == 1


def test_a_trainer_keeps_checkpointing_on_when_chosen(patched_trainer, tiny_model, tmp_path):
    choose_gradient_checkpointing("true", tiny_model, 64, 2)
    trainer = trainer_on(patched_trainer, lora(tiny_model, True), tmp_path)
    assert trainer.args.gradient_checkpointing is True


def test_a_trainer_without_a_choice_is_left_alone(patched_trainer, tiny_model, tmp_path):
    trainer = trainer_on(patched_trainer, lora(tiny_model, False), tmp_path)
    assert trainer.args.gradient_checkpointing is True
    assert all(type(callback).__name__ != "FirstStepMemoryCheck" for callback in trainer.callback_handler.callbacks)


@pytest.mark.parametrize("backend", ["hf", "unsloth"])
def test_both_backends_patch_the_trainer(backend, monkeypatch, backend_patches_undone_after):
    from transformers import Trainer

    from nbddp.runtime import backend as backends

    init = Trainer.__init__
    unpatched = init.__wrapped__ if patches.is_patched(init, "gradient-checkpointing-choice") else init
    monkeypatch.setattr(Trainer, "__init__", unpatched)  # restored after the test, like the others
    monkeypatch.setattr(Trainer, "compute_loss", Trainer.compute_loss)
    monkeypatch.delitem(sys.modules, "unsloth.chat_templates", raising=False)
    if backend == "unsloth":
        monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    else:
        monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    backends.activate(backend)
    assert patches.is_patched(Trainer.__init__, "gradient-checkpointing-choice")
