"""Write models/tiny-vision/: a tiny Llava config (CLIP vision tower, Llama text model), processor, chat template.

No weights are written: `nbddp.examples.tiny_model.ensure_weights("models/tiny-vision")` builds them from
config.json (seeded), as for models/tiny-llama. The files are written by hand, so Transformers 4.56 and 5.x both load
them (`AutoProcessor`, `AutoModelForImageTextToText`) and rebuilding gives the same bytes:

    python models/build_tiny_vision.py                     # rewrite models/tiny-vision/
    python models/build_tiny_vision.py --out /tmp/tiny     # e.g. to compare with the committed files

The tokenizer is byte-level with no merges (one token per byte, any text encodes), plus the chat markers and
`<image>` as special tokens. A 32x32 image is 16 patches of 8x8, so each image is 16 `<image>` tokens: a training
step on two CPU cores takes well under a second. Generation never samples `<image>` (`suppress_tokens`): a random
model otherwise does now and then, and in a GRPO completion that token makes Llava's next forward refuse the batch
("Image features and image tokens do not match"); a trained model never writes it.
"""
import argparse
from pathlib import Path

from build_tiny_llama import added_tokens_decoder, byte_level_tokenizer, dump_json, write_atomically
from tokenizers import pre_tokenizers

OUT = Path(__file__).resolve().parent / "tiny-vision"

PAD, END, IMAGE = "<pad>", "<|end|>", "<image>"
ROLES = ["system", "user", "assistant"]
SPECIAL_TOKENS = [PAD, END, IMAGE] + [f"<|{role}|>" for role in ROLES]  # ids 0..5, then the 256 bytes
MAX_LENGTH = 512
IMAGE_SIZE, PATCH_SIZE = 32, 8

# Each turn is `<|role|>\n` + its text, images as <image>, + `<|end|>\n`; so `train_on_responses_only` takes
# instruction_part="<|user|>\n" and response_part="<|assistant|>\n".
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

VISION_CONFIG = {
    "model_type": "clip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH_SIZE,
    "projection_dim": 32,
    "num_channels": 3,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-05,
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
        "model_input_names": ["input_ids", "attention_mask"],  # as Llama's: no token_type_ids (4.x returns them)
        "model_max_length": MAX_LENGTH,
        "pad_token": PAD,
        "padding_side": "right",
        "processor_class": "LlavaProcessor",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def image_processor_config():
    return {
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "CLIPImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "processor_class": "LlavaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": IMAGE_SIZE},
    }


def processor_config():
    # "default" drops CLIP's class token, so an image is (32 / 8) ** 2 = 16 tokens
    return {
        "image_token": IMAGE,
        "num_additional_image_tokens": 1,
        "patch_size": PATCH_SIZE,
        "processor_class": "LlavaProcessor",
        "vision_feature_select_strategy": "default",
    }


def model_config(vocab):
    text_config = {
        "model_type": "llama",
        **TEXT_SHAPE,
        "head_dim": TEXT_SHAPE["hidden_size"] // TEXT_SHAPE["num_attention_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": MAX_LENGTH,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "vocab_size": len(vocab),
        "eos_token_id": vocab[END],
        "pad_token_id": vocab[PAD],
        "tie_word_embeddings": False,
    }
    return {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "image_seq_length": (IMAGE_SIZE // PATCH_SIZE) ** 2,
        "image_token_index": vocab[IMAGE],
        "multimodal_projector_bias": True,
        "projector_hidden_act": "gelu",
        "text_config": text_config,
        "vision_config": VISION_CONFIG,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "default",
        "eos_token_id": vocab[END],
        "pad_token_id": vocab[PAD],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def generation_config(vocab):
    return {"eos_token_id": vocab[END], "pad_token_id": vocab[PAD], "suppress_tokens": [vocab[IMAGE]]}


def build(out_dir):
    vocab = build_vocab()
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "chat_template.jinja": CHAT_TEMPLATE,
        "config.json": dump_json(model_config(vocab)),
        "generation_config.json": dump_json(generation_config(vocab)),
        "preprocessor_config.json": dump_json(image_processor_config()),
        "processor_config.json": dump_json(processor_config()),
        "special_tokens_map.json": dump_json({"eos_token": END, "pad_token": PAD}),
        "tokenizer.json": byte_level_tokenizer(vocab, SPECIAL_TOKENS).to_str(pretty=True) + "\n",
        "tokenizer_config.json": dump_json(tokenizer_config(vocab)),
    }
    for name, text in files.items():
        write_atomically(out_dir / name, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default models/tiny-vision)")
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
