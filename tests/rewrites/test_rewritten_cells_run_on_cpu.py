"""A cell written for one GPU (its own device strings, process group, tracker and notebook progress bar), rewritten
by export, runs as 2 gloo processes on a CPU: one tracker run, from rank 0, and both ranks in one process group."""
import os
import subprocess
import sys
import textwrap

import pytest

from rewrite_case import LOCATION

from nbddp.export.rewrites import apply

CELL = """\
import torch
import torch.distributed as dist
from tqdm.notebook import tqdm
import wandb
dist.init_process_group("nccl")
torch.cuda.set_device(0)
torch.set_default_device("cuda")
device = "cuda:0"
x = torch.ones(2).to(device)
dist.all_reduce(x)
wandb.init(project="nbddp")
for step in tqdm(range(2)):
    wandb.log({"step": step})
wandb.finish()
with open(LOG, "a") as log:
    log.write(f"{dist.get_rank()} {x.tolist()} {x.device}\\n")
"""

# Stands in for wandb: writes what each rank asked of it.
FAKE_WANDB = """\
import os

def _note(what):
    with open(os.environ["NBDDP_TEST_LOG"], "a") as log:
        log.write(f"{os.environ['RANK']} wandb.{what}\\n")

def init(**options):
    _note("init")

def log(values):
    _note(f"log {values}")

def finish():
    _note("finish")
"""


@pytest.mark.e2e
def test_a_one_gpu_cell_rewritten_runs_on_two_cpu_processes(tmp_path):
    code, _ = apply(CELL, LOCATION)
    script = tmp_path / "train.py"
    script.write_text("import os\nfrom nbddp.runtime.context import init_distributed\nddp = init_distributed()\n"
                      'LOG = os.environ["NBDDP_TEST_LOG"]\n' + code + "ddp.shutdown()\n")
    (tmp_path / "wandb.py").write_text(FAKE_WANDB)
    log = tmp_path / "log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "NBDDP_TEST_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, textwrap.shorten(result.stderr, 3000)
    lines = log.read_text().splitlines()
    assert [line for line in lines if "wandb" in line] == [
        "0 wandb.init", "0 wandb.log {'step': 0}", "0 wandb.log {'step': 1}", "0 wandb.finish"]
    assert sorted(line for line in lines if "wandb" not in line) == ["0 [2.0, 2.0] cpu", "1 [2.0, 2.0] cpu"]
