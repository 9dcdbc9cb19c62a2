import collections
import json

import pytest

from nbddp.formats import checkpoint_markers
from nbddp.orchestration.launch import failure_report
from nbddp.orchestration.launch.failure_report import RankFailure, describe, find_output_dir, parse_summary


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


@pytest.mark.parametrize("message", [
    "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:18825",
    "RuntimeError: [pair.cc:589] Read error [127.0.0.1]:18825: Connection reset by peer",
    "RuntimeError: [pair.cc:323] writev [127.0.0.1]:18825: Broken pipe",  # a blocking write to the ended peer
    "RuntimeError: [pair.cc:176] Socket unexpectedly closed [127.0.0.1]:18825",
])
def test_the_rank_that_lost_its_peer_is_not_taken_for_the_cause(tmp_path, message):
    # rank 0's gloo call failed as rank 1 was killed, and torchrun observed rank 0 first
    lost = error_file(tmp_path / "0.json", message,
                      origin="generated/train.py line 237 comes from notebooks/03_train.ipynb, cell 6, line 1")
    text = describe(1, summary((0, 1, lost, "RuntimeError: ..."), (1, -9)))
    assert text.splitlines()[1:] == [
        "  rank 1 failed: killed by SIGKILL (the out-of-memory killer, or kill -9; pid 1917)",
        f"  rank 0 stopped after it: {message}",
    ]


def test_a_broken_pipe_of_the_ranks_own_is_its_failure_not_a_lost_peer(tmp_path):
    # a closed stdout or a dead DataLoader worker: Python's BrokenPipeError, not gloo's words
    own = error_file(tmp_path / "0.json", "BrokenPipeError: [Errno 32] Broken pipe")
    text = describe(1, summary((0, 1, own, "BrokenPipeError: ..."), (1, -9)))
    assert text.splitlines()[1].startswith("  rank 0 failed: BrokenPipeError: [Errno 32] Broken pipe")
    assert text.splitlines()[2].startswith("  rank 1 failed too: killed by SIGKILL")


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
    text = describe(1, summary((1, -9)), output_dir)
    assert text.splitlines()[-2:] == [
        f"  last logged step: 11 ({output_dir / 'metrics.jsonl'})",
        f"  last complete checkpoint: {output_dir / 'checkpoint-8'} (step 8); rerun with --resume true to continue from it",
    ]


def test_progress_when_nothing_was_written_yet(tmp_path):
    assert failure_report.progress_lines(tmp_path / "outputs") == [
        f"  last logged step: none in {tmp_path / 'outputs' / 'metrics.jsonl'}",
        f"  last complete checkpoint: none in {tmp_path / 'outputs'}",
    ]


def test_progress_survives_any_bytes_and_names_a_damaged_checkpoint(tmp_path):
    output_dir = tmp_path / "outputs"
    for step in (2, 4):
        (output_dir / f"checkpoint-{step}").mkdir(parents=True)
        checkpoint_markers.mark_complete(output_dir / f"checkpoint-{step}", step, world_size=2)
    (output_dir / "checkpoint-4" / "optimizer.pt").write_bytes(b"")  # marked, yet it would not load
    (output_dir / "metrics.jsonl").write_bytes(b'{"step": 3, "loss": 1.0}\n\xff\xfe\n[1, 2]\n{"step": "x"}\n7\n')
    assert failure_report.progress_lines(output_dir) == [
        f"  last logged step: 3 ({output_dir / 'metrics.jsonl'})",
        f"  {output_dir / 'checkpoint-4'} would not load (optimizer.pt is empty (0 bytes)), and --resume true moves it "
        f"to nbddp-damaged/; last complete checkpoint: {output_dir / 'checkpoint-2'} (step 2); rerun with --resume "
        "true to continue from it",
    ]


def test_progress_when_output_dir_is_a_file_or_below_one(tmp_path):
    (tmp_path / "file").write_text("the user's")
    assert failure_report.progress_lines(tmp_path / "file") == [
        f"  output_dir {tmp_path / 'file'}: not a folder, so no steps were logged and no checkpoint written there"]
    assert failure_report.progress_lines(tmp_path / "file" / "out")[0].startswith("  last logged step: none in ")
    assert (tmp_path / "file").read_text() == "the user's"


