"""The fallback's torchao paths: QAT and save_pretrained_torchao (nbddp/fallback/qat.py, save.py)."""
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from nbddp.errors import UsageError
from nbddp.fallback.models import FastLanguageModel
from tests.fallback.test_save import BATCH, logits, trained, tiny_model_path  # noqa: F401 (fixtures)
from tests.runtime.test_smoke_sandbox import SAVED_THERE, no_network, project, smoke_run  # noqa: F401 (fixtures)

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
needs_torchao = pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed (pip install torchao==0.18.0; "
                                                            "requirements*.txt leave it out)")


def reload(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)


@needs_torchao
def test_a_ptq_save_reloads_quantized_with_plain_transformers_and_the_merged_models_logits(trained, tmp_path):
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis
    from torchao.utils import TorchAOBaseTensor

    model, tokenizer = trained
    expected = logits(model)
    with model.disable_adapter():
        base = logits(model)
    model.save_pretrained_torchao(str(tmp_path / "model"), tokenizer,
                                  torchao_config=IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)))
    assert not (tmp_path / "model").exists()  # Unsloth writes the quantized model beside the name it is given
    reloaded = reload(tmp_path / "model-torchao")
    layer = reloaded.model.layers[0]
    assert isinstance(layer.self_attn.q_proj.weight, TorchAOBaseTensor)
    assert not isinstance(reloaded.lm_head.weight, TorchAOBaseTensor)  # as TorchAoConfig leaves the head
    assert reloaded.config.quantization_config.quant_method == "torchao"
    # Per-row int8 rounds each weight to within 1/254 of its row's largest, bfloat16 (the merge's dtype) to 2**-9 of
    # itself: through the 2 layers the logits move by about 1% of their scale. The adapters move them by more than
    # half of it, so a save that lost the merge is far outside.
    scale = expected.abs().max()
    assert (logits(reloaded) - expected).abs().max() < 0.03 * scale
    assert (base - expected).abs().max() > 0.5 * scale
    assert any("lora_A" in name for name, _ in model.named_parameters())  # the model keeps its adapters


@needs_torchao
def test_a_phone_deployment_qat_finetune_saves_the_int8_int4_model_that_qat_simulated(tiny_model_path, tmp_path):
    from torchao.quantization.qat.linear import FakeQuantizedLinear
    from torchao.utils import TorchAOBaseTensor

    model, tokenizer = FastLanguageModel.from_pretrained(tiny_model_path, load_in_4bit=False, full_finetuning=True,
                                                         qat_scheme="phone-deployment")
    assert isinstance(model.model.layers[0].mlp.down_proj, FakeQuantizedLinear)
    model.train()
    model(input_ids=torch.tensor(BATCH), labels=torch.tensor(BATCH)).loss.backward()  # it trains
    simulated = logits(model.to(torch.bfloat16))
    model.save_pretrained_torchao(str(tmp_path / "phone_model"), tokenizer)
    saved = set(os.listdir(tmp_path / "phone_model"))
    assert {"config.json", "tokenizer.json", "executorch_export_config.yaml"} <= saved
    reloaded = reload(tmp_path / "phone_model")
    assert isinstance(reloaded.model.embed_tokens.weight, TorchAOBaseTensor)
    assert isinstance(reloaded.lm_head.weight, TorchAOBaseTensor)
    # The fake quantization rounds as the int8/int4 kernels do, but on the training weights' float32 scales where the
    # save quantizes bfloat16 ones: a few 4-bit levels flip (4.6% of the scale measured); without quantization
    # the logits are 20% away from the simulated ones.
    scale = simulated.abs().max()
    assert (logits(reloaded) - simulated).abs().max() < 0.1 * scale


@needs_torchao
def test_int4_which_needs_a_gpu_kernel_says_what_to_do_and_writes_nothing(model_cache, tmp_path):
    from nbddp.examples.tiny_model import ensure_weights

    wide = ensure_weights(str(Path(__file__).parents[2] / "models" / "tiny-llama"))  # in_features 128: int4's groups
    model, tokenizer = FastLanguageModel.from_pretrained(wide, load_in_4bit=False)
    model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8, qat_scheme="int4")
    if importlib.util.find_spec("mslk") is not None:
        pytest.skip("mslk is installed: Int4WeightOnlyConfig quantizes here")
    with pytest.raises(UsageError, match=r"Int4WeightOnlyConfig cannot quantize on this machine \(Requires mslk"):
        model.save_pretrained_torchao(str(tmp_path / "model"), tokenizer)
    assert not (tmp_path / "model").exists() and not (tmp_path / "model-torchao").exists()


@needs_torchao
def test_in_a_smoke_run_the_torchao_save_lands_in_its_folder(backend_patches_undone_after, trained, smoke_run,
                                                              project, no_network):
    from torchao.quantization import IntxWeightOnlyConfig

    model, tokenizer = trained
    model.save_pretrained_torchao("model", tokenizer, torchao_config=IntxWeightOnlyConfig(weight_dtype=torch.int8))
    assert not (project / "model-torchao").exists()
    assert "config.json" in os.listdir(smoke_run / "model-torchao")


def test_without_torchao_the_save_says_which_to_install(trained, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchao", None)  # import torchao raises ImportError
    model, tokenizer = trained
    with pytest.raises(UsageError, match=r"save_pretrained_torchao\('model'\) quantizes with torchao, .* "
                                         r"pip install torchao==0\.18\.0"):
        model.save_pretrained_torchao("model", tokenizer)
