import json

import pytest

from nbddp import checkpoint_markers
from nbddp.orchestration import failure_report
from nbddp.orchestration.failure_report import RankFailure, describe, find_output_dir, parse_summary


def summary(root, *others):
    """torchrun's ChildFailedError text (torch/distributed/elastic/multiprocessing/errors: _MSG_FORMAT_TEMPLATE)."""
    def entry(index, rank, exitcode, error_file="<N/A>", traceback="Signal 9 (SIGKILL) received by PID 1917"):
        signal_name = {-9: "  (SIGKILL)", -15: "  (SIGTERM)"}.get(exitcode, "")
        return "\n".join([
            f"[{index}]:",
            "  time      : 2026-11-29_21:30:00",
            "  host      : localhost",
            f"  rank      : {rank} (local_rank: {rank})",
            f"  exitcode  : {exitcode} (pid: {1916 + rank}){signal_name}",
            f"  error_file: {error_file}",
            f"  traceback : {traceback}".replace("\n", "\n  "),  # torch indents the traceback's lines so
        ])
    failures = "\n".join(entry(index, *failure) for index, failure in enumerate(others, start=1))
    return "\n".join([
        "[default0]:step 11 ...", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 40,
        "generated/train.py FAILED", "-" * 40, "Failures:", failures or "  <NO_OTHER_FAILURES>", "-" * 40,
        "Root Cause (first observed failure):", entry(0, *root), "=" * 40,
    ])


def error_file(path, message, origin=None, rank=0):
    """An error file as the runtime's excepthook writes it (torch.distributed.elastic's format)."""
    report = f"[rank {rank}] Traceback (most recent call last):\n[rank {rank}]   File ...\n[rank {rank}] {message}\n"
    if origin:
        report += f"[rank {rank}] nbddp: {origin}\n"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": report,
                                                                              "timestamp": "1795987800"}}}))
    return str(path)


def test_a_killed_rank_and_the_one_torchrun_stopped():
    failures = parse_summary(summary((1, -9), (0, -15)))
    assert failures == [RankFailure(1, 1, -9, 1917), RankFailure(0, 0, -15, 1916)]
    text = describe(1, summary((1, -9), (0, -15)))
    assert text.splitlines() == [
        "nbddp: training failed (torchrun exit status 1)",
        "  rank 1 failed: killed by SIGKILL (the out-of-memory killer, or kill -9; pid 1917)",
        "  rank 0 stopped after it: killed by SIGTERM (torchrun stops every rank once one fails; pid 1916)",
    ]


def test_the_rank_that_lost_its_peer_is_not_taken_for_the_cause(tmp_path):
    # rank 0's gloo call failed as rank 1 was killed, and torchrun observed rank 0 first
    lost = error_file(tmp_path / "0.json", "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:18825",
                      origin="generated/train.py line 237 comes from notebooks/03_train.ipynb, cell 6, line 1")
    text = describe(1, summary((0, 1, lost, "RuntimeError: ..."), (1, -9)))
    assert text.splitlines()[1:] == [
        "  rank 1 failed: killed by SIGKILL (the out-of-memory killer, or kill -9; pid 1917)",
        "  rank 0 stopped after it: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:18825",
    ]


def test_an_exception_is_named_with_its_notebook_cell(tmp_path):
    raised = error_file(tmp_path / "1.json", "ValueError: bad value", rank=1,
                        origin="generated/train.py line 237 comes from notebooks/03_train.ipynb, cell 6, line 1")
    text = describe(1, summary((1, 1, raised, "[rank 1] Traceback (most recent call last):\n  rank: 0\n[rank 1] ValueError: bad value"), (0, -15)))
    assert text.splitlines()[1:3] == [
        "  rank 1 failed: ValueError: bad value",
        "    generated/train.py line 237 comes from notebooks/03_train.ipynb, cell 6, line 1",
    ]


def test_bad_input_reports_give_their_origin_too(tmp_path):
    path = tmp_path / "error.json"
    report = "[rank 0] nbddp: error: data/x.jsonl row 17: missing \"output\"\n" \
             "[rank 0]   generated/train.py line 61 comes from notebooks/01_data_prep.ipynb, cell 9, line 3\n"
    path.write_text(json.dumps({"message": {"message": "DataError: row 17", "extraInfo": {"py_callstack": report}}}))
    assert failure_report.read_error_file(str(path)) == (
        "DataError: row 17", "generated/train.py line 61 comes from notebooks/01_data_prep.ipynb, cell 9, line 3")


@pytest.mark.parametrize("content", [None, "not json", '{"message": "Signal 9"}'])
def test_missing_or_foreign_error_files_give_what_they_can(tmp_path, content):
    path = tmp_path / "error.json"
    if content is not None:
        path.write_text(content)
    expected = ("Signal 9", None) if content and content.startswith("{") else (None, None)
    assert failure_report.read_error_file(str(path)) == expected


def test_a_failure_before_the_workers_ran_has_no_summary():
    text = describe(1, "torch.distributed.DistNetworkError: failed to bind the rendezvous port\n")
    assert text.splitlines() == ["nbddp: training failed (torchrun exit status 1)",
                                 "  torchrun printed no per-rank failure summary; its output above says why"]


def test_the_last_summary_counts():
    text = "\n".join([summary((0, 1)), "restarting workers...", summary((1, -9))])
    assert [failure.rank for failure in parse_summary(text)] == [1]


def test_progress_from_metrics_and_checkpoints(tmp_path):
    output_dir = tmp_path / "outputs"
    for step in (4, 8, 12):
        (output_dir / f"checkpoint-{step}").mkdir(parents=True)
    for step in (4, 8):
        checkpoint_markers.mark_complete(output_dir / f"checkpoint-{step}", step, world_size=2)
    lines = [json.dumps({"event": "eval", "step": 0}), *(json.dumps({"step": s, "loss": 1.0}) for s in range(1, 12))]
    (output_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 12, "lo')  # rank 0 killed mid-line
    text = describe(1, summary((1, -9)), "generated/train.py", ["--max_steps", "20", "--output_dir", str(output_dir)])
    assert text.splitlines()[-2:] == [
        f"  last logged step: 11 ({output_dir / 'metrics.jsonl'})",
        f"  last complete checkpoint: {output_dir / 'checkpoint-8'} (step 8); rerun with --resume true to continue from it",
    ]


def test_progress_when_nothing_was_written_yet(tmp_path):
    assert failure_report.progress_lines(tmp_path / "outputs") == [
        f"  last logged step: none in {tmp_path / 'outputs' / 'metrics.jsonl'}",
        f"  last complete checkpoint: none in {tmp_path / 'outputs'}",
    ]


def test_output_dir_from_the_flags_else_the_scripts_default(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('# %% tags=["parameters"]\noutput_dir = "outputs"\nmax_steps = 3\n\n# %%\nprint(max_steps)\n')
    assert find_output_dir(script, ["--output_dir", "a", "--output_dir=b"]) == "b"
    assert find_output_dir(script, ["--max_steps", "5"]) == "outputs"
    other = tmp_path / "allreduce.py"
    other.write_text("print('no parameters cell')\n")
    assert find_output_dir(other, []) is None
    assert find_output_dir(tmp_path / "missing.py", []) is None