def test_output_dir_from_the_flags_else_the_scripts_default(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('# %% tags=["parameters"]\noutput_dir = "outputs"\nmax_steps = 3\n\n# %%\nprint(max_steps)\n')
    assert find_output_dir(script, ["--output_dir", "a", "--output_dir=b"]) == "b"
    assert find_output_dir(script, ["--max_steps", "5"]) == "outputs"
    other = tmp_path / "allreduce.py"
    other.write_text("print('no parameters cell')\n")
    assert find_output_dir(other, []) is None
    assert find_output_dir(tmp_path / "missing.py", []) is None


def torchrun_log(terminated=(), killed=()):
    """What torchrun's agent logs for each worker it signals (torch/distributed/elastic/multiprocessing/api.py)."""
    where = "14487 torch/distributed/elastic/multiprocessing/api.py"
    lines = [f"W1201 16:32:45.019000 {where}:1028] Sending process {pid} closing signal SIGTERM" for pid in terminated]
    lines += [f"W1201 16:34:25.476000 {where}:1047] Unable to shutdown process {pid} via 15, forcefully exiting via 9"
              for pid in killed]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("observed", [[(1, -15), (0, -15)], [(0, -15), (1, -15)]])
def test_a_sigterm_from_outside_is_told_from_torchruns_own(observed):
    # `kill 1917` (or a scheduler) ended rank 1; torchrun then sent SIGTERM to rank 0 (pid 1916) and logged it
    text = describe(1, torchrun_log(terminated=[1916]) + summary(*observed))
    assert text.splitlines()[1:] == [
        "  rank 1 failed: killed by SIGTERM from outside torchrun (kill, a scheduler's time limit or preemption; "
        "pid 1917)",
        "  rank 0 stopped after it: killed by SIGTERM (torchrun stops every rank once one fails; pid 1916)",
    ]


def test_every_rank_terminated_from_outside():
    # scancel, `kill` of every worker: torchrun stopped none itself
    assert describe(1, summary((0, -15), (1, -15))).splitlines()[1:] == [
        "  rank 0 failed: killed by SIGTERM from outside torchrun (kill, a scheduler's time limit or preemption; "
        "pid 1916)",
        "  rank 1 failed too: killed by SIGTERM from outside torchrun (kill, a scheduler's time limit or preemption; "
        "pid 1917)",
    ]


@pytest.mark.parametrize("timed_out", [True, False])
def test_a_hung_rank_is_named_first_not_the_one_that_timed_out_waiting_for_it(tmp_path, timed_out):
    # rank 1 stopped (SIGSTOP, a wedged driver): rank 0's collective timed out, torchrun's SIGTERM did not end
    # rank 1, and torchrun killed it 30 s later
    waited = error_file(tmp_path / "0.json", "RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                                             "waiting 4000ms for recv operation to complete") if timed_out else "<N/A>"
    text = describe(1, torchrun_log(terminated=[1917], killed=[1917]) + summary((0, 1, waited), (1, -9)))
    rank_0 = "  rank 0 stopped after it: RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:78] Timed out " \
             "waiting 4000ms for recv operation to complete"
    assert text.splitlines()[1:] == [
        "  rank 1 hung: torchrun's SIGTERM did not end it, so torchrun killed it (stopped, or stuck in the kernel or a "
        "driver; pid 1917)",
        rank_0 if timed_out else "  rank 0 failed too: exited with status 1 (pid 1916)",
    ]


@pytest.mark.parametrize("lost_peer", [True, False])
def test_a_rank_that_ended_early_with_status_0_is_named(tmp_path, lost_peer):
    # rank 1 ended its script early (status 0), so torchrun lists only rank 0, whose all_reduce lost its peer
    lost = error_file(tmp_path / "0.json", "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:18825") \
        if lost_peer else "<N/A>"
    text = describe(1, summary((0, 1, lost)), processes=2)
    assert text.splitlines()[1:] == [
        "  rank 1 ended early: exited with status 0 while the other ranks still ran (its script ended early)",
        "  rank 0 stopped after it: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:18825"
        if lost_peer else "  rank 0 failed too: exited with status 1 (pid 1916)",
    ]


def test_ranks_of_another_node_are_not_taken_for_early_exits():
    # node 1 of 2 nodes, 2 workers each: its workers are ranks 2 and 3
    failures = parse_summary(summary((3, -9)).replace("3 (local_rank: 3)", "3 (local_rank: 1)"))
    assert [(f.rank, f.local_rank) for f in failure_report.ended_early(failures, 2)] == [(2, 0)]
    assert failure_report.ended_early(failures, None) == []


DiskUsage = collections.namedtuple("DiskUsage", "total used free")


@pytest.mark.parametrize("free_mib, callstack, line", [
    # the traceback the error file keeps: torch.save's own message does not say why, the chained OSError does
    (5, "OSError: [Errno 28] No space left on device: '/x/outputs/checkpoint-8/optimizer.pt'",
     "  disk full: No space left on device writing /x/outputs/checkpoint-8/optimizer.pt; 5 MiB free on the disk of {}"),
    (5, "", "  disk full: only 5 MiB free on the disk of {}"),
    (50_000, "", None),
])
def test_a_full_disk_is_said(tmp_path, monkeypatch, free_mib, callstack, line):
    monkeypatch.setattr(failure_report.shutil, "disk_usage", lambda path: DiskUsage(10**12, 0, free_mib * 2**20))
    path = tmp_path / "1.json"
    message = "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": callstack}}}))
    output_dir = tmp_path / "outputs"  # not created yet: the space of the disk it would be on
    lines = describe(1, summary((1, 1, str(path)), (0, -15)), output_dir).splitlines()
    assert lines[1] == f"  rank 1 failed: {message}"
    disk = [text for text in lines if "disk full" in text]
    assert disk == ([line.format(output_dir)] if line else [])


