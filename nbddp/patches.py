"""Every change nbddp makes to other libraries and to process globals, in one table (PATCHES), and the helpers that
make them.

Each patch has a name, what it changes, the library it changes, when it applies and why (the upstream issue or the
version that made it necessary). The helpers change a thing once however often they are called, and record how to
put it back: `undo()` restores everything, for tests. `announce()` gives rank 0 one line naming the active patches,
and warns when an installed library is outside the versions they were tested on (TESTED: the two stacks of
requirements.txt and requirements-notebooks.txt, and Unsloth's release on the GPU host). The runtime and the
fallback (`nbddp.fallback`) both patch through it: it belongs to neither room.

What can be a callback is one (metrics, progress, checkpoint markers, the first-step memory check). The rest are
patches because Transformers has no hook for them: callbacks see a Trainer's events, not its loss computation, its
evaluation loop, its accelerator's DDP settings, its dataloaders before `train()` builds them or the folder it saves
into, and a callback cannot give its trainer another callback (the memory check that the gradient checkpointing choice
adds per model).
"""
import dataclasses
import functools
import importlib.metadata
import inspect

from packaging.version import Version

from nbddp import log

__all__ = ["PATCHES", "TESTED", "wrap", "set_attribute", "set_item", "append", "record", "undo", "active",
           "is_patched", "announce"]


@dataclasses.dataclass(frozen=True)
class Patch:
    target: str  # what is changed
    library: str  # the distribution that defines it ("python": the interpreter's own globals)
    when: str  # "hf backend", "unsloth backend", "every run", "a script", "CPU runs", "smoke runs", "--strategy fsdp",
    # "the run setting cuda_graphs", "the run setting one_launch_optimizer"
    why: str


