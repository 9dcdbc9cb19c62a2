"""Peak GPU memory per gradient-checkpointing mode, and the cheapest mode that fits, from a config file.

The estimate itself is the runtime's (`nbddp.runtime.memory.memory_estimate`, which the generated script uses to
choose its mode); this module gives it the benchmarks' inputs: a config.json and `load_in_4bit`, before any
model exists. Modes, cheapest first: "off", "true", "unsloth" (see the runtime module for what each keeps).
"""
from nbddp.runtime.memory.memory_estimate import HEADROOM, MODES, cheapest_fitting, estimate_peak, shape_from_config

__all__ = ["MODES", "choose_checkpointing", "estimate_peak_gib"]


def estimate_peak_gib(config, seq_len, micro_batch, load_in_4bit, mode, lora_r=16):
    """Estimated peak allocated memory (GiB) of one Unsloth rank, broken into its parts."""
    return estimate_peak(shape_from_config(config, load_in_4bit, lora_r), seq_len, micro_batch, mode)


def choose_checkpointing(config, seq_len, micro_batch, load_in_4bit, capacity_gib, headroom=HEADROOM, lora_r=16):
    """The cheapest mode whose estimate fits in headroom * capacity, with every mode's estimate."""
    estimates = [estimate_peak_gib(config, seq_len, micro_batch, load_in_4bit, m, lora_r) for m in MODES]
    budget = headroom * capacity_gib
    fitting = cheapest_fitting(estimates, budget)
    if fitting is None:
        raise ValueError(
            f"no checkpointing mode fits {budget:.1f} GiB (smallest estimate "
            f"{min(e['total_gib'] for e in estimates):.1f} GiB): lower the micro batch or sequence length"
        )
    return {"chosen": fitting["mode"], "budget_gib": budget, "estimates": estimates}
