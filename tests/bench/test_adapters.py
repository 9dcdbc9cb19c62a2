"""bench/adapters.py: two saved adapters of the tiny Llama reloaded with plain PEFT, side by side."""
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from bench.adapters import compare
from nbddp.examples.tiny_model import ensure_weights


def saved_adapter(base, folder, lora_b):
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(lora_b)
    model.save_pretrained(folder)
    return str(folder)


def test_the_same_adapter_gives_the_same_logits_and_a_trained_one_differs(tmp_path, monkeypatch):
    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path / "cache"))
    base = ensure_weights(str(Path(__file__).parents[2] / "models" / "tiny-llama"))
    fresh, trained = saved_adapter(base, tmp_path / "fresh", 0.0), saved_adapter(base, tmp_path / "trained", 0.01)
    same = compare(base, fresh, fresh)
    assert same["same_names"] and same["max_abs_logit_diff"] == 0.0 and same["a"]["lora_B_nonzero"] == 0
    apart = compare(base, fresh, trained)
    assert apart["b"]["lora_tensors"] == apart["a"]["lora_tensors"] > 0
    assert apart["b"]["lora_B_nonzero"] == apart["b"]["lora_tensors"] // 2  # every lora_B, no lora_A is zero
    assert apart["max_abs_logit_diff"] > 0.01 * apart["logit_scale"]
