"""Model FLOPs per trained token for LoRA on a Llama config, and MFU against a measured matmul rate.

Convention (model FLOPs, no recompute counted, so checkpointing lowers MFU rather than inflating it):
  frozen base matmuls   forward 2*N  + backward input-gradients 2*N   (no weight gradients)  = 4*N
  LoRA adapters         forward, input-gradients and weight-gradients 3 * 2*r*(in+out)
  causal attention      forward 2*s*heads*head_dim (QK^T and AV over s/2 keys on average),
                        backward twice that                                  = 6*s*heads*head_dim
per layer per token, with N the linear weights of every decoder layer plus lm_head (the embedding
lookup is no matmul). Same formula for QLoRA: the 4-bit weights are dequantised to bf16 matmuls.
"""
# one parameter count for flops and memory
from nbddp.runtime.memory.memory_estimate import LORA_TARGETS, parameter_counts


def flops_per_token(config, seq_len, lora_r=16, targets=LORA_TARGETS):
    """Model FLOPs of one trained token (forward + backward) under the convention in the module docstring."""
    counts = parameter_counts(config, lora_r, targets)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    attention = 6 * config["num_hidden_layers"] * seq_len * config["num_attention_heads"] * head_dim
    return 4 * (counts["decoder_linear"] + counts["lm_head"]) + 6 * counts["lora"] + attention


def mfu(tokens_per_s_per_gpu, flops_per_trained_token, matmul_flops_per_s):
    """Fraction of the measured dense bf16 matmul rate that the model FLOPs reach on one GPU."""
    return tokens_per_s_per_gpu * flops_per_trained_token / matmul_flops_per_s
