"""A notebook's own `device_map={"": int(os.environ.get("LOCAL_RANK", 0))}`, as export rewrites it
(inject_device_map: `ddp.device_map()`), loads the model on 2 CPU processes; as written, it names a GPU they lack."""
import os
import subprocess
import sys

import pytest

from nbddp.export.rewrites import apply
from nbddp.export.rewrites.base import CellLocation

CELL = """\
import os
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(MODEL, device_map={"": int(os.environ.get("LOCAL_RANK", 0))})
with open(os.environ["LOG"], "a") as log:
    log.write(f"rank {ddp.rank}: model on {model.device}\\n")
"""


def run_two(script, model_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "MODEL": model_path,
           "LOG": str(script.with_suffix(".log"))}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.e2e
def test_the_notebooks_local_rank_map_loads_the_model_on_two_cpu_processes(tmp_path, tiny_model_path):
    head = ("import os\nfrom nbddp.runtime.context import init_distributed\nddp = init_distributed()\n"
            'MODEL = os.environ["MODEL"]\n')
    code, changes = apply(CELL, CellLocation("notebooks/02_model.ipynb", 3))
    assert "device_map=ddp.device_map()" in code
    assert [change.rewrite for change in changes] == ["inject-device-map"]
    rewritten, written = tmp_path / "rewritten.py", tmp_path / "written.py"
    rewritten.write_text(head + code + "ddp.shutdown()\n")
    written.write_text(head + CELL + "ddp.shutdown()\n")
    result = run_two(rewritten, tiny_model_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(rewritten.with_suffix(".log").read_text().splitlines()) == [
        "rank 0: model on cpu", "rank 1: model on cpu"]
    assert run_two(written, tiny_model_path).returncode != 0  # what the notebook's own map does on a CPU
