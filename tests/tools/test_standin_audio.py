"""The audio notebooks' stand-ins: their families' tiny models (tiny-orpheus, tiny-csm), evaluate's "wer" metric and
the SNAC codec that tools/standin_datasets.py writes beside a notebook."""
import builtins
import subprocess
import sys
from pathlib import Path

import pytest

from tools import standin_datasets
from tools.standins import model_source

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model_id, folder", [("unsloth/orpheus-3b-0.1-ft", "tiny-orpheus"),
                                              ("unsloth/csm-1b", "tiny-csm"), ("sesame/csm-1b", "tiny-csm"),
                                              ("unsloth/whisper-large-v3", "tiny-whisper")])
def test_an_audio_family_gets_its_own_tiny_model(model_id, folder):
    assert model_source(REPO, vision=False, model_ids=[model_id]) == REPO / "models" / folder


def test_other_ids_with_csm_inside_a_word_keep_the_chat_model():
    assert model_source(REPO, vision=False, model_ids=["unsloth/docsm-7b"]) == REPO / "models" / "tiny-chat"


@pytest.mark.parametrize("script, folder", [("build_tiny_orpheus.py", "tiny-orpheus"), ("build_tiny_csm.py", "tiny-csm")])
def test_the_committed_audio_models_are_what_their_build_scripts_write(tmp_path, script, folder):
    import transformers

    if folder == "tiny-csm" and int(transformers.__version__.split(".")[0]) >= 5:
        pytest.skip("build_tiny_csm.py saves with Transformers 4.56 (the notebook's stack), whose layout 5.x reads")
    subprocess.run([sys.executable, str(REPO / "models" / script), "--out", str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    committed = sorted(p.name for p in (REPO / "models" / folder).iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (REPO / "models" / folder / name).read_bytes(), name


def test_orpheus_reaches_the_ids_of_its_audio_codes():
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(REPO / "models" / "tiny-orpheus")
    assert config.vocab_size > 128266 + 7 * 4096 - 1  # the notebook's last SNAC code id


def test_the_wer_metric_loads_from_its_folder_and_counts_word_errors(tmp_path):
    pytest.importorskip("evaluate")
    pytest.importorskip("jiwer")
    import evaluate

    folder = standin_datasets.build(tmp_path, "wer")
    metric = evaluate.load(str(folder))
    assert metric.compute(predictions=["a b c", "x"], references=["a b d", "x y"]) == pytest.approx(2 / 5)


def test_the_snac_codec_loads_and_codes_in_the_notebooks_layout(tmp_path):
    pytest.importorskip("snac")
    import torch
    from snac import SNAC

    model = SNAC.from_pretrained(str(standin_datasets.build(tmp_path, "hubertsiuzdak/snac_24khz")))
    codes = model.encode(torch.zeros(1, 1, 6000))
    assert [c.shape[1] for c in codes] == [3, 6, 12]  # 1, 2 and 4 codes a frame: Orpheus's 7 a frame
    assert all(int(c.max()) < 4096 for c in codes)


def test_a_codec_without_its_package_gets_no_folder(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def without_snac(name, *args, **kwargs):
        if name == "snac":
            raise ImportError("No module named 'snac'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_snac)
    assert standin_datasets.build(tmp_path, "hubertsiuzdak/snac_24khz") is None
    assert not (tmp_path / "hubertsiuzdak" / "snac_24khz").exists()

