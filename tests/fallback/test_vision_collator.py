"""FastVisionModel and `unsloth.trainer.UnslothVisionDataCollator` on the hf backend, with models/tiny-vision."""
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from datasets import Image as ImageFeature
from PIL import Image
from trl import SFTConfig, SFTTrainer

from nbddp.errors import UsageError
from nbddp.runtime import backend as backends
from nbddp.fallback.models import FastVisionModel
from nbddp.fallback.vision_collator import UnslothVisionDataCollator, _masked_token_ids, _messages
from nbddp.examples.tiny_model import ensure_weights

TINY_VISION = Path(__file__).resolve().parents[2] / "models" / "tiny-vision"
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
IMAGE_TOKENS = 16  # a 32x32 image in 8x8 patches
INSTRUCTION = "Which colour is this?"


@pytest.fixture(scope="module")
def tiny_vision_path(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("NBDDP_CACHE", str(tmp_path_factory.mktemp("cache")))
        return ensure_weights(str(TINY_VISION))


def load(path, **options):
    return FastVisionModel.from_pretrained(path, max_seq_length=128, load_in_4bit=False, **options)


def trainable(model):
    names = {name.removeprefix("base_model.model.") for name, p in model.named_parameters() if p.requires_grad}
    return {name.split(".lora_")[0] for name in names}


def image_dataset():
    """A datasets Image column of solid-colour pictures (48x40, larger than the model's 32) and their names."""
    names = list(COLOURS) * 2
    images = [Image.new("RGB", (48, 40), COLOURS[name]) for name in names]
    return Dataset.from_dict({"image": images, "text": names}).cast_column("image", ImageFeature())


def convert_to_conversation(sample):  # as Unsloth's vision notebooks write it
    return {"messages": [
        {"role": "user", "content": [{"type": "text", "text": INSTRUCTION}, {"type": "image", "image": sample["image"]}]},
        {"role": "assistant", "content": [{"type": "text", "text": sample["text"]}]},
    ]}


def test_loads_the_model_with_its_processor(tiny_vision_path):
    model, processor = load(tiny_vision_path)
    assert type(model).__name__ == "LlavaForConditionalGeneration" and model.dtype == torch.float32
    assert type(processor).__name__ == "LlavaProcessor"
    assert processor.tokenizer.padding_side == "right" and processor.tokenizer.model_max_length == 128
    FastVisionModel.for_inference(model)
    assert processor.tokenizer.padding_side == "left" and not model.training
    FastVisionModel.for_training(model)
    assert processor.tokenizer.padding_side == "right" and model.training


def test_the_processor_takes_a_chat_as_text_as_unsloths_does(tiny_vision_path):
    """Unsloth's vision GRPO notebooks call `tokenizer(image, prompt)` with a row's chat prompt."""
    import pickle

    _, processor = load(tiny_vision_path)
    image = Image.new("RGB", (32, 32), COLOURS["red"])
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": INSTRUCTION}]}]
    text = processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    expected = processor(text=text, images=image, return_tensors="pt")["input_ids"]
    assert torch.equal(processor(image, chat, return_tensors="pt")["input_ids"], expected)  # (images, text, ...)
    assert torch.equal(processor(images=image, text=chat, return_tensors="pt")["input_ids"], expected)
    assert type(processor).__name__ == "LlavaProcessor"
    assert type(pickle.loads(pickle.dumps(processor))) is type(processor).__mro__[1]  # the plain class


def layers(tower, components):
    prefix = "model.vision_tower.encoder.layers" if tower == "vision" else "model.language_model.layers"
    return {f"{prefix}.{i}.{name}" for i in range(2) for name in components}


VISION_ATTENTION = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"]
VISION_MLP = ["mlp.fc1", "mlp.fc2"]
LANGUAGE_ATTENTION = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
LANGUAGE_MLP = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


@pytest.mark.parametrize("flags, expected", [
    ({}, layers("vision", VISION_ATTENTION + VISION_MLP) | layers("language", LANGUAGE_ATTENTION + LANGUAGE_MLP)),
    ({"finetune_vision_layers": False}, layers("language", LANGUAGE_ATTENTION + LANGUAGE_MLP)),
    ({"finetune_language_layers": False, "finetune_mlp_modules": False}, layers("vision", VISION_ATTENTION)),
    ({"finetune_attention_modules": False}, layers("vision", VISION_MLP) | layers("language", LANGUAGE_MLP)),
    ({"target_modules": ["q_proj", "fc1"], "finetune_vision_layers": False}, layers("language", ["self_attn.q_proj"])),
    ({"target_modules": "all-linear", "finetune_vision_layers": False},
     layers("vision", VISION_ATTENTION + VISION_MLP) | layers("language", LANGUAGE_ATTENTION + LANGUAGE_MLP)),
])
def test_finetune_flags_pick_the_lora_targets(tiny_vision_path, flags, expected):
    model = FastVisionModel.get_peft_model(load(tiny_vision_path)[0], r=4, lora_alpha=4, random_state=3407, **flags)
    # never lm_head or the projector between the towers; Transformers 4 nests CLIP's encoder one level deeper
    assert {name.replace("vision_tower.vision_model.", "vision_tower.") for name in trainable(model)} == expected


@pytest.fixture(scope="module")
def model_and_processor(tiny_vision_path):
    return load(tiny_vision_path)


def tokens(processor, text):
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_batch_labels_the_text_and_not_the_images_or_padding(model_and_processor):
    model, processor = model_and_processor
    rows = [convert_to_conversation(sample) for sample in image_dataset()][:2]
    rows[1]["messages"][1]["content"][0]["text"] = "a longer answer"
    batch = UnslothVisionDataCollator(model, processor)(rows)
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    pad_id = processor.tokenizer.pad_token_id
    assert batch["pixel_values"].shape == (2, 3, 32, 32)
    assert ((batch["input_ids"] == image_id).sum(dim=1) == IMAGE_TOKENS).all()
    labels, ids = batch["labels"], batch["input_ids"]
    assert (ids[0] == pad_id).any()  # the shorter row is padded
    assert (labels[(ids == image_id) | (ids == pad_id)] == -100).all()
    text = (ids != image_id) & (ids != pad_id)
    assert labels[text].equal(ids[text])


def test_left_padding_masks_the_target_after_the_pads(model_and_processor):
    model, processor = model_and_processor
    rows = [convert_to_conversation(sample) for sample in image_dataset()][:2]
    rows[1]["messages"][1]["content"][0]["text"] = "a longer answer"
    processor.tokenizer.padding_side = "left"
    try:
        batch = UnslothVisionDataCollator(model, processor, pad_to_multiple_of=8)(rows)
    finally:
        processor.tokenizer.padding_side = "right"
    first_token = int(batch["attention_mask"][0].argmax())
    assert first_token > 0 and batch["labels"][0][first_token] == -100  # predicted from a pad
    assert batch["labels"][0][first_token + 1] == batch["input_ids"][0][first_token + 1]
    assert batch["input_ids"].shape[1] % 8 == 0


def test_pixel_values_take_the_models_dtype(tiny_vision_path):
    model, processor = load(tiny_vision_path, dtype=torch.bfloat16)
    batch = UnslothVisionDataCollator(model, processor)([convert_to_conversation(next(iter(image_dataset())))])
    assert batch["pixel_values"].dtype == torch.bfloat16


def test_the_configs_image_token_is_masked_too(model_and_processor):
    processor = model_and_processor[1]
    model = SimpleNamespace(config=SimpleNamespace(image_token_index=250, text_config=None))
    image_id, pad_id = processor.tokenizer.convert_tokens_to_ids("<image>"), processor.tokenizer.pad_token_id
    assert _masked_token_ids(model, processor.tokenizer) == {250, image_id, pad_id}


def test_train_on_responses_only_labels_the_answers(model_and_processor):
    model, processor = model_and_processor
    collator = UnslothVisionDataCollator(model, processor, train_on_responses_only=True,
                                         instruction_part="<|user|>\n", response_part="<|assistant|>\n")
    batch = collator([convert_to_conversation(sample) for sample in image_dataset()][:1])
    answer = tokens(processor, "red<|end|>")  # up to and with the EOS, as Unsloth does
    assert batch["labels"][0][batch["labels"][0] != -100].tolist() == answer


def test_responses_that_are_never_found_say_what_to_check(model_and_processor):
    model, processor = model_and_processor
    collator = UnslothVisionDataCollator(model, processor, train_on_responses_only=True,
                                         instruction_part="<|user|>\n", response_part="### Answer:")
    with pytest.raises(UsageError, match="no row of this batch has an answer to train on; check instruction_part"):
        collator([convert_to_conversation(sample) for sample in image_dataset()][:1])


def test_rows_from_arrow_and_an_images_column(model_and_processor):
    """Arrow stores an image in a chat as {"bytes", "path"} and fills missing keys with None; llava-instruct-mix rows
    keep their images in an `images` column and put bare {"type": "image"} parts in the chat."""
    model, processor = model_and_processor
    collator = UnslothVisionDataCollator(model, processor)
    rows = [convert_to_conversation(sample) for sample in image_dataset()][:2]
    from_list = collator(list(Dataset.from_list(rows)))
    separate = [{"images": [row["messages"][0]["content"][1]["image"]], "messages": [
        {"role": "user", "content": [{"type": "text", "text": INSTRUCTION}, {"type": "image"}]},
        row["messages"][1]]} for row in rows]
    assert from_list["input_ids"].equal(collator(rows)["input_ids"])
    assert from_list["pixel_values"].equal(collator(rows)["pixel_values"])
    assert _messages(Dataset.from_list(rows)[0])[1] == rows[0]["messages"][1]  # no {"image": None} in the text part
    assert collator(separate)["pixel_values"].equal(collator(rows)["pixel_values"])


@pytest.mark.parametrize("resize, size", [("min", (32, 27)), (24, (24, 20)), ((16, 16), (16, 16)), ("max", (48, 40))])
def test_images_are_resized_as_unsloth_does(model_and_processor, resize, size):
    collator = UnslothVisionDataCollator(*model_and_processor, resize=resize)
    assert collator._resized(Image.new("RGB", (48, 40))).size == size


def test_tokenizers_rows_without_a_chat_and_audio_are_refused_with_what_to_do(model_and_processor):
    model, processor = model_and_processor
    with pytest.raises(UsageError, match="needs the processor of a vision-language model, not a"):
        UnslothVisionDataCollator(model, processor.tokenizer)
    with pytest.raises(UsageError, match=r"a row has neither 'messages' nor 'conversations' \(its keys: \['image'"):
        UnslothVisionDataCollator(model, processor)([next(iter(image_dataset()))])
    audio = {"messages": [{"role": "user", "content": [{"type": "audio", "audio": [0.0] * 16}]}]}
    with pytest.raises(UsageError, match="a 'audio' part; .* collates text, images and videos only"):
        UnslothVisionDataCollator(model, processor)([audio])


class RecordingProcessor:
    """The tiny Llava's processor, which takes no videos: records the `videos` and `fps` it is called with and
    answers as for the text and images alone, with a `pixel_values_videos` of ones."""

    def __init__(self, processor):
        self.processor, self.calls = processor, []
        self.image_processor, self.tokenizer = processor.image_processor, processor.tokenizer

    def apply_chat_template(self, *args, **kwargs):
        return self.processor.apply_chat_template(*args, **kwargs)

    def __call__(self, videos=None, fps=None, **kwargs):
        self.calls.append({"videos": videos, "fps": fps})
        batch = self.processor(**kwargs)
        batch["pixel_values_videos"] = torch.ones(2, 4, dtype=torch.float64)
        return batch


def video_row(path, fps=None):
    part = {"type": "video", "video": path} | ({"fps": fps} if fps is not None else {})
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "a ball rolls"}]}]}