PATCHES = {
    "clone-model-loss": Patch(
        "transformers.Trainer.compute_loss", "transformers", "unsloth backend",
        "unslothai/unsloth#3452: Trainer scales the loss in place on N processes, which autograd refuses for the "
        "view Unsloth's fused cross-entropy returns (runtime.trainer.trainer_patches)"),
    "unsloth-packed-attention": Patch(
        "unsloth.utils.attention_dispatch._TORCH_VARLEN_ATTN, _LEAN_VARLEN, _varlen_can_use_cudnn", "unsloth",
        "unsloth backend",
        "Unsloth 2026.10.9 runs a padding-free row's attention as one varlen flash call only with torch 2.12's "
        "varlen_attn(enable_gqa=); on torch 2.11 without flash-attn or a loading xformers it runs SDPA once per "
        "sequence, about half a step's kernel launches: its own aten flash path runs there "
        "(runtime.packed_attention)"),
    "unsloth-graphed-layers": Patch(
        "the forward of each of an Unsloth model's decoder layers (instance attributes); while a bucket is captured, "
        "unsloth.utils.attention_dispatch._varlen_attn_call (counted) and the packed-sequence cache entry", "unsloth",
        "the run setting cuda_graphs",
        "Unsloth 2026.10.9 issues about a hundred kernels a layer and pass from the host, which leaves an 8B QLoRA "
        "step's GPU idle two thirds of the time on an H100; replaying each layer from a CUDA graph issues one "
        "(runtime.graphed_layers)"),
    "trl-unsloth-arguments": Patch(
        "__init__ of TRL's SFT, GRPO, DPO and ORPO trainers", "trl", "hf backend",
        "TRL 0.13 moved dataset_text_field=, max_seq_length=, beta=, tokenizer= into the configs; importing Unsloth "
        "moves them back (unsloth/trainer.py), the fallback does the same (nbddp.fallback.trl_compat)"),
    "trl-config-old-keywords": Patch(
        "__init__ of those trainers' configs", "trl", "hf backend",
        "Transformers 5 and TRL 1.x renamed keywords the notebooks pass (warmup_ratio=); Unsloth forwards them "
        "(nbddp.fallback.rl_config_compat)"),
    "sft-max-seq-length": Patch(
        "trl.SFTConfig.__init__", "trl", "hf backend",
        "Unsloth's SFTConfig takes max_seq_length=, TRL's only max_length= (nbddp.fallback.trl_compat)"),
    "trl-availability-flags": Patch(
        "trl.import_utils._<package>_available", "trl", "hf backend",
        "TRL 0.x caches Transformers' _is_package_available, a tuple (exists, None) since Transformers 5 and so true "
        "without the package: TRL 0.22's GRPO trainer imports the absent vLLM; importing Unsloth makes them "
        "booleans (unsloth/import_fixes.py), the fallback does the same (nbddp.fallback.trl_compat)"),
    "trl-vision-mapping-name": Patch(
        "transformers.models.auto.modeling_auto.MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", "transformers", "hf backend",
        "TRL 0.22's DPO trainer imports that name, which Transformers 5 renamed "
        "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES; importing Unsloth puts the old name back (unsloth_zoo's "
        "temporary patches), the fallback does the same (nbddp.fallback.trl_compat)"),
    "trl-moved-names": Patch(
        "trl.__getattr__", "trl", "every run",
        "TRL 1.x moved ORPOTrainer/ORPOConfig to trl.experimental.orpo: the import error says where "
        "(nbddp.fallback.trl_compat)"),
    "fsdp-gather-adapter": Patch(
        "transformers.trainer.DEFAULT_CALLBACKS", "transformers", "--strategy fsdp",
        "the notebook's save_pretrained runs on the main process alone and cannot gather FSDP's shards: every rank "
        "gathers the LoRA weights at the end of training (runtime.trainer.fsdp)"),
    "fsdp-gathered-save": Patch(
        "peft.PeftModel.save_pretrained", "peft", "--strategy fsdp",
        "writes those gathered weights rather than this rank's shards (runtime.trainer.fsdp)"),
    "fsdp1-adapter-names": Patch(
        "peft.tuners.tuners_utils._get_tuner_state_dict_key_prefixes", "peft", "--strategy fsdp",
        "PEFT 0.21 picks an adapter's weights by module names and drops only a leading FSDP1 wrapper segment: with "
        "decoder layers in FSDP1 units of their own, every adapter save (the notebook's, Trainer's checkpoints) "
        "was empty and a resume restored nothing (runtime.trainer.fsdp)"),
    "fsdp1-adapter-load": Patch(
        "peft.set_peft_model_state_dict", "peft", "--strategy fsdp",
        "PEFT 0.21 tells a PeftModel by its parameter names, which an FSDP1 unit's flat parameter lacks: it cut "
        "`base_model.model.` off the keys of the checkpoint accelerate loads on resume, and loaded nothing "
        "(runtime.trainer.fsdp)"),
    "unsloth-fallback-module": Patch(
        'sys.modules["unsloth"], ["unsloth.chat_templates"], ["unsloth.trainer"], ["unsloth.dataprep"], '
        '["unsloth_zoo.utils"], ["unsloth_zoo"]', "python",
        "hf backend",
        "Unsloth needs a CUDA GPU: the notebooks' `from unsloth import ...` gets the Transformers+PEFT fallback "
        "(runtime.backend)"),
    "gradient-checkpointing-choice": Patch(
        "transformers.Trainer.__init__", "transformers", "every run",
        "the trainer honours the gradient checkpointing nbddp chose for the model, and checks its first step's "
        "memory (runtime.memory.gradient_checkpointing)"),
    "unused-tower-adapters": Patch(
        "transformers.Trainer.__init__", "transformers", "every run",
        "a multimodal model's tower adapters get no gradient, which stops DDP; static graphs fail under no_sync() "
        "(pytorch/pytorch#143580), so gradient accumulation needs find_unused_parameters "
        "(runtime.trainer.unused_parameters)"),
    "batch-layout-at-train": Patch(
        "transformers.Trainer.train", "transformers", "every run",
        "--batch_layout auto lays out the batch once the trainer knows its model and data "
        "(runtime.memory.fuller_batch)"),
    "layout-check-in-smoke": Patch(
        "transformers.Trainer.train", "transformers", "smoke runs",
        "the smoke run trains its steps in the notebook's layout and again in the fuller one, from one model load "
        "(runtime.memory.smoke_layout_check)"),
    "one-process-eval-loss": Patch(
        "transformers.Trainer.evaluation_loop", "transformers", "every run",
        "the held-out loss of N processes is the loss of 1, whatever the padding (runtime.trainer.eval_loss)"),
    "progress-and-metrics-callbacks": Patch(
        "transformers.trainer.DEFAULT_CALLBACKS, CallbackHandler.add_callback", "transformers", "every run",
        "every Trainer shows rank 0's progress, and nbddp's metrics reach the reporting callbacks, which "
        "Transformers calls first (runtime.reporting.progress, trainer.trainer_patches)"),
    "finite-loss": Patch(
        "transformers.trainer.DEFAULT_CALLBACKS", "transformers", "every run",
        "Trainer trains on after a NaN or infinite loss and logs a finite one in its place (logging_nan_inf_filter): "
        "the run stops at that step (runtime.trainer.finite_loss)"),
    "checkpoint-markers": Patch(
        "transformers.trainer.DEFAULT_CALLBACKS, Trainer._get_output_dir, .train, ._save_checkpoint",
        "transformers", "every run",
        "a checkpoint is resumed from only once every rank finished writing it (runtime.trainer.training_checkpoints)"),
    "bitsandbytes-step-syncs": Patch(
        "bitsandbytes.optim.optimizer.sync_gpu (from torch's optimizer step pre-hooks)", "bitsandbytes",
        "hf backend",
        "bitsandbytes syncs the device after each parameter's update, which its kernels on the default stream do not "
        "need (bitsandbytes-foundation/bitsandbytes#2050); importing Unsloth skips those syncs "
        "(unsloth/import_fixes.py), the fallback on a GPU does the same (nbddp.fallback.bitsandbytes_compat)"),
    "bitsandbytes-one-launch": Patch(
        "torch's global optimizer step pre- and post-hooks, for bitsandbytes' Optimizer2State (\"adam\"); the state "
        "tensors of the parameters they update become views of flat buffers", "bitsandbytes",
        "the run setting one_launch_optimizer",
        "bitsandbytes 0.50.2 has no multi-tensor form of its 8-bit blockwise update: 448 launches and some 28 ms of "
        "host time a step for an 8B LoRA, for 2.5 ms of kernels; laid end to end in whole blocks, one launch does "
        "the same arithmetic (runtime.trainer.one_launch_optimizer)"),
    "json-data-lines": Patch(
        "datasets.load_dataset", "datasets", "every run",
        "load_dataset('json') fails on a line that is no JSON object without naming the file or the line "
        "(runtime.inputs.data)"),
    "smoke-sandbox": Patch(
        "save_pretrained, push_to_hub, from_pretrained, torch.save/load, savefig, save_to_disk/load_from_disk",
        "transformers", "smoke runs",
        "the smoke run writes into its own folder and pushes nothing (runtime.smoke_sandbox)"),
    "notebook-display": Patch(
        "builtins.display", "python", "a script",
        "cells call IPython's builtin display() bare, which a script lacks (runtime.reporting.script_display)"),
    "cell-tracebacks": Patch(
        "sys.excepthook", "python", "a script",
        "a traceback also names the notebook cell its line came from (runtime.reporting.tracebacks)"),
    "rank-exits": Patch(
        "sys.exit, builtins.exit, builtins.quit", "python", "a script",
        "a rank that ends itself says where, and ends before finalization, which waited for gloo's threads until "
        "torchrun stopped it as if another rank had failed first (runtime.reporting.tracebacks)"),
    "accelerate-use-cpu": Patch(
        "os.environ['ACCELERATE_USE_CPU']", "accelerate", "CPU runs",
        "accelerate runs DDP over gloo only when told it is a CPU run; otherwise each rank trains alone "
        "(runtime.context)"),
    "indexed-cpu-storage": Patch(
        "torch.serialization's location tags", "torch", "CPU runs",
        "accelerate gives CPU ranks the device cpu:0, which torch.load cannot restore when resuming (runtime.context)"),
}

