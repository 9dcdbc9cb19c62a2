"""models/tiny-vision (a Llava config, processor and chat template) and models/build_tiny_vision.py, which wrote it."""
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "tiny-vision"


@pytest.fixture(scope="module")
def processor():
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(MODEL), local_files_only=True)


def test_any_text_round_trips(processor):
    text = "Write the LaTeX for this image: \\frac{a}{b} — ünïcode"
    ids = processor.tokenizer(text, add_special_tokens=False).input_ids
    assert processor.tokenizer.decode(ids) == text


def test_a_chat_renders_with_one_image_token_per_patch(processor):
    from PIL import Image

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "red"}]}]
    text = processor.apply_chat_template(messages, tokenize=False)
    assert text == "<|user|>\n<image>Which colour?<|end|>\n<|assistant|>\nred<|end|>\n"
    batch = processor(text=[text], images=[Image.new("RGB", (50, 40))], return_tensors="pt")
    assert (batch["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<image>")).sum() == 16
    assert batch["pixel_values"].shape == (1, 3, 32, 32)
