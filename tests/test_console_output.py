"""What a researcher reads: the default run of the starter job prints nbddp's lines and its notebook's own prints,
at most 5 lines that are not nbddp's, each of them in the run's logs too; other libraries' progress bars and
warnings, on every rank, only in the logs."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NBDDP_LINE = ("nbddp: ", "smoke: ", "launch: ", "run: ", "  ")  # the runtime's, each command's, the summary's rows

pytestmark = pytest.mark.e2e


def test_the_default_run_prints_nbddps_lines_and_leaves_the_noise_in_the_logs(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
           "NBDDP_CACHE": str(tmp_path / "models"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("NBDDP_LOG_LEVEL", None)
    subprocess.run([sys.executable, str(REPO / "pipeline.py"), "new", "job"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=300)
    result = subprocess.run([sys.executable, str(REPO / "pipeline.py"), "run", "-p", "max_steps", "6", "-p",
                             "eval_steps", "3"], cwd=tmp_path / "job", env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines() + result.stderr.splitlines()
    others = [line for line in lines if not line.removeprefix("[default0]:").removeprefix("[default1]:")
              .startswith(NBDDP_LINE)]
    assert len(others) <= 5, others
    logs = "".join(path.read_text(errors="replace") for path in (tmp_path / "job" / "runs").rglob("logs/**/*.log"))
    for line in others:
        assert line.split("]:", 1)[-1] in logs
    assert not any(line.strip() in ("[default0]:", "[default1]:") for line in lines)
    assert "%|" not in result.stderr and "Warning: " not in result.stderr  # in the logs, not here
    assert "%|" in logs and "UserWarning: 'pin_memory'" in logs  # from every rank
    patched = next(line for line in lines if " patches of " in line)
    assert len(patched) < 160 and "details: patched: " in logs
