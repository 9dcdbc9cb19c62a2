"""The Transformers+PEFT fallback for Unsloth, installed as the module `unsloth` by `--backend hf`.

It keeps Unsloth's call signatures (unsloth/models/loader.py and llama.py), so a notebook written for
Unsloth runs unchanged on a CPU or a GPU without Unsloth:

    from unsloth import FastLanguageModel, is_bfloat16_supported
    model, tokenizer = FastLanguageModel.from_pretrained("models/tiny", max_seq_length=512, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, random_state=3407)

With CUDA and bitsandbytes, `load_in_4bit` is the standard Transformers+PEFT QLoRA recipe (nf4, double
quantisation, `prepare_model_for_kbit_training`): the baseline the benchmarks compare Unsloth against.
transformers and peft are imported inside the functions: this module is imported before Unsloth, which
must be imported before them.
"""
import dataclasses
import importlib.util
import os
import sys

import torch

from nbddp.runtime import hf_chat_templates as chat_templates  # `unsloth.chat_templates` (see backends.activate)
from nbddp.runtime.checkpointing import peft_mode
from nbddp.runtime.models import require_model

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Options of Unsloth's from_pretrained that mean nothing to Transformers: accepted and ignored.
UNSLOTH_ONLY_LOAD_OPTIONS = frozenset({
    "load_in_16bit", "load_in_fp8", "fix_tokenizer", "use_gradient_checkpointing", "resize_model_vocab",
    "use_exact_model_name", "offload_embedding", "float32_mixed_precision", "fast_inference",
    "gpu_memory_utilization", "float8_kv_cache", "random_state", "max_lora_rank", "disable_log_stats",
    "qat_scheme", "unsloth_tiled_mlp", "text_only", "device_map_planner_kwargs", "on_model_resolved",
})


def is_bfloat16_supported() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


class FastLanguageModel:
    """Unsloth's `FastLanguageModel` API on plain Transformers and PEFT."""

    @staticmethod
    def from_pretrained(
        model_name="unsloth/Llama-3.2-1B-Instruct",
        max_seq_length=2048,
        dtype=None,
        load_in_4bit=True,  # Unsloth's default: QLoRA
        load_in_8bit=False,
        device_map=None,
        full_finetuning=False,
        token=None,
        trust_remote_code=False,
        **kwargs,
    ):
        """Load `(model, tokenizer)`; other keyword arguments go to `AutoModelForCausalLM.from_pretrained`."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        require_model(model_name)  # a clear error now, rather than Transformers' after a minute of retries
        dtype = _resolve_dtype(dtype)
        options = {key: value for key, value in kwargs.items() if key not in UNSLOTH_ONLY_LOAD_OPTIONS}
        if (load_in_4bit or load_in_8bit) and not full_finetuning:
            quantization = _quantization_config(load_in_4bit, dtype)
            if quantization is not None:
                options["quantization_config"] = quantization
        if device_map is None and torch.cuda.is_available():
            device_map = {"": torch.cuda.current_device()}
        model = AutoModelForCausalLM.from_pretrained(
            model_name, dtype=dtype, device_map=device_map, token=token, trust_remote_code=trust_remote_code, **options
        )
        tokenizer = AutoTokenizer.from_pretrained(model_name, token=token, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        tokenizer.padding_side = "right"  # for training; for_inference switches it to left
        tokenizer.model_max_length = max_seq_length
        model.max_seq_length = max_seq_length
        model.nbddp_tokenizer = tokenizer
        return model, tokenizer

    @staticmethod
    def get_peft_model(
        model,
        r=16,
        target_modules=DEFAULT_TARGET_MODULES,
        lora_alpha=16,
        lora_dropout=0.0,
        bias="none",
        layers_to_transform=None,
        layers_pattern=None,
        use_gradient_checkpointing="unsloth",
        random_state=3407,
        max_seq_length=2048,  # unused, as in Unsloth
        use_rslora=False,
        modules_to_save=None,
        init_lora_weights=True,
        loftq_config=None,
        **kwargs,
    ):
        """Wrap `model` with LoRA adapters; only the adapters (and `modules_to_save`) are trainable."""
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
        from transformers import set_seed

        # "false" arrives as a string from flags and papermill (bool() would read it as True); Unsloth's
        # "unsloth" mode is its own offloading variant, here plain gradient checkpointing.
        checkpointing = peft_mode(use_gradient_checkpointing) != "off"
        checkpointing_kwargs = {"use_reentrant": False}
        if getattr(model, "hf_quantizer", None) is not None:
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs=checkpointing_kwargs
            )
        elif checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs)
        lora_fields = {field.name for field in dataclasses.fields(LoraConfig)}
        config = LoraConfig(
            r=r,
            target_modules=target_modules,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            bias=bias,
            layers_to_transform=layers_to_transform,
            layers_pattern=layers_pattern,
            use_rslora=use_rslora,
            modules_to_save=modules_to_save,
            init_lora_weights=init_lora_weights,
            loftq_config=loftq_config or {},
            task_type="CAUSAL_LM",
            **{key: value for key, value in kwargs.items() if key in lora_fields},
        )
        set_seed(random_state)  # as Unsloth does: the LoRA init is the same on every rank and every run
        return get_peft_model(model, config)

    @staticmethod
    def for_inference(model):
        model.eval()
        _set_padding_side(model, "left")  # generation appends on the right
        return model

    @staticmethod
    def for_training(model, use_gradient_checkpointing=None):
        model.train()
        _set_padding_side(model, "right")
        return model


def _resolve_dtype(dtype):
    """Unsloth's rule for dtype=None: bfloat16 where the GPU has it, float16 on older GPUs, float32 on CPU."""
    if isinstance(dtype, str):
        return getattr(torch, dtype)
    if dtype is not None:
        return dtype
    if not torch.cuda.is_available():
        return torch.float32
    return torch.bfloat16 if is_bfloat16_supported() else torch.float16


def _quantization_config(load_in_4bit: bool, compute_dtype):
    """bitsandbytes quantisation, or None (full precision, with a warning) where it cannot run."""
    from transformers import BitsAndBytesConfig

    if not (torch.cuda.is_available() and importlib.util.find_spec("bitsandbytes")):
        _warn_on_rank0(f"load_in_{4 if load_in_4bit else 8}bit needs CUDA and bitsandbytes; loading in full precision")
        return None
    if not load_in_4bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def _set_padding_side(model, side: str) -> None:
    tokenizer = getattr(model, "nbddp_tokenizer", None)
    if tokenizer is not None:
        tokenizer.padding_side = side


def _warn_on_rank0(message: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(f"nbddp: {message}", file=sys.stderr)
