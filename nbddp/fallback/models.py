"""The Transformers+PEFT fallback for Unsloth, installed as the module `unsloth` by `--backend hf`.

It keeps Unsloth's call signatures (unsloth/models/loader.py, llama.py and vision.py), so a notebook written for
Unsloth runs unchanged on a CPU or a GPU without Unsloth:

    from unsloth import FastLanguageModel, is_bfloat16_supported
    model, tokenizer = FastLanguageModel.from_pretrained("models/tiny", max_seq_length=512, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, random_state=3407)

    from unsloth import FastVisionModel  # or FastModel: a vision-language model gets its processor
    model, processor = FastVisionModel.from_pretrained("models/tiny-vision", load_in_4bit=False)
    model = FastVisionModel.get_peft_model(model, finetune_vision_layers=False, r=16, lora_alpha=16)

With CUDA and bitsandbytes, `load_in_4bit` is the standard Transformers+PEFT QLoRA recipe (nf4, double
quantisation, `prepare_model_for_kbit_training`): the baseline the benchmarks compare Unsloth against.
transformers, peft and trl are imported inside the functions (`unsloth.trainer`, trainer.py, on first use):
this module is imported before Unsloth, which must be imported before them. A public name Unsloth has and this
module lacks raises UsageError naming it, so `from unsloth import X` says what to do instead of "cannot import".
"""
import copyreg
import dataclasses
import functools
import importlib.util
import inspect
import re
from collections import Counter

import torch

from nbddp import log
from nbddp.errors import UsageError
# chat_templates: `unsloth.chat_templates`
from nbddp.fallback import chat_templates, fsdp, qat, rl_environments, save
from nbddp.gradient_checkpointing_modes import peft_mode
from nbddp.model_names import require_model
from nbddp.rank import is_main_process

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Options of Unsloth's from_pretrained that mean nothing to Transformers: accepted and ignored.
UNSLOTH_ONLY_LOAD_OPTIONS = frozenset({
    "load_in_16bit", "load_in_fp8", "fix_tokenizer", "use_gradient_checkpointing", "resize_model_vocab",
    "use_exact_model_name", "offload_embedding", "float32_mixed_precision", "fast_inference",
    "gpu_memory_utilization", "float8_kv_cache", "random_state", "max_lora_rank", "disable_log_stats",
    "qat_scheme", "unsloth_tiled_mlp", "text_only", "device_map_planner_kwargs", "on_model_resolved",
    "unsloth_force_compile", "return_logits", "fullgraph", "whisper_language", "whisper_task", "target_parameters",
})

# Trained as whole matrices (modules_to_save) when listed in target_modules, as Unsloth does: LoRA on them is dead.
EMBEDDING_MODULES = ("embed_tokens", "lm_head")

# unsloth_zoo's get_peft_regex: which parts of a model's module names say vision or language, attention or MLP.
VISION_TAGS = ("vision", "image", "visual", "patch")
LANGUAGE_TAGS = ("language", "text")
ATTENTION_TAGS = ("self_attn", "attention", "attn", "mixer")
MLP_TAGS = ("mlp", "feed_forward", "ffn", "dense", "mixer")

FAMILY_LOADERS = ("FastLlamaModel", "FastMistralModel", "FastQwen2Model", "FastQwen3Model", "FastQwen3MoeModel",
                  "FastGraniteModel", "FastFalconH1Model")  # FastLanguageModel under unsloth/models/__init__.py's names

DIFFUSION_MODEL_TYPES = ("diffusion_gemma", "diffusion_gemma4")  # unsloth/models/diffusion.py's

VLLM_METHODS = ("fast_generate", "load_lora")  # what fast_inference=True gives an Unsloth model

# `unsloth.trainer`'s names, which Unsloth also exports at the top (trainer.py imports trl, so on first use).
TRAINER_NAMES = ("UnslothTrainer", "UnslothTrainingArguments", "UnslothVisionDataCollator")
# `unsloth.chat_templates`' public names, which Unsloth exports at the top too: chat_templates has them (or
# says what to do instead).
CHAT_TEMPLATE_NAMES = ("get_chat_template", "test_chat_templates", "test_hf_gguf_equivalence", "remove_special_tokens",
                       "to_sharegpt", "standardize_sharegpt", "standardize_data_formats", "apply_chat_template",
                       "train_on_responses_only", "test_construct_chat_template")


