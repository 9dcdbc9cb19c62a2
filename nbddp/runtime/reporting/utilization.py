"""How much of the GPU the training uses: model FLOPs utilisation (MFU) against the GPU's measured matmul rate.

    peak = measure_matmul_peak(device)                         # dense bf16 FLOP/s of this GPU, measured
    mfu(tokens_per_s_per_gpu, flops_per_token(config, seq_len, lora_r), peak)

FLOP convention (CONVENTION, model FLOPs: recompute is not counted, so checkpointing lowers MFU rather than
inflating it), per trained token:
  frozen base matmuls   forward 2*N + backward input-gradients 2*N (no weight gradients)   = 4*N
  LoRA adapters         forward, input-gradients and weight-gradients 3 * 2*r*(in+out)
  causal attention      forward 2*s*heads*head_dim (QK^T and AV over s/2 keys on average), backward twice that
                                                                                            = 6*s*heads*head_dim
per layer, with N the linear weights of every decoder layer plus lm_head (the embedding lookup is no matmul) and s
the row's length. Same formula for QLoRA: the 4-bit weights are dequantised to bf16 matmuls. The denominator is
measured, not a datasheet figure: the median rate of 8192-wide bf16 matmuls on this GPU, as bench/ measures it.
"""
import statistics

from nbddp.runtime.memory.memory_estimate import LORA_TARGETS, parameter_counts

CONVENTION = "model FLOPs (4N frozen + 6 LoRA + causal attention per token, recompute not counted)"


def flops_per_token(config: dict, seq_len: float, lora_r=16, targets=LORA_TARGETS) -> float:
    """Model FLOPs of one trained token (forward + backward) in rows of `seq_len` tokens, under CONVENTION."""
    counts = parameter_counts(config, lora_r, targets)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    attention = 6 * config["num_hidden_layers"] * seq_len * config["num_attention_heads"] * head_dim
    return 4 * (counts["decoder_linear"] + counts["lm_head"]) + 6 * counts["lora"] + attention


def mfu(tokens_per_s_per_gpu: float, flops_per_trained_token: float, matmul_flops_per_s: float) -> float:
    """Fraction of the measured dense bf16 matmul rate that the model FLOPs reach on one GPU."""
    return tokens_per_s_per_gpu * flops_per_trained_token / matmul_flops_per_s


def measure_matmul_peak(device, size=8192, repeats=10, warmup=3) -> dict:
    """Dense bf16 matmul rate of the GPU `device`: random normal inputs (zeros run faster), three input pairs in
    rotation, CUDA events around each product after a warm-up, median over the repeats (FLOP/s). About 0.1 s and
    1.5 GiB on an H100, handed back to the allocator's cache afterwards."""
    import torch

    generator = torch.Generator(device=device).manual_seed(0)
    pairs = [tuple(torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator)
                   for _ in range(2)) for _ in range(3)]
    out = torch.empty(size, size, device=device, dtype=torch.bfloat16)
    with torch.cuda.device(device):
        for i in range(warmup):
            torch.matmul(*pairs[i % 3], out=out)
        times_ms = []
        for i in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(*pairs[i % 3], out=out)
            end.record()
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
    del pairs, out
    torch.cuda.empty_cache()
    rates = [2 * size ** 3 / (t / 1e3) for t in times_ms]
    return {"device": torch.cuda.get_device_name(device), "size": size, "repeats": repeats,
            "median_flops_per_s": statistics.median(rates), "min_flops_per_s": min(rates),
            "max_flops_per_s": max(rates)}
