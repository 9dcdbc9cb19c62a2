"""Unsloth's torchao paths on the fallback: quantization-aware training and `save_pretrained_torchao`
(unsloth/models/_utils.py `_prepare_model_for_qat`, unsloth/save.py `unsloth_save_pretrained_torchao`, 2026.10.9).

    model, tokenizer = FastLanguageModel.from_pretrained(name, full_finetuning=True, qat_scheme="phone-deployment")
    model = FastLanguageModel.get_peft_model(model, r=16, qat_scheme="int4")       # or QAT with LoRA
    model.save_pretrained_torchao("phone_model", tokenizer)                       # the QAT scheme's quantization
    model.save_pretrained_torchao("model", tokenizer, torchao_config=Int8DynamicActivationIntxWeightConfig())

`prepare_qat` fake-quantizes the layers of Unsloth's recipe for the scheme (torchao's QATConfig "prepare"), LoRA
adapters left out. `save_pretrained_torchao` quantizes a bfloat16 copy of the model (LoRA merged in, fake
quantization removed; the model itself trains on) with the QAT recipe, or with `torchao_config` applied to every
linear layer but the output head as Transformers' TorchAoConfig does, and saves it with the TorchAoConfig in its
config.json, so `AutoModelForCausalLM.from_pretrained` reloads it quantized. Where Unsloth writes: a full finetune's
QAT save in `save_directory`, any other in `save_directory + "-torchao"`. It quantizes in memory where Unsloth saves
16 bits and reloads them through TorchAoConfig: the same modules and configs, and only the main process's
`save_pretrained` writes (the smoke sandbox redirects it). Without torchao, or for a config whose kernels this
machine lacks (qat_scheme "int4" needs mslk, CUDA only), UsageError says what to do.
"""
import contextlib
import copy
import dataclasses
import os
from typing import Callable, List, Optional, Tuple

import torch

from nbddp import log
from nbddp.errors import UsageError
from nbddp.runtime.rank import is_main_process

TORCHAO = "torchao==0.18.0"  # what Unsloth's GPU site installs; it runs on torch 2.13's CPU build too
SCHEMES = ("int8-int4", "phone-deployment", "int8", "int4")
EXECUTORCH_MODEL_TYPES = {"llama", "qwen2", "qwen3", "qwen3_5", "qwen3_5_text", "phi3", "lfm2"}  # export_llm's
EXECUTORCH_CONFIG = "executorch_export_config.yaml"


@dataclasses.dataclass
class TorchAOConfig:
    """Unsloth's record of a model's QAT recipe (`model._torchao_config`): (torchao config, module filter) pairs."""
    qat_scheme: str
    base_config_and_filter_fns: List[Tuple[object, Optional[Callable]]]


def prepare_qat(model, qat_scheme):
    """Fake-quantize `model` in place for `qat_scheme` (None: nothing) and record the recipe on it and the models it
    wraps, as Unsloth does; returns `model`."""
    if qat_scheme is None:
        return model
    _require_torchao(f"qat_scheme={qat_scheme!r}")
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig

    qat_scheme = "int8-int4" if qat_scheme == "phone-deployment" else qat_scheme  # Unsloth's alias
    recipe = TorchAOConfig(qat_scheme, _recipe(model, qat_scheme))
    if recipe.qat_scheme == "int8-int4":
        _untie_embeddings(model)  # quantized apart: the embedding in 8 bits, the head in 4
    hooked = [module for module in model.modules() if hasattr(module, "_require_grads_hook")]
    for base_config, keep in recipe.base_config_and_filter_fns:
        quantize_(model, QATConfig(base_config, step="prepare"), filter_fn=keep)
    for module in hooked:  # PEFT's hook making the inputs require grad sat on the embedding QAT replaced
        module._require_grads_hook.remove()
        module.enable_input_require_grads()
    inner = model
    while hasattr(inner, "model"):
        inner._torchao_config = recipe
        inner = inner.model
    inner._torchao_config = recipe
    return model