def __getattr__(name):
    # PEP 562: `from unsloth import X` for a name not defined above ends here.
    if name == "trainer" or name in TRAINER_NAMES:
        from nbddp.fallback import trainer

        return trainer if name == "trainer" else getattr(trainer, name)
    if name in CHAT_TEMPLATE_NAMES:
        return getattr(chat_templates, name)
    if name in rl_environments.NAMES:
        return getattr(rl_environments.load(), name)
    if name == "FastSentenceTransformer":
        raise UsageError(
            "unsloth.FastSentenceTransformer (embedding models) is not in nbddp's Transformers+PEFT fallback "
            "(--backend hf). Train with sentence_transformers directly (SentenceTransformer(model_name) and "
            "SentenceTransformerTrainer, with a peft LoraConfig through model.add_adapter), or run on a GPU with "
            "Unsloth installed (--backend unsloth)")
    if name.startswith("_"):  # dunders and privates: the import system and tools probe these
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise UsageError(
        f"unsloth.{name} is Unsloth's; nbddp's Transformers+PEFT fallback (--backend hf) has only "
        "FastLanguageModel, FastModel, FastVisionModel, FastTextModel, "
        f"the per-family loaders ({', '.join(FAMILY_LOADERS)}), "
        f"{', '.join(TRAINER_NAMES)}, PatchDPOTrainer, "
        "is_bfloat16_supported and is_bf16_supported. Replace it with its Transformers, PEFT or TRL equivalent, "
        "or run on a GPU with Unsloth installed (--backend unsloth)")


def is_bfloat16_supported() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


is_bf16_supported = is_bfloat16_supported  # Unsloth's other name for it


def PatchDPOTrainer():  # noqa: N802 (Unsloth's name)
    """Nothing to do: Unsloth's own is a no-op too (its DPO patches are applied when Unsloth is imported), and TRL's
    DPOTrainer runs as it is on this backend."""


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
        return _load(AutoModelForCausalLM, AutoTokenizer, model_name, max_seq_length, dtype, load_in_4bit,
                     load_in_8bit, device_map, full_finetuning, token, trust_remote_code, kwargs)

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
        """Wrap `model` with LoRA adapters; only the adapters (and `modules_to_save`) are trainable.

        `embed_tokens` and `lm_head` in `target_modules` move to `modules_to_save`, as in Unsloth. The result has
        Unsloth's `save_lora(directory)` (the adapter's `save_pretrained`) and its saving methods (see save.py).
        """
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
        from transformers import set_seed

        # "false" arrives as a string from flags and papermill (bool() would read it as True); Unsloth's
        # "unsloth" mode is its own offloading variant, here plain gradient checkpointing.
        checkpointing = peft_mode(use_gradient_checkpointing) != "off"
        checkpointing_kwargs = {"use_reentrant": False}
        # Under FSDP (as TRL does for sharded QLoRA) not: it casts the norms to float32, and FSDP1 flattens a
        # layer's frozen weights into one tensor of one dtype
        if getattr(model, "hf_quantizer", None) is not None and not fsdp.active():
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs=checkpointing_kwargs
            )
        elif checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs)
        if isinstance(target_modules, (list, tuple)):
            target_modules, modules_to_save = _embeddings_to_save(target_modules, modules_to_save)
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
            **{"task_type": "CAUSAL_LM", **{key: value for key, value in kwargs.items() if key in lora_fields}},
        )
        set_seed(random_state)  # as Unsloth does: the LoRA init is the same on every rank and every run
        peft_model = get_peft_model(model, config)
        qat.prepare_qat(peft_model, kwargs.get("qat_scheme"))  # QAT of the base layers, as Unsloth
        peft_model.save_lora = peft_model.save_pretrained
        return save.attach(peft_model)

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


