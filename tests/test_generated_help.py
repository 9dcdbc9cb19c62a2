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
