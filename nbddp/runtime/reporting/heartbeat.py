"""Each worker's heartbeat, by which `pipeline.py launch` names a rank that stopped answering long before the
process-group timeout (the run setting `timeout_s`, 1800 s by default) would end the job
(`orchestration.launch.hang_watch`).

When the run setting `heartbeat_dir` names a folder (launch sets it to a private one of its own), a daemon thread
touches `<folder>/rank-<RANK>`, which holds the worker's pid, every BEAT_S seconds. It beats while the rank's main
thread computes, loads or waits in a collective; it stops when the process is stopped (SIGSTOP, Ctrl-Z in its terminal),
its machine stalls, or native code holds the interpreter lock.
"""
import os
import threading
import time

from nbddp.formats.run_settings import ENV

VARIABLE = ENV.HEARTBEAT_DIR
BEAT_S = 5.0


def start(rank: int) -> None:
    """Beat for `rank` in the run setting `heartbeat_dir`'s folder, if it is set; once per process."""
    folder = os.environ.get(VARIABLE)
    if not folder or any(thread.name == "nbddp-heartbeat" for thread in threading.enumerate()):
        return
    path = os.path.join(folder, f"rank-{rank}")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as beat_file:
        beat_file.write(str(os.getpid()))

    def beat():
        while True:
            time.sleep(BEAT_S)
            try:
                os.utime(path)
            except OSError:  # the launcher has removed its folder: the job is over
                return

    threading.Thread(target=beat, name="nbddp-heartbeat", daemon=True).start()
