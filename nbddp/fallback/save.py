"""Unsloth's saving methods on the fallback's models, with Unsloth's call signatures (unsloth/save.py, 2026.10.9).

`attach(model)` binds them to each model the fallback loads and each PEFT model it wraps, as Unsloth's
`patch_saving_functions` binds its own:

    model.save_pretrained_merged("model", tokenizer, save_method="merged_16bit")  # or "lora"
    model.push_to_hub_merged("me/model", tokenizer, save_method="merged_16bit", token="hf_...")

"merged_16bit" writes the LoRA merged into the base weights, by PEFT's `merge_and_unload` on a copy (the model keeps
its adapters and may train on; a model FSDP shards is merged from its checkpoint by the main process alone,
`fsdp.merged_in_one_process`), as a plain Transformers checkpoint in 16 bits: `dtype`, else the model's when it is
float16 or bfloat16, else bfloat16 (what Unsloth writes on a GPU that has it); the copy needs the memory of a second
model. "lora" writes the adapter. The tokenizer goes beside either, its padding on the left for inference, as
Unsloth saves it. Everything is written and pushed by Transformers' and PEFT's `save_pretrained` and `push_to_hub`,
so a smoke run's sandbox (smoke_sandbox) redirects the writes and skips the pushes. What needs Unsloth's own
exporters (4-bit and FP8/FP4 merges, GGUF through llama.cpp) raises UsageError saying what to do instead.

`save_pretrained_torchao` (unsloth/save.py `unsloth_save_pretrained_torchao`) quantizes a bfloat16 copy of the
model (LoRA merged in, fake quantization removed; the model itself trains on) with its QAT recipe (qat.py), or with
`torchao_config` applied to every linear layer but the output head as Transformers' TorchAoConfig does, and saves it
with the TorchAoConfig in its config.json, so `AutoModelForCausalLM.from_pretrained` reloads it quantized:

    model.save_pretrained_torchao("phone_model", tokenizer)                       # the QAT scheme's quantization
    model.save_pretrained_torchao("model", tokenizer, torchao_config=Int8DynamicActivationIntxWeightConfig())

Where Unsloth writes: a full finetune's QAT save in `save_directory`, any other in `save_directory + "-torchao"`. It
quantizes in memory where Unsloth saves 16 bits and reloads them through TorchAoConfig: the same modules and configs,
and only the main process's `save_pretrained` writes (the smoke sandbox redirects it, and `write_executorch_config`).
Without torchao, or for a config whose kernels this machine lacks (qat_scheme "int4" needs mslk, CUDA only),
UsageError says what to do.
"""
import contextlib
import copy
import inspect
import os
import types

import torch

from nbddp import log
from nbddp.errors import UsageError
from nbddp.fallback import fsdp, qat
from nbddp.rank import is_main_process

EXECUTORCH_MODEL_TYPES = {"llama", "qwen2", "qwen3", "qwen3_5", "qwen3_5_text", "phi3", "lfm2"}  # export_llm's
EXECUTORCH_CONFIG = "executorch_export_config.yaml"

BACKEND = "nbddp's Transformers+PEFT fallback (--backend hf)"
ON_UNSLOTH = "or run on a GPU with Unsloth installed (--backend unsloth)"
SAVE_METHODS = ("merged_16bit", "lora")
MERGE_FIRST = 'model.save_pretrained_merged("merged", tokenizer, save_method="merged_16bit")'

# Options of Unsloth's saving methods about its own writer (temporary buffers, memory use, model cards,
# calibration for FP8/FP4 exports): accepted and ignored.
UNSLOTH_ONLY_SAVE_OPTIONS = frozenset({
    "state_dict", "save_function", "save_peft_format", "temporary_location", "maximum_memory_usage", "datasets",
    "calibration_dataset", "num_calibration_samples", "max_seq_length", "install_missing_dependencies",
})


def attach(model):
    """Bind save_pretrained_merged, push_to_hub_merged, save_pretrained_gguf, push_to_hub_gguf and
    save_pretrained_torchao to `model` (a Transformers model or a PeftModel); returns `model`."""
    for name, method in METHODS.items():
        setattr(model, name, types.MethodType(method, model))
    return model


def save_pretrained_merged(self, save_directory, tokenizer=None, save_method="merged_16bit", push_to_hub=False,
                           token=None, is_main_process=True, max_shard_size="5GB", safe_serialization=True,
                           variant=None, tags=None, dtype=None, **unsloth_options):
    """Unsloth's `save_pretrained_merged`: `save_method` "merged_16bit" or "lora" into `save_directory`, the tokenizer
    beside it; with `push_to_hub`, pushed to the repository `save_directory` names instead."""
    _check_options("save_pretrained_merged", unsloth_options)
    if push_to_hub:
        return push_to_hub_merged(self, save_directory, tokenizer, save_method, token=token,
                                  max_shard_size=max_shard_size, safe_serialization=safe_serialization, tags=tags,
                                  dtype=dtype)
    model = _to_save(self, "save_pretrained_merged", save_method, dtype)
    model.save_pretrained(save_directory, **_accepted(model.save_pretrained, is_main_process=is_main_process,
                                                      max_shard_size=max_shard_size, variant=variant,
                                                      safe_serialization=safe_serialization))
    if tokenizer is not None and is_main_process:
        _padded_left(tokenizer, tokenizer.save_pretrained, save_directory)