class FastModel:
    """Unsloth's `FastModel`: a vision-language model (its config has a `vision_config`) with its processor, any
    other as FastLanguageModel loads it; LoRA targets picked by layer family as Unsloth's `get_peft_regex` does."""

    @staticmethod
    def from_pretrained(
        model_name="unsloth/Llama-3.2-11B-Vision-Instruct-bnb-4bit",
        max_seq_length=2048,
        dtype=None,
        load_in_4bit=True,
        load_in_8bit=False,
        full_finetuning=False,
        token=None,
        device_map=None,
        trust_remote_code=False,
        auto_model=None,
        **kwargs,
    ):
        """Load `(model, processor)` (a tokenizer for a text-only model other than Whisper, which is given
        `whisper_language` and `whisper_task`); `auto_model` overrides the model class."""
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
        from transformers import AutoProcessor, AutoTokenizer

        require_model(model_name)
        _refuse_diffusion_models(model_name, token)
        config = AutoConfig.from_pretrained(model_name, token=token, trust_remote_code=trust_remote_code)
        vision = hasattr(config, "vision_config")
        model_class = auto_model or (AutoModelForImageTextToText if vision else AutoModelForCausalLM)
        whisper = kwargs.get("whisper_language") is not None and kwargs.get("whisper_task") is not None
        model, processor = _load(model_class, AutoProcessor if vision or whisper else AutoTokenizer, model_name,
                                 max_seq_length, dtype, load_in_4bit, load_in_8bit, device_map, full_finetuning, token,
                                 trust_remote_code, kwargs)
        if whisper:  # as Unsloth loads Whisper: its processor, the tokenizer prefixing the language and task
            processor.tokenizer.set_prefix_tokens(language=kwargs["whisper_language"], task=kwargs["whisper_task"])
        return model, processor

    @staticmethod
    def get_peft_model(
        model,
        r=16,
        target_modules=None,
        lora_alpha=16,
        lora_dropout=0.0,
        bias="none",
        finetune_vision_layers=True,
        finetune_language_layers=True,
        finetune_attention_modules=True,
        finetune_mlp_modules=True,
        **kwargs,
    ):
        """LoRA on the linear layers the four `finetune_*` flags select (with a list `target_modules`, only those
        of them); other keyword arguments as FastLanguageModel.get_peft_model takes them."""
        flags = (finetune_vision_layers, finetune_language_layers, finetune_attention_modules, finetune_mlp_modules)
        if target_modules == "all-linear":  # Unsloth: every family
            target_modules, flags = None, (True,) * 4
        if target_modules is None or not all(flags):
            if target_modules is not None:  # a list, to narrow: embed_tokens and lm_head are no LoRA targets
                target_modules, kwargs["modules_to_save"] = _embeddings_to_save(
                    target_modules, kwargs.get("modules_to_save"))
            target_modules = peft_target_regex(model, *flags, target_modules=target_modules)
        return FastLanguageModel.get_peft_model(
            model, r=r, target_modules=target_modules, lora_alpha=lora_alpha, lora_dropout=lora_dropout, bias=bias,
            **kwargs)

    for_inference = staticmethod(FastLanguageModel.for_inference)
    for_training = staticmethod(FastLanguageModel.for_training)


class FastVisionModel(FastModel):
    """Unsloth's `FastVisionModel`: the same as FastModel."""


FastTextModel = FastModel  # Unsloth's FastTextModel is FastModel too


