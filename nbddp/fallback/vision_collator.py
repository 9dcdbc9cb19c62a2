"""The hf backend's `UnslothVisionDataCollator` (`unsloth.trainer`), as Unsloth's vision notebooks use it:

    trainer = SFTTrainer(
        model=model, tokenizer=processor, train_dataset=converted_dataset,
        data_collator=UnslothVisionDataCollator(model, processor),
        args=SFTConfig(remove_unused_columns=False, dataset_text_field="",
                       dataset_kwargs={"skip_prepare_dataset": True}, ...),
    )

Each row is a chat (`{"messages": [...]}`, `{"conversations": [...]}` or the list itself) whose parts are
`{"type": "text", "text": ...}`, `{"type": "image", "image": ...}` (a PIL image, a path, or the {"bytes", "path"}
dict Arrow stores it as) and `{"type": "video", "video": ...}` (what the processor's `videos` takes: a path, frames);
the images may instead be the row's `images` column. As unsloth_zoo's collator (vision_utils.py) does, the batch is
the processor's output for the rows' chat-template texts, images and videos (padded, truncated to
`max_seq_length`, images first shrunk to the vision tower's `image_size` by `resize="min"`), with `labels` =
`input_ids` except padding, image and video placeholder tokens and the targets after a pad, which are -100;
`train_on_responses_only=True` also masks everything but the answers (`unsloth.chat_templates.
train_on_responses_only`'s rule, with `instruction_part` and `response_part`). A subclass may override
`_extract_images_videos_for_example(example, messages)` -> (images, videos, {"fps": [one rate per video]}), as
with unsloth_zoo's, and read `patch_size` (the vision tower's).

Not carried over: audio parts (bad input that says so), `formatting_func`, prompt/completion rows, padding-free
packing and the per-model repairs of Unsloth's processors.
"""
import math

import datasets
import torch
from PIL import Image

from nbddp.errors import UsageError
from nbddp.fallback import chat_templates

# unsloth_zoo/vlm_tokens.py's IMAGE_TOKENS: placeholders that stand in for images and are never targets.
IMAGE_TOKENS = (
    "<|image|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<image>",
    "</image>", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "<image_soft_token>", "<start_of_image>", "<end_of_image>",
    "<|image>", "<image|>", "<|video|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_LINE_BREAK|>", "<|IMG_PATCH|>",
    "<img>", "</img>", "<IMG_CONTEXT>", "<video>", "<|IMAGE|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>",
    "<|media_begin|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>",
)
# Config keys of the token ids a model's forward replaces with image or video features.
IMAGE_TOKEN_ID_KEYS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index")
DEFAULT_PATCH_SIZE = 14  # unsloth_zoo's IMAGE_FACTOR // 2, for a model whose vision config has no patch_size
PART_TYPES = ("text", "image", "video")


