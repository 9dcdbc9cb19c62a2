"""`--strategy auto`, the generated scripts' default: DDP when one training rank fits one GPU, else FSDP.

Decided in `runtime.setup`, before the backend is chosen (FSDP takes the Transformers+PEFT one) and so before the
model exists: from the model the script will load (`inputs.model_loader`: its first Unsloth loader call, read
from the script's source), that model's config.json (a local folder, or the Hugging Face cache: nothing is
downloaded), and the memory estimate (`memory.memory_estimate`: the cheapest gradient checkpointing mode that fits
`HEADROOM` of the GPU's total memory). DDP without a GPU (accelerate runs FSDP only on GPUs), with one process
(FSDP has nothing to shard across), with `--backend unsloth`, for full finetuning
(`fallback.fsdp.refuse_full_finetuning`), and whenever the model is not known before the cells run. An 8-bit model
that does not fit stays on DDP with a warning: FSDP refuses those (`fallback.fsdp.refuse_8bit`); a 4-bit one (QLoRA)
is sharded with FSDP1. The choice and its numbers are one line of rank 0's (`describe`).
"""
import json
from dataclasses import dataclass
from pathlib import Path

from nbddp.formats.sourcemap import SourceMap, SourceMapError
from nbddp.runtime.inputs.model_loader import LOADER_ARGUMENTS, LORA_R, PlannedModel, planned_model
from nbddp.runtime.memory.gradient_checkpointing import UNSLOTH_MIN_OFFLOAD_SEQ
from nbddp.runtime.memory.memory_estimate import (GIB, HEADROOM, MODES, cheapest_fitting, estimate_peak,
                                                  format_gib, shape_from_config)

DECODER_WIDTHS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")  # a mixture of experts: not a dense decoder


@dataclass(frozen=True)
class Choice:
    strategy: str  # "ddp" or "fsdp"
    reason: str  # why, with the numbers
    warning: bool = False  # it will likely not fit: said as a warning


def choose(script: str | None, namespace: dict | None, backend: str, world_size: int, local_rank: int) -> Choice:
    """The strategy for `--strategy auto` in this process (the working directory already the cells')."""
    import torch

    if not torch.cuda.is_available():
        return Choice("ddp", "no CUDA GPU, and accelerate runs FSDP only on GPUs")
    if script is None or namespace is None:
        return Choice("ddp", "no script file to read the model from (a notebook kernel, the smoke run's "
                             "included): the model is known only when its cell runs")
    planned = planned_model(Path(script).read_text(encoding="utf-8"), namespace)
    if planned is None:
        return Choice("ddp", "the script has no FastLanguageModel/FastModel/FastVisionModel.from_pretrained call "
                             "to size the model from")
    where = _location(script, planned.line)
    if planned.unknown:
        given = ", ".join(f"{name}={expression}" for name, expression in planned.unknown.items())
        return Choice("ddp", f"{planned.loader} ({where}) is given {given}, known only when that cell runs, so "
                             "the memory estimate cannot size the model first; pass --strategy fsdp to shard it")
    name = str(planned.arguments["model_name"])
    config = model_config(name)
    if config is None:
        return Choice("ddp", f"no config.json for {name!r} ({where}) in a local folder or the Hugging Face cache "
                             "(nothing is downloaded before the cells run), so the memory estimate cannot size it; "
                             "pass --strategy fsdp to shard it")
    gpu_gib = torch.cuda.get_device_properties(local_rank).total_memory / GIB
    return decide(planned, config, gpu_gib, world_size, unsloth=_unsloth_backend(backend),
                  explicit_unsloth=backend == "unsloth")


