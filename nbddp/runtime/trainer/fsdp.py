"""`--strategy fsdp`: the notebook's trainer shards the model across the GPUs (FSDP) instead of copying it (DDP).

DDP keeps a whole model on every GPU; FSDP keeps 1/N of it, for models that do not fit one GPU. The engine is
Transformers' Trainer with accelerate's FSDP2, set through the training arguments the notebook builds
(`training_kwargs`, which `ddp.training_args` applies). Unsloth's kernels do not shard (unslothai/unsloth#2767),
so the notebook runs on the Transformers+PEFT fallback (`choose`), which loads the model without a per-rank device
map (accelerate places the shards). A 4-bit (QLoRA) model is sharded with FSDP1 instead (`remember_model`: FSDP2
with bitsandbytes gives wrong outputs, bitsandbytes#1945), with flat parameters (FSDP1's original parameters fail
its full state dict on bitsandbytes' base layers) and its 4-bit weights stored in the compute dtype
(`bnb_4bit_quant_storage`) so that FSDP can flatten them with the rest; an 8-bit one is refused (`refuse_8bit`).

Saves: Trainer's own checkpoints are FSDP-aware. The notebook's `model.save_pretrained(...)`, which export guards
to the main process, cannot gather the shards alone (a gather is a collective of every rank), so at the end of
training every rank gathers the trainable (LoRA) weights, small beside the model, and the main process's
`save_pretrained` writes those (`install`), under FSDP1 too (a notebook's own `fsdp_config`): one adapter that
plain PEFT loads. A merged save merges that adapter into the base checkpoint loaded again by the main process
(`merged_in_one_process`). Full finetuning is refused (`refuse_full_finetuning`): its whole weights stay sharded.
Generation after training on several GPUs is refused (`refuse_lone_generation`): it would run on the main process
alone; on one, it runs under autocast as training did (`generate_as_trained`).

accelerate runs FSDP only on GPUs (its state.py sets DistributedType.FSDP in the CUDA-like branch alone): on CPU
processes Trainer would train plain DDP without a word, so `--strategy fsdp` without CUDA is refused. A smoke run
(one process outside torchrun) trains as the notebook wrote it: Trainer refuses FSDP without a process group.
"""
import functools
import re

from nbddp import log, patches
from nbddp.errors import UsageError
from nbddp.formats.script_parameters import STRATEGIES
from nbddp.rank import is_main_process
from nbddp.runtime.inputs.flags import DEFAULT_TIMEOUT_S, TIMEOUT_VARIABLE
from nbddp.runtime.trainer.optimizers import QUANTIZED_TORCH_UPDATE

# this process's choice, the loaded model's decoder layers and whether it is 4-bit, whether the smoke run's note was
# printed, the quantized optimizers it replaced
_chosen = {"strategy": "ddp", "layers": (), "quantized": False, "noted": False, "optimizers_said": set()}
FSDP1_UNIT = "_fsdp_wrapped_module"  # the attribute FullyShardedDataParallel keeps its module in


def choose(requested: str, backend: str, on_gpu: bool) -> tuple[str, str]:
    """`(strategy, backend)` for this run (`requested`: ddp or fsdp; `setup` decides auto first, `auto_strategy`):
    the backend "hf" (with FSDP) or as requested (DDP); UsageError for a strategy that is not one, FSDP without
    CUDA, or FSDP with `--backend unsloth`."""
    if requested not in STRATEGIES:
        raise UsageError(f"--strategy {requested!r}: expected one of {', '.join(STRATEGIES)} (ddp: a whole model on "
                         "every GPU; fsdp: the model sharded across them; auto: fsdp when the memory estimate says "
                         "one GPU cannot hold it)")
    _chosen["strategy"] = requested
    if requested == "ddp":
        return requested, backend
    if not on_gpu:
        raise UsageError("--strategy fsdp needs CUDA GPUs: accelerate (so Transformers' Trainer) runs FSDP only on "
                         "GPUs, and on CPU processes it would train plain DDP; use --strategy ddp here")
    if backend == "unsloth":
        raise UsageError("--strategy fsdp with --backend unsloth: Unsloth's kernels do not shard "
                         "(unslothai/unsloth#2767); use --backend auto or hf, which run the notebook through "
                         "Transformers+PEFT under FSDP")
    return requested, "hf"


