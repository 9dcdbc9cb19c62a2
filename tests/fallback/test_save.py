"""Unsloth's saving methods on the fallback's models (nbddp/fallback/save.py)."""
import json
import os

import pytest
import torch

from nbddp.errors import UsageError
from nbddp.fallback.models import FastLanguageModel
from tests.runtime.test_smoke_sandbox import SAVED_THERE, no_network, project, smoke_run  # noqa: F401 (fixtures)

BATCH = [[1, 3, 4, 5, 6, 3, 7], [1, 8, 9, 10, 11, 12, 2]]


@pytest.fixture
def tiny_model_path(tiny_llama_dir, model_cache):
    """The tiny Llama, its tokenizer_config recording its padding side as the hub's Llama tokenizers do."""
    from nbddp.examples.tiny_model import ensure_weights

    config = tiny_llama_dir / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "padding_side": "right"}))
    return ensure_weights(str(tiny_llama_dir))


@pytest.fixture
def trained(tiny_model_path):
    """The fallback's tiny Llama with LoRA adapters as training leaves them: lora_B no longer zero, so the merged
    weights differ from the base's."""
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=32, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, random_state=3407)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.2)
    return model, tokenizer


def logits(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor(BATCH)).logits.float()


def base_logits(model):
    with model.disable_adapter():
        return logits(model)


def reload(directory, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)


def test_merged_16bit_is_a_plain_bfloat16_checkpoint_with_the_peft_models_logits(trained, tmp_path):
    from safetensors import safe_open

    model, tokenizer = trained
    expected, base = logits(model), base_logits(model)
    model.save_pretrained_merged(str(tmp_path / "merged"), tokenizer, save_method="merged_16bit")
    with safe_open(tmp_path / "merged" / "model.safetensors", "pt") as weights:
        names = list(weights.keys())
        assert {weights.get_tensor(name).dtype for name in names} == {torch.bfloat16}
    assert names and not any("lora" in name or "base_layer" in name for name in names)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = logits(reload(tmp_path / "merged"))
    # bfloat16 rounds each weight to within 2**-9 of itself; through the 2 layers' matrix products these errors
    # move the logits by well under 2% of their scale (0.6% measured). The adapters move them by more than half of
    # it, so a merge that lost them, or the base saved unmerged, is far outside the tolerance.
    scale = expected.abs().max()
    assert (merged - expected).abs().max() < 0.02 * scale
    assert (base - expected).abs().max() > 0.5 * scale
    assert json.loads((tmp_path / "merged" / "tokenizer_config.json").read_text())["padding_side"] == "left"
    assert tokenizer.padding_side == "right"  # the training tokenizer as it was


def test_merged_in_float32_is_exactly_the_peft_models(trained, tmp_path):
    model, tokenizer = trained
    model.save_pretrained_merged(str(tmp_path / "merged"), tokenizer, dtype=torch.float32)
    torch.testing.assert_close(logits(reload(tmp_path / "merged")), logits(model), rtol=1e-5, atol=1e-5)


def test_saving_leaves_the_trained_model_as_it_was_and_training(trained, tmp_path):
    model, tokenizer = trained
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    expected = logits(model)
    model.save_pretrained_merged(str(tmp_path / "merged"), tokenizer)
    after = dict(model.named_parameters())
    assert before.keys() == after.keys() and any("lora_A" in name for name in after)
    assert all(before[name].equal(after[name]) for name in before)
    assert logits(model).equal(expected)
    model.train()
    model(input_ids=torch.tensor(BATCH), labels=torch.tensor(BATCH)).loss.backward()
    assert any(parameter.grad is not None and parameter.grad.abs().sum() > 0
               for name, parameter in model.named_parameters() if "lora_B" in name)


def test_lora_saves_the_adapter_that_peft_reloads(trained, tiny_model_path, tmp_path):
    from peft import PeftModel

    model, tokenizer = trained
    model.save_pretrained_merged(str(tmp_path / "lora"), tokenizer, save_method="lora")
    saved = set(os.listdir(tmp_path / "lora"))
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= saved
    assert "model.safetensors" not in saved
    reloaded = PeftModel.from_pretrained(reload(tiny_model_path), tmp_path / "lora")
    torch.testing.assert_close(logits(reloaded), logits(model), rtol=1e-6, atol=1e-6)


def test_a_model_without_adapters_saves_whole_in_16_bits(tiny_model_path, tmp_path):
    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, max_seq_length=32, load_in_4bit=False)
    model.save_pretrained_merged(str(tmp_path / "full"), tokenizer)
    assert model.dtype == torch.float32
    assert reload(tmp_path / "full", dtype="auto").dtype == torch.bfloat16


