"""Each kind of Unsloth notebook, exported and trained on CPU: 2 gloo processes train as 1 does.

The fixtures (tests/fixtures/kinds/<kind>/) are the code cells of one of Unsloth's own notebooks each, as they
are (their headers say which, and what was changed); they load the hub's models and datasets by their ids, which
resolve to local stand-ins (tools/standins.py, tools/standin_datasets.py) in the folder each run starts from.
For each kind: the script runs on 1 and on 2 processes, a few steps, at the notebook's global batch; rank 0's
prints come once; the adapter is saved once, by rank 0; and where the trainer is deterministic (everything but
GRPO, which samples its completions), the per-step losses of 2 processes are those of 1.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import standin_datasets, standins
from tools.notebook_facts import read_facts

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "tests" / "fixtures" / "kinds"
SAVE_HOOK = REPO / "tests" / "fixtures" / "e2e" / "sitecustomize.py"
STEPS = 3
DETERMINISTIC = {"conversational", "continued_pretraining", "dpo", "vision"}

pytestmark = pytest.mark.e2e


def kinds():
    return sorted(path.name for path in KINDS.iterdir() if path.is_dir())


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("kinds")


def export(kind, work) -> tuple[Path, object]:
    notebooks = work / kind / "notebooks"
    shutil.copytree(KINDS / kind, notebooks)
    out = work / kind / "out"
    result = subprocess.run([sys.executable, str(REPO / "pipeline.py"), "export", "--notebooks", str(notebooks),
                             "--out", str(out)], cwd=work / kind, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return out / "train.py", read_facts(next(notebooks.glob("*.ipynb")))


def run(script, facts, run_dir, nproc, work):
    """The script on `nproc` torchrun processes from `run_dir`, which holds the stand-ins the notebook loads."""
    from nbddp.examples.tiny_model import ensure_weights

    run_dir.mkdir(parents=True)
    model = Path(ensure_weights(str(standins.model_source(REPO, facts.loads_vision_model()))))
    ids = set(facts.dataset_ids) | {i for i in standin_datasets.LAYOUTS if facts.mentions(i)}
    datasets = {i: folder for i in ids if (folder := standin_datasets.build(work / "datasets", i))}
    standins.assemble(run_dir, standins.model_standin_names(facts.model_ids), model, datasets)
    hook = run_dir.parent / f"hook-{nproc}"
    hook.mkdir()
    shutil.copy(SAVE_HOOK, hook / "sitecustomize.py")
    log = run_dir.parent / f"saves-{nproc}.log"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "NBDDP_MAX_STEPS": str(STEPS),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), str(REPO), os.environ.get("PYTHONPATH")])),
           "NBDDP_E2E_SAVE_LOG": str(log), "WANDB_MODE": "disabled"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(script), "--backend", "hf", "--workdir", str(run_dir)]  # the cells run among the stand-ins
    result = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    saves = log.read_text().splitlines() if log.exists() else []
    return result, saves


def losses(run_dir) -> list[list[float]]:
    """Each trainer's training loss of each step, from the metrics.jsonl nbddp's callback wrote next to its
    checkpoints (a second trainer of the script into `<output_dir>/trainer-2/`), the first trainer's first."""
    found = []
    for metrics in sorted(run_dir.rglob("metrics.jsonl")):
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        found.append([record["loss"] for record in records if "event" not in record and "loss" in record])
    return found


@pytest.mark.parametrize("kind", kinds())
def test_a_kind_of_notebook_trains_on_two_processes_as_on_one(kind, work):
    script, facts = export(kind, work)
    one, _ = run(script, facts, work / kind / "one", 1, work)
    two, saves = run(script, facts, work / kind / "two", 2, work)

    output = two.stdout + two.stderr
    assert output.count("nbddp: backend=") == 1
    assert output.count("global batch") == one.stdout.count("global batch") >= 1  # the layout, said once
    assert saves and all(save.startswith("0 ") for save in saves), saves  # saved (adapter, checkpoint) by rank 0
    # the notebook's own saves once each (the CPT notebook's two trainings each checkpoint into outputs/)
    adapters = [save for save in saves if "checkpoint-" not in save]
    assert len(adapters) == len(set(adapters)), saves
    trainers_one, trainers_two = losses(work / kind / "one"), losses(work / kind / "two")
    assert len(trainers_one) == len(trainers_two) >= 1  # the CPT notebook trains twice
    assert all(len(steps) == STEPS for steps in trainers_one + trainers_two)
    if kind in DETERMINISTIC:
        for one_steps, two_steps in zip(trainers_one, trainers_two):
            assert two_steps == pytest.approx(one_steps, abs=1e-4)
