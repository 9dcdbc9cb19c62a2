"""Run a training script as `python SCRIPT ARGS` would, with its Trainer steps timed by bench.step_timer.

    BENCH_RESULT_DIR=/tmp/trial BENCH_T0=$(date +%s.%N) \
        torchrun --standalone --nproc_per_node 2 bench/timed_run.py generated/train.py --max_steps 40

Environment: BENCH_RESULT_DIR (required; each rank writes rank<R>.json there), BENCH_T0 (epoch
seconds when the launch began, for wall time to first step; default: now), BENCH_DDP_KWARGS
(JSON dict of accelerate DistributedDataParallelKwargs fields to override, e.g.
{"gradient_as_bucket_view": true}), BENCH_REMOVE_CALLBACKS (comma-separated callback class names
to take off the trainer, e.g. MetricsCallback), BENCH_PROFILE_STEPS (FIRST-LAST: profile those optimizer
steps, FIRST >= 2; see bench.step_timer).
"""
import json
import os
import runpy
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench import step_timer  # noqa: E402  (needs the repository root on the path first)


def parse_profile_steps(text):
    """Parse "FIRST-LAST" into (FIRST, LAST), "" into None. Profiling starts at the end of step FIRST-1: FIRST >= 2."""
    if not text:
        return None
    try:
        first, last = (int(part) for part in text.split("-"))
    except ValueError:
        sys.exit(f"timed_run.py: BENCH_PROFILE_STEPS must be FIRST-LAST, e.g. 41-43, not {text!r}")
    if not 2 <= first <= last:
        sys.exit(f"timed_run.py: BENCH_PROFILE_STEPS {text!r}: need 2 <= FIRST <= LAST")
    return first, last


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: timed_run.py SCRIPT [ARGS...]")
    script = os.path.abspath(sys.argv[1])
    result_dir = os.environ.get("BENCH_RESULT_DIR")
    if not result_dir:
        sys.exit("timed_run.py: set BENCH_RESULT_DIR to the folder for rank<R>.json")
    t0 = float(os.environ.get("BENCH_T0") or time.time())
    removed = [name for name in os.environ.get("BENCH_REMOVE_CALLBACKS", "").split(",") if name]
    profile_steps = parse_profile_steps(os.environ.get("BENCH_PROFILE_STEPS", ""))
    step_timer.install(result_dir, t0, json.loads(os.environ.get("BENCH_DDP_KWARGS") or "{}"), removed,
                       profile_steps)
    sys.argv = [script, *sys.argv[2:]]
    sys.path.remove(REPO)  # the script sees the path `python SCRIPT` gives it: its folder first
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
