import json

import pytest

from nbddp.errors import NbddpError
from nbddp.orchestration.metrics import read_metrics


def write_lines(path, records):
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_steps_eval_and_end_records_are_told_apart(tmp_path):
    path = write_lines(tmp_path / "metrics.jsonl", [
        {"step": 1, "loss": 2.0, "learning_rate": 1e-4, "tokens_per_s": 10.0, "peak_mem_gib": 1.0, "time_s": 1},
        {"step": 2, "loss": 1.5, "learning_rate": 1e-4, "tokens_per_s": 30.0, "peak_mem_gib": 1.5, "time_s": 2},
        {"event": "eval", "step": 2, "eval_loss": 1.7},
        {"step": 3, "loss": 1.2, "learning_rate": 1e-4, "tokens_per_s": 20.0, "peak_mem_gib": 1.2, "time_s": 3},
        {"event": "eval", "step": 3, "eval_loss": 1.4},
        {"event": "end", "step": 3, "train_runtime": 3.0},
    ])
    metrics = read_metrics(path)
    assert metrics.losses == [(1, 2.0), (2, 1.5), (3, 1.2)]
    assert (metrics.final_train_loss, metrics.eval_loss) == (1.2, 1.4)
    assert (metrics.median_tokens_per_s, metrics.max_peak_mem_gib) == (20.0, 1.5)
    assert (metrics.loss_at(2), metrics.loss_at(9)) == (1.5, None)


def test_an_empty_run_has_no_figures(tmp_path):
    metrics = read_metrics(write_lines(tmp_path / "metrics.jsonl", [{"event": "end"}]))
    assert (metrics.final_train_loss, metrics.eval_loss, metrics.median_tokens_per_s) == (None, None, None)


def test_a_broken_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo\n')
    with pytest.raises(NbddpError, match="metrics.jsonl, line 2"):
        read_metrics(path)
