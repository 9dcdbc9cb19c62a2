"""The tiny models kept in models/: each builder rewrites its folder's committed files byte for byte, and no
weights are committed (nbddp.runtime.tiny_model.ensure_weights builds them)."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOKENIZER_FILES = ["config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
# (model folder, its builder, the files committed in the folder)
MODELS = [
    ("tiny-llama", "build_tiny_llama.py", TOKENIZER_FILES),
    ("tiny-chat", "build_tiny_chat.py", TOKENIZER_FILES),
    ("tiny-vision", "build_tiny_vision.py", ["chat_template.jinja", "config.json", "generation_config.json",
                                             "preprocessor_config.json",
                                             "processor_config.json", "special_tokens_map.json", "tokenizer.json",
                                             "tokenizer_config.json"]),
]
IDS = [model for model, _, _ in MODELS]


@pytest.mark.parametrize("model, builder, committed", MODELS, ids=IDS)
def test_rebuilding_gives_the_committed_bytes(model, builder, committed, tmp_path):
    subprocess.run([sys.executable, str(REPO / "models" / builder), "--out", str(tmp_path)], check=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (REPO / "models" / model / name).read_bytes(), name


@pytest.mark.parametrize("model, builder, committed", MODELS, ids=IDS)
def test_no_weights_are_committed(model, builder, committed):
    assert sorted(path.name for path in (REPO / "models" / model).iterdir()) == committed
