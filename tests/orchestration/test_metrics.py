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


def split(steps, between, forward_backward, optimizer):
    return {"steps": steps, "between_steps_s": between, "forward_backward_s": forward_backward,
            "optimizer_s": optimizer}


def test_the_step_split_is_summed_after_the_first_record(tmp_path):
    path = write_lines(tmp_path / "metrics.jsonl", [
        {"step": 1, "loss": 2.0, "step_split": split(1, 5.0, 9.0, 1.0)},  # warm-up: left out
        {"step": 3, "loss": 1.5, "step_split": split(2, 0.1, 0.6, 0.1)},
        {"step": 4, "loss": 1.4},  # a record with no split (not measured there)
        {"step": 5, "loss": 1.2, "step_split": split(2, 0.1, 0.8, 0.3)},
    ])
    assert read_metrics(path).step_split == pytest.approx(split(4, 0.2, 1.4, 0.4))


def test_one_split_counts_and_none_or_a_partial_one_gives_no_total(tmp_path):
    one = write_lines(tmp_path / "one.jsonl", [{"step": 1, "loss": 2.0, "step_split": split(1, 1.0, 2.0, 3.0)}])
    assert read_metrics(one).step_split == split(1, 1.0, 2.0, 3.0)
    assert read_metrics(write_lines(tmp_path / "none.jsonl", [{"step": 1, "loss": 2.0}])).step_split is None
    partial = write_lines(tmp_path / "partial.jsonl", [{"step": 1, "loss": 2.0, "step_split": {"steps": 1}}])
    assert read_metrics(partial).step_split is None
