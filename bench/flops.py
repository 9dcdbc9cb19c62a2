"""Model FLOPs per trained token for LoRA on a Llama config, and MFU against a measured matmul rate.

Convention (model FLOPs, no recompute counted, so checkpointing lowers MFU rather than inflating it):
  frozen base matmuls   forward 2*N  + backward input-gradients 2*N   (no weight gradients)  = 4*N
  LoRA adapters         forward, input-gradients and weight-gradients 3 * 2*r*(in+out)
  causal attention      forward 2*s*heads*head_dim (QK^T and AV over s/2 keys on average),
                        backward twice that                                  = 6*s*heads*head_dim
per layer per token, with N the linear weights of every decoder layer plus lm_head (the embedding
lookup is no matmul). Same formula for QLoRA: the 4-bit weights are dequantised to bf16 matmuls.
"""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_shapes(config):
    """(name, in_features, out_features) of each linear layer in one decoder layer."""
    hidden = config["hidden_size"]
    inner = config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_dim = config["num_attention_heads"] * head_dim
    kv_dim = config["num_key_value_heads"] * head_dim
    return [
        ("q_proj", hidden, q_dim),
        ("k_proj", hidden, kv_dim),
        ("v_proj", hidden, kv_dim),
        ("o_proj", q_dim, hidden),
        ("gate_proj", hidden, inner),
        ("up_proj", hidden, inner),
        ("down_proj", inner, hidden),
    ]


def parameter_counts(config, lora_r=16, targets=LORA_TARGETS):
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


def flops_per_token(config, seq_len, lora_r=16, targets=LORA_TARGETS):
    """Model FLOPs of one trained token (forward + backward) under the convention in the module docstring."""
    counts = parameter_counts(config, lora_r, targets)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    attention = 6 * config["num_hidden_layers"] * seq_len * config["num_attention_heads"] * head_dim
    return 4 * (counts["decoder_linear"] + counts["lm_head"]) + 6 * counts["lora"] + attention


def mfu(tokens_per_s_per_gpu, flops_per_trained_token, matmul_flops_per_s):
    """Fraction of the measured dense bf16 matmul rate that the model FLOPs reach on one GPU."""
    return tokens_per_s_per_gpu * flops_per_trained_token / matmul_flops_per_s
