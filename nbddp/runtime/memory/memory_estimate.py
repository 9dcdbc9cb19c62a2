"""Peak GPU memory of one LoRA training rank, per gradient-checkpointing mode.

Modes, cheapest in time first: "off" (no recompute), "true" (each decoder layer recomputed in backward, its
input kept on the GPU), "unsloth" (same recompute, the layer inputs offloaded to host memory, which costs
PCIe traffic on top).

    shape = shape_from_model(model, lora_r=16)          # or shape_from_config(config_dict, load_in_4bit, 16)
    estimate_peak(shape, seq_len=2048, micro_batch=2, mode="off")["total_gib"]

The activation term per layer and token is calibrated on Unsloth bf16 LoRA, 1.1B shape, seq 2048, micro
batch 4 on an H200: off measured 10.4 GiB, "unsloth" 3.0 GiB; 6*hidden + 2*kv_dim + 2*intermediate values
(the layer input, norm outputs, Q, attention output, residual, K/V, and SwiGLU's gate and up, from which
Unsloth recomputes the product), times the allocator factor, gives 11.4 and 2.9 GiB there. At 8B (seq 2048,
micro batch 2, "unsloth") it gives 17.7 GiB against 16.3-16.7 measured, and 7.1 against 6.9 for QLoRA
(docs/performance.md). The Transformers+PEFT fallback (`transformers_peft`) keeps more per layer, measured
at 8B with checkpointing off: 1.5x Unsloth's activations in bf16 (42.4 GiB peak), 2.4x under QLoRA (45.1 GiB,
more than its bf16 run: peft's prepare_model_for_kbit_training runs the norms, embeddings and head in fp32);
it also materialises the logits, which Unsloth's fused loss does not.

No torch here: bench imports this module on hosts and in tests where no model is loaded.
"""
from dataclasses import dataclass

MODES = ("off", "true", "unsloth")  # cheapest in time (least extra work) first
GIB = 2 ** 30
BF16 = 2
FP32 = 4
NF4_BYTES_PER_WEIGHT = 0.5 + 4 / 64 / 4 + 1 / 256  # 4-bit values, double-quantised absmax per 64, second-level scales
LORA_BYTES_PER_PARAM = 4 + 4 + 2 * 4  # fp32 adapter, its gradient, Adam's two moments
ALLOCATOR_OVERHEAD = 1.10  # fragmentation and workspaces seen between allocated and estimated
HEADROOM = 0.85  # of the memory a process can have, what an estimate may fill: fragmentation, eval batches, longer rows
# Per-layer activations of the Transformers+PEFT fallback over Unsloth's (see above).
TRANSFORMERS_PEFT_ACTIVATIONS = 1.5
TRANSFORMERS_PEFT_4BIT_ACTIVATIONS = 2.4
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def format_gib(gib: float) -> str:
    """A memory figure for a message: one decimal from 1 GiB up, two significant digits below (a tiny model's
    0.084 GiB peak is not "0.1", nor its 0.0031 GiB estimate "0.0")."""
    return f"{gib:.1f}" if gib >= 1 else f"{gib:.2g}"


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a model: its decoder's widths, and the bytes its weights take."""

    num_layers: int
    hidden_size: int
    kv_dim: int
    intermediate_size: int
    vocab_size: int
    activation_bytes: int  # bytes of one activation value: 2 under bf16/fp16 training
    weight_bytes: float  # the base model's weights as loaded (4-bit or not)
    lora_params: int  # adapter parameters that will train
    four_bit: bool = False  # the decoder's linears are bitsandbytes 4-bit


def linear_shapes(config: dict):
    """(name, in_features, out_features) of each linear layer in one Llama-style decoder layer."""
    hidden = config["hidden_size"]
    inner = config["intermediate_size"]
    q_dim = config["num_attention_heads"] * _head_dim(config)
    kv_dim = _kv_dim(config)
    return [
        ("q_proj", hidden, q_dim),
        ("k_proj", hidden, kv_dim),
        ("v_proj", hidden, kv_dim),
        ("o_proj", q_dim, hidden),
        ("gate_proj", hidden, inner),
        ("up_proj", hidden, inner),
        ("down_proj", inner, hidden),
    ]


def parameter_counts(config: dict, lora_r=16, targets=LORA_TARGETS):
    """Parameters of the base model (split into decoder linears, embeddings+head, norms) and of the LoRA adapters."""
    layers = config["num_hidden_layers"]
    hidden = config["hidden_size"]
    vocab = config["vocab_size"]
    shapes = linear_shapes(config)
    decoder_linear = layers * sum(i * o for _, i, o in shapes)
    head = hidden * vocab
    embedding = 0 if config.get("tie_word_embeddings") else hidden * vocab
    norms = (2 * layers + 1) * hidden
    lora = layers * sum(lora_r * (i + o) for name, i, o in shapes if name in targets)
    return {
        "decoder_linear": decoder_linear,
        "lm_head": head,
        "embedding": embedding,
        "norms": norms,
        "base_total": decoder_linear + head + embedding + norms,
        "lora": lora,
    }


