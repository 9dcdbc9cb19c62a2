"""The memory estimate against the peaks measured on H200s (docs/performance.md), and the loaded-model view."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from nbddp.runtime.memory.memory_estimate import (MODES, cheapest_fitting, estimate_peak, shape_from_config,
                                                  shape_from_model)

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"


def config(shape):
    return json.loads((CONFIGS / shape / "config.json").read_text())


def meta_llama(shape, **overrides):
    """A Llama of the bench shape with no memory behind it: parameters on the meta device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(**{**config(shape), **overrides})).to(torch.bfloat16)


@pytest.mark.parametrize(
    "shape, micro_batch, load_in_4bit, mode, transformers_peft, measured_gib",
    [
        ("llama-1.1b", 4, False, "off", False, 10.4),  # Unsloth bf16 LoRA, checkpointing off
        ("llama-1.1b", 4, False, "unsloth", False, 3.0),  # the same with Unsloth's offloaded checkpointing
        ("llama3-8b", 2, False, "unsloth", False, 16.3),  # generated script, Unsloth, 1 GPU
        ("llama3-8b", 2, False, "unsloth", False, 16.7),  # the same on each of 2 GPUs
        ("llama3-8b", 2, True, "unsloth", False, 6.9),  # QLoRA, Unsloth
        ("llama3-8b", 2, True, "true", True, 11.2),  # QLoRA, Transformers+PEFT fallback (plain recompute)
        ("llama3-8b", 2, True, "off", True, 45.1),  # the same without checkpointing
        ("llama3-8b", 2, False, "off", True, 42.4),  # bf16 LoRA, Transformers+PEFT fallback, no checkpointing
        ("llama3-8b", 2, False, "off", False, 30.2),  # bf16 LoRA, Unsloth, no checkpointing
        ("llama3-8b", 2, True, "off", False, 20.6),  # QLoRA, Unsloth, no checkpointing
    ],
)
def test_estimate_is_close_to_the_peaks_measured_on_h200(shape, micro_batch, load_in_4bit, mode, transformers_peft,
                                                          measured_gib):
    estimate = estimate_peak(shape_from_config(config(shape), load_in_4bit, 16), 2048, micro_batch, mode, transformers_peft)
    assert estimate["total_gib"] == pytest.approx(measured_gib, rel=0.12)


def test_modes_trade_memory_for_work():
    shape = shape_from_config(config("llama3-8b"), False, 16)
    totals = [estimate_peak(shape, 2048, 2, mode)["total_gib"] for mode in MODES]
    assert totals[0] > totals[1] > totals[2]


def test_materialised_logits_cost_tokens_times_vocab():
    shape = shape_from_config(config("llama3-8b"), True, 16)
    fused = estimate_peak(shape, 2048, 2, "true")
    full = estimate_peak(shape, 2048, 2, "true", transformers_peft=True)
    assert fused["logits_gib"] == 0
    assert full["logits_gib"] * 2 ** 30 == 2048 * 2 * 128256 * (2 + 4)  # bf16 logits and their fp32 copy


def test_the_fallback_keeps_more_activations_most_of_all_under_qlora():
    bf16, nf4 = (shape_from_config(config("llama3-8b"), four_bit, 16) for four_bit in (False, True))
    unsloth = estimate_peak(bf16, 2048, 2, "off")["activations_gib"]
    assert estimate_peak(bf16, 2048, 2, "off", transformers_peft=True)["activations_gib"] == pytest.approx(1.5 * unsloth)
    assert estimate_peak(nf4, 2048, 2, "off", transformers_peft=True)["activations_gib"] == pytest.approx(2.4 * unsloth)


def test_loaded_model_gives_the_same_shape_as_its_config():
    loaded = shape_from_model(meta_llama("llama3-8b"), lora_r=16)
    from_config = shape_from_config(config("llama3-8b"), False, 16)
    assert dataclasses.replace(loaded, weight_bytes=0) == dataclasses.replace(from_config, weight_bytes=0)
    # The loaded model also holds its buffers (rotary frequencies): 256 bytes more of 16 GB.
    assert 0 < loaded.weight_bytes - from_config.weight_bytes < 1024


def test_loaded_model_weights_are_counted_as_loaded():
    bf16 = shape_from_model(meta_llama("llama-1.1b"), lora_r=16)
    fp32 = shape_from_model(meta_llama("llama-1.1b").float(), lora_r=16)
    assert fp32.weight_bytes == 2 * bf16.weight_bytes
    assert (fp32.activation_bytes, bf16.activation_bytes) == (4, 2)


def test_adapters_are_counted_on_the_targets_only():
    model = meta_llama("llama-1.1b")
    attention_only = shape_from_model(model, lora_r=8, targets=("q_proj", "v_proj"))
    hidden, layers = 2048, 22
    assert attention_only.lora_params == layers * 8 * ((hidden + hidden) + (hidden + 4 * 64))


def test_a_config_without_decoder_widths_has_no_shape():
    class Model:
        class config:
            @staticmethod
            def to_dict():
                return {"model_type": "mystery", "d_model": 512}

    assert shape_from_model(Model(), lora_r=16) is None


def test_cheapest_fitting_takes_the_first_under_budget():
    estimates = [{"mode": "off", "total_gib": 30.0}, {"mode": "true", "total_gib": 18.0},
                 {"mode": "unsloth", "total_gib": 17.0}]
    assert cheapest_fitting(estimates, 100)["mode"] == "off"
    assert cheapest_fitting(estimates, 18.0)["mode"] == "true"
    assert cheapest_fitting(estimates, 17.5)["mode"] == "unsloth"
    assert cheapest_fitting(estimates, 10) is None


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="sometimes"):
        estimate_peak(shape_from_config(config("llama-1.1b"), False), 2048, 4, "sometimes")


def test_a_model_with_bitsandbytes_4bit_weights_is_four_bit():
    class Params4bit(torch.nn.Parameter):  # bitsandbytes' class, by name: it needs a GPU to exist for real
        pass

    model = meta_llama("llama-1.1b")
    assert not shape_from_model(model, lora_r=16).four_bit
    projection = model.model.layers[0].self_attn.q_proj
    projection.weight = Params4bit(projection.weight.detach(), requires_grad=False)
    assert shape_from_model(model, lora_r=16).four_bit