class FastLlamaModel(FastLanguageModel):
    """Unsloth's per-family loaders (FastLlamaModel, FastQwen2Model, FastMistralModel, ...): FastLanguageModel's
    API, whose `from_pretrained` takes `token` and `device_map` fifth and sixth (unsloth/models/llama.py)."""

    @staticmethod
    def from_pretrained(model_name="unsloth/llama-3-8b-bnb-4bit", max_seq_length=None, dtype=None, load_in_4bit=True,
                        token=None, device_map=None, rope_scaling=None, fix_tokenizer=True, model_patcher=None,
                        tokenizer_name=None, trust_remote_code=False, **kwargs):
        if tokenizer_name not in (None, model_name):
            raise UsageError(f"from_pretrained: tokenizer_name={tokenizer_name!r} differs from the model's "
                             f"{model_name!r}, which nbddp's Transformers+PEFT fallback (--backend hf) does not "
                             "load; save the tokenizer beside the model, or leave tokenizer_name out")
        return FastLanguageModel.from_pretrained(
            model_name, max_seq_length=max_seq_length, dtype=dtype,
            load_in_4bit=load_in_4bit, token=token, device_map=device_map, trust_remote_code=trust_remote_code,
            **kwargs)


# unsloth/models/__init__.py's other per-family loaders: each FastLlamaModel with its own patches
FastMistralModel = FastQwen2Model = FastQwen3Model = FastQwen3MoeModel = FastGraniteModel = FastFalconH1Model = \
    FastLlamaModel


def peft_target_regex(model, vision, language, attention, mlp, target_modules=None) -> str:
    """The PEFT `target_modules` regex for the selected layer families, as unsloth_zoo's `get_peft_regex` builds it.

    Candidates are the leaf names of `model`'s linear layers that occur more than once or inside a numbered layer
    (so not `lm_head` or a one-off projector), or `target_modules`. A module qualifies when its name shows a selected
    part (vision, language) then a selected component (attention, MLP) then the leaf; a text-only model's
    `model.layers.N.` counts as language. When nothing qualifies the part is not required (names without tags).
    """
    if not (vision or language):
        raise UsageError("get_peft_model: finetune_vision_layers and finetune_language_layers are both False, so no "
                         "layer is left to train; set at least one to True")
    if not (attention or mlp):
        raise UsageError("get_peft_model: finetune_attention_modules and finetune_mlp_modules are both False, so no "
                         "module is left to train; set at least one to True")
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    if target_modules is None:
        counts = Counter(name.rsplit(".", 1)[-1] for name in linear)
        in_layers = {name.rsplit(".", 1)[-1] for name in linear if re.search(r"\.\d+\.", name)}
        target_modules = [leaf for leaf, count in counts.items() if count > 1 or leaf in in_layers]
    parts = "|".join((VISION_TAGS if vision else ()) + (LANGUAGE_TAGS if language else ()))
    components = "|".join((ATTENTION_TAGS if attention else ()) + (MLP_TAGS if mlp else ()))
    leaves = "|".join(re.escape(leaf) for leaf in target_modules)
    regex = rf".*?(?:{parts}).*?(?:{components}).*?\.(?:{leaves})"
    if language:
        regex = rf"(?:{regex})|(?:\bmodel\.layers\.\d+(?!.*\.experts\.\d)\..*?(?:{components}).*?\.(?:{leaves}))"
    if not any(re.fullmatch(regex, name) for name in linear):
        regex = rf".*?(?:{components}).*?\.(?:{leaves})"
    if not any(re.fullmatch(regex, name) for name in linear):
        raise UsageError(f"get_peft_model: no linear layer of {type(model).__name__} matches target_modules "
                         f"{target_modules} and the finetune_* flags; list the last part of its linear layers' names "
                         "(q_proj, ...), or leave target_modules out to take them all")
    return regex


def _refuse_diffusion_models(model_name, token) -> None:
    """UsageError for a text-diffusion model, which Unsloth's FastModel hands to its FastDiffusionModel (its own
    masked-diffusion loss, trainer and samplers: unsloth/models/diffusion*.py), and this fallback does not have."""
    from transformers import PretrainedConfig

    model_type = PretrainedConfig.get_config_dict(model_name, token=token)[0].get("model_type")
    if model_type in DIFFUSION_MODEL_TYPES:
        raise UsageError(
            f"model {model_name!r} is a text-diffusion model ({model_type}), which Unsloth trains with its "
            "FastDiffusionModel (its own diffusion loss, trainer and samplers); nbddp's Transformers+PEFT fallback "
            "(--backend hf) trains autoregressive models only. Run on a GPU with Unsloth installed "
            "(--backend unsloth), or pick an autoregressive model")


