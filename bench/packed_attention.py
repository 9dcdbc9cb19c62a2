"""Unsloth's attention over one padding-free micro batch at Llama-3.1 8B's shapes (32 query and 8 key/value heads of
128), forward and backward through Unsloth's `run_attention`: as Unsloth runs it on this torch (on torch 2.11
without flash-attn or a loading xformers: SDPA once per sequence) and under nbddp's `unsloth-packed-attention`
patch (one varlen flash call), on one GPU.

    python -m bench.packed_attention --out $OUT/packed_attention.json [--rounds 3 --layers 32]

The micro batch: 8 sequences of alpaca-cleaned's heavy-tail lengths (LENGTHS, 2,284 tokens). Per variant and round:
`--layers` forward+backward calls (one step's attention), `host_ms` the time to issue them, `drained_ms` until the
GPU finished them, `launches` the kernel launches of one call (torch.profiler). Variants alternate within a round.
`error`: each variant's largest difference from a float32 reference (SDPA per sequence in float32) in the output and
the three input gradients, relative to that tensor's largest value; `max_rel_diff`: between the two variants.
`windows`: the same two figures, untimed, for a sliding-window layer (WINDOWS: Gemma's and Mistral's local
attention, which the patch also routes to the varlen kernel). Needs CUDA and Unsloth (the GPU image's).
"""
import argparse
import importlib.metadata
import json
import platform
import statistics
import time

LENGTHS = (74, 164, 372, 120, 955, 201, 97, 301)
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
WINDOWS = (64,)


def inputs(torch, device):
    generator = torch.Generator(device=device).manual_seed(3407)
    total = sum(LENGTHS)

    def tensor(heads):
        return torch.randn(1, heads, total, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=generator)

    return tensor(HEADS), tensor(KV_HEADS), tensor(KV_HEADS), tensor(HEADS).transpose(1, 2).contiguous()


def packed_info(torch, packing):
    """The micro batch's sequence table, built once per micro batch as Unsloth's Llama forward does for its layers."""
    return packing.get_packed_info_from_kwargs(
        {"packed_seq_lengths": torch.tensor(LENGTHS, dtype=torch.int32)}, torch.device("cuda"))


