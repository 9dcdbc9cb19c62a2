"""`--strategy fsdp`: the notebook's trainer shards the model across the GPUs (FSDP) instead of copying it (DDP).

DDP keeps a whole model on every GPU; FSDP keeps 1/N of it, for models that do not fit one GPU. The engine is
Transformers' Trainer with accelerate's FSDP2, set through the training arguments the notebook builds
(`training_kwargs`, which `ddp.training_args` applies). Unsloth's kernels do not shard (unslothai/unsloth#2767),
so the notebook runs on the Transformers+PEFT fallback (`choose`), which loads the model without a per-rank device
map (accelerate places the shards). How the fallback loads and saves a model under FSDP is its own
(`nbddp.fallback.fsdp`, which `choose` tells the strategy). A 4-bit (QLoRA) model is sharded with FSDP1 instead
(`training_kwargs`, from what the fallback remembered of the loaded model: FSDP2 with bitsandbytes gives wrong
outputs, bitsandbytes#1945), with flat parameters (FSDP1's original parameters fail its full state dict on
bitsandbytes' base layers) and its 4-bit weights stored in the compute dtype (`bnb_4bit_quant_storage`) so that FSDP
can flatten them with the rest; an 8-bit one is refused (`fallback.fsdp.refuse_8bit`).

Saves: Trainer's own checkpoints are FSDP-aware. The notebook's `model.save_pretrained(...)`, which export guards
to the main process, cannot gather the shards alone (a gather is a collective of every rank), so at the end of
training every rank gathers the trainable (LoRA) weights, small beside the model, and the main process's
`save_pretrained` writes those (`install`), under FSDP1 too (a notebook's own `fsdp_config`): one adapter that
plain PEFT loads. A merged save merges that adapter into the base checkpoint loaded again by the main process
(`fallback.fsdp.merged_in_one_process`). Full finetuning is refused (`fallback.fsdp.refuse_full_finetuning`): its
whole weights stay sharded.
Generation after training on several GPUs is refused (`refuse_lone_generation`): it would run on the main process
alone; on one, it runs under autocast as training did (`generate_as_trained`).

accelerate runs FSDP only on GPUs (its state.py sets DistributedType.FSDP in the CUDA-like branch alone): on CPU
processes Trainer would train plain DDP without a word, so `--strategy fsdp` without CUDA is refused. A smoke run
(one process outside torchrun) trains as the notebook wrote it: Trainer refuses FSDP without a process group.
"""
import functools

from nbddp import log, patches
from nbddp.errors import UsageError
from nbddp.fallback import fsdp as fallback_fsdp
from nbddp.formats.script_parameters import STRATEGIES
from nbddp.rank import is_main_process
from nbddp.runtime.trainer.optimizers import QUANTIZED_TORCH_UPDATE

# this process's strategy (ddp | fsdp); whether the smoke run's note was printed, the quantized optimizers it replaced
_chosen = {"strategy": "ddp"}
_said = {"noted": False, "optimizers_said": set()}
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
    fallback_fsdp.set_strategy(requested)  # the fallback loads and saves the model for it
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
    """Whether this process trains under `--strategy fsdp`, as `choose` decided."""
    return _chosen["strategy"] == "fsdp"


def training_kwargs(kwargs: dict) -> dict:
    """The training arguments' keywords with FSDP set (the notebook's own `fsdp`/`fsdp_config` win): full
    sharding (FSDP2; FSDP1 with flat parameters for a 4-bit model), each decoder layer wrapped, a full state dict
    for the final save, non-reentrant gradient checkpointing (the reentrant kind recomputes outside FSDP's hooks),
    a quantized optimizer replaced by torch's (`shardable_optimizer`). Unchanged without a process group (a smoke
    run), where Trainer refuses FSDP."""
    import torch.distributed as dist

    if not dist.is_initialized():  # a smoke run: one process outside torchrun, where Trainer refuses FSDP
        if not _said["noted"]:
            _said["noted"] = True
            log.info("nbddp: --strategy fsdp: one process outside torchrun (a smoke run) has nothing to shard; its "
                     "trainer runs as the notebook wrote it")
        return kwargs
    config = {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "state_dict_type": "FULL_STATE_DICT"}
    layers, quantized = fallback_fsdp.loaded_model()
    if quantized:
        config.update(version=1, use_orig_params=False, cpu_ram_efficient_loading=False)
    if layers:
        config["transformer_layer_cls_to_wrap"] = list(layers)
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
    if is_main_process() and name not in _said["optimizers_said"]:
        _said["optimizers_said"].add(name)
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
            if peft_model is None or not fallback_fsdp.is_sharded(model):
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