def test_video_parts_go_to_the_processor_one_list_per_row_with_their_rate(model_and_processor):
    model, processor = model_and_processor
    recording = RecordingProcessor(processor)
    text_row = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": "Hi"}]}]}
    batch = UnslothVisionDataCollator(model, recording)([video_row("a.mp4", 2), text_row, video_row("b.mp4", 2)])
    assert recording.calls == [{"videos": [["a.mp4"], ["b.mp4"]], "fps": 2.0}]
    assert batch["pixel_values_videos"].dtype == torch.float32  # the model's
    with pytest.raises(UsageError, match=r"the videos of one batch give different fps \(\[1, 2\]\)"):
        UnslothVisionDataCollator(model, recording)([video_row("a.mp4", 1), video_row("b.mp4", 2)])


def test_a_subclass_picks_the_images_and_videos_as_unsloth_zoos_hook_lets_it(model_and_processor):
    """Muse_Glimmer_(30B)-Multimodal's collator: its own `_extract_images_videos_for_example`, which sizes images
    by `patch_size` and gives every video the notebook's frame rate."""
    model, processor = model_and_processor

    class PathsAtOneFrameASecond(UnslothVisionDataCollator):
        def _extract_images_videos_for_example(self, example, messages):
            videos = [part["video"] for message in messages for part in message["content"] if part["type"] == "video"]
            return [], videos, {"fps": [1.0] * len(videos)}

    recording = RecordingProcessor(processor)
    collator = PathsAtOneFrameASecond(model, recording)
    assert collator.patch_size == 8  # the tiny Llava's vision tower's
    collator([video_row("clip.mp4")])
    assert recording.calls == [{"videos": [["clip.mp4"]], "fps": 1.0}]


