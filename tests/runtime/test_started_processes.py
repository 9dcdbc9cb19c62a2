"""A process a cell starts (`ddp.start_process(lambda: subprocess.Popen(...))`) starts once per machine, and every
rank can poll, signal and wait for it."""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

from nbddp.runtime.context import DistributedContext
from nbddp.runtime.started_processes import ProcessOfAnotherRank

# Appends a line to its log when it starts, then serves until it is stopped.
SERVER = "import sys, time; open(sys.argv[1], 'a').write('started\\n'); time.sleep(60)"


@pytest.fixture
def private_tmp(monkeypatch, tmp_path):
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)


def rank(local_rank):
    return DistributedContext(rank=local_rank, local_rank=local_rank, world_size=2, local_world_size=2)


def start_server(ddp, log):
    return ddp.start_process(lambda: subprocess.Popen([sys.executable, "-c", SERVER, str(log)]))


def test_the_other_rank_gets_the_first_ranks_process_and_sees_it_exit(private_tmp, tmp_path):
    first = start_server(rank(0), tmp_path / "log")
    other = start_server(rank(1), tmp_path / "log")
    try:
        assert isinstance(first, subprocess.Popen) and isinstance(other, ProcessOfAnotherRank)
        assert (other.pid, other.args) == (first.pid, first.args)
        assert other.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=0.2)
        other.terminate()  # the notebook's `server.terminate()`, on the rank that did not start it
        assert first.wait(timeout=30) == -signal.SIGTERM
        assert other.wait(timeout=30) == -signal.SIGTERM
        other.kill()  # after its exit: nothing is sent
    finally:
        first.kill()
        first.wait(timeout=30)
    assert (tmp_path / "log").read_text() == "started\n"


def start_true(ddp, made=None):
    """The script's one line that starts a process, as each rank runs it; `made` lists the ranks that evaluated the
    call's arguments."""
    return ddp.start_process(lambda: subprocess.Popen(["true"], stdin=made.append(ddp.rank) if made else None))


def test_the_other_rank_does_not_evaluate_the_calls_arguments(private_tmp, tmp_path):
    made = [None]
    first = start_true(rank(0), made)
    start_true(rank(1), made)
    assert made == [None, 0] and first.wait(timeout=30) == 0


def test_each_time_a_line_runs_again_starts_another_process(private_tmp, tmp_path):
    zero, one = rank(0), rank(1)
    processes = []
    for _ in range(2):  # a loop in the cell: two processes, each started once
        processes += [start_true(zero), start_true(one)]
    assert [type(process).__name__ for process in processes] == ["Popen", "ProcessOfAnotherRank"] * 2
    assert processes[0].pid != processes[2].pid
    assert [process.wait(timeout=30) for process in processes] == [0, 0, 0, 0]


def test_one_process_on_the_machine_just_starts_it(private_tmp, tmp_path):
    process = start_true(DistributedContext())
    assert isinstance(process, subprocess.Popen) and process.wait(timeout=30) == 0
    assert not list((tmp_path / "tmp").iterdir())


# A server on localhost, as a notebook starts one: it notes its start before it binds the port (so a second one
# would show, though it could not bind).
HTTP_SERVER = textwrap.dedent("""\
    import http.server, sys
    open(sys.argv[1], "a").write("started\\n")
    class Reply(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Reply).serve_forever()
    """)

# Each rank starts the server, then polls it on localhost until it answers, as the notebooks' next cell does.
WORKER = textwrap.dedent("""\
    import subprocess, sys, time, urllib.request
    from nbddp.runtime.context import init_distributed

    server_code, log, port = sys.argv[1:]
    ddp = init_distributed()
    server = ddp.start_process(lambda: subprocess.Popen([sys.executable, "-c", server_code, log, port]))
    for _ in range(300):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise RuntimeError(f"rank {ddp.rank}: no answer on port {port}")
    seen = open(f"{log}.rank{ddp.rank}", "w")  # each rank's own file: no two ranks' lines to interleave
    print(f"rank {ddp.rank} has {type(server).__name__} {server.pid} {server.poll()}", file=seen, flush=True)
    ddp.barrier()
    server.terminate()
    try:
        print(f"rank {ddp.rank} saw it exit with {server.wait(timeout=30)}", file=seen, flush=True)
    except subprocess.TimeoutExpired:
        server.kill()
        raise
    ddp.shutdown()
    """)


@pytest.mark.e2e
def test_two_gloo_processes_start_the_server_once_and_both_reach_it(tmp_path):
    (tmp_path / "tmp").mkdir()
    worker, log = tmp_path / "worker.py", tmp_path / "log"
    worker.write_text(WORKER)
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(worker), HTTP_SERVER, str(log), str(port)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert log.read_text() == "started\n"
    seen = "".join((tmp_path / f"log.rank{rank}").read_text() for rank in (0, 1))
    has = re.findall(r"rank (\d) has (\w+) (\d+) (-?\w+)", seen)
    assert sorted(kind for _, kind, _, _ in has) == ["Popen", "ProcessOfAnotherRank"], (seen, result.stdout)
    assert len({pid for _, _, pid, _ in has}) == 1 and [running for *_, running in has] == ["None", "None"]
    assert sorted(re.findall(r"rank (\d) saw it exit with (-?\d+)", seen)) == [("0", "-15"), ("1", "-15")]
