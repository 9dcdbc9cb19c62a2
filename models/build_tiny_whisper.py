"""Write models/tiny-whisper/: a tiny Whisper config, its tokenizer and feature extractor (a WhisperProcessor).

No weights are written: `nbddp.examples.tiny_model.ensure_weights("models/tiny-whisper")` builds them from
config.json (seeded), as for models/tiny-llama. The files are written by hand, so Transformers 4.56 and 5.x both load
them (`AutoProcessor`, `WhisperForConditionalGeneration`) and rebuilding gives the same bytes:

    python models/build_tiny_whisper.py                     # rewrite models/tiny-whisper/
    python models/build_tiny_whisper.py --out /tmp/tiny     # e.g. to compare with the committed files

The tokenizer is byte-level with no merges (one token per byte, any text encodes), then Whisper's special tokens in
Whisper's order (`<|startoftranscript|>`, a token per language, the tasks, `<|notimestamps|>`), which its tokenizer
counts on: a language's token is `<|startoftranscript|>`'s id + 1 + the language's index. The feature extractor cuts
audio into 1 s windows (Whisper's are 30 s) of 100 mel frames, which the encoder's `max_source_positions` matches.
"""
import argparse
from pathlib import Path

from build_tiny_llama import added_tokens_decoder, byte_level_tokenizer, dump_json, write_atomically
from tokenizers import pre_tokenizers
from transformers.models.whisper.tokenization_whisper import LANGUAGES

OUT = Path(__file__).resolve().parent / "tiny-whisper"

END, START, NO_TIMESTAMPS = "<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>"
TASKS = ["<|translate|>", "<|transcribe|>"]
SPECIAL_TOKENS = ([END, START] + [f"<|{code}|>" for code in LANGUAGES] + TASKS
                  + ["<|startoflm|>", "<|startofprev|>", "<|nospeech|>", NO_TIMESTAMPS])  # after the 256 bytes
SAMPLING_RATE, HOP_LENGTH, CHUNK_SECONDS, MEL_BINS = 16000, 160, 1, 80
FRAMES = CHUNK_SECONDS * SAMPLING_RATE // HOP_LENGTH  # the encoder's two convolutions halve them
MAX_TARGET = 448

MODEL_SHAPE = {
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
}


def build_vocab():
    return {token: i for i, token in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()) + SPECIAL_TOKENS)}


def tokenizer_config(vocab):
    return {
        "added_tokens_decoder": added_tokens_decoder({token: vocab[token] for token in SPECIAL_TOKENS}),
        "bos_token": END,
        "clean_up_tokenization_spaces": False,
        "eos_token": END,
        "model_max_length": MAX_TARGET,
        "pad_token": END,
        "processor_class": "WhisperProcessor",
        "tokenizer_class": "WhisperTokenizer",
        "unk_token": END,
    }


def feature_extractor_config():
    return {
        "chunk_length": CHUNK_SECONDS,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": MEL_BINS,
        "hop_length": HOP_LENGTH,
        "n_fft": 400,
        "padding_side": "right",
        "padding_value": 0.0,
        "processor_class": "WhisperProcessor",
        "return_attention_mask": False,
        "sampling_rate": SAMPLING_RATE,
    }


def model_config(vocab):
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        **MODEL_SHAPE,
        "activation_function": "gelu",
        "num_mel_bins": MEL_BINS,
        "max_source_positions": FRAMES // 2,
        "max_target_positions": MAX_TARGET,
        "vocab_size": len(vocab),
        "bos_token_id": vocab[END],
        "eos_token_id": vocab[END],
        "pad_token_id": vocab[END],
        "decoder_start_token_id": vocab[START],
        "begin_suppress_tokens": [vocab[END]],
        "suppress_tokens": [],
        "is_encoder_decoder": True,
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
    }


def generation_config(vocab):
    """What WhisperForConditionalGeneration.generate reads: the language, task and timestamp tokens."""
    return {
        "begin_suppress_tokens": [vocab[END]],
        "bos_token_id": vocab[END],
        "decoder_start_token_id": vocab[START],
        "eos_token_id": vocab[END],
        "is_multilingual": True,
        "lang_to_id": {f"<|{code}|>": vocab[f"<|{code}|>"] for code in LANGUAGES},
        "max_length": MAX_TARGET,
        "no_timestamps_token_id": vocab[NO_TIMESTAMPS],
        "pad_token_id": vocab[END],
        "suppress_tokens": [],
        "task_to_id": {task.strip("<|>"): vocab[task] for task in TASKS},
    }


def build(out_dir):
    vocab = build_vocab()
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": dump_json(model_config(vocab)),
        "generation_config.json": dump_json(generation_config(vocab)),
        "preprocessor_config.json": dump_json(feature_extractor_config()),
        "special_tokens_map.json": dump_json({"bos_token": END, "eos_token": END, "pad_token": END, "unk_token": END}),
        "tokenizer.json": byte_level_tokenizer(vocab, SPECIAL_TOKENS).to_str(pretty=True) + "\n",
        "tokenizer_config.json": dump_json(tokenizer_config(vocab)),
    }
    for name, text in files.items():
        write_atomically(out_dir / name, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default models/tiny-whisper)")
    build(parser.parse_args().out)


if __name__ == "__main__":
    main()