def push_to_hub_merged(self, repo_id, tokenizer=None, save_method="merged_16bit", use_temp_dir=None,
                       commit_message=None, private=None, token=None, max_shard_size="5GB", create_pr=False,
                       safe_serialization=True, revision=None, commit_description=None, tags=None, dtype=None,
                       **unsloth_options):
    """Unsloth's `push_to_hub_merged`: what `save_pretrained_merged` writes, pushed to `repo_id` by the model's and
    the tokenizer's `push_to_hub` (the options they do not take, in this Transformers release, are dropped)."""
    _check_options("push_to_hub_merged", unsloth_options)
    model = _to_save(self, "push_to_hub_merged", save_method, dtype)
    options = dict(use_temp_dir=use_temp_dir, commit_message=commit_message, private=private, token=token,
                   max_shard_size=max_shard_size, create_pr=create_pr, safe_serialization=safe_serialization,
                   revision=revision, commit_description=commit_description, tags=tags)
    model.push_to_hub(repo_id, **_accepted(model.push_to_hub, **options))
    if tokenizer is not None:
        _padded_left(tokenizer, tokenizer.push_to_hub, repo_id, **_accepted(tokenizer.push_to_hub, **options))


def save_pretrained_gguf(self, save_directory, tokenizer=None, quantization_method="fast_quantized", **options):
    """Unsloth's `save_pretrained_gguf`: refused, with what to do (see `_gguf_refusal`)."""
    raise _gguf_refusal("save_pretrained_gguf", save_directory, quantization_method)


def push_to_hub_gguf(self, repo_id, tokenizer=None, quantization_method="fast_quantized", **options):
    """Unsloth's `push_to_hub_gguf`: refused, with what to do (see `_gguf_refusal`)."""
    raise _gguf_refusal("push_to_hub_gguf", repo_id, quantization_method,
                        then=", and upload model.gguf with huggingface_hub's upload_file")


def save_pretrained_torchao(self, save_directory, tokenizer=None, torchao_config=None, push_to_hub=False,
                            token=None):
    """Unsloth's `save_pretrained_torchao`: the model quantized with torchao (its QAT scheme's recipe, or
    `torchao_config`) and saved, or with `push_to_hub` pushed to the repository `save_directory` names, as the
    module docstring says; the tokenizer goes beside the weights, padding on the left."""
    from peft import PeftModel

    call = f"model.save_pretrained_torchao({save_directory!r})"
    qat.require_torchao(call)
    recipe = getattr(self, "_torchao_config", None)
    if torchao_config is None and recipe is None:
        raise UsageError(
            f"{call} without torchao_config on a model not trained with qat_scheme: pass the quantization, "
            "torchao_config=Int8DynamicActivationIntxWeightConfig() for example (from torchao.quantization), or "
            "train with qat_scheme (from_pretrained(..., full_finetuning=True, qat_scheme=...) or "
            "get_peft_model(..., qat_scheme=...))")
    in_place = torchao_config is None and not isinstance(self, PeftModel)
    target = str(save_directory) if in_place else f"{save_directory}-torchao"
    if not is_main_process():
        return
    quantized = _to_save(self, "save_pretrained_torchao", "merged_16bit", torch.bfloat16)
    if quantized is self:
        quantized = copy.deepcopy(self)
    _strip_fake_quantization(quantized)
    configs = recipe.base_config_and_filter_fns if torchao_config is None else [
        (getattr(torchao_config, "quant_type", torchao_config), _linear_but_head(quantized))]
    _quantize(quantized, configs, call)
    with _hf_quantizer(quantized):
        if push_to_hub:
            quantized.push_to_hub(target, token=token)
            if tokenizer is not None:
                _padded_left(tokenizer, tokenizer.push_to_hub, target, token=token)
        else:
            quantized.save_pretrained(target, **_accepted(quantized.save_pretrained, safe_serialization=False))
            if tokenizer is not None:
                _padded_left(tokenizer, tokenizer.save_pretrained, target)
    if torchao_config is None and recipe.qat_scheme == "int8-int4" and not push_to_hub:
        write_executorch_config(target, self.config.model_type)


METHODS = {function.__name__: function for function in (
    save_pretrained_merged, push_to_hub_merged, save_pretrained_gguf, push_to_hub_gguf, save_pretrained_torchao)}