def shape_from_config(config: dict, load_in_4bit: bool, lora_r=16) -> ModelShape:
    """The shape of a Llama-style model from its config.json, before any model exists (the benchmarks' view)."""
    counts = parameter_counts(config, lora_r)
    if load_in_4bit:  # bitsandbytes quantises the decoder's linears; embeddings, head and norms stay bf16
        dense = counts["embedding"] + counts["lm_head"] + counts["norms"]
        weights = counts["decoder_linear"] * NF4_BYTES_PER_WEIGHT + dense * BF16
    else:
        weights = counts["base_total"] * BF16
    return ModelShape(**_decoder_widths(config), activation_bytes=BF16, weight_bytes=weights, lora_params=counts["lora"],
                      four_bit=load_in_4bit)


def shape_from_model(model, lora_r: int, targets=LORA_TARGETS) -> ModelShape | None:
    """The shape of a loaded model: its weights' bytes as loaded, the adapters `lora_r` would add to `targets`.

    None when the config lacks a decoder's widths (hidden_size, intermediate_size, ...), e.g. a mixture of experts.
    """
    config = model.config.to_dict()
    if not all(key in config for key in ("num_hidden_layers", "hidden_size", "intermediate_size",
                                          "num_attention_heads", "vocab_size")):
        return None
    tensors = list(model.parameters()) + list(model.buffers())
    weights = sum(tensor.numel() * tensor.element_size() for tensor in tensors)  # packed 4-bit weights count as such
    lora = sum(
        lora_r * (module.in_features + module.out_features)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in targets and hasattr(module, "in_features") and hasattr(module, "out_features")
    )
    activation_bytes = model.get_input_embeddings().weight.element_size()
    four_bit = any(type(parameter).__name__ == "Params4bit" for parameter in model.parameters())
    return ModelShape(**_decoder_widths(config), activation_bytes=activation_bytes, weight_bytes=weights,
                      lora_params=lora, four_bit=four_bit)


def estimate_peak(shape: ModelShape, seq_len: int, micro_batch: int, mode: str, transformers_peft=False) -> dict:
    """Estimated peak allocated memory (GiB) of one rank, with its parts.

    `transformers_peft`: the Transformers+PEFT fallback, which keeps more activations per layer and computes the
    loss from materialised logits (bf16 logits and their fp32 copy), not chunked as in Unsloth's fused loss.
    """
    if mode not in MODES:
        raise ValueError(f"checkpointing mode {mode!r} is not one of {MODES}")
    tokens = seq_len * micro_batch
    value = shape.activation_bytes
    per_layer = value * (6 * shape.hidden_size + 2 * shape.kv_dim + 2 * shape.intermediate_size) * tokens
    if transformers_peft:
        per_layer *= TRANSFORMERS_PEFT_4BIT_ACTIVATIONS if shape.four_bit else TRANSFORMERS_PEFT_ACTIVATIONS
    layer_input = value * shape.hidden_size * tokens
    if mode == "off":
        activations = shape.num_layers * per_layer
    elif mode == "true":
        activations = shape.num_layers * layer_input + per_layer
    else:  # "unsloth": inputs live on the host; one layer's activations plus two transfer buffers on the GPU
        activations = per_layer + 2 * layer_input
    parts = {
        "weights": shape.weight_bytes,
        "lora_and_optimizer": shape.lora_params * LORA_BYTES_PER_PARAM,
        "activations": activations,
        "logits": tokens * shape.vocab_size * (value + FP32) if transformers_peft else 0,
    }
    total = sum(parts.values()) * ALLOCATOR_OVERHEAD
    return {"mode": mode, "total_gib": total / GIB, **{k + "_gib": v / GIB for k, v in parts.items()}}


def cheapest_fitting(estimates: list[dict], budget_gib: float) -> dict | None:
    """The first estimate (estimates come cheapest mode first) whose total fits in `budget_gib`, or None."""
    return next((estimate for estimate in estimates if estimate["total_gib"] <= budget_gib), None)


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _kv_dim(config: dict) -> int:
    return (config.get("num_key_value_heads") or config["num_attention_heads"]) * _head_dim(config)


def _decoder_widths(config: dict) -> dict:
    return {
        "num_layers": config["num_hidden_layers"],
        "hidden_size": config["hidden_size"],
        "kv_dim": _kv_dim(config),
        "intermediate_size": config["intermediate_size"],
        "vocab_size": config["vocab_size"],
    }
