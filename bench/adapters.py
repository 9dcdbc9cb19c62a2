"""Two saved LoRA adapters of one base model, reloaded with plain PEFT: their LoRA tensors and logits side by side.

    python -m bench.adapters BASE ADAPTER_A ADAPTER_B      # prints one JSON object

Used by the GPU benchmarks to show that a save under FSDP (or a resumed run's) is the adapter it should be: the
same LoRA tensor names in both, how many of their lora_B (zero at initialisation) trained away from zero, and the
largest logit difference on fixed token ids beside the logits' scale.
"""
import json
import sys


def compare(base, adapter_a, adapter_b, tokens=32, seed=0):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    vocab = min(model.config.vocab_size, 100)  # ids every stand-in tokenizer has
    ids = torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed)).to(device)
    result, logits = {}, []
    for label, adapter in (("a", adapter_a), ("b", adapter_b)):
        weights = load_file(f"{adapter}/adapter_model.safetensors")
        result[label] = {"path": str(adapter), "lora_tensors": len(weights),
                         "lora_B_nonzero": sum(1 for k, v in weights.items() if "lora_B" in k and v.abs().max() > 0)}
        result[f"{label}_names"] = sorted(weights)
        peft_model = PeftModel.from_pretrained(model, adapter, adapter_name=label)
        with torch.no_grad():
            logits.append(peft_model.eval()(input_ids=ids).logits.float().cpu())
        model = peft_model.unload()  # the base again, for the next adapter
    result["same_names"] = result.pop("a_names") == result.pop("b_names")
    result["max_abs_logit_diff"] = float((logits[0] - logits[1]).abs().max())
    result["logit_scale"] = float(logits[1].abs().max())
    return result


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.splitlines()[2].strip())
    print(json.dumps(compare(*sys.argv[1:])))
