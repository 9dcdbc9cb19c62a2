"""Transformers' optimizer names that cannot run everywhere: bitsandbytes' need bitsandbytes and a CUDA device
(`ddp.optimizer` trains AdamW without them), and no quantized one runs under FSDP (`fsdp.shardable_optimizer`
trains torch's of the same update), and bitsandbytes' step without a device sync per parameter
(`patch_bitsandbytes_step`)."""
from nbddp import patches

# transformers.trainer_optimizer._BITSANDBYTES_OPTIMIZERS, each by Transformers' torch optimizer of the same update
# (None: Transformers has that update in bitsandbytes alone)
BITSANDBYTES_TORCH_UPDATE = {
    **dict.fromkeys(("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit"), "adamw_torch"),
    **dict.fromkeys(("rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit"), "rmsprop"),
    **dict.fromkeys(("ademamix", "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "lion_32bit",
                     "lion_8bit", "paged_lion_32bit", "paged_lion_8bit"), None),
}
BITSANDBYTES_OPTIMIZERS = frozenset(BITSANDBYTES_TORCH_UPDATE)
# every quantized optimizer of Transformers: bitsandbytes' and torchao's AdamW in 4 and 8 bits
QUANTIZED_TORCH_UPDATE = {**BITSANDBYTES_TORCH_UPDATE,
                          **dict.fromkeys(("adamw_torch_4bit", "adamw_torch_8bit"), "adamw_torch")}


def patch_bitsandbytes_step() -> None:
    """A bitsandbytes optimizer that keeps its states in device memory (not paged) and steps on the default CUDA
    stream no longer waits for the GPU after each parameter. bitsandbytes' `Optimizer8bit.step` calls its module's
    `sync_gpu` (`torch.cuda.synchronize()`) once per parameter, 448 times a step for Llama-3.1 8B's LoRA, while its
    update kernels run on the legacy default stream: the stream that produced the gradients and runs the next
    step's kernels, so they stay in order without waiting (bitsandbytes-foundation/bitsandbytes#2050 drops the same
    syncs). The same kernels run on the same data in the same order. A global optimizer step pre-hook sets
    `sync_gpu` before each step: a no-op for such an optimizer, bitsandbytes' own for paged optimizers and other
    streams (torch freezes a subclass's `step` when the first instance is built, so `step` itself is not wrapped).
    A no-op without CUDA or bitsandbytes; patching twice is once."""
    import importlib.util

    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    if PATCH in patches.active() or not torch.cuda.is_available() or importlib.util.find_spec("bitsandbytes") is None:
        return
    import bitsandbytes.optim.optimizer as module

    synchronize = module.sync_gpu

    def choose_sync(optimizer, args, kwargs):
        if isinstance(optimizer, module.Optimizer8bit):
            ordered = not optimizer.is_paged and _steps_on_default_stream(optimizer)
            module.sync_gpu = _ordered_by_the_stream if ordered else synchronize

    hook = register_optimizer_step_pre_hook(choose_sync)

    def restore():
        hook.remove()
        module.sync_gpu = synchronize

    patches.record(PATCH, restore)


PATCH = "bitsandbytes-step-syncs"


def _steps_on_default_stream(optimizer) -> bool:
    """Whether the optimizer's parameters are on a CUDA device whose current stream is the default one."""
    import torch

    device = next((p.device for group in optimizer.param_groups for p in group["params"]), None)
    return device is not None and device.type == "cuda" and \
        torch.cuda.current_stream(device) == torch.cuda.default_stream(device)


def _ordered_by_the_stream(tensor) -> None:
    """bitsandbytes' per-parameter `sync_gpu` while an optimizer steps on the default stream: nothing to wait for."""
