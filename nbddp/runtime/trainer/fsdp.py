"""`--strategy fsdp`: the notebook's trainer shards the model across the GPUs (FSDP) instead of copying it (DDP).

DDP keeps a whole model on every GPU; FSDP keeps 1/N of it, for models that do not fit one GPU. The engine is
Transformers' Trainer with accelerate's FSDP2, set through the training arguments the notebook builds
(`training_kwargs`, which `ddp.training_args` applies). Unsloth's kernels do not shard (unslothai/unsloth#2767),
so the notebook runs on the Transformers+PEFT fallback (`choose`), which loads the model without a per-rank device
map (accelerate places the shards). A 4-bit or 8-bit (QLoRA) model is refused (`refuse_quantized`): FSDP2 with
bitsandbytes gives wrong outputs (bitsandbytes#1945), and under FSDP1 the adapter saved was empty (one H200, the
tiny Llama in 4-bit), which the gathered save below now repairs, but QLoRA under FSDP1 has not been measured since.

Saves: Trainer's own checkpoints are FSDP-aware. The notebook's `model.save_pretrained(...)`, which export guards
to the main process, cannot gather the shards alone (a gather is a collective of every rank), so at the end of
training every rank gathers the trainable (LoRA) weights, small beside the model, and the main process's
`save_pretrained` writes those (`install`), under FSDP1 too (a notebook's own `fsdp_config`): one adapter that
plain PEFT loads. Generation after training on several GPUs is refused (`refuse_lone_generation`): it would run on
the main process alone.

accelerate runs FSDP only on GPUs (its state.py sets DistributedType.FSDP in the CUDA-like branch alone): on CPU
processes Trainer would train plain DDP without a word, so `--strategy fsdp` without CUDA is refused. A smoke run
(one process outside torchrun) trains as the notebook wrote it: Trainer refuses FSDP without a process group.
"""
import functools

from nbddp import log
from nbddp.errors import UsageError
from nbddp.formats.script_parameters import STRATEGIES
from nbddp.runtime import patches

# this process's choice, the loaded model's decoder layers, whether the smoke run's note was printed
_chosen = {"strategy": "ddp", "layers": (), "noted": False}
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


def refuse_quantized(model_name: str, bits: int) -> None:
    raise UsageError(f"--strategy fsdp with load_in_{bits}bit=True ({model_name}): nbddp shards only 16- and 32-bit "
                     "models. FSDP2 gives wrong outputs with bitsandbytes' 4-bit weights (bitsandbytes#1945), and "
                     "under FSDP1 nbddp has not measured its saved adapter; use --strategy ddp (QLoRA keeps a "
                     "70B model on one 80 GB GPU), or load_in_4bit=False with --strategy fsdp")


def remember_model(model) -> None:
    """What `training_kwargs` needs of the loaded model: its decoder layers' classes (Transformers'
    `_no_split_modules`, the blocks FSDP wraps one by one)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    _chosen["layers"] = tuple(getattr(base, "_no_split_modules", None) or ())


def training_kwargs(kwargs: dict) -> dict:
    """The training arguments' keywords with FSDP set (the notebook's own `fsdp`/`fsdp_config` win): full
    sharding, each decoder layer wrapped, a full state dict for the final save, non-reentrant gradient
    checkpointing (the reentrant kind recomputes outside FSDP's hooks). Unchanged without a process group (a smoke
    run), where Trainer refuses FSDP."""
    import torch.distributed as dist

    if not dist.is_initialized():  # a smoke run: one process outside torchrun, where Trainer refuses FSDP
        if not _chosen["noted"]:
            _chosen["noted"] = True
            log.info("nbddp: --strategy fsdp: one process outside torchrun (a smoke run) has nothing to shard; its "
                     "trainer runs as the notebook wrote it")
        return kwargs
    config = {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "state_dict_type": "FULL_STATE_DICT"}
    if _chosen["layers"]:
        config["transformer_layer_cls_to_wrap"] = list(_chosen["layers"])
    kwargs = {"fsdp": "full_shard auto_wrap", "fsdp_config": config, **kwargs}
    if kwargs.get("gradient_checkpointing"):
        given = kwargs.get("gradient_checkpointing_kwargs") or {}
        kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": False, **given}
    return kwargs


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


def install() -> None:
    """Every Trainer gets a `GatherAdapter` (`gather_adapter_class`) and `PeftModel.save_pretrained` writes what it
    gathered (see the module's docstring); installing twice is once."""
    from peft import PeftModel
    from transformers import trainer as transformers_trainer

    patches.append("fsdp-gather-adapter", transformers_trainer.DEFAULT_CALLBACKS, gather_adapter_class())
    patches.wrap("fsdp-gathered-save", PeftModel, "save_pretrained", _saves_gathered)


@functools.cache
def gather_adapter_class():
    """`GatherAdapter`, made once transformers may be imported: a TrainerCallback that, at the end of training,
    gathers the trainable weights of an FSDP-managed model onto the main process's PeftModel (`nbddp_gathered`),
    which its `save_pretrained` then writes."""
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


def _saves_gathered(original):
    @functools.wraps(original)
    def save_pretrained(self, save_directory, *args, **kwargs):
        gathered = getattr(self, "nbddp_gathered", None)
        if not gathered or kwargs.get("state_dict") is not None:
            return original(self, save_directory, *args, **kwargs)
        kwargs["state_dict"] = gathered
        self.named_modules = functools.partial(_without_fsdp1_units, self.named_modules)
        try:
            return original(self, save_directory, *args, **kwargs)
        finally:
            del self.named_modules  # the class's again

    return save_pretrained


def _without_fsdp1_units(named_modules, *args, **kwargs):
    """`named_modules()` with FSDP1's wrapper segments left out of the names, as the gathered state dict has them:
    PEFT (0.21) picks an adapter's weights by its modules' names, and with FSDP1's in them it saved none."""
    for name, module in named_modules(*args, **kwargs):
        yield name.replace(f"{FSDP1_UNIT}.", ""), module