def save_pretrained_torchao(model, save_directory, tokenizer=None, torchao_config=None, push_to_hub=False,
                            token=None):
    """Quantize and save (or with `push_to_hub`, push to the repository `save_directory` names) as the module
    docstring says; the tokenizer goes beside the weights, padding on the left."""
    from peft import PeftModel

    from nbddp.runtime.backends import hf_saving

    call = f"model.save_pretrained_torchao({save_directory!r})"
    _require_torchao(call)
    recipe = getattr(model, "_torchao_config", None)
    if torchao_config is None and recipe is None:
        raise UsageError(
            f"{call} without torchao_config on a model not trained with qat_scheme: pass the quantization, "
            "torchao_config=Int8DynamicActivationIntxWeightConfig() for example (from torchao.quantization), or "
            "train with qat_scheme (from_pretrained(..., full_finetuning=True, qat_scheme=...) or "
            "get_peft_model(..., qat_scheme=...))")
    in_place = torchao_config is None and not isinstance(model, PeftModel)
    target = str(save_directory) if in_place else f"{save_directory}-torchao"
    if not is_main_process():
        return
    quantized = hf_saving._to_save(model, "save_pretrained_torchao", "merged_16bit", torch.bfloat16)
    if quantized is model:
        quantized = copy.deepcopy(model)
    _strip_fake_quantization(quantized)
    configs = recipe.base_config_and_filter_fns if torchao_config is None else [
        (getattr(torchao_config, "quant_type", torchao_config), _linear_but_head(quantized))]
    _quantize(quantized, configs, call)
    with _hf_quantizer(quantized):
        if push_to_hub:
            quantized.push_to_hub(target, token=token)
            if tokenizer is not None:
                hf_saving._padded_left(tokenizer, tokenizer.push_to_hub, target, token=token)
        else:
            quantized.save_pretrained(target, **hf_saving._accepted(quantized.save_pretrained,
                                                                    safe_serialization=False))
            if tokenizer is not None:
                hf_saving._padded_left(tokenizer, tokenizer.save_pretrained, target)
    if torchao_config is None and recipe.qat_scheme == "int8-int4" and not push_to_hub:
        _write_executorch_config(target, model.config.model_type)


def _require_torchao(call):
    try:
        import torchao  # noqa: F401
    except ImportError as error:
        raise UsageError(
            f"{call} quantizes with torchao, which is not installed ({error}): pip install {TORCHAO} (it runs on "
            "CPU for qat_scheme 'int8-int4', 'phone-deployment' and 'int8'), or run on a GPU with Unsloth installed "
            "(--backend unsloth)") from None


def _recipe(model, qat_scheme):
    """Unsloth's (torchao config, filter) pairs for the schemes whose fake quantization runs on a CPU."""
    from torchao.quantization import Int4WeightOnlyConfig, Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup

    def linear(group_size=1, minimum=0):
        return lambda module, name: (isinstance(module, torch.nn.Linear) and ".lora_" not in f".{name}"
                                     and module.in_features >= minimum and module.in_features % group_size == 0)

    if qat_scheme == "int8-int4":
        return [(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)),
                 lambda module, name: isinstance(module, torch.nn.Embedding)),
                (Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
                 linear(32))]
    if qat_scheme == "int8":
        return [(IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0)), linear())]
    if qat_scheme == "int4":
        return [(Int4WeightOnlyConfig(group_size=128), linear(128, 128))]
    raise UsageError(
        f"qat_scheme={qat_scheme!r}: nbddp's Transformers+PEFT fallback (--backend hf) trains with the schemes "
        f"{', '.join(SCHEMES)}; Unsloth's others (fp8-int4, fp8-fp8, nvfp4, mxfp8, cactus) need its GPU kernels or "
        "its own recipe. Run on a GPU with Unsloth installed (--backend unsloth)")


def _untie_embeddings(model):
    """Give the output head its own copy of a tied input embedding, and keep Transformers from tying them again."""
    model.config.get_text_config().tie_word_embeddings = False
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and head.weight is embedding.weight:
        weight = embedding.weight
        head.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad)


def _strip_fake_quantization(model):
    """Fake-quantized modules back to plain ones, weights untouched (QATConfig "convert" without a config)."""
    from torchao.quantization import quantize_
    from torchao.quantization.qat import QATConfig

    quantize_(model, QATConfig(step="convert"), filter_fn=lambda module, name: hasattr(module, "weight_fake_quantizer"))


def _linear_but_head(model):
    """The modules Transformers' TorchAoConfig quantizes by default: the linear layers, the output head left out."""
    head = model.get_output_embeddings()
    return lambda module, name: isinstance(module, torch.nn.Linear) and module is not head