# The versions the patches were tested on, inclusive (major.minor), per library they patch.
TESTED = {
    "transformers": ("4.56", "5.17"),
    "trl": ("0.22", "1.14"),
    "accelerate": ("1.15", "1.15"),
    "datasets": ("4.8", "4.8"),
    "torch": ("2.11", "2.13"),
    "unsloth": ("2026.10", "2026.10"),
}

# Where pip finds torch's CPU builds (PyPI's Linux wheels are CUDA builds, with several GB of CUDA libraries).
TORCH_CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"

MARK = "nbddp_patches"  # on a wrapper: the names of the patches it carries, inner wrappers' included
_MISSING = object()


class _Records(list):
    """(patch, restore) pairs, in the order applied: this process's own, so pickled empty. dill pickles a module
    outside site-packages by value, this one too when a pickled function reaches it (datasets' map workers, Unsloth's
    compiled trainers), and the restores hold the libraries' original functions: pickled by value they were 45 MiB
    on CPU, and on a GPU with Unsloth they reached torch._dynamo's config module, which does not pickle at all."""

    def __reduce__(self):
        return _Records, ()


_undo = _Records()
_active: dict = {}  # patch name -> None, in the order first applied


def wrap(patch: str, owner, attribute: str, make) -> None:
    """Set `owner.attribute` to `make(function)`, the function it holds now (a classmethod's or staticmethod's
    function, rewrapped alike; None when there is none), unless that already carries `patch`. `make` may use
    functools.wraps."""
    _check(patch)
    current = inspect.getattr_static(owner, attribute, None)
    descriptor = isinstance(current, (classmethod, staticmethod))
    function = current.__func__ if descriptor else current
    if is_patched(function, patch):
        return
    wrapper = make(function)
    setattr(wrapper, MARK, getattr(function, MARK, frozenset()) | {patch})
    set_attribute(patch, owner, attribute, type(current)(wrapper) if descriptor else wrapper)


