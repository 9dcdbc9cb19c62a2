"""Unsloth's padding-free attention as one varlen kernel call per layer on torch 2.11, as Unsloth runs it on 2.12+.

Unsloth trains padding-free by default: a micro batch is one row of its sequences end to end, and each layer's
attention must stay inside each sequence. Without flash-attn or an xformers that loads (PyPI's xformers is built for
CUDA 12.8 and does not load beside a CUDA 13 torch; Unsloth then prints so and uses torch's attention), Unsloth
2026.10.9 takes torch's varlen flash kernel only where `torch.nn.attention.varlen.varlen_attn` has `enable_gqa`
(torch 2.12). On torch 2.11 it runs SDPA once per sequence instead, each padded to a multiple of 128 rows and
sliced back: on one H100 (Llama-3.1 8B, 8 rows a micro batch) 256 attention calls a step and about 7,000 of its
13,100 kernel launches (the pads, the slices, and their backward's zero fills, copies and additions).

Unsloth's own eager varlen path (`_LeanFlashVarlen`) calls aten's flash-attention kernels with the sequences'
offsets; torch 2.11 has those kernels, grouped-query attention included. `use_varlen_kernel` turns that path on there.
"""
import functools
import inspect
import sys

from nbddp import patches

PATCH = "unsloth-packed-attention"
DISPATCH = "unsloth.utils.attention_dispatch"
# What Unsloth's dispatch module must have for the patch to mean what it says (Unsloth 2026.10.9).
NAMES = ("_TORCH_VARLEN_ATTN", "_LEAN_VARLEN", "_LeanFlashVarlen", "_varlen_attn_call", "_torch_varlen_takes",
         "HAS_FLASH_ATTENTION", "HAS_XFORMERS")


def use_varlen_kernel() -> bool:
    """After `import unsloth`: give Unsloth's attention dispatch the varlen kernel it lacks on torch 2.11, so that a
    packed row's attention is one aten flash call per layer, not one SDPA call per sequence. True when patched (now or
    before). Nothing without CUDA, where Unsloth already has a varlen kernel, flash-attn or a loading xformers, where
    torch has no `varlen_attn` with `window_size` or no flash kernel, or where Unsloth's module lacks a name of NAMES."""
    if PATCH in patches.active():
        return True
    import torch

    dispatch = sys.modules.get(DISPATCH)
    if dispatch is None or not torch.cuda.is_available() or not all(hasattr(dispatch, name) for name in NAMES):
        return False
    if dispatch._TORCH_VARLEN_ATTN is not None or dispatch.HAS_FLASH_ATTENTION or dispatch.HAS_XFORMERS:
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return False
    if "window_size" not in inspect.signature(varlen_attn).parameters:
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
    under grouped-query attention query head h reads key/value head h // (H / H_kv), so those heads are repeated."""
    if enable_gqa and key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return varlen_attn(query, key, value, *args, **kwargs)


def flash_only(*args, **kwargs) -> bool:
    """torch 2.11's `varlen_attn` always runs the flash kernel (cuDNN's ragged attention came with 2.12)."""
    return False