@pytest.fixture
def hf_backend_active(monkeypatch, backend_patches_undone_after):
    for name in ("unsloth", "unsloth.chat_templates", "unsloth.trainer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    backends.activate("hf")


def test_a_vision_notebook_trains(hf_backend_active, tiny_vision_path, tmp_path):
    """The cells of Unsloth's Qwen2_VL_(7B)-Vision notebook, on the tiny model and a generated image dataset."""
    from unsloth import FastVisionModel
    from unsloth.trainer import UnslothVisionDataCollator

    model, tokenizer = FastVisionModel.from_pretrained(tiny_vision_path, load_in_4bit=True,
                                                       use_gradient_checkpointing="unsloth")
    model = FastVisionModel.get_peft_model(
        model, finetune_vision_layers=True, finetune_language_layers=True, finetune_attention_modules=True,
        finetune_mlp_modules=True, r=4, lora_alpha=4, lora_dropout=0, bias="none", random_state=3407,
        use_rslora=False, loftq_config=None)
    converted_dataset = Dataset.from_list([convert_to_conversation(sample) for sample in image_dataset()])
    FastVisionModel.for_training(model)
    trainer = SFTTrainer(
        model=model,
        tokenizer=tokenizer,
        data_collator=UnslothVisionDataCollator(model, tokenizer),
        train_dataset=converted_dataset,
        args=SFTConfig(
            per_device_train_batch_size=2, gradient_accumulation_steps=1, max_steps=3, learning_rate=1e-2,
            logging_steps=1, seed=3407, output_dir=str(tmp_path / "outputs"), report_to="none",
            remove_unused_columns=False, dataset_text_field="", dataset_kwargs={"skip_prepare_dataset": True},
            max_length=128, bf16=False),
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    changed = {name for name, p in model.named_parameters() if p.requires_grad and not p.equal(before[name])}
    assert any("vision_tower" in name for name in changed) and any("language_model" in name for name in changed)
