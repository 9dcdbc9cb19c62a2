"""`generated/train.py --help`, the real exported script: every parameter with its notebook comment and default."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "generated" / "train.py"


@pytest.mark.skipif(not SCRIPT.exists(), reason="generated/train.py is not exported")
def test_help_teaches_each_parameter_from_its_notebook_comment():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # argparse wraps lines
    assert ("--use_gradient_checkpointing STR auto | unsloth | true | false: auto takes the fastest that fits in "
            "memory; default: 'auto' (from 02_lora_setup.ipynb)") in text
    assert "--backend {auto,unsloth,hf} auto | unsloth | hf; default: 'auto' (from nbddp)" in text
    assert "--warmup_steps INT default: 10 (from 03_train.ipynb)" in text  # no comment in the notebook


@pytest.mark.skipif(not SCRIPT.exists(), reason="generated/train.py is not exported")
def test_the_setup_cell_is_two_lines_and_bad_flags_are_named_before_torch_loads(tmp_path):
    text = SCRIPT.read_text()
    assert "\n# %% nbddp setup\nfrom nbddp import runtime\nddp = runtime.setup(globals())\n\n" in text
    done = subprocess.run([sys.executable, str(SCRIPT), "--max_step", "3"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == ("train.py: error: unrecognized arguments: --max_step 3 "
                                            "(did you mean --max_steps?)")
    (tmp_path / "file").write_text("")
    done = subprocess.run([sys.executable, str(SCRIPT), "--output_dir", str(tmp_path / "file" / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"nbddp: error: output_dir '{tmp_path / 'file' / 'out'}'")
