"""bench/packed_attention.py's float32 reference, on CPU: the attention each path is measured against."""
import torch

from bench import packed_attention


def test_the_reference_is_causal_attention_within_each_sequence_with_grouped_key_value_heads(monkeypatch):
    monkeypatch.setattr(packed_attention, "LENGTHS", (3, 5, 2))
    monkeypatch.setattr(packed_attention, "HEADS", 4)
    monkeypatch.setattr(packed_attention, "KV_HEADS", 2)
    monkeypatch.setattr(packed_attention, "HEAD_DIM", 8)
    q, k, v, grad_out = packed_attention.inputs(torch, "cpu")
    out, dq, dk, dv = packed_attention.reference(torch, q, k, v, grad_out)

    # the same attention from one masked SDPA over the whole row: query t sees keys s <= t of its own sequence
    sequence = torch.repeat_interleave(torch.arange(3), torch.tensor([3, 5, 2]))
    position = torch.arange(10)
    mask = (sequence[:, None] == sequence[None, :]) & (position[None, :] <= position[:, None])
    q2, k2, v2 = (x.detach().float().requires_grad_() for x in (q, k, v))
    expected = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask,
                                                                enable_gqa=True).transpose(1, 2)
    expected.backward(grad_out.float().view(expected.shape))
    for got, want in ((out, expected.detach()), (dq, q2.grad), (dk, k2.grad), (dv, v2.grad)):
        assert torch.allclose(got, want, atol=1e-5)
    assert out.shape == (1, 10, 4, 8)


def test_the_largest_difference_is_relative_to_the_reference_tensors_largest_value():
    reference = (torch.tensor([2.0, -4.0]), torch.tensor([1.0, 1.0]))
    measured = (torch.tensor([2.0, -3.0]), torch.tensor([1.0, 1.5]))
    assert packed_attention.largest_difference(torch, measured, reference) == 0.5


def test_the_windowed_reference_lets_each_query_see_its_window_latest_keys_of_its_sequence(monkeypatch):
    monkeypatch.setattr(packed_attention, "LENGTHS", (6, 3))
    monkeypatch.setattr(packed_attention, "HEADS", 2)
    monkeypatch.setattr(packed_attention, "KV_HEADS", 1)
    monkeypatch.setattr(packed_attention, "HEAD_DIM", 8)
    q, k, v, grad_out = packed_attention.inputs(torch, "cpu")
    out = packed_attention.reference(torch, q, k, v, grad_out, window=2)[0]
    # query 4 of the first sequence sees keys 3 and 4 only
    scores = q[0, :, 4].float() @ k[0, 0, 3:5].float().T / 8 ** 0.5
    want = torch.softmax(scores, dim=-1) @ v[0, 0, 3:5].float()
    assert torch.allclose(out[0, 4], want, atol=1e-5)
    # the second sequence's first query sees only itself
    assert torch.allclose(out[0, 6], v[0, 0, 6].float().expand(2, -1), atol=1e-6)