def test_no_space_in_the_workers_stderr_is_enough():
    text = describe(1, "[rank1]: OSError: [Errno 28] No space left on device\n" + summary((1, 1)))
    assert "  disk full: No space left on device" in text.splitlines()


def test_an_error_every_rank_raised_is_written_out_once(tmp_path):
    message = "NonFiniteLoss: the training loss is not finite (NaN or infinite) at step 3 of 8: ..."
    files = [error_file(tmp_path / f"{rank}.json", message, rank=rank) for rank in (0, 1)]
    text = describe(1, summary((0, 1, files[0], message), (1, 1, files[1], message)))
    assert text.splitlines()[1:] == [f"  rank 0 failed: {message}", "  rank 1 failed too: the same error"]
    # torchrun observed rank 1 first: the same report, lowest rank first (which exited first is chance)
    assert describe(1, summary((1, 1, files[1], message), (0, 1, files[0], message))) == text


def test_different_errors_keep_torchruns_order(tmp_path):
    first, second = "ValueError: bad row", "KeyError: 'text'"
    files = [error_file(tmp_path / f"{rank}.json", message, rank=rank) for rank, message in ((1, first), (0, second))]
    text = describe(1, summary((1, 1, files[0], first), (0, 1, files[1], second)))
    assert text.splitlines()[1:] == [f"  rank 1 failed: {first}", f"  rank 0 failed too: {second}"]


@pytest.mark.parametrize("content", [b"\xff\xfe not json", b"[1, 2]", b'{"message": "text only"}',
                                     b'{"message": {"message": "X", "extraInfo": "not a dict"}}',
                                     b'{"message": {"message": ["X"], "extraInfo": {"py_callstack": 5}}}'])
def test_an_error_file_of_any_bytes_never_crashes_the_report(tmp_path, content):
    path = tmp_path / "error.json"
    path.write_bytes(content)
    message, origin = failure_report.read_error_file(str(path))
    assert origin is None and (message is None or isinstance(message, str))
    text = describe(1, summary((1, 1, str(path), "..."), (0, -15)))
    assert text.splitlines()[1].startswith("  rank 1 failed: ")


def test_a_script_that_is_not_text_has_no_output_dir_to_report(tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes(b"\xff\xfe\x00 not a script")
    assert find_output_dir(script, []) is None
