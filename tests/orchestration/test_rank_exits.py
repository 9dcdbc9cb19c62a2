"""A rank that ends itself with sys.exit() while the others still run, before or after training, on 2 CPU processes:
`pipeline.py launch` names it first, not the other rank's lost connection, and no process outlives the job.

The script is the generated one with `sys.exit(0)` on rank 1 added to the line of `trainer.train()`, before or after
it (the line numbers, so the source map, stay the same), run with the example notebooks' folder as its workdir."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "generated" / "train.py"
TRAIN = "trainer_stats = trainer.train(resume_from_checkpoint=ddp.checkpoint_to_resume(trainer))"
EXIT = "import sys; sys.exit({status}) if ddp.rank == 1 else None"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not SCRIPT.exists(), reason="generated/train.py is not exported")]


def processes_of(text):
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return found


@pytest.mark.parametrize("when, status", [("before", 0), ("after", 0), ("before", 3)])
def test_a_rank_that_exits_by_itself_is_named_first(tmp_path, when, status):
    source = SCRIPT.read_text()
    assert TRAIN in source
    script = tmp_path / "train.py"
    exit_line = EXIT.format(status=status)
    script.write_text(source.replace(TRAIN, f"{exit_line}; {TRAIN}" if when == "before" else f"{TRAIN}; {exit_line}"))
    shutil.copy(SCRIPT.with_name("train.sourcemap.json"), tmp_path)
    command = [sys.executable, "pipeline.py", "launch", "--nproc-per-node", "2", "--script", str(script), "--",
               "--backend", "hf", "--max_steps", "2", "--workdir", str(REPO / "notebooks"),
               "--output_dir", str(tmp_path / "outputs")]
    result = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 1
    report = result.stderr[result.stderr.rindex("nbddp: training failed"):].splitlines()
    named = ("  rank 1 ended early: exited with status 0 while the other ranks still ran (its script ended early)"
             if status == 0 else "  rank 1 failed: exited with status 3 (pid ")
    assert report[1].startswith(named), result.stderr[-6000:]  # with torchrun's summary, which the report reads
    # its lost connection, or torchrun's SIGTERM when torchrun saw rank 1's status first
    assert report[2].startswith("  rank 0 stopped after it: ")
    assert f"[rank 1] nbddp: this rank ends here with status {status} while the other ranks go on (they stop at " \
           "their next collective); " in result.stderr
    assert "comes from notebooks/03_train.ipynb, cell 6, line 1" in result.stderr
    assert ("nbddp: step 2/2" in result.stdout) == (when == "after")
    assert not processes_of(str(script))