def _load(model_class, processor_class, model_name, max_seq_length, dtype, load_in_4bit, load_in_8bit, device_map,
          full_finetuning, token, trust_remote_code, kwargs):
    """`(model, tokenizer or processor)` loaded for training: padding on the right, `model.max_seq_length` set (to
    the model's context length when None, as Unsloth's FastLlamaModel does)."""
    dtype = _resolve_dtype(dtype)
    options = {key: value for key, value in kwargs.items() if key not in UNSLOTH_ONLY_LOAD_OPTIONS}
    if fsdp.active() and full_finetuning:
        fsdp.refuse_full_finetuning(model_name)
    if fsdp.active():
        model_name, load_in_4bit = fsdp.shardable_checkpoint(model_name, load_in_4bit, dtype, token, trust_remote_code)
    if (load_in_4bit or load_in_8bit) and not full_finetuning:
        if fsdp.active() and not load_in_4bit:
            fsdp.refuse_8bit(model_name)
        # FSDP1 flattens the 4-bit weights with the others into one tensor: one storage dtype for all
        quantization = _quantization_config(load_in_4bit, dtype, storage=dtype if fsdp.active() else None)
        if quantization is not None:
            options["quantization_config"] = quantization
    if fsdp.active():
        device_map = None  # the whole model in CPU memory; accelerate puts each rank's shards on its GPU
    elif device_map is None and torch.cuda.is_available():
        device_map = {"": torch.cuda.current_device()}
    model = model_class.from_pretrained(
        model_name, dtype=dtype, device_map=device_map, token=token, trust_remote_code=trust_remote_code, **options
    )
    if fsdp.active():
        fsdp.remember_model(model)
    processor = processor_class.from_pretrained(model_name, token=token, trust_remote_code=trust_remote_code)
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:  # Transformers 5's Qwen2VLConfig has none of its own
        model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"  # for training; for_inference switches it to left
    if max_seq_length is None:
        max_seq_length = model.config.get_text_config().max_position_embeddings
    tokenizer.model_max_length = max_seq_length
    model.max_seq_length = max_seq_length
    model.nbddp_tokenizer = tokenizer
    if hasattr(processor, "image_processor"):
        processor.__class__ = _takes_chats(type(processor))
    if hasattr(model, "generate"):  # a classifier (auto_model=AutoModelForSequenceClassification) has none
        model.generate = _takes_encoding_as_input_ids(model.generate)
    model.gradient_checkpointing_enable = _non_reentrant_by_default(model.gradient_checkpointing_enable)
    save.attach(model)  # save_pretrained_merged, ...: Unsloth binds its saving methods to every model it loads
    if full_finetuning:  # Unsloth takes qat_scheme in from_pretrained for full finetuning only
        qat.prepare_qat(model, kwargs.get("qat_scheme"))
    if kwargs.get("fast_inference"):
        for name in VLLM_METHODS:
            setattr(model, name, functools.partial(_vllm_only, name))
    return model, processor


@functools.cache  # one subclass per processor class
def _takes_chats(processor_class):
    """A subclass of a processor class whose call first applies the chat template to `text` given as a chat (a list
    of {"role", "content"} messages), as Unsloth's processors do (unsloth_zoo tokenizer_utils.py,
    patch_processor_call): its vision GRPO notebooks call `tokenizer(image, prompt)` with a row's chat prompt, which
    plain Transformers refuses ("'dict' object has no attribute 'replace'"). Same name; pickled as the original."""
    original_call = processor_class.__call__
    names = list(inspect.signature(original_call).parameters)[1:]
    text_index = names.index("text") if "text" in names else None  # (images, text, ...) or (text, images, ...)

    def __call__(self, *args, **kwargs):
        args = list(args)
        positional = text_index is not None and text_index < len(args)
        text = args[text_index] if positional else kwargs.get("text")
        if isinstance(text, list) and text and isinstance(text[0], dict) and "role" in text[0]:
            text = self.apply_chat_template(text, tokenize=False,
                                            add_generation_prompt=kwargs.pop("add_generation_prompt", True))
            if positional:
                args[text_index] = text
            else:
                kwargs["text"] = text
        return original_call(self, *args, **kwargs)

    def __reduce_ex__(self, protocol):
        return copyreg._reconstructor, (processor_class, object, None), dict(self.__dict__)

    return type(processor_class.__name__, (processor_class,), {
        "__call__": __call__, "__reduce_ex__": __reduce_ex__, "__module__": processor_class.__module__,
        "__qualname__": processor_class.__qualname__})


