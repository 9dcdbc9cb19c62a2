"""Which `unsloth` the notebooks' `from unsloth import FastLanguageModel` gets: the real one, or the
Transformers+PEFT fallback (`nbddp.fallback`) installed under that name.

Unsloth needs a CUDA GPU; the fallback runs anywhere, so the same script trains on a laptop CPU. `choose` decides,
`activate` imports or installs the choice and then gives every Trainer nbddp's patches (`trainer_patches.install`).
"""
import importlib
import importlib.util
import sys

import torch

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.fallback import bitsandbytes_compat, dataprep, models, trl_compat, zoo_files
from nbddp.runtime import packed_attention
from nbddp.runtime.inputs.flags import BACKEND_CHOICES
from nbddp.runtime.trainer import trainer_patches


def choose(requested: str) -> tuple[str, str]:
    """("unsloth" | "hf", why) for the `--backend` value `requested` (auto | unsloth | hf)."""
    has_cuda = torch.cuda.is_available()
    has_unsloth = _unsloth_installed()
    if requested == "hf":
        return "hf", "Transformers+PEFT fallback: requested"
    if requested == "unsloth":
        if not has_cuda or not has_unsloth:
            missing = "a CUDA GPU" if not has_cuda else "the unsloth package"
            raise UsageError(f"--backend unsloth needs {missing}; use --backend hf (or auto) on this machine")
        return "unsloth", "Unsloth: requested"
    if requested == "auto":
        if has_cuda and has_unsloth:
            return "unsloth", "Unsloth: CUDA and unsloth found"
        return "hf", f"Transformers+PEFT fallback: {'no CUDA' if not has_cuda else 'unsloth not installed'}"
    raise UsageError(f"--backend must be one of {', '.join(BACKEND_CHOICES)}, not {requested!r}")


def activate(backend: str) -> None:
    """Import the real Unsloth, or install the fallback (`_install_fallback`); then patch every Trainer
    (`trainer_patches.install`), after Unsloth, which must be imported before transformers."""
    if backend == "hf":
        _install_fallback()
    else:
        # Unsloth patches transformers/trl/peft as it is imported, so it must come before them. Every rank
        # imports it: once the process group exists, Unsloth's compiler lets global rank 0 write
        # unsloth_compiled_cache/ and broadcasts to the others, a collective all ranks must join
        # (unsloth_zoo.utils.distributed_function). Imported on local rank 0 first while the others waited
        # in a barrier, it hung on 2 GPUs until the NCCL watchdog aborted (unsloth 2026.10.9).
        importlib.import_module("unsloth")
        packed_attention.use_varlen_kernel()
        import trl
        from transformers import Trainer

        trainer_patches.patch_compute_loss(Trainer)
        trl_compat.refuse_moved_names(trl)  # Llama3_(8B)-ORPO's `from trl import ORPOConfig` on TRL 1.x: say where
    trainer_patches.install()


def _install_fallback() -> None:
    """Install the fallback as the module `unsloth` (and `unsloth.chat_templates`, `unsloth.trainer`,
    `unsloth.dataprep`; and an installed unsloth_zoo's `unsloth_zoo.utils`), and patch TRL as importing Unsloth
    does (`trl_compat.patch_trl`), and bitsandbytes' optimizers as it does (`bitsandbytes_compat`)."""
    for name, module in (("unsloth", models), ("unsloth.chat_templates", models.chat_templates),
                         ("unsloth.trainer", models.trainer),  # fallback/trainer.py: imports trl, as patch_trl does
                         ("unsloth.dataprep", dataprep)):
        patches.set_item("unsloth-fallback-module", sys.modules, name, module)
    # `from unsloth_zoo.utils import Version` (Unsloth's vision GRPO notebooks check TRL's version with it) finds
    # unsloth_zoo's own file there, run at its first use, rather than the package that refuses without Unsloth.
    if utils := zoo_files.lazy_module("utils"):
        patches.set_item("unsloth-fallback-module", sys.modules, "unsloth_zoo.utils", utils, default_only=True)
    # `from unsloth_zoo.rl_replacements import _maybe_compile` (Muse_Glimmer_(30B)-GRPO replaces Unsloth's GRPO
    # log-softmax with its own; TRL's GRPOTrainer, which the fallback trains with, does not call it) loads that
    # module's own file, and its siblings, with the package's __init__ unrun.
    if zoo := zoo_files.package():
        patches.set_item("unsloth-fallback-module", sys.modules, "unsloth_zoo", zoo, default_only=True)
    # Importing Unsloth lets TRL's trainers take Unsloth-era arguments (dataset_text_field=, max_seq_length=,
    # tokenizer=, beta=, ...) and its configs the keywords Transformers 5 and TRL 1.x renamed (warmup_ratio=);
    # without it, notebooks that pass them fail here. So the fallback patches TRL itself, which means
    # importing trl now rather than in the notebook's first trainer cell.
    trl_compat.patch_trl()
    # Importing Unsloth also spares bitsandbytes' optimizers a device sync per parameter; on a GPU, so does this.
    bitsandbytes_compat.patch_optimizer_step()


def _unsloth_installed() -> bool:
    module = sys.modules.get("unsloth")
    if module is not None:  # already imported: the real one, unless it is our own fallback
        return module is not models
    return importlib.util.find_spec("unsloth") is not None
