import json
from pathlib import Path

import pytest

from nbddp.runtime.memory.memory_estimate import parameter_counts
from nbddp.runtime.reporting.utilization import flops_per_token, mfu

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"
TINY = Path(__file__).resolve().parents[2] / "models" / "tiny-llama" / "config.json"


def config(shape):
    return json.loads((CONFIGS / shape / "config.json").read_text())


@pytest.mark.parametrize("shape", ["llama-1.1b", "llama3-8b"])
def test_base_parameter_count_matches_transformers(shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**config(shape)))
    assert parameter_counts(config(shape))["base_total"] == sum(p.numel() for p in model.parameters())


def test_lora_parameter_count_matches_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = json.loads(TINY.read_text())
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**tiny)), LoraConfig(
        r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert parameter_counts(tiny, lora_r=16)["lora"] == trainable


def test_llama3_8b_flops_per_token_is_about_four_times_its_matmul_weights():
    c = config("llama3-8b")
    counts = parameter_counts(c)
    per_token = flops_per_token(c, seq_len=2048)
    assert 4 * (counts["decoder_linear"] + counts["lm_head"]) < per_token < 4.4 * counts["base_total"]
    assert flops_per_token(c, seq_len=4096) > per_token  # attention grows with the sequence


def test_mfu_is_achieved_over_measured_rate():
    assert mfu(10_000, 32e9, 800e12) == pytest.approx(0.4)
