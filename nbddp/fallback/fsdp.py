"""How the fallback loads and saves a model that `--strategy fsdp` shards across the GPUs. FSDP runs on the
fallback alone (Unsloth's kernels do not shard: `runtime.trainer.fsdp.choose`), so what loading and saving need of it
is the fallback's; the training arguments and the gathering of the adapter at the end of training are the runtime's
(`runtime.trainer.fsdp`).

`runtime.trainer.fsdp.choose` tells the fallback the strategy it chose (`set_strategy`); `active` answers for the
fallback's loading and saving. Under FSDP a model loads without a per-rank device map (accelerate places the shards); a
4-bit (QLoRA) one stores its 4-bit weights in the compute dtype (`bnb_4bit_quant_storage`) so that FSDP1 can flatten
them with the rest, and a checkpoint saved already quantized loads from the checkpoint it was quantized from
(`shardable_checkpoint`); an 8-bit one is refused (`refuse_8bit`), and so is full finetuning (`refuse_full_finetuning`):
its whole weights stay sharded, and the notebook's save, on the main process alone, could not gather them. The loaded
model's decoder layers and quantization are remembered (`remember_model`) for the runtime's training arguments
(`loaded_model`). A merged save of a sharded model (`is_sharded`) merges the adapter gathered at the end of training
into the base checkpoint, loaded again whole by the main process (`merged_in_one_process`).
"""
import re

from nbddp import log
from nbddp.errors import UsageError
from nbddp.formats.run_settings import ENV, setting
from nbddp.rank import is_main_process

# this process's strategy (ddp | fsdp), the loaded model's decoder layers and whether it is 4-bit
_chosen = {"strategy": "ddp", "layers": (), "quantized": False}


def set_strategy(strategy: str) -> None:
    """This process's `--strategy` (ddp or fsdp), as `runtime.trainer.fsdp.choose` decided it."""
    _chosen["strategy"] = strategy


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
    """What `runtime.trainer.fsdp.training_kwargs` needs of the loaded model: its decoder layers' classes (Transformers'
    `_no_split_modules`, the blocks FSDP wraps one by one) and whether bitsandbytes quantized it (4-bit: 8-bit is
    refused as it loads), which takes FSDP1 with flat parameters (runtime.trainer.fsdp's docstring)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    _chosen["layers"] = tuple(getattr(base, "_no_split_modules", None) or ())
    _chosen["quantized"] = getattr(base, "hf_quantizer", None) is not None


def loaded_model() -> tuple[tuple[str, ...], bool]:
    """The decoder layers' classes and whether bitsandbytes quantized it, of the model `remember_model` saw last."""
    return _chosen["layers"], _chosen["quantized"]


def is_sharded(model) -> bool:
    """Whether FSDP (1 or 2) manages `model`: its parameters are DTensors or one of its modules is an FSDP1 unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return (any(isinstance(module, FullyShardedDataParallel) for module in model.modules())
            or any(isinstance(parameter, DTensor) for parameter in model.parameters()))


def merged_in_one_process(peft_model, dtype):
    """The LoRA of a sharded `peft_model` merged into its base weights by the main process alone, on its CPU: the
    checkpoint the base model was loaded from (a QLoRA model's 16-bit one), loaded again whole in `dtype` (the
    save's 16 bits), given the adapter gathered at the end of training (the runtime's `GatherAdapter`), merged by
    PEFT. PEFT cannot merge a sharded model (each rank holds a slice of every weight), and the other ranks have left
    training, so no collective can gather the base weights now. It takes the memory of a whole model in CPU RAM.
    UsageError before training has ended, for a checkpoint stored quantized, for a LoRA initialization that rewrote
    the base weights (PiSSA, OLoRA, LoftQ, EVA, CorDA: the checkpoint no longer holds them), and when the embeddings
    were resized after loading (the checkpoint's no longer fit the adapter)."""
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
                 f"up to {ENV.TIMEOUT_S} (default {setting('timeout_s').default} s) for it")
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