def _quantize(model, configs, call):
    """Apply each (config, filter) to `model`, and record them as the TorchAoConfig of its config."""
    from torchao.quantization import ModuleFqnToConfig, quantize_
    from torchao.utils import TorchAOBaseTensor
    from transformers import TorchAoConfig

    by_module = {}
    for base_config, keep in configs:
        names = [name for name, module in model.named_modules() if name and keep(module, name)]
        try:
            quantize_(model, base_config, filter_fn=keep)
        except (ImportError, NotImplementedError, RuntimeError) as error:
            raise UsageError(
                f"{call}: torchao's {type(base_config).__name__} cannot quantize on this machine ({error}). Its CPU "
                "configs are IntxWeightOnlyConfig and Int8DynamicActivationIntxWeightConfig (qat_scheme 'int8' and "
                "'int8-int4'); save the merged model, model.save_pretrained_merged(\"merged\", tokenizer), and "
                "quantize it where the kernels run, or run on a GPU with Unsloth installed (--backend unsloth)"
            ) from None
        by_module.update(dict.fromkeys(names, base_config))
    embeddings = [model.get_input_embeddings(), model.get_output_embeddings()]
    quantized_embeddings = any(module is not None and isinstance(module.weight, TorchAOBaseTensor)
                               for module in embeddings)
    options = {"include_input_output_embeddings": True, "modules_to_not_convert": []} if quantized_embeddings else {}
    model.config.quantization_config = TorchAoConfig(quant_type=ModuleFqnToConfig(by_module), **options)


@contextlib.contextmanager
def _hf_quantizer(model):
    """Transformers 5 saves torchao's tensor subclasses only with a torchao HfQuantizer on the model (Unsloth's
    `_torchao_hf_quantizer_attached`); Transformers 4 pickles them as they are."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5 or getattr(model, "hf_quantizer", None) is not None:
        yield
        return
    from transformers.quantizers.auto import AutoHfQuantizer

    model.hf_quantizer = AutoHfQuantizer.from_config(model.config.quantization_config, pre_quantized=False)
    try:
        yield
    finally:
        del model.hf_quantizer


def _write_executorch_config(directory, model_type):
    """Unsloth's ExecuTorch export settings for qat_scheme "int8-int4": printed, and written beside the weights
    for the model types ExecuTorch's export_llm takes."""
    from nbddp.runtime import smoke_sandbox

    settings = ("quantization.qmode=8da4w quantization.group_size=32 quantization.use_hqq=false "
                'quantization.embedding_quantize="8,0"')
    if model_type not in EXECUTORCH_MODEL_TYPES:
        log.info(f"nbddp: ExecuTorch's export_llm does not take model type {model_type!r}; export with "
                 f"optimum-executorch (XNNPACK) using {settings}, to match this QAT recipe")
        return
    path = os.path.join(directory, EXECUTORCH_CONFIG)
    with open(smoke_sandbox.redirected(path), "w", encoding="utf-8") as file:
        file.write(EXECUTORCH_YAML)
    log.info(f"nbddp: for ExecuTorch, export with export_llm using {settings} (its defaults, group_size 128 with "
             f"HQQ, do not match this QAT recipe); config written to {path}")


EXECUTORCH_YAML = """\
# ExecuTorch export_llm config matching Unsloth qat_scheme="phone-deployment" (int8-int4).
# Export from a merged 16-bit checkpoint (model.save_pretrained_merged(dir, tokenizer)), converted to
# ExecuTorch's format, e.g. for Qwen3: python -m examples.models.qwen3.convert_weights <dir> model.pth
# Then: python -m extension.llm.export.export_llm --config this_file.yaml \\
#   +base.model_class=<e.g. qwen3_0_6b> +base.params=<model params json> +base.checkpoint=model.pth
model:
  use_kv_cache: True
  use_sdpa_with_kv_cache: True
  dtype_override: fp32
quantization:
  qmode: 8da4w
  group_size: 32
  use_hqq: False
  embedding_quantize: "8,0"
backend:
  xnnpack:
    enabled: True
    extended_ops: True
"""  # unsloth/save.py's EXECUTORCH_PHONE_DEPLOYMENT_CONFIG
