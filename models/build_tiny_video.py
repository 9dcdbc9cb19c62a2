"""Write models/tiny-video/: a tiny Qwen2-VL config (images and videos), processor, chat template.

The stand-in for image+video models (tools/standins.py, VIDEO_MODELS): its processor has an image token, a video
token and a video processor (`temporal_patch_size`, `fps`, `num_frames`), and its model takes `pixel_values` and
`pixel_values_videos`. No weights are written: `nbddp.examples.tiny_model.ensure_weights` builds them from
config.json (seeded), as for models/tiny-vision. The files are written by hand as Transformers 5.x saves a
Qwen2-VL processor (Qwen2-VL's video processor needs torchvision), so rebuilding gives the same bytes:

    python models/build_tiny_video.py                     # rewrite models/tiny-video/
    python models/build_tiny_video.py --out /tmp/tiny     # e.g. to compare with the committed files

The tokenizer is byte-level with no merges plus the chat markers and Qwen2-VL's vision tokens. An image or a pair
of frames of at most 32x32 pixels is 8x8 patches of 4x4, merged 2x2 into at most 16 `<|image_pad|>` (or
`<|video_pad|>`) tokens. The chat template writes the markers the Muse Glimmer notebooks train on (`<|start|>user
<|message|>`, an answer after `<|start|>assistant to=user<|message|>`); the generation prompt is
`<|start|>assistant`, to which those notebooks add ` to=user<|message|>`. Generation never samples the vision
tokens (`suppress_tokens`), as in models/tiny-vision.
"""
import argparse
from pathlib import Path

from build_tiny_llama import added_tokens_decoder, byte_level_tokenizer, dump_json, write_atomically
from tokenizers import pre_tokenizers

OUT = Path(__file__).resolve().parent / "tiny-video"

PAD, END, START, MESSAGE = "<pad>", "<|eot|>", "<|start|>", "<|message|>"  # ATEM ends a turn with <|eot|>
VISION_START, VISION_END, IMAGE, VIDEO = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
SPECIAL_TOKENS = [PAD, END, START, MESSAGE, VISION_START, VISION_END, IMAGE, VIDEO]  # ids 0..7, then the 256 bytes
MAX_LENGTH = 4096
PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 4, 2, 2
MIN_PIXELS, MAX_PIXELS = 8 * 8, 32 * 32

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|start|>assistant to=user<|message|>"
    "{% else %}<|start|>{{ message['role'] }}<|message|>{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)

VISION_CONFIG = {
    "model_type": "qwen2_vl_vision",
    "depth": 2,
    "embed_dim": 32,
    "hidden_size": 64,  # the merger's output: the text model's hidden size
    "hidden_act": "quick_gelu",
    "mlp_ratio": 2,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": PATCH_SIZE,
    "spatial_merge_size": MERGE_SIZE,
    "temporal_patch_size": TEMPORAL_PATCH_SIZE,
}

TEXT_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}


def build_vocab():
    return {token: i for i, token in enumerate(SPECIAL_TOKENS + sorted(pre_tokenizers.ByteLevel.alphabet()))}


def tokenizer_config(vocab):
    return {
        "added_tokens_decoder": added_tokens_decoder({token: vocab[token] for token in SPECIAL_TOKENS}),
        "clean_up_tokenization_spaces": False,
        "eos_token": END,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": MAX_LENGTH,
        "pad_token": PAD,
        "padding_side": "right",
        "processor_class": "Qwen2VLProcessor",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def _pixels():
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "merge_size": MERGE_SIZE,
        "patch_size": PATCH_SIZE,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": MAX_PIXELS, "shortest_edge": MIN_PIXELS},
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }


def processor_config():
    # every frame of a clip is kept (do_sample_frames False): the notebooks set both fps and num_frames, which
    # Qwen2-VL's frame sampler refuses together
    return {
        "image_processor": {**_pixels(), "image_processor_type": "Qwen2VLImageProcessor"},
        "processor_class": "Qwen2VLProcessor",
        "video_processor": {**_pixels(), "do_sample_frames": False, "max_frames": 768, "min_frames": 4,
                            "return_metadata": False, "video_processor_type": "Qwen2VLVideoProcessor"},
    }


def model_config(vocab):
    head_dim = TEXT_SHAPE["hidden_size"] // TEXT_SHAPE["num_attention_heads"]
    text_config = {
        "model_type": "qwen2_vl_text",
        **TEXT_SHAPE,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_LENGTH,
        "rms_norm_eps": 1e-06,
        # temporal, height and width sections of each head's rotary frequencies (head_dim / 2 of them), in the
        # keys Qwen2-VL's hub configs have: Transformers 4 reads `rope_scaling`, 5 makes `rope_parameters` of it
        "rope_scaling": {"type": "mrope",
                         "mrope_section": [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]},
        "rope_theta": 10000.0,
        "vocab_size": len(vocab),
        "bos_token_id": None,  # Qwen2-VL's default (151643) is past this vocabulary
        "eos_token_id": vocab[END],
        "pad_token_id": vocab[PAD],
        "tie_word_embeddings": False,
    }
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "image_token_id": vocab[IMAGE],
        "video_token_id": vocab[VIDEO],
        "vision_start_token_id": vocab[VISION_START],
        "vision_end_token_id": vocab[VISION_END],
        "text_config": text_config,
        "vision_config": VISION_CONFIG,
        "eos_token_id": vocab[END],
        "pad_token_id": vocab[PAD],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def generation_config(vocab):
    return {"eos_token_id": vocab[END], "pad_token_id": vocab[PAD],
            "suppress_tokens": [vocab[token] for token in (VISION_START, VISION_END, IMAGE, VIDEO)]}


def build(out_dir):
    vocab = build_vocab()
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "chat_template.jinja": CHAT_TEMPLATE,
        "config.json": dump_json(model_config(vocab)),
        "generation_config.json": dump_json(generation_config(vocab)),
        "processor_config.json": dump_json(processor_config()),
        "special_tokens_map.json": dump_json({"eos_token": END, "pad_token": PAD}),
        "tokenizer.json": byte_level_tokenizer(vocab, SPECIAL_TOKENS).to_str(pretty=True) + "\n",
        "tokenizer_config.json": dump_json(tokenizer_config(vocab)),
    }
    for name, text in files.items():
        write_atomically(out_dir / name, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default models/tiny-video)")
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
