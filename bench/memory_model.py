"""Peak GPU memory of one LoRA training rank, per gradient-checkpointing mode, and the cheapest mode that fits.

Modes, cheapest first: "off" (no recompute), "true" (each decoder layer recomputed in backward, its
input kept on the GPU), "unsloth" (same recompute, the layer inputs offloaded to host memory, which
costs PCIe traffic on top). The activation term per layer and token is calibrated on Unsloth bf16
LoRA, 1.1B shape, seq 2048, micro batch 4 on an H200: off measured 10.4 GiB, "unsloth" 3.0 GiB;
6*hidden + 2*kv_dim + 2*intermediate bf16 values (the layer input, norm outputs, Q, attention
output, residual, K/V, and SwiGLU's gate and up, from which Unsloth recomputes the product), times
the allocator factor, gives 11.4 and 2.9 GiB there. The Transformers+PEFT fallback keeps more per layer, so this is a lower
bound for it.
"""
from bench.flops import linear_shapes, parameter_counts

MODES = ("off", "true", "unsloth")  # cheapest (least extra work) first
GIB = 2 ** 30
BF16 = 2
NF4_BYTES_PER_WEIGHT = 0.5 + 4 / 64 / 4 + 1 / 256  # 4-bit values, double-quantised absmax per 64, second-level scales
LORA_BYTES_PER_PARAM = 4 + 4 + 2 * 4  # fp32 adapter, its gradient, Adam's two moments
ALLOCATOR_OVERHEAD = 1.10  # fragmentation and workspaces seen between allocated and estimated


def activation_bytes_per_token_layer(config):
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_dim = config["num_key_value_heads"] * head_dim
    return BF16 * (6 * config["hidden_size"] + 2 * kv_dim + 2 * config["intermediate_size"])


def estimate_peak_gib(config, seq_len, micro_batch, load_in_4bit, mode, lora_r=16):
    """Estimated peak allocated memory (GiB) of one rank, broken into its parts."""
    if mode not in MODES:
        raise ValueError(f"checkpointing mode {mode!r} is not one of {MODES}")
    counts = parameter_counts(config, lora_r)
    dense = counts["embedding"] + counts["lm_head"] + counts["norms"]
    if load_in_4bit:
        weights = counts["decoder_linear"] * NF4_BYTES_PER_WEIGHT + dense * BF16
    else:
        weights = counts["base_total"] * BF16
    tokens = seq_len * micro_batch
    per_layer = activation_bytes_per_token_layer(config) * tokens
    layers = config["num_hidden_layers"]
    layer_input = BF16 * config["hidden_size"] * tokens
    if mode == "off":
        activations = layers * per_layer
    elif mode == "true":
        activations = layers * layer_input + per_layer
    else:  # "unsloth": inputs live on the host; one layer's activations plus two transfer buffers on the GPU
        activations = per_layer + 2 * layer_input
    lora = counts["lora"] * LORA_BYTES_PER_PARAM
    parts = {"weights": weights, "lora_and_optimizer": lora, "activations": activations}
    total = sum(parts.values()) * ALLOCATOR_OVERHEAD
    return {"mode": mode, "total_gib": total / GIB, **{k + "_gib": v / GIB for k, v in parts.items()}}


def choose_checkpointing(config, seq_len, micro_batch, load_in_4bit, capacity_gib, headroom=0.85, lora_r=16):
    """The cheapest mode whose estimate fits in headroom * capacity, with every mode's estimate."""
    estimates = [estimate_peak_gib(config, seq_len, micro_batch, load_in_4bit, m, lora_r) for m in MODES]
    budget = headroom * capacity_gib
    fitting = [e for e in estimates if e["total_gib"] <= budget]
    if not fitting:
        raise ValueError(
            f"no checkpointing mode fits {budget:.1f} GiB (smallest estimate "
            f"{min(e['total_gib'] for e in estimates):.1f} GiB): lower the micro batch or sequence length"
        )
    return {"chosen": fitting[0]["mode"], "budget_gib": budget, "estimates": estimates}