class UnslothVisionDataCollator:
    """Rows of chats with images -> the processor's batch with `labels` (see the module docstring)."""

    def __init__(
        self,
        model,
        processor,
        max_seq_length=None,
        resize="min",  # the vision tower's image_size; "max": as they are; N or (width, height)
        ignore_index=-100,
        train_on_responses_only=False,
        instruction_part=None,
        response_part=None,
        pad_to_multiple_of=None,
    ):
        if getattr(processor, "image_processor", None) is None:
            raise UsageError(
                f"UnslothVisionDataCollator needs the processor of a vision-language model, not a "
                f"{type(processor).__name__}: pass the second value FastVisionModel.from_pretrained returns (a local "
                "model folder needs its preprocessor_config.json)")
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.ignore_index = ignore_index
        self.pad_to_multiple_of = pad_to_multiple_of
        self.dtype = model.get_input_embeddings().weight.dtype
        self.max_seq_length = max_seq_length if max_seq_length is not None else getattr(model, "max_seq_length", None)
        self.image_size = _image_size(model, resize)
        self.patch_size = _patch_size(model)
        self.masked_ids = torch.tensor(sorted(_masked_token_ids(model, self.tokenizer)))
        self.response_labels = None
        if train_on_responses_only:
            self.response_labels = chat_templates.train_on_responses_only(
                None, instruction_part=instruction_part, response_part=response_part, tokenizer=self.tokenizer,
                return_function=True)

    def __call__(self, examples):
        texts, images, videos, rates = [], [], [], []
        for example in examples:
            messages = _messages(example)
            texts.append(self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=False))
            row_images, row_videos, video_options = self._extract_images_videos_for_example(example, messages)
            images.append([self._resized(_decoded(image)) for image in row_images])
            if len(row_videos) > 0:  # one list per row that has videos, as unsloth_zoo's collator passes them
                videos.append(list(row_videos))
                rates += list((video_options or {}).get("fps") or [])
        options = {"padding": True, "return_tensors": "pt", "add_special_tokens": False}
        if self.max_seq_length is not None:
            options.update(truncation=True, max_length=self.max_seq_length)
        if self.pad_to_multiple_of is not None:
            options["pad_to_multiple_of"] = self.pad_to_multiple_of
        if any(images):  # one list per row, empty for a text-only row
            options["images"] = images
        if videos:
            options["videos"] = videos
            options.update(_video_rate(rates))
        batch = self.processor(text=texts, **options)
        for key in ("pixel_values", "pixel_values_videos"):
            if key in batch:
                batch[key] = batch[key].to(self.dtype)
        batch["labels"] = self._labels(batch["input_ids"], batch.get("attention_mask"))
        return batch

    def _extract_images_videos_for_example(self, example, messages):
        """(images, videos, {"fps": rates}) of one row: its `images` column or its image parts, its video parts
        and the `fps` they give (unsloth_zoo's hook of the same name, which notebooks override)."""
        images = example.get("images") if isinstance(example, dict) else None
        parts = [part for message in messages for part in message["content"]]
        if images is None:
            images = [part["image"] for part in parts if part["type"] == "image" and part.get("image") is not None]
        video_parts = [part for part in parts if part["type"] == "video" and part.get("video") is not None]
        rates = [part["fps"] for part in video_parts if part.get("fps") is not None]
        return images, [part["video"] for part in video_parts], {"fps": rates}

    def _labels(self, input_ids, attention_mask):
        labels = input_ids.clone()
        labels[torch.isin(labels, self.masked_ids) | (labels < 0)] = self.ignore_index
        if attention_mask is not None:  # a target predicted from a pad: only left padding has them
            labels[:, 1:].masked_fill_(attention_mask[:, :-1] == 0, self.ignore_index)
        if self.response_labels is not None:
            answers = torch.tensor(self.response_labels({"input_ids": input_ids.tolist()})["labels"])
            labels[answers == chat_templates.IGNORE_INDEX] = self.ignore_index
            if (labels == self.ignore_index).all():
                raise UsageError(
                    "UnslothVisionDataCollator(train_on_responses_only=True): no row of this batch has an answer to "
                    "train on; check instruction_part and response_part against processor.apply_chat_template(...) "
                    "of a row, or raise max_seq_length if the answers were truncated away")
        return labels

    def _resized(self, image):
        """As Unsloth's resize: to `image_size` when a pair, else scaled down so the width is at most `image_size`."""
        if self.image_size is None:
            return image
        if isinstance(self.image_size, tuple):
            return image.resize(self.image_size, Image.Resampling.LANCZOS)
        width, height = image.size
        if width <= self.image_size:
            return image
        size = (self.image_size, max(1, (height * self.image_size + width // 2) // width))
        return image.resize(size, Image.Resampling.LANCZOS)


def _messages(example) -> list:
    """The row's chat with text-only contents as a text part and the keys Arrow filled with None dropped."""
    messages = example.get("messages", example.get("conversations")) if isinstance(example, dict) else example
    if messages is None:
        raise UsageError(
            f"UnslothVisionDataCollator: a row has neither 'messages' nor 'conversations' (its keys: "
            f"{sorted(example)}); make each row {{'messages': [{{'role': 'user', 'content': [{{'type': 'image', "
            "'image': image}, {'type': 'text', 'text': ...}]}, {'role': 'assistant', 'content': [...]}]}")
    chat = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        parts = [{key: value for key, value in part.items() if value is not None} for part in content]
        for part in parts:
            if part["type"] not in PART_TYPES:
                raise UsageError(
                    f"UnslothVisionDataCollator: a {part['type']!r} part; nbddp's Transformers+PEFT fallback "
                    "(--backend hf) collates text, images and videos only. Run on a GPU with Unsloth installed "
                    "(--backend unsloth), or build the batches with the processor yourself")
        chat.append({**message, "content": parts})
    return chat


def _video_rate(rates) -> dict:
    """The processor's `fps` option for the videos' sampling rates: one number when they agree (a list is refused,
    as unsloth_zoo's collapse_fps gives it), none when no video gave one."""
    if not rates:
        return {}
    if any(not math.isclose(float(rate), float(rates[0]), rel_tol=1e-4, abs_tol=1e-4) for rate in rates):
        raise UsageError(
            f"UnslothVisionDataCollator: the videos of one batch give different fps ({rates}); nbddp's "
            "Transformers+PEFT fallback (--backend hf) passes the processor one rate. Give every video the same fps "
            "or use per_device_train_batch_size=1")
    return {"fps": float(rates[0])}


def _patch_size(model) -> int:
    """The vision tower's patch size, one number (a square patch), as unsloth_zoo's collator keeps it."""
    size = getattr(getattr(model.config, "vision_config", None), "patch_size", None)
    if isinstance(size, (list, tuple)):
        size = math.lcm(*(int(side) for side in size)) if size else None
    return int(size) if size is not None else DEFAULT_PATCH_SIZE


def _decoded(image):
    """A PIL image from a PIL image, a path, or the {"bytes", "path"} dict Arrow stores an image in a chat as."""
    if isinstance(image, str):
        image = {"path": image, "bytes": None}
    return datasets.Image().decode_example(image) if isinstance(image, dict) else image


def _image_size(model, resize):
    if resize == "min":
        size = getattr(getattr(model.config, "vision_config", None), "image_size", None)
        return tuple(size) if isinstance(size, (list, tuple)) else size
    if resize == "max":
        return None
    if isinstance(resize, int) or (isinstance(resize, (list, tuple)) and len(resize) == 2):
        return tuple(resize) if isinstance(resize, (list, tuple)) else resize
    raise UsageError(f"UnslothVisionDataCollator: resize={resize!r}; give \"min\" (the model's image size), "
                     "\"max\" (no resizing), a number of pixels or a (width, height) pair")


def _masked_token_ids(model, tokenizer) -> set[int]:
    """Padding and the image placeholders: the tokenizer's that it has (not as unknown), and the config's."""
    ids = {tokenizer.convert_tokens_to_ids(token) for token in IMAGE_TOKENS}
    ids -= {tokenizer.unk_token_id, None}
    configs = [model.config] + [getattr(model.config, key, None) for key in ("text_config", "vision_config")]
    ids |= {getattr(config, key, None) for config in configs for key in IMAGE_TOKEN_ID_KEYS}
    return {token for token in ids | {tokenizer.pad_token_id} if isinstance(token, int) and token >= 0}
