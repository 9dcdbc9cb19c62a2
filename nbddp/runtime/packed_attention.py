"""Unsloth's padding-free attention as one varlen kernel call per layer on torch 2.11, as Unsloth runs it on 2.12.

Unsloth trains padding-free: a micro batch is one row of its sequences end to end. Without flash-attn or an xformers
that loads, Unsloth 2026.10.9 takes torch's varlen flash kernel only where `varlen_attn` has `enable_gqa` (torch
2.12); on torch 2.11 it runs SDPA once per sequence, padded and sliced back, about half a step's kernel launches
(docs/performance.md, "Where the step goes"). Its own eager varlen path (`_LeanFlashVarlen`) calls aten's flash
kernels, which torch 2.11 has, grouped-query attention included: `use_varlen_kernel` turns that path on there, with
Unsloth's routing of which calls take it unchanged.
"""
import functools
import inspect
import os
import sys

from nbddp import patches

PATCH = "unsloth-packed-attention"
DISPATCH = "unsloth.utils.attention_dispatch"
# What Unsloth's dispatch module must have for the patch to mean what it says (Unsloth 2026.10.9).
NAMES = ("_TORCH_VARLEN_ATTN", "_LEAN_VARLEN", "_LeanFlashVarlen", "_varlen_attn_call", "_torch_varlen_takes",
         "HAS_FLASH_ATTENTION", "HAS_XFORMERS")
# Unsloth's own switches that turn its varlen path off (attention_dispatch.py): the user's choice stands.
SWITCHES = ("UNSLOTH_TORCH_VARLEN", "UNSLOTH_LEAN_VARLEN")


def use_varlen_kernel() -> bool:
    """After `import unsloth`: give Unsloth's attention dispatch the varlen kernel it lacks on torch 2.11. True when
    patched (now or before). Nothing without CUDA, where Unsloth has a varlen kernel, flash-attn or a loading
    xformers, where a switch of SWITCHES is off, where torch's `varlen_attn` is not 2.11's (`window_size`, no
    `enable_gqa`) or torch has no flash kernel, or where Unsloth's module lacks a name of NAMES."""
    if PATCH in patches.active():
        return True
    import torch

    dispatch = sys.modules.get(DISPATCH)
    if dispatch is None or not torch.cuda.is_available() or not all(hasattr(dispatch, name) for name in NAMES):
        return False
    if dispatch._TORCH_VARLEN_ATTN is not None or dispatch.HAS_FLASH_ATTENTION or dispatch.HAS_XFORMERS:
        return False
    if any(os.environ.get(name, "1").lower() in ("0", "false", "no", "off") for name in SWITCHES):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return False
    parameters = inspect.signature(varlen_attn).parameters
    if "window_size" not in parameters or "enable_gqa" in parameters:
        return False
    if not getattr(torch.backends.cuda, "is_flash_attention_available", lambda: False)():
        return False
    # Eager calls take _LeanFlashVarlen (aten's flash kernels); a call traced by torch.compile takes varlen_attn.
    patches.set_attribute(PATCH, dispatch, "_TORCH_VARLEN_ATTN", functools.partial(varlen_attn_gqa, varlen_attn))
    patches.set_attribute(PATCH, dispatch, "_varlen_can_use_cudnn", flash_only)
    patches.set_attribute(PATCH, dispatch, "_LEAN_VARLEN", True)
    return True


def varlen_attn_gqa(varlen_attn, query, key, value, *args, enable_gqa=False, **kwargs):
    """torch 2.12's `varlen_attn(..., enable_gqa=)` on torch 2.11's: query (T, H, D), key and value (T, H_kv, D);
    with `enable_gqa` query head h reads key/value head h // (H / H_kv), so those heads are repeated."""
    if enable_gqa:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return varlen_attn(query, key, value, *args, **kwargs)


def flash_only(*args, **kwargs) -> bool:
    """Unsloth's question "would `varlen_attn` use cuDNN here?": never on torch 2.11, so eager calls take aten's flash
    kernels, the ones `varlen_attn` itself calls."""
    return False