def decide(planned: PlannedModel, config: dict, gpu_gib: float, world_size: int, unsloth: bool,
           explicit_unsloth: bool = False) -> Choice:
    """The choice for `planned` (every loader argument known) whose config.json is `config`, on GPUs of `gpu_gib`
    GiB, `world_size` processes; `unsloth`: DDP would run on Unsloth (its activations; the "unsloth" mode)."""
    arguments = planned.arguments
    name = arguments["model_name"]
    text = config if all(key in config for key in DECODER_WIDTHS) else config.get("text_config") or {}
    if not all(key in text for key in DECODER_WIDTHS) or any(text.get(key) for key in EXPERTS):
        return Choice("ddp", f"the config.json of {name!r} is not a dense decoder's (hidden_size, "
                             "intermediate_size, ...; no experts), which the memory estimate sizes")
    if arguments["full_finetuning"]:
        return Choice("ddp", f"{planned.loader} sets full_finetuning=True, and under FSDP nbddp trains LoRA adapters "
                             "only (see --strategy fsdp): a whole model on every GPU")
    quantization = config.get("quantization_config") or {}  # a pre-quantized checkpoint's
    four_bit = bool(arguments["load_in_4bit"] or quantization.get("load_in_4bit") or "bnb-4bit" in str(name))
    quantized = four_bit or bool(arguments["load_in_8bit"] or quantization)
    lora_r = planned.lora_r or LORA_R
    micro_batch = planned.micro_batch or 1  # not known: the least it can be
    seq_len = int(arguments["max_seq_length"] or LOADER_ARGUMENTS["max_seq_length"])
    shape = shape_from_config(text, load_in_4bit=four_bit, lora_r=lora_r)  # 8-bit: sized as 16-bit, the upper bound
    modes = MODES if unsloth and seq_len >= UNSLOTH_MIN_OFFLOAD_SEQ else tuple(m for m in MODES if m != "unsloth")
    estimates = [estimate_peak(shape, seq_len, micro_batch, mode, transformers_peft=not unsloth) for mode in modes]
    budget = HEADROOM * gpu_gib
    fitting = cheapest_fitting(estimates, budget)
    chosen = fitting or estimates[-1]
    bits = "4-bit" if four_bit else "8-bit" if quantized else "16-bit"
    sizes = (f"{name!r} {bits}, LoRA r {lora_r}{'' if planned.lora_r else ' (assumed)'}, seq {seq_len}, micro "
             f"batch {micro_batch}{'' if planned.micro_batch else ' (not known before the cells run: 1 assumed)'}")
    numbers = (f"one rank's estimated peak {format_gib(chosen['total_gib'])} GiB ({sizes}, gradient checkpointing "
               f"{chosen['mode']}) against {format_gib(budget)} GiB ({HEADROOM:.0%} of the {format_gib(gpu_gib)} GiB "
               "GPU)")
    if fitting is not None:
        return Choice("ddp", f"{numbers}: fits, so a whole model on every GPU")
    if explicit_unsloth:
        return Choice("ddp", f"{numbers}: does not fit, and --backend unsloth does not shard (FSDP takes "
                             "--backend auto or hf)", warning=True)
    if quantized and not four_bit:
        return Choice("ddp", f"{numbers}: does not fit, and FSDP does not shard bitsandbytes' 8-bit weights (see "
                             "--strategy fsdp); use a GPU with more memory, a shorter max_seq_length or a smaller "
                             "per_device_train_batch_size, or load_in_4bit=True (QLoRA, which FSDP shards) on 2+ "
                             "GPUs", warning=True)
    if world_size < 2:
        return Choice("ddp", f"{numbers}: does not fit, and one process has nothing to shard across; run on 2+ GPUs "
                             "(auto then shards it with FSDP), or with load_in_4bit=True (QLoRA under DDP)",
                      warning=True)
    return Choice("fsdp", f"{numbers}: does not fit, so the model is sharded across the {world_size} processes")


def describe(choice: Choice) -> str:
    """Rank 0's line."""
    prefix = "nbddp: warning: " if choice.warning else "nbddp: "
    return f"{prefix}--strategy auto: {choice.strategy}: {choice.reason}"


def model_config(name: str) -> dict | None:
    """The config.json of model `name`: a local folder's, else the Hugging Face cache's (never a download); None
    when neither has one."""
    local = Path(name) / "config.json"
    if local.is_file():
        return json.loads(local.read_text(encoding="utf-8"))
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # HFValidationError: not a repo id (a folder that does not exist)
        return None
    return json.loads(Path(cached).read_text(encoding="utf-8")) if isinstance(cached, str) else None


def _unsloth_backend(backend: str) -> bool:
    """Whether DDP would run on Unsloth: as `backend.choose` decides."""
    from nbddp.runtime.backend import choose

    return choose(backend)[0] == "unsloth"


def _location(script: str, line: int) -> str:
    """Where script `line` came from (notebook, cell, line), by the source map; the script's line without one."""
    try:
        found = SourceMap.for_script(script).lookup(line)
    except (SourceMapError, OSError):
        found = None
    return str(found.origin) if found and found.origin else f"{script}, line {line}"
