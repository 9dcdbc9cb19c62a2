import json

import pytest

from nbddp.errors import NbddpError
from nbddp.formats import metrics

STEP = {"step": 1, "loss": 2.5, "learning_rate": 0.0002, "tokens": 10, "tokens_per_s": None, "peak_mem_gib": 1.0,
        "time_s": 0.5}
EVAL = {"event": "eval", "step": 1, "eval_loss": 2.4}
PLAN = {"event": "batch_plan", "micro_batch": 2, "accumulation": 2, "processes": 2, "text": "global batch 8 rows"}
END = {"event": "end", "step": 2, "train_runtime": 3.5, "train_loss": 2.3}


def test_each_record_is_appended_as_one_json_line_and_read_back(tmp_path):
    path = tmp_path / "outputs" / metrics.METRICS_FILE
    for record in (PLAN, STEP, EVAL, END):
        metrics.append(path, record)
    assert path.read_text().splitlines() == [json.dumps(record) for record in (PLAN, STEP, EVAL, END)]
    assert metrics.read(path) == [PLAN, STEP, EVAL, END]


def test_step_records_and_event_records_are_told_apart():
    records = [PLAN, STEP, EVAL, {"step": 2, "loss": 2.0}, END]
    assert metrics.steps(records) == [STEP, {"step": 2, "loss": 2.0}]
    assert (metrics.events(records, "eval"), metrics.events(records, "end")) == ([EVAL], [END])
    assert metrics.events(records, "batch_plan") == [PLAN]


def test_a_line_that_is_not_json_is_named_unless_reading_leniently(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    path.write_text(json.dumps(STEP) + "\n\n" + json.dumps(EVAL) + '\n{"step": 2, "lo')  # rank 0 killed mid-line
    with pytest.raises(NbddpError, match=r"metrics.jsonl, line 4: not a JSON line"):
        metrics.read(path)
    assert metrics.read(path, strict=False) == [STEP, EVAL]


def test_the_last_step_is_the_last_step_record_s(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    assert metrics.last_step(path) is None  # no file yet
    path.write_text(json.dumps(PLAN) + "\n")
    assert metrics.last_step(path) is None  # no step yet
    path.write_text("".join(json.dumps(record) + "\n" for record in (STEP, {"step": 7, "loss": 1.0}, END))
                    + '{"step": 8, "lo')
    assert metrics.last_step(path) == 7  # not the end record's 2, nor the torn line's 8


def test_starting_empties_the_file_and_makes_its_folder(tmp_path):
    path = tmp_path / "outputs" / metrics.METRICS_FILE
    metrics.start(path)
    assert path.read_text() == ""
    metrics.append(path, STEP)
    metrics.start(path)
    assert path.read_text() == ""


def test_resuming_keeps_the_lines_up_to_the_step_as_they_were(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    lines = [json.dumps(PLAN), '{"step":4,  "loss": 2.9}', json.dumps(EVAL), '{"step": 5, "loss": 2.8}',
             '{"step": 6, "loss": 2.7}']
    path.write_text("\n".join(lines) + '\n{"step": 7, "lo')
    metrics.start(path, resumed_at=5)
    assert path.read_text().splitlines() == ['{"step":4,  "loss": 2.9}', json.dumps(EVAL), '{"step": 5, "loss": 2.8}']
    assert [p.name for p in tmp_path.iterdir()] == [metrics.METRICS_FILE]  # no temp file left behind


def test_lines_that_are_no_record_are_named_or_left_out_never_a_crash(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    path.write_bytes(json.dumps(STEP).encode() + b"\n\xff\xfe torn\n[1, 2, 3]\n" + json.dumps(EVAL).encode() + b"\n")
    with pytest.raises(NbddpError, match=r"metrics.jsonl, line 2: not a JSON line \(not UTF-8 text: invalid start "):
        metrics.read(path)
    path.write_bytes(json.dumps(STEP).encode() + b"\n[1, 2, 3]\n")
    with pytest.raises(NbddpError, match=r"line 2: not a JSON line \(not a JSON object\): '\[1, 2, 3\]'"):
        metrics.read(path)
    path.write_bytes(json.dumps(STEP).encode() + b"\n\xff\xfe torn\n[1, 2, 3]\n5\n" + json.dumps(EVAL).encode())
    assert metrics.read(path, strict=False) == [STEP, EVAL]
    assert metrics.last_step(path) == 1


def test_resuming_drops_lines_that_are_no_record(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe\n[1]\n{"step": "2"}\n{"step": 2, "loss": 1.9}\n')
    metrics.start(path, resumed_at=2)
    assert path.read_text().splitlines() == ['{"step": 1, "loss": 2.0}', '{"step": 2, "loss": 1.9}']


def test_no_last_step_where_output_dir_is_a_file(tmp_path):
    (tmp_path / "file").write_text("")
    assert metrics.last_step(tmp_path / "file" / metrics.METRICS_FILE) is None


def test_numbers_json_has_not_are_written_as_null(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    metrics.append(path, {"step": 3, "loss": float("nan"), "grad_norm": float("inf"), "nested": [float("-inf"), 1.5]})
    assert path.read_text() == '{"step": 3, "loss": null, "grad_norm": null, "nested": [null, 1.5]}\n'