def _takes_encoding_as_input_ids(generate):
    """`generate` that also takes `input_ids=<BatchEncoding>`, as Unsloth's does (unsloth/models/llama.py,
    unsloth_fast_generate): notebooks pass `tokenizer.apply_chat_template(..., return_tensors="pt")`, a tensor in
    Transformers 4 and a BatchEncoding in 5, where plain `generate` fails with a bare AttributeError."""

    @functools.wraps(generate)
    def generate_unpacking(*args, **kwargs):
        encoding = kwargs.get("input_ids")
        if encoding is not None and not isinstance(encoding, torch.Tensor) and hasattr(encoding, "items"):
            for key, value in kwargs.pop("input_ids").items():
                kwargs.setdefault(key, value)
        return generate(*args, **kwargs)

    return generate_unpacking


def _non_reentrant_by_default(enable):
    """`gradient_checkpointing_enable` that checkpoints without re-entry unless told otherwise. TRL 0.x's trainers
    enable checkpointing themselves, and Transformers 4's default (re-entrant) gives adapters whose inputs need no
    gradient, a vision tower's, none: they would not train (torch: "None of the inputs have requires_grad=True")."""

    @functools.wraps(enable)
    def gradient_checkpointing_enable(gradient_checkpointing_kwargs=None, **options):  # 5.x: every_n_layers=
        return enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs or {"use_reentrant": False}, **options)

    return gradient_checkpointing_enable


def _vllm_only(method, *args, **kwargs):
    raise UsageError(
        f"model.{method} is Unsloth's vLLM engine (fast_inference=True), which nbddp's Transformers+PEFT fallback "
        "(--backend hf) does not have. Generate with Transformers instead: "
        "model.generate(**tokenizer(prompts, return_tensors=\"pt\", padding=True), max_new_tokens=...), with the "
        "trained adapter already active in `model`; or run on a GPU with Unsloth and vLLM installed "
        "(--backend unsloth)")


def _embeddings_to_save(target_modules, modules_to_save):
    """`target_modules` without embed_tokens and lm_head, and `modules_to_save` with them."""
    saved = [modules_to_save] if isinstance(modules_to_save, str) else list(modules_to_save or [])
    saved += [name for name in target_modules if name in EMBEDDING_MODULES and name not in saved]
    targets = [name for name in target_modules if name not in EMBEDDING_MODULES]
    return targets, saved or None


def _resolve_dtype(dtype):
    """Unsloth's rule for dtype=None: bfloat16 where the GPU has it, float16 on older GPUs, float32 on CPU."""
    if isinstance(dtype, str):
        return getattr(torch, dtype)
    if dtype is not None:
        return dtype
    if not torch.cuda.is_available():
        return torch.float32
    return torch.bfloat16 if is_bfloat16_supported() else torch.float16


def _quantization_config(load_in_4bit: bool, compute_dtype, storage=None):
    """bitsandbytes quantisation, or None (full precision, with a warning) where it cannot run; `storage`: the
    dtype 4-bit weights are packed in (bitsandbytes' default uint8 when None)."""
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
        **({"bnb_4bit_quant_storage": storage} if storage is not None else {}),
    )


def _set_padding_side(model, side: str) -> None:
    tokenizer = getattr(model, "nbddp_tokenizer", None)
    if tokenizer is not None:
        tokenizer.padding_side = side


def _warn_on_rank0(message: str) -> None:
    if is_main_process():
        log.warning(f"nbddp: {message}")
