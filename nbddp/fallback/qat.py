"""Unsloth's quantization-aware training on the fallback (unsloth/models/_utils.py `_prepare_model_for_qat`,
2026.10.9): `qat_scheme=` of `from_pretrained` (full finetuning) and of `get_peft_model`.

    model, tokenizer = FastLanguageModel.from_pretrained(name, full_finetuning=True, qat_scheme="phone-deployment")
    model = FastLanguageModel.get_peft_model(model, r=16, qat_scheme="int4")       # or QAT with LoRA

`prepare_qat` fake-quantizes the layers of Unsloth's recipe for the scheme (torchao's QATConfig "prepare"), LoRA
adapters left out, and records the recipe on the model (`_torchao_config`), which `save.save_pretrained_torchao`
quantizes by. Without torchao, UsageError says what to install.
"""
import dataclasses
from typing import Callable, List, Optional, Tuple

import torch

from nbddp.errors import UsageError

TORCHAO = "torchao==0.18.0"  # what Unsloth's GPU site installs; it runs on torch 2.13's CPU build too
SCHEMES = ("int8-int4", "phone-deployment", "int8", "int4")


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
    require_torchao(f"qat_scheme={qat_scheme!r}")
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


def require_torchao(call):
    """UsageError naming `call` and what to install, unless torchao is installed."""
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