def test_the_model_get_peft_model_wrapped_says_which_to_save(trained, tmp_path):
    model, tokenizer = trained
    with pytest.raises(UsageError, match="call it on the model get_peft_model returned"):
        model.base_model.model.save_pretrained_merged(str(tmp_path / "merged"), tokenizer)
    assert not (tmp_path / "merged").exists()


def test_push_to_hub_merged_pushes_the_merged_model_and_tokenizer_through_push_to_hub(trained, monkeypatch):
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    pushed = []

    def push_to_hub(self, repo_id, *, commit_message=None, private=None, token=None):
        pushed.append((type(self).__name__, repo_id, private, token, getattr(self, "dtype", None)))

    monkeypatch.setattr(PreTrainedModel, "push_to_hub", push_to_hub)
    monkeypatch.setattr(PreTrainedTokenizerBase, "push_to_hub", push_to_hub)
    model, tokenizer = trained
    model.push_to_hub_merged("me/model", tokenizer, save_method="merged_16bit", token="hf_x", private=True,
                             use_temp_dir=False, safe_serialization=True)
    assert pushed == [("LlamaForCausalLM", "me/model", True, "hf_x", torch.bfloat16),
                      (type(tokenizer).__name__, "me/model", True, "hf_x", None)]


def test_in_a_smoke_run_the_merged_save_lands_in_its_folder_and_the_push_is_skipped(
        backend_patches_undone_after, trained, smoke_run, project, no_network, capsys):
    model, tokenizer = trained
    model.save_pretrained_merged("merged", tokenizer, save_method="merged_16bit")
    model.push_to_hub_merged("me/merged", tokenizer, save_method="merged_16bit", token="hf_x")
    model.push_to_hub_merged("me/lora", tokenizer, save_method="lora", token="hf_x")
    assert not (project / "merged").exists() and no_network == []
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(smoke_run / "merged"))
    assert capsys.readouterr().out.splitlines() == [
        f"nbddp: smoke run: save to merged went to runs/20260101T000000Z-smoke/merged {SAVED_THERE}",
        "nbddp: smoke run: push_to_hub to me/merged skipped (the training run pushes)",
        "nbddp: smoke run: push_to_hub to me/lora skipped (the training run pushes)"]


@pytest.mark.parametrize("call, says", [
    (lambda m, t: m.save_pretrained_gguf("model", t, quantization_method="q4_k_m"),
     r"model\.save_pretrained_gguf\('model', quantization_method='q4_k_m'\) .* llama\.cpp/convert_hf_to_gguf\.py merged"),
    (lambda m, t: m.push_to_hub_gguf("me/model", t, quantization_method="q8_0", token="hf_x"),
     r"model\.push_to_hub_gguf\('me/model', .* upload model\.gguf with huggingface_hub's upload_file"),
    (lambda m, t: m.save_pretrained_merged("model", t, save_method="merged_4bit"),
     r"model\.save_pretrained_merged\(save_method='merged_4bit'\) writes bitsandbytes 4-bit .* \(--backend unsloth\)"),
    (lambda m, t: m.push_to_hub_merged("me/model", t, save_method="merged_4bit_forced"),
     r"model\.push_to_hub_merged\(save_method='merged_4bit_forced'\) writes bitsandbytes 4-bit"),
    (lambda m, t: m.save_pretrained_merged("model", t, save_method="mxfp4"),
     r"model\.save_pretrained_merged\(save_method='mxfp4'\): .* writes save_method \"merged_16bit\" or \"lora\""),
])
def test_what_the_fallback_cannot_write_says_what_to_do_and_writes_nothing(trained, tmp_path, monkeypatch, call,
                                                                           says):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(UsageError, match=says):
        call(*trained)
    assert os.listdir(tmp_path / "work") == []


def test_a_quantized_model_merges_on_a_gpu_from_its_saved_adapter(trained, tmp_path):
    model, tokenizer = trained
    model.base_model.model.hf_quantizer = object()  # as bitsandbytes leaves a 4-bit model (CUDA only)
    with pytest.raises(UsageError, match=r"4-bit or 8-bit model: .* save_method=\"lora\"\), and merge it into"):
        model.save_pretrained_merged(str(tmp_path / "merged"), tokenizer)
    assert not (tmp_path / "merged").exists()


def test_an_option_unsloth_does_not_have_is_a_type_error(trained, tmp_path):
    model, tokenizer = trained
    model.save_pretrained_merged(str(tmp_path / "m"), tokenizer, maximum_memory_usage=0.5, temporary_location="t")
    with pytest.raises(TypeError, match="unexpected keyword argument 'save_mthod'"):
        model.save_pretrained_merged(str(tmp_path / "m"), tokenizer, save_mthod="lora")
