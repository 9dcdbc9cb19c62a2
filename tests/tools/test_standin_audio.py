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


@pytest.mark.e2e
def test_the_speaking_orpheus_writes_snac_frames_that_the_notebook_decodes(tmp_path, monkeypatch):
    """Orpheus_(3B)-TTS's inference cell: prompt ids, sampling as it sets it, then the last start of speech, frames
    of 7 ids less 128266 + k * 4096 each, which SNAC's codebooks (4096 codes) must hold."""
    import torch
    from transformers import AutoModelForCausalLM

    from nbddp.examples.tiny_model import ensure_weights
    from tools.standins import speaking_orpheus_variant

    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path / "cache"))
    folder = speaking_orpheus_variant(Path(ensure_weights(str(REPO / "models" / "tiny-orpheus"))), tmp_path)
    model = AutoModelForCausalLM.from_pretrained(folder)
    prompt = torch.tensor([[128259, 128000, 40, 41, 42, 128009, 128260]])  # SOH SOT text EOT EOH
    torch.manual_seed(0)
    generated = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=1 + 7 * 6,
                               do_sample=True, temperature=0.6, top_p=0.95, repetition_penalty=1.1,
                               eos_token_id=128258)[0, prompt.shape[1]:]
    assert generated[0] == 128257  # start of speech
    codes = generated[1:] - 128266
    assert len(codes) == 7 * 6
    layers = codes.view(6, 7) - torch.arange(7) * 4096
    assert ((0 <= layers) & (layers < 4096)).all()
    assert len(set(layers[:, 0].tolist())) > 1  # sampled within each codebook, not one fixed code


SESAME_TEXT = "Sesame is a super cool TTS model which can be fine tuned with Unsloth."


@pytest.mark.e2e
def test_the_tiny_csm_generates_only_codes_that_its_codec_decodes(tmp_path, monkeypatch):
    """Sesame_CSM_(1B)-TTS's two text-only generations: a random backbone also picks the ids after the 2048 codes
    (on Transformers 4.56, greedy: 2049 for the first in float32, the second in bfloat16), which Mimi cannot
    decode; the stand-in's generation config leaves them out, for the backbone and the depth decoder."""
    import torch
    from transformers import AutoProcessor, CsmForConditionalGeneration

    from nbddp.examples.tiny_model import ensure_weights

    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path))
    processor = AutoProcessor.from_pretrained(REPO / "models" / "tiny-csm")
    model = CsmForConditionalGeneration.from_pretrained(ensure_weights(str(REPO / "models" / "tiny-csm")))
    prompts = [processor("[0]We just finished fine tuning a text to speech model... and it's pretty good!",
                         add_special_tokens=True, return_tensors="pt"),
               processor.apply_chat_template([{"role": "0", "content": [{"type": "text", "text": SESAME_TEXT}]}],
                                             tokenize=True, return_dict=True)]
    for dtype in (torch.float32, torch.bfloat16):
        for inputs in prompts:
            codes = model.to(dtype).generate(**inputs, max_new_tokens=125)
            assert codes.shape[-1] == 4 and codes.max() < 2048
    audio = model.float().generate(**prompts[1], max_new_tokens=25, output_audio=True)
    assert audio[0].ndim == 1 and audio[0].numel() > 0