def attention_call(dispatch, seq_info, q, k, v, grad_out, window=None):
    """One layer's attention forward and backward as Unsloth's Llama runs it (`window`: a sliding-window layer's
    width); (output, dq, dk, dv)."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    config = dispatch.AttentionConfig(backend=dispatch.select_attention_backend(True), n_kv_heads=KV_HEADS,
                                      n_groups=HEADS // KV_HEADS, flash_dense_kwargs={"causal": True},
                                      flash_varlen_kwargs={"dropout_p": 0.0, "causal": True})
    context = dispatch.AttentionContext(bsz=1, q_len=q.shape[2], kv_seq_len=k.shape[2], n_heads=HEADS,
                                        head_dim=HEAD_DIM, requires_grad=True, seq_info=seq_info, training=True,
                                        attention_mask=None, causal_mask=None, sliding_window=window)
    out = dispatch.run_attention(config=config, context=context, Q=q, K=k, V=v)
    out.backward(grad_out.view(out.shape))
    return out.detach(), q.grad, k.grad, v.grad


def reference(torch, q, k, v, grad_out, window=None):
    """Causal attention within each sequence (with `window`: to the `window` latest keys, itself included), in
    float32, one SDPA per sequence; (output (1, T, H, D), dq, dk, dv)."""
    q, k, v = (x.detach().float().requires_grad_() for x in (q, k, v))
    outs, start = [], 0
    for length in LENGTHS:
        part = slice(start, start + length)
        kk, vv = (x[:, :, part].repeat_interleave(HEADS // KV_HEADS, dim=1) for x in (k, v))
        if window is None:
            outs.append(torch.nn.functional.scaled_dot_product_attention(q[:, :, part], kk, vv, is_causal=True))
        else:
            position = torch.arange(length, device=q.device)
            offset = position[:, None] - position[None, :]
            band = (offset >= 0) & (offset < window)
            outs.append(torch.nn.functional.scaled_dot_product_attention(q[:, :, part], kk, vv, attn_mask=band))
        start += length
    out = torch.cat(outs, dim=2).transpose(1, 2)
    out.backward(grad_out.float().view(out.shape))
    return out.detach(), q.grad, k.grad, v.grad


def timed(torch, dispatch, seq_info, tensors, layers):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(layers):
        attention_call(dispatch, seq_info, *tensors)
    issued = time.perf_counter()
    torch.cuda.synchronize()
    return (issued - start) * 1e3, (time.perf_counter() - start) * 1e3


def launches(torch, dispatch, seq_info, tensors):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        attention_call(dispatch, seq_info, *tensors)
        torch.cuda.synchronize()
    return sum(event.count for event in prof.key_averages()
               if event.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"))


def largest_difference(torch, a, b):
    return max(float((x.float() - y.float()).abs().max() / y.float().abs().max()) for x, y in zip(a, b))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=32, help="attention calls timed per variant and round")
    args = parser.parse_args()
    import unsloth  # noqa: F401  (before torch's users, as in a notebook)
    import torch
    from unsloth.utils import attention_dispatch as dispatch
    from unsloth.utils import packing

    from nbddp import patches
    from nbddp.runtime import packed_attention

    tensors = inputs(torch, "cuda")
    exact = reference(torch, *tensors)

    def variant(patched):
        patches.undo()
        if patched and not packed_attention.use_varlen_kernel():
            return None  # this Unsloth and torch have a packed path the patch leaves alone
        seq_info = packed_info(torch, packing)
        for _ in range(3):
            attention_call(dispatch, seq_info, *tensors)  # warm-up: cuDNN plans, caches
        host, drained = timed(torch, dispatch, seq_info, tensors, args.layers)
        result = attention_call(dispatch, seq_info, *tensors)
        return {"host_ms": host, "drained_ms": drained, "launches": launches(torch, dispatch, seq_info, tensors),
                "result": result}

    rounds, results = [], {}
    for round_ in range(args.rounds):
        order = ("unsloth", "nbddp") if round_ % 2 == 0 else ("nbddp", "unsloth")
        for name in order:
            results[name] = variant(name == "nbddp")
        patches.undo()
        rounds.append({name: ({key: value for key, value in result.items() if key != "result"} if result else None)
                       for name, result in results.items()})
        print(f"round {round_ + 1}: {json.dumps(rounds[-1])}", flush=True)
    applies = results["nbddp"] is not None
    windows = {}
    for window in WINDOWS:
        exact_window, got = reference(torch, *tensors, window=window), {}
        for name in ("unsloth", "nbddp") if applies else ("unsloth",):
            patches.undo()
            if name == "nbddp":
                packed_attention.use_varlen_kernel()
            got[name] = attention_call(dispatch, packed_info(torch, packing), *tensors, window=window)
        patches.undo()
        windows[window] = {"error": {name: largest_difference(torch, result, exact_window)
                                     for name, result in got.items()},
                           "max_rel_diff": largest_difference(torch, got["nbddp"], got["unsloth"]) if applies else None}
    summary = {
        "what": __doc__.split("\n\n")[0], "lengths": LENGTHS, "tokens": sum(LENGTHS), "layers": args.layers,
        "patch_applies": applies, "rounds": rounds,
        "median": {name: {key: statistics.median(r[name][key] for r in rounds)
                          for key in ("host_ms", "drained_ms", "launches")} for name in results if results[name]},
        "error": {name: largest_difference(torch, result["result"], exact)
                  for name, result in results.items() if result},
        "max_rel_diff": (largest_difference(torch, results["nbddp"]["result"], results["unsloth"]["result"])
                         if applies else None),
        "windows": windows, "device": torch.cuda.get_device_name(), "python": platform.python_version(),
        "versions": {name: importlib.metadata.version(name) for name in ("torch", "unsloth")},
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with open(args.out, "w") as out:
        json.dump(summary, out, indent=1)
    print(json.dumps({key: summary[key] for key in ("median", "error", "max_rel_diff", "windows", "device")}))


if __name__ == "__main__":
    main()