def is_patched(function, patch: str) -> bool:
    """Whether `function` is (or wraps) the wrapper `patch` made."""
    return patch in getattr(function, MARK, ())


def set_attribute(patch: str, owner, attribute: str, value) -> None:
    """`setattr(owner, attribute, value)`, undone by putting back what `owner` itself held (or nothing)."""
    _check(patch)
    previous = vars(owner).get(attribute, _MISSING)
    setattr(owner, attribute, value)
    record(patch, functools.partial(_restore_attribute, owner, attribute, previous))


def set_item(patch: str, mapping, key, value, *, default_only=False) -> None:
    """`mapping[key] = value` (`sys.modules`, `os.environ`); with `default_only`, only when `key` is not there."""
    _check(patch)
    if default_only and key in mapping:
        return
    previous = mapping.get(key, _MISSING)
    mapping[key] = value
    record(patch, functools.partial(_restore_item, mapping, key, previous))


def append(patch: str, items: list, item) -> None:
    """Append `item` to `items` unless it is there."""
    _check(patch)
    if item not in items:
        items.append(item)
        record(patch, functools.partial(items.remove, item))


def record(patch: str, restore) -> None:
    """Note that `patch` is active, and that `restore()` undoes what was just done for it (None: it stays)."""
    _check(patch)
    _active[patch] = None
    _undo.append((patch, restore))


def undo() -> None:
    """Put back everything the helpers changed, newest first."""
    while _undo:
        restore = _undo.pop()[1]
        if restore is not None:
            restore()
    _active.clear()


def active() -> tuple[str, ...]:
    """The names of the patches applied in this process (not undone), in the order first applied."""
    return tuple(_active)


def announce() -> None:
    """One info line counting the active patches (their names: a `log.detail` line, for the logs and -v); a warning
    per patched library whose installed version is outside TESTED. For rank 0."""
    if not _active:
        return
    libraries = sorted({PATCHES[name].library for name in _active} - {"python"})
    log.info(f"nbddp: {len(_active)} patches of {', '.join(libraries) or 'Python'} for DDP (why: "
             "nbddp/patches.py; the names: -v, or the run's logs)")
    log.detail(f"patched: {', '.join(_active)}")
    for library, (low, high) in TESTED.items():
        installed = _version(library)
        patched = [name for name in _active if PATCHES[name].library == library]
        if installed is None or not patched or _within(installed, low, high):
            continue
        tested = low if low == high else f"{low} to {high}"
        index = f" (on a CPU machine, add {TORCH_CPU_INDEX})" if library == "torch" else ""
        log.warning(f"nbddp: warning: {library} {installed} is installed, and nbddp's patches of it "
                    f"({', '.join(patched)}) were tested on {library} {tested}; if training fails inside "
                    f"{library}, install a tested version: pip install '{library}{tested_range(library)}'{index}")


def tested_range(library: str) -> str:
    """The pip version range of the releases of `library` TESTED: `>=2.11,<2.14` for torch tested on 2.11 to 2.13
    (pyproject.toml declares these; tests/test_install_metadata.py checks it)."""
    low, high = TESTED[library]
    major, minor = Version(high).release[:2]
    return f">={low},<{major}.{minor + 1}"


def _check(patch: str) -> None:
    if patch not in PATCHES:
        raise KeyError(f"{patch!r} is not in nbddp.patches.PATCHES: add it to the table, with why")


def _within(installed: str, low: str, high: str) -> bool:
    """Whether `installed`'s major.minor is in [low, high] ("5.17.0+cpu" is 5.17)."""
    release = Version(installed).release[:2]
    return Version(low).release <= release <= Version(high).release


def _version(library: str) -> str | None:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def _restore_attribute(owner, attribute, previous) -> None:
    if previous is _MISSING:
        if attribute in vars(owner):
            delattr(owner, attribute)
    else:
        setattr(owner, attribute, previous)


def _restore_item(mapping, key, previous) -> None:
    if previous is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = previous
