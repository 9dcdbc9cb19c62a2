"""Unsloth's packed attention on its varlen path on torch 2.11 (runtime.packed_attention), on a stand-in for
Unsloth's attention dispatch module: the real one imports only with CUDA."""
import sys
import types

import pytest
import torch

from nbddp import patches
from nbddp.runtime import packed_attention

# Unsloth 2026.10.9's attention_dispatch, cut to what the patch reads and what it changes, as imported on torch 2.11
# without flash-attn or xformers: no varlen kernel, so _varlen_attn_call is never reached
DISPATCH = '''
HAS_FLASH_ATTENTION = False
HAS_XFORMERS = False
_TORCH_VARLEN_ATTN = None
_LEAN_VARLEN = False


class _LeanFlashVarlen:
    @staticmethod
    def apply(*args):
        return ("lean", args)


def _torch_varlen_takes(*args):
    return _TORCH_VARLEN_ATTN is not None


def _varlen_attn_call(Q, K, V, cu_seqlens, max_seqlen, *, scale, window_size, enable_gqa):
    if _LEAN_VARLEN and not compiling[0] and not _varlen_can_use_cudnn(Q, K, V, max_seqlen, list(window_size),
                                                                      enable_gqa):
        return _LeanFlashVarlen.apply(Q, K, V, cu_seqlens, max_seqlen)
    return _TORCH_VARLEN_ATTN(Q, K, V, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale,
                              window_size=window_size, enable_gqa=enable_gqa)
'''


def torch_211_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
    """torch 2.11's signature: window_size, no enable_gqa."""
    return ("varlen_attn", query, key, value)


def torch_212_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                          enable_gqa=False):
    return ("varlen_attn", query, key, value)


@pytest.fixture
def dispatch(monkeypatch, backend_patches_undone_after):
    """The stand-in in sys.modules, CUDA and torch's flash kernel said to be there, torch 2.11's varlen_attn."""
    module = types.ModuleType(packed_attention.DISPATCH)
    module.compiling = [False]
    exec(DISPATCH, module.__dict__)
    monkeypatch.setitem(sys.modules, packed_attention.DISPATCH, module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    varlen = types.ModuleType("torch.nn.attention.varlen")
    varlen.varlen_attn = torch_211_varlen_attn
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", varlen)
    return module


def call(module, heads=8, kv_heads=2):
    q, k, v = torch.randn(5, heads, 4), torch.randn(5, kv_heads, 4), torch.randn(5, kv_heads, 4)
    return module._varlen_attn_call(q, k, v, torch.tensor([0, 2, 5]), 3, scale=None, window_size=(-1, 0),
                                    enable_gqa=heads != kv_heads)


def test_the_patch_sends_eager_packed_attention_to_unsloths_lean_flash_path(dispatch):
    assert not dispatch._torch_varlen_takes()
    assert packed_attention.use_varlen_kernel()
    assert dispatch._torch_varlen_takes()
    assert call(dispatch)[0] == "lean"
    assert packed_attention.PATCH in patches.active()


def test_a_compiled_call_gets_torch_2_11s_varlen_attn_with_the_key_value_heads_repeated_per_group(dispatch):
    packed_attention.use_varlen_kernel()
    dispatch.compiling[0] = True
    q, k, v = torch.randn(5, 8, 4), torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    name, _, key, value = dispatch._varlen_attn_call(q, k, v, torch.tensor([0, 5]), 5, scale=None,
                                                     window_size=(-1, 0), enable_gqa=True)
    assert name == "varlen_attn" and key.shape == value.shape == (5, 8, 4)
    for head in range(8):  # query head h reads key/value head h // 4
        assert torch.equal(key[:, head], k[:, head // 4]) and torch.equal(value[:, head], v[:, head // 4])


def test_undo_puts_unsloths_module_back(dispatch):
    packed_attention.use_varlen_kernel()
    patches.undo()
    assert dispatch._TORCH_VARLEN_ATTN is None and dispatch._LEAN_VARLEN is False
    assert not hasattr(dispatch, "_varlen_can_use_cudnn")


def test_twice_is_once(dispatch):
    assert packed_attention.use_varlen_kernel() and packed_attention.use_varlen_kernel()
    patches.undo()
    assert dispatch._TORCH_VARLEN_ATTN is None


@pytest.mark.parametrize("change", [
    "HAS_XFORMERS = True",  # a loading xformers: Unsloth's block-diagonal call is one per layer already
    "HAS_FLASH_ATTENTION = True",  # flash-attn's own varlen kernel
    "_TORCH_VARLEN_ATTN = object()",  # torch 2.12+: Unsloth has its varlen kernel
    "del _LeanFlashVarlen",  # an Unsloth without the path the patch turns on
])
def test_nothing_changes_where_unsloth_has_another_path_or_lacks_this_one(dispatch, change):
    exec(change, dispatch.__dict__)
    before = dispatch._TORCH_VARLEN_ATTN
    assert not packed_attention.use_varlen_kernel()
    assert dispatch._TORCH_VARLEN_ATTN is before and dispatch._LEAN_VARLEN is False


def test_nothing_changes_without_cuda_or_torchs_flash_kernel_or_window_size(dispatch, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not packed_attention.use_varlen_kernel()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: False)
    assert not packed_attention.use_varlen_kernel()
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    sys.modules["torch.nn.attention.varlen"].varlen_attn = lambda query, key, value, cu_seq_q, cu_seq_k, max_q, \
        max_k, *, is_causal=False: None  # torch 2.10's: no window_size
    assert not packed_attention.use_varlen_kernel()
    assert dispatch._TORCH_VARLEN_ATTN is None and packed_attention.PATCH not in patches.active()


@pytest.mark.parametrize("switch", packed_attention.SWITCHES)
def test_unsloths_own_switch_off_keeps_its_varlen_path_off(dispatch, monkeypatch, switch):
    monkeypatch.setenv(switch, "0")
    assert not packed_attention.use_varlen_kernel()
    assert dispatch._TORCH_VARLEN_ATTN is None and dispatch._LEAN_VARLEN is False


def test_a_torch_whose_varlen_attn_has_enable_gqa_is_left_to_unsloth(dispatch):
    sys.modules["torch.nn.attention.varlen"].varlen_attn = torch_212_varlen_attn  # Unsloth's switch off on 2.12+
    assert not packed_attention.use_varlen_kernel()
    assert dispatch._TORCH_VARLEN_ATTN is None


def test_without_unsloth_imported_nothing_changes(monkeypatch, backend_patches_undone_after):
    monkeypatch.delitem(sys.modules, packed_attention.DISPATCH, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not packed_attention.use_varlen_kernel()
