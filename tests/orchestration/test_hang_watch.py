"""The hang watch: a stopped rank is named and killed long before the collective timeout; a live one is left alone;
end to end, `launch` of 2 gloo ranks where rank 1 stops itself ends within seconds, its report naming rank 1 hung."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration.launch import hang_watch, launch
from nbddp.runtime.reporting import heartbeat

REPO = Path(__file__).resolve().parents[2]

# A worker: beats (every 0.2 s), then stops itself or keeps running.
WORKER = r'''
import os, signal, sys, time
from nbddp.runtime.reporting import heartbeat
heartbeat.BEAT_S = 0.2
heartbeat.start(int(sys.argv[1]))
print("beating", flush=True)
if sys.argv[2] == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(30)
'''

# The job: rank 1 stops itself; rank 0 waits for it in a barrier, as it would in a collective.
JOB = r'''
import os, signal
from nbddp import runtime
ddp = runtime.setup(backend="hf", script=__file__)
if ddp.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
ddp.barrier()
ddp.shutdown()
'''


def start_worker(tmp_path, folder, rank, action):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, heartbeat.VARIABLE: str(folder),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    worker = subprocess.Popen([sys.executable, str(script), str(rank), action], env=env, stdout=subprocess.PIPE,
                              text=True)
    assert worker.stdout.readline().strip() == "beating"
    return worker


def test_a_stopped_rank_is_named_and_killed_a_live_one_is_not(tmp_path):
    folder = tmp_path / "beats"
    folder.mkdir()
    live, stopped = start_worker(tmp_path, folder, 0, "run"), start_worker(tmp_path, folder, 1, "stop")
    watch = hang_watch.Watch(folder, limit=2.0)
    watch.start()
    try:
        assert stopped.wait(timeout=20) == -signal.SIGKILL
        assert live.poll() is None  # beating, so alive and left alone
    finally:
        watch.stop()
        live.kill()
    assert (watch.hung.rank, watch.hung.pid, watch.hung.stopped) == (1, stopped.pid, True)
    assert "rank 1" in watch.hung.describe() and "stopped (SIGSTOP or Ctrl-Z)" in watch.hung.describe()


def test_a_pid_that_is_no_worker_of_ours_is_never_killed(tmp_path):
    folder = tmp_path / "beats"
    folder.mkdir()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    (folder / "rank-0").write_text(str(stranger.pid))  # a stale file whose pid now belongs to another process
    os.utime(folder / "rank-0", (time.time() - 60, time.time() - 60))
    watch = hang_watch.Watch(folder, limit=1.0)
    watch.start()
    time.sleep(2.5)
    watch.stop()
    try:
        assert stranger.poll() is None and watch.hung is None
    finally:
        stranger.kill()


@pytest.mark.parametrize("text", ["abc", "-5"])
def test_a_bad_limit_says_what_to_give(text):
    with pytest.raises(UsageError, match="NBDDP_HANG_S"):
        hang_watch.limit_s({"NBDDP_HANG_S": text})


def test_zero_turns_the_watch_off():
    env = {"NBDDP_HANG_S": "0"}
    with hang_watch.watching(env) as watch:
        assert watch is None and heartbeat.VARIABLE not in env


@pytest.mark.e2e
def test_launch_names_a_stopped_rank_long_before_the_collective_timeout(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    plan = launch.plan_launch(script, [], launch.LaunchOptions("2"), environ={})
    environ = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NBDDP_HANG_S": "12",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    status = launch.execute(plan, environ=environ)
    elapsed = time.monotonic() - started
    report = capsys.readouterr().err
    assert status != 0 and elapsed < 120, (status, elapsed)  # the collective timeout is 1800 s
    assert "rank 1 (pid" in report and "stopped answering" in report and "SIGSTOP" in report, report