def active() -> bool:
    return _chosen["strategy"] == "fsdp"


def refuse_8bit(model_name: str) -> None:
    raise UsageError(f"--strategy fsdp with load_in_8bit=True ({model_name}): nbddp shards 16- and 32-bit models "
                     "and 4-bit ones (QLoRA, under FSDP1), not bitsandbytes' 8-bit weights; use load_in_4bit=True or "
                     "load_in_8bit=False with --strategy fsdp, or --strategy ddp")


def refuse_full_finetuning(model_name: str) -> None:
    raise UsageError(f"--strategy fsdp with full_finetuning=True ({model_name}): under FSDP nbddp trains LoRA "
                     "adapters, which it gathers from the shards when training ends for the notebook's saves; the "
                     "whole model's weights stay sharded across the GPUs, and the notebook's save, which runs on the "
                     "main process alone, could not gather them. Train LoRA (full_finetuning=False and "
                     "get_peft_model) with --strategy fsdp, or pass --strategy ddp (a whole model on every GPU)")


def shardable_checkpoint(model_name: str, load_in_4bit: bool, dtype, token=None, trust_remote_code=False):
    """`(model_name, load_in_4bit)` to load under FSDP: a checkpoint saved already quantized by bitsandbytes packs
    its 4-bit weights in uint8 (its `bnb_4bit_quant_storage`), which FSDP1 cannot flatten with the layer's bf16
    norms, so the checkpoint it was quantized from (the name without `-unsloth-bnb-4bit` or `-bnb-4bit`, as
    Unsloth's hub names it) is loaded instead and quantized as it loads. UsageError when there is none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_name, token=token, trust_remote_code=trust_remote_code)
    quantization = getattr(config, "quantization_config", None) or {}
    if not isinstance(quantization, dict):
        quantization = quantization.to_dict()
    if quantization.get("quant_method") != "bitsandbytes":
        return model_name, load_in_4bit
    if quantization.get("load_in_8bit"):
        refuse_8bit(model_name)
    storage = str(quantization.get("bnb_4bit_quant_storage", "uint8")).removeprefix("torch.")
    compute = str(dtype).removeprefix("torch.")
    if storage == compute:
        return model_name, True
    name = model_name.rstrip("/")
    base, problem = re.sub(r"-(unsloth-)?bnb-4bit$", "", name), None
    if base == name:
        problem = "its name names no base checkpoint (it does not end in -bnb-4bit)"
    else:
        try:
            AutoConfig.from_pretrained(base, token=token, trust_remote_code=trust_remote_code)
        except OSError as error:
            problem = f"{base!r}, the checkpoint its name names as its base, cannot be loaded ({error})"
    if problem:
        raise UsageError(f"--strategy fsdp with {model_name!r}: a checkpoint saved in 4 bits by bitsandbytes, its "
                         f"weights packed in {storage}, which FSDP cannot flatten with the model's "
                         f"{compute} weights, and {problem}; pass the unquantized "
                         "checkpoint as model_name with load_in_4bit=True (quantized as it loads), or use "
                         "--strategy ddp")
    if is_main_process():
        log.info(f"nbddp: --strategy fsdp: {model_name} is stored in 4 bits packed in {storage}, which FSDP cannot "
                 f"flatten with the model's other weights; loading {base} and quantizing it as it loads instead")
    return base, True


def remember_model(model) -> None:
    """What `training_kwargs` needs of the loaded model: its decoder layers' classes (Transformers'
    `_no_split_modules`, the blocks FSDP wraps one by one) and whether bitsandbytes quantized it (4-bit: 8-bit is
    refused as it loads), which takes FSDP1 with flat parameters (the module's docstring)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    _chosen["layers"] = tuple(getattr(base, "_no_split_modules", None) or ())
    _chosen["quantized"] = getattr(base, "hf_quantizer", None) is not None


def training_kwargs(kwargs: dict) -> dict:
    """The training arguments' keywords with FSDP set (the notebook's own `fsdp`/`fsdp_config` win): full
    sharding (FSDP2; FSDP1 with flat parameters for a 4-bit model), each decoder layer wrapped, a full state dict
    for the final save, non-reentrant gradient checkpointing (the reentrant kind recomputes outside FSDP's hooks),
    a quantized optimizer replaced by torch's (`shardable_optimizer`). Unchanged without a process group (a smoke
    run), where Trainer refuses FSDP."""
    import torch.distributed as dist

    if not dist.is_initialized():  # a smoke run: one process outside torchrun, where Trainer refuses FSDP
        if not _chosen["noted"]:
            _chosen["noted"] = True
            log.info("nbddp: --strategy fsdp: one process outside torchrun (a smoke run) has nothing to shard; its "
                     "trainer runs as the notebook wrote it")
        return kwargs
    config = {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "state_dict_type": "FULL_STATE_DICT"}
    if _chosen["quantized"]:
        config.update(version=1, use_orig_params=False, cpu_ram_efficient_loading=False)
    if _chosen["layers"]:
        config["transformer_layer_cls_to_wrap"] = list(_chosen["layers"])
    kwargs = {"fsdp": _fsdp_on(), "fsdp_config": config, **kwargs}
    if "optim" in kwargs:
        kwargs["optim"] = shardable_optimizer(kwargs["optim"])
    if kwargs.get("gradient_checkpointing"):
        given = kwargs.get("gradient_checkpointing_kwargs") or {}
        kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": False, **given}
    return kwargs


def _fsdp_on():
    """What turns full sharding on in this Transformers' TrainingArguments, the rest being in `fsdp_config`:
    True where `fsdp` defaults to None (5.x, whose option string is deprecated and goes in 5.20), else the option
    string (4.x, the notebooks' pin, which reads True as full_shard without auto_wrap). On 5.x both give accelerate
    the same plugin arguments."""
    from transformers import TrainingArguments

    return True if TrainingArguments.__dataclass_fields__["fsdp"].default is None else "full_shard auto_wrap"


def shardable_optimizer(optim):
    """`optim` (a Transformers optimizer name), or the torch optimizer of the same update for a quantized one
    (`QUANTIZED_TORCH_UPDATE`), said once by the main process; UsageError for one torch has no counterpart of.
    Under FSDP2 bitsandbytes' cannot step the sharded (DTensor) parameters (bitsandbytes#1403), under FSDP1 the
    flat parameters change which of their states it keeps in 8 bits (bitsandbytes#2080), and FSDP's optimizer
    state dict fails on quantized state (accelerate#1362, torchao#1185)."""
    name = getattr(optim, "value", optim)  # a name or Transformers' OptimizerNames
    if name not in QUANTIZED_TORCH_UPDATE:
        return optim
    replacement = QUANTIZED_TORCH_UPDATE[name]
    if replacement is None:
        raise UsageError(f"--strategy fsdp with optim={name!r}: a bitsandbytes optimizer, whose state FSDP can "
                         "neither shard nor save (bitsandbytes#1403, #2080), and Transformers has no torch one of "
                         "the same update; "
                         "use optim='adamw_torch' with --strategy fsdp, or --strategy ddp")
    if is_main_process() and name not in _chosen["optimizers_said"]:
        _chosen["optimizers_said"].add(name)
        log.info(f"nbddp: --strategy fsdp: optim={name!r} -> {replacement!r}: FSDP can neither shard nor save a "
                 "quantized optimizer's state (bitsandbytes#1403, #2080); the same update in 32 bits, whose state "
                 "for LoRA's weights alone is small (and sharded across the GPUs)")
    return replacement


def gather_trainable(model) -> dict:
    """The full (unsharded) trainable weights of an FSDP-managed `model`, on the CPU of the main process (empty
    on the others). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options)


def peft_model_of(model):
    """The PeftModel a trainer's (possibly FSDP1-wrapped) model is or holds; None if there is none."""
    from peft import PeftModel

    for module in (model, getattr(model, "module", None)):
        if isinstance(module, PeftModel):
            return module
    return None


def is_sharded(model) -> bool:
    """Whether FSDP (1 or 2) manages `model`: its parameters are DTensors or one of its modules is an FSDP1 unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return (any(isinstance(module, FullyShardedDataParallel) for module in model.modules())
            or any(isinstance(parameter, DTensor) for parameter in model.parameters()))


def merged_in_one_process(peft_model, dtype):
    """The LoRA of a sharded `peft_model` merged into its base weights by the main process alone, on its CPU: the
    checkpoint the base model was loaded from (a QLoRA model's 16-bit one), loaded again whole in `dtype` (the
    save's 16 bits), given the adapter gathered at the end of training (`GatherAdapter`), merged by PEFT. PEFT
    cannot merge a sharded model (each rank holds a slice of every weight), and the other ranks have left training,
    so no collective can gather the base weights now. It takes the memory of a whole model in CPU RAM. UsageError
    before training has ended, for a checkpoint stored quantized, for a LoRA initialization that rewrote the base
    weights (PiSSA, OLoRA, LoftQ, EVA, CorDA: the checkpoint no longer holds them), and when the embeddings were
    resized after loading (the checkpoint's no longer fit the adapter)."""
    import copy

    from peft import get_peft_model

    gathered = getattr(peft_model, "nbddp_gathered", None)
    if not gathered:
        raise UsageError("a merged save under --strategy fsdp before training has ended: the model is sharded "
                         "across the GPUs and its adapter is gathered when training ends; save after "
                         "trainer.train(), or save the adapter (save_method=\"lora\") with trainer.save_model()")
    base, adapter = peft_model.get_base_model(), peft_model.active_adapter
    config = copy.deepcopy(peft_model.peft_config[adapter])
    name = base.name_or_path
    instead = "; save the adapter (save_method=\"lora\") and merge it in one process, or use --strategy ddp"
    if config.init_lora_weights not in (True, False, "gaussian"):
        raise UsageError(f"a merged save under --strategy fsdp with init_lora_weights={config.init_lora_weights!r}, "
                         f"which rewrote the base weights as the adapter was made: {name}, which the merge loads "
                         "again, no longer holds them" + instead)
    if getattr(type(base).config_class.from_pretrained(name), "quantization_config", None):
        raise UsageError(f"a merged save under --strategy fsdp: {name} is stored quantized, and the merge loads the "
                         "base checkpoint again in 16 bits" + instead + " (merging into the checkpoint it was "
                         "quantized from)")
    if is_main_process():
        log.info(f"nbddp: --strategy fsdp: merging the trained adapter into {name} in this one process, on the CPU "
                 "(PEFT cannot merge a sharded model): the memory of a whole model in RAM; the other ranks wait "
                 f"up to {TIMEOUT_VARIABLE} (default {DEFAULT_TIMEOUT_S} s) for it")
    whole = type(base).from_pretrained(name, dtype=dtype)
    trained, loaded = base.get_input_embeddings().num_embeddings, whole.get_input_embeddings().num_embeddings
    if trained != loaded:
        raise UsageError(f"a merged save under --strategy fsdp: the model's embeddings were resized to {trained} "
                         f"tokens after loading, and {name} has {loaded}, so the checkpoint the merge loads again "
                         "no longer fits the adapter" + instead + " after resizing the base model as the notebook "
                         "does")
    config.init_lora_weights = False  # the gathered weights replace them
    whole = get_peft_model(whole, config, adapter_name=adapter)
    unexpected = whole.load_state_dict(gathered, strict=False).unexpected_keys
    untrained = {key for key, parameter in whole.named_parameters() if parameter.requires_grad} - set(gathered)
    if unexpected or untrained:  # the gathered names are the PeftModel's own: this would be nbddp's fault
        raise RuntimeError(f"nbddp: the gathered adapter does not fit {name}: {sorted(unexpected or untrained)[:3]}")
    return whole.merge_and_unload().to(dtype)


def install() -> None:
    """Every Trainer gets a `GatherAdapter` (`gather_adapter_class`), `PeftModel.save_pretrained` writes what it
    gathered (see the module's docstring), and PEFT finds an adapter's weights under FSDP1 (`_without_fsdp1_units`);
    installing twice is once."""
    import peft
    from peft import PeftModel
    from peft.tuners import tuners_utils
    from transformers import trainer as transformers_trainer

    patches.append("fsdp-gather-adapter", transformers_trainer.DEFAULT_CALLBACKS, gather_adapter_class())
    patches.wrap("fsdp-gathered-save", PeftModel, "save_pretrained", _saves_gathered)
    patches.wrap("fsdp1-adapter-names", tuners_utils, "_get_tuner_state_dict_key_prefixes", _without_fsdp1_units)
    patches.wrap("fsdp1-adapter-load", peft, "set_peft_model_state_dict", _loads_into_fsdp1)


@functools.cache
def gather_adapter_class():
    """`GatherAdapter`, made once transformers may be imported: a TrainerCallback that, at the end of training,
    gathers the trainable weights of an FSDP-managed model onto the main process's PeftModel (`nbddp_gathered`),
    which its `save_pretrained` then writes."""
    import torch
    from transformers import TrainerCallback

    class GatherAdapter(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            peft_model = peft_model_of(model) if model is not None else None
            if peft_model is None or not is_sharded(model):
                return
            gathered = gather_trainable(model)
            peft_model.nbddp_gathered = gathered if state.is_world_process_zero else None
            if args.world_size > 1:
                refuse_lone_generation(peft_model)
            elif args.bf16 or args.fp16:
                generate_as_trained(peft_model, torch.bfloat16 if args.bf16 else torch.float16)

    return GatherAdapter


def refuse_lone_generation(peft_model) -> None:
    """`peft_model.generate` raises a UsageError: export runs inference cells on the main process alone, and the
    model's shards are on every rank, so its first all-gather would wait forever for the others."""
    def generate(*args, **kwargs):
        raise UsageError("model.generate() after training under --strategy fsdp on several GPUs: the cell runs on the "
                         "main process alone and the model is sharded across every rank, so it would wait forever; "
                         "load the saved adapter in a single process to generate (e.g. a notebook-only cell), or "
                         "train with --strategy ddp")

    peft_model.generate = generate


def generate_as_trained(peft_model, dtype) -> None:
    """`peft_model.generate` runs under torch.autocast in `dtype`, as the trainer ran its forwards. FSDP1 keeps a
    LoRA unit's weights in float32 outside its forward and casts them to `dtype` inside, and PEFT, outside autocast,
    casts the input to the dtype it reads first: "expected mat1 and mat2 to have the same dtype" (one H200)."""
    import torch

    generate = peft_model.generate
    device_type = next(peft_model.parameters()).device.type

    @functools.wraps(generate)
    def generate_in_autocast(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype):
            return generate(*args, **kwargs)

    peft_model.generate = generate_in_autocast


def _saves_gathered(original):
    @functools.wraps(original)
    def save_pretrained(self, save_directory, *args, **kwargs):
        gathered = getattr(self, "nbddp_gathered", None)
        if gathered and kwargs.get("state_dict") is None:
            kwargs["state_dict"] = gathered
        return original(self, save_directory, *args, **kwargs)

    return save_pretrained


def _without_fsdp1_units(original):
    """PEFT's `_get_tuner_state_dict_key_prefixes(model, ...)` with every FSDP1 wrapper segment left out, as FSDP1's
    state dicts have them: PEFT (0.21) drops only a leading one, so with decoder layers in units of their own it
    picked no adapter weights, in every save and load of one (the notebook's, Trainer's checkpoints, a resume)."""
    @functools.wraps(original)
    def prefixes(model, *args, **kwargs):
        return {prefix.replace(f"{FSDP1_UNIT}.", "") for prefix in original(model, *args, **kwargs)}

    return prefixes


def _loads_into_fsdp1(original):
    """`peft.set_peft_model_state_dict` (accelerate's load of an adapter checkpoint, a resume) into an FSDP1 unit
    holding the PeftModel: PEFT tells a PeftModel by its parameters' names starting with `base_model.model.`, which
    the unit's own flat parameter lacks, so it cut that prefix off the checkpoint's keys and loaded nothing."""
    @functools.wraps(original)
    def set_peft_model_state_dict(model, *args, **kwargs):
        from torch.distributed.fsdp import FullyShardedDataParallel

        if not isinstance(model, FullyShardedDataParallel):
            return original(model, *args, **kwargs)
        model.named_parameters = model.module.named_parameters
        try:
            return original(model, *args, **kwargs)
        finally:
            del model.named_parameters  # the class's again

    return set_peft_model_state_dict
