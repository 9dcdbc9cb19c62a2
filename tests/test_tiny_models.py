"""The tiny models kept in models/: each builder rewrites its folder's committed files byte for byte, no weights are
committed (nbddp.examples.tiny_model.ensure_weights builds them), and the tiny Whisper trains as Whisper's
notebook loads it."""
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
    ("tiny-video", "build_tiny_video.py", ["chat_template.jinja", "config.json", "generation_config.json",
                                           "processor_config.json", "special_tokens_map.json", "tokenizer.json",
                                           "tokenizer_config.json"]),
    ("tiny-whisper", "build_tiny_whisper.py", ["config.json", "generation_config.json", "preprocessor_config.json",
                                               "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]),
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


def test_the_tiny_whisper_loads_and_trains_as_whisper_s_notebook_has_it(tmp_path, monkeypatch):
    """Whisper.ipynb: FastModel.from_pretrained(auto_model=WhisperForConditionalGeneration, whisper_language=...,
    whisper_task=...) gives the processor, whose feature extractor and tokenizer make a training batch."""
    import numpy as np
    import torch
    from transformers import WhisperForConditionalGeneration

    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path))
    from nbddp.fallback.models import FastModel
    from nbddp.examples.tiny_model import ensure_weights

    path = ensure_weights(str(REPO / "models" / "tiny-whisper"))
    _, loading = WhisperForConditionalGeneration.from_pretrained(path, output_loading_info=True)
    assert not loading["missing_keys"]  # the encoder's weights too: built as a speech-to-text model
    model, processor = FastModel.from_pretrained(
        path, load_in_4bit=False, auto_model=WhisperForConditionalGeneration, whisper_language="English",
        whisper_task="transcribe")
    model = FastModel.get_peft_model(model, r=4, target_modules=["q_proj", "v_proj"], task_type=None)
    audio = np.sin(np.arange(8000, dtype=np.float32) / 10)  # half a second at 16 kHz
    features = processor.feature_extractor(audio, sampling_rate=16000).input_features
    labels = processor.tokenizer("Hello there.").input_ids
    assert processor.tokenizer.convert_ids_to_tokens(labels[:4]) == [
        "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    loss = model(input_features=torch.tensor(np.asarray(features)), labels=torch.tensor([labels])).loss
    loss.backward()
    assert loss.item() > 0


def test_the_tiny_video_takes_videos_and_loads_through_the_fallbacks_loader(tmp_path, monkeypatch):
    """models/tiny-video: a Qwen2-VL whose forward takes a clip's patches (`pixel_values_videos`) in place of its
    `<|video_pad|>` tokens; its config has no `pad_token_id` of its own (Transformers 5), which loading sets."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path))
    from nbddp.fallback.models import _load
    from nbddp.examples.tiny_model import ensure_weights

    path = ensure_weights(str(REPO / "models" / "tiny-video"))
    model, tokenizer = _load(AutoModelForImageTextToText, AutoTokenizer, path, 256, None, False, False, None, False,
                             None, False, {})
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert model.config.pad_token_id == tokenizer.pad_token_id == 0
    ids = tokenizer.convert_tokens_to_ids
    grid = torch.tensor([[2, 8, 8]])  # 4 frames of 32x32: 2 x 8 x 8 patches, merged 2x2 into 32 tokens
    input_ids = torch.tensor([[ids("<|vision_start|>")] + [ids("<|video_pad|>")] * 32 + [ids("<|vision_end|>")]
                              + tokenizer("a clip", add_special_tokens=False)["input_ids"]])
    video_tokens = (input_ids == ids("<|video_pad|>")).long() * 2  # the processor's mm_token_type_ids: 2 for video
    output = model(input_ids=input_ids, mm_token_type_ids=video_tokens, pixel_values_videos=torch.randn(128, 96),
                   video_grid_thw=grid, labels=input_ids)  # 96 = 3 channels x 2 frames x 4 x 4 pixels a patch
    assert torch.isfinite(output.loss)
