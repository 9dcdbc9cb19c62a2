import json
from pathlib import Path

import pytest

from bench.memory_model import MODES, choose_checkpointing, estimate_peak_gib

CONFIGS = Path(__file__).resolve().parents[2] / "bench" / "configs"


def config(shape):
    return json.loads((CONFIGS / shape / "config.json").read_text())


def test_modes_trade_memory_for_work():
    totals = [estimate_peak_gib(config("llama3-8b"), 2048, 2, False, m)["total_gib"] for m in MODES]
    assert totals[0] > totals[1] > totals[2]


def test_four_bit_weights_need_less_memory():
    bf16 = estimate_peak_gib(config("llama3-8b"), 2048, 2, False, "unsloth")["weights_gib"]
    nf4 = estimate_peak_gib(config("llama3-8b"), 2048, 2, True, "unsloth")["weights_gib"]
    assert nf4 < 0.4 * bf16


@pytest.mark.parametrize("mode, measured_gib", [("off", 10.4), ("unsloth", 3.0)])
def test_estimate_is_close_to_the_measured_1b_peaks(mode, measured_gib):
    # Unsloth bf16 LoRA, 1.1B shape, seq 2048, micro batch 4, one H200 (docs/performance.md).
    estimate = estimate_peak_gib(config("llama-1.1b"), 2048, 4, False, mode)["total_gib"]
    assert estimate == pytest.approx(measured_gib, rel=0.15)


def test_choice_is_the_cheapest_mode_that_fits():
    c = config("llama3-8b")
    assert choose_checkpointing(c, 2048, 2, False, capacity_gib=139)["chosen"] == "off"
    assert choose_checkpointing(c, 2048, 2, False, capacity_gib=24)["chosen"] == "true"
    assert choose_checkpointing(c, 2048, 2, False, capacity_gib=21.5)["chosen"] == "unsloth"
    with pytest.raises(ValueError, match="no checkpointing mode fits"):
        choose_checkpointing(c, 2048, 2, False, capacity_gib=8)


def test_unknown_mode_is_an_error():
    with pytest.raises(ValueError):
        estimate_peak_gib(config("llama-1.1b"), 2048, 4, False, "sometimes")