def _to_save(model, method, save_method, dtype):
    """What `save_method` writes of `model`: a PeftModel itself ("lora"), a merged 16-bit copy ("merged_16bit"), or
    for a model without adapters (full finetuning) itself or a 16-bit copy, as Unsloth saves it whole."""
    from peft import PeftModel
    from peft.tuners.tuners_utils import BaseTunerLayer

    save_method = _normalized(method, save_method)
    adapters = isinstance(model, PeftModel)
    if not adapters and any(isinstance(module, BaseTunerLayer) for module in model.modules()):
        raise UsageError(
            f"model.{method} was called on the model that get_peft_model wrapped, whose layers now hold the LoRA "
            "adapters; call it on the model get_peft_model returned (model = FastLanguageModel.get_peft_model(...))")
    if save_method == "lora":
        return model
    if adapters and fsdp.is_sharded(model):  # a QLoRA model's too: merged into its 16-bit checkpoint
        return fsdp.merged_in_one_process(model, _merged_dtype(model, dtype))
    if getattr(model, "hf_quantizer", None) is not None:
        raise UsageError(
            f"model.{method}(save_method=\"merged_16bit\") on a 4-bit or 8-bit model: {BACKEND} merges with PEFT, "
            "which would round the merged weights back to 4 bits. Save the adapter, "
            f"model.{method}(..., save_method=\"lora\"), and merge it into the base model loaded in 16 bits: "
            "PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16), "
            f"adapter).merge_and_unload().save_pretrained(...); {ON_UNSLOTH}")
    dtype = _merged_dtype(model, dtype)
    if not adapters:
        return model if model.dtype == dtype else copy.deepcopy(model).to(dtype)
    return copy.deepcopy(model).merge_and_unload().to(dtype)


def _normalized(method, save_method):
    """`save_method` spelled as Unsloth reads it ("Merged 16bit" is "merged_16bit"); UsageError for the methods the
    fallback cannot write."""
    key = str(save_method).lower().strip().replace("-", "_").replace(" ", "_")
    if key in SAVE_METHODS:
        return key
    if key.startswith("merged_4bit"):
        raise UsageError(
            f"model.{method}(save_method={save_method!r}) writes bitsandbytes 4-bit weights through Unsloth's "
            f"exporter, which {BACKEND} does not have. Save save_method=\"merged_16bit\" and load that with "
            "BitsAndBytesConfig(load_in_4bit=True) where it runs (a CUDA GPU); " + ON_UNSLOTH)
    raise UsageError(
        f"model.{method}(save_method={save_method!r}): {BACKEND} writes save_method \"merged_16bit\" or \"lora\"; "
        "Unsloth's quantized exports (merged_4bit, fp8, mxfp4, nvfp4, torchao_fp8, ...) need its exporter. Save "
        "\"merged_16bit\" and quantize that (llm-compressor for FP8/FP4, transformers' TorchAoConfig for "
        f"torchao), {ON_UNSLOTH}")


def _merged_dtype(model, dtype):
    if isinstance(dtype, str):
        return getattr(torch, dtype)
    if dtype is not None:
        return dtype
    return model.dtype if model.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


def _gguf_refusal(method, target, quantization_method, then=""):
    return UsageError(
        f"model.{method}({target!r}, quantization_method={quantization_method!r}) converts the model to GGUF with "
        f"llama.cpp, which {BACKEND} does not build or run. Save the merged model, {MERGE_FIRST}, and convert it: "
        "python llama.cpp/convert_hf_to_gguf.py merged --outfile model.gguf --outtype q8_0 (llama.cpp's "
        f"llama-quantize makes the k-quants such as q4_k_m){then}; {ON_UNSLOTH}")


def _check_options(method, options):
    unknown = sorted(set(options) - UNSLOTH_ONLY_SAVE_OPTIONS)
    if unknown:
        raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r}")


def _accepted(function, **options):
    """The `options` that `function` names as parameters (Transformers 5's push_to_hub dropped use_temp_dir and
    safe_serialization, its save_pretrained safe_serialization)."""
    parameters = inspect.signature(function).parameters
    return {name: value for name, value in options.items()
            if name in parameters and parameters[name].kind is not inspect.Parameter.VAR_KEYWORD}


def _padded_left(tokenizer, save, *args, **kwargs):
    """`save(*args, **kwargs)` with the tokenizer (a processor's too) padding on the left, then as it was."""
    inner = getattr(tokenizer, "tokenizer", tokenizer)
    side = inner.padding_side
    inner.padding_side = "left"
    try:
        save(*args, **kwargs)
    finally:
        inner.padding_side = side


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


def write_executorch_config(directory, model_type):
    """Unsloth's ExecuTorch export settings for qat_scheme "int8-int4": printed, and written into `directory`, beside
    the weights, for the model types ExecuTorch's export_llm takes (a smoke run's sandbox redirects `directory`)."""
    settings = ("quantization.qmode=8da4w quantization.group_size=32 quantization.use_hqq=false "
                'quantization.embedding_quantize="8,0"')
    if model_type not in EXECUTORCH_MODEL_TYPES:
        log.info(f"nbddp: ExecuTorch's export_llm does not take model type {model_type!r}; export with "
                 f"optimum-executorch (XNNPACK) using {settings}, to match this QAT recipe")
        return
    path = os.path.join(directory, EXECUTORCH_CONFIG)
    with open(path, "w", encoding="utf-8") as file:
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
