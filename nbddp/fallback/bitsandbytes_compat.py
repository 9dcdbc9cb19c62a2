"""What importing Unsloth does to bitsandbytes' optimizers (unsloth/import_fixes.py,
`patch_bitsandbytes_optimizer_step_sync`), for the fallback on a GPU: no device sync after each parameter.

bitsandbytes' `Optimizer8bit.step` calls its module's `sync_gpu` (`torch.cuda.synchronize()`) after each
parameter's update: 448 host waits a step for Llama-3.1 8B's LoRA under `optim="adamw_8bit"`. Its update kernels run
on the legacy default stream, the stream that produced the gradients and runs the next step's kernels, so for
an optimizer whose states are in device memory (not paged) they stay in order without waiting; the same kernels run
on the same data in the same order (bitsandbytes-foundation/bitsandbytes#2050 drops the same syncs).
"""
import importlib.util

from nbddp import patches

PATCH = "bitsandbytes-step-syncs"


def patch_optimizer_step() -> None:
    """Before each step of a bitsandbytes optimizer, a global optimizer step pre-hook sets bitsandbytes' `sync_gpu`:
    a no-op when the optimizer is not paged and every parameter's device steps on its default stream, bitsandbytes'
    own otherwise (torch freezes a subclass's `step` when its first instance is built, so `step` is not wrapped).
    Nothing without CUDA or a loadable bitsandbytes, or with one that no longer has `sync_gpu`; patching twice is
    once."""
    import torch

    if PATCH in patches.active() or not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        return
    try:
        import bitsandbytes.optim.optimizer as module
    except Exception:  # a bitsandbytes that cannot load here (its CUDA library): nothing of it runs to patch
        return
    synchronize = getattr(module, "sync_gpu", None)
    if synchronize is None or not hasattr(module, "Optimizer8bit"):
        return
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def choose_sync(optimizer, args, kwargs):
        if isinstance(optimizer, module.Optimizer8bit):
            ordered = not optimizer.is_paged and _steps_on_default_streams(optimizer)
            module.sync_gpu = _ordered_by_the_stream if ordered else synchronize

    hook = register_optimizer_step_pre_hook(choose_sync)

    def restore():
        hook.remove()
        module.sync_gpu = synchronize

    patches.record(PATCH, restore)


def _steps_on_default_streams(optimizer) -> bool:
    """Whether every parameter is on a CUDA device whose current stream is its default one."""
    import torch

    devices = {p.device for group in optimizer.param_groups for p in group["params"]}
    return bool(devices) and all(device.type == "cuda" and
                                 torch.cuda.current_stream(device) == torch.cuda.default_stream(device)
                                 for device in devices)


def _ordered_by_the_stream(tensor) -> None:
    """bitsandbytes' per-parameter `sync_gpu` while an optimizer steps on the default stream: nothing to wait for."""
