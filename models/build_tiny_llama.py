"""Write models/tiny-llama/: a small Llama config and a word-level tokenizer for data/tiny_instructions.jsonl.

No weights are written: `nbddp.examples.tiny_model.ensure_weights("models/tiny-llama")` builds them from
config.json (seeded), so the repository stays small. Same data, same bytes:

    python models/build_tiny_llama.py                     # rewrite models/tiny-llama/
    python models/build_tiny_llama.py --out /tmp/tiny     # e.g. to compare with the committed files

The tokenizer is a `tokenizers` WordLevel model saved as standard PreTrainedTokenizerFast files, so
`AutoTokenizer.from_pretrained("models/tiny-llama")` (and Unsloth on a GPU) load it offline. Pieces
are words with their leading space, runs of punctuation, and single whitespace characters, and
decoding concatenates them, so decode(encode(text)) gives the text back exactly (after `<s>`).
"""
import argparse
import json
import os
import tempfile
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "tiny_instructions.jsonl"
OUT = REPO / "models" / "tiny-llama"

# Must match `alpaca_prompt` in notebooks/01_data_prep.ipynb (a test checks): Unsloth's Alpaca template.
ALPACA_PROMPT = """Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.

### Instruction:
{}

### Input:
{}

### Response:
{}"""

UNK, PAD, BOS, EOS = "<unk>", "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = [UNK, PAD, BOS, EOS]  # ids 0..3
PIECE_PATTERN = r" ?\w+| ?[^\w\s]+|\s"  # " word", "word", "###", ":", "\n"
MAX_LENGTH = 512

# Small enough that 300 LoRA steps take about a minute on 2 CPU cores. initializer_range is larger
# than Llama's 0.02 on purpose: the weights stay random (ensure_weights builds them with
# transformers' own init from this config) and LoRA leaves lm_head and the norms frozen, so with
# 0.02 the largest logit the adapters could ever reach is about 0.02 * hidden_size, too small to
# fit anything. 0.15 lets the frozen head express confident predictions.
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "initializer_range": 0.15,
}


def piece_pre_tokenizer():
    return pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")


def corpus_texts(data_path):
    """Every training text as the notebooks format it: the Alpaca template filled with one row."""
    with open(data_path, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            yield ALPACA_PROMPT.format(row["instruction"], row["input"], row["output"])


def build_vocab(texts):
    """Special tokens first, then every piece of the corpus in sorted order, so ids never depend on row order."""
    pre_tokenizer = piece_pre_tokenizer()
    pieces = {piece for text in texts for piece, _ in pre_tokenizer.pre_tokenize_str(text)}
    return {token: i for i, token in enumerate(SPECIAL_TOKENS + sorted(pieces))}


def build_tokenizer(vocab):
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = piece_pre_tokenizer()
    tokenizer.decoder = decoders.Fuse()
    # Like Llama's tokenizer: a BOS in front of every sequence; the notebooks append EOS themselves.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def added_tokens_decoder(ids):
    """tokenizer_config.json's entry for special tokens, `{token: id}`, as Transformers writes it."""
    return {
        str(token_id): {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True,
        }
        for token, token_id in ids.items()
    }


def byte_level_tokenizer(vocab, special_tokens):
    """A tokenizer of single bytes (no merges) plus `special_tokens`: the vision and speech stand-ins'."""
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(special_tokens)
    return tokenizer


def tokenizer_config(vocab):
    """tokenizer_config.json as transformers 4.x and 5.x both read it (written by hand so it does not
    depend on which transformers version ran this script)."""
    return {
        "added_tokens_decoder": added_tokens_decoder({token: vocab[token] for token in SPECIAL_TOKENS}),
        "bos_token": BOS,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "model_input_names": ["input_ids", "attention_mask"],  # as Llama's: no token_type_ids, which
        # transformers 4.x's PreTrainedTokenizerFast returns by default and LlamaForCausalLM.generate refuses
        "model_max_length": MAX_LENGTH,
        "pad_token": PAD,
        "padding_side": "right",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
    }


def model_config(vocab):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **MODEL_SHAPE,
        "head_dim": MODEL_SHAPE["hidden_size"] // MODEL_SHAPE["num_attention_heads"],
        "hidden_act": "silu",
        "max_position_embeddings": MAX_LENGTH,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": len(vocab),
        "bos_token_id": vocab[BOS],
        "eos_token_id": vocab[EOS],
        "pad_token_id": vocab[PAD],
        "torch_dtype": "float32",
        "use_cache": True,
    }


def dump_json(value):
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_atomically(path, text):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="\n", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(text)
    os.chmod(tmp.name, 0o644)  # a temporary file starts private
    os.replace(tmp.name, path)


def build(data_path, out_dir):
    vocab = build_vocab(corpus_texts(data_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": build_tokenizer(vocab).to_str(pretty=True) + "\n",
        "tokenizer_config.json": dump_json(tokenizer_config(vocab)),
        "special_tokens_map.json": dump_json({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}),
        "config.json": dump_json(model_config(vocab)),
    }
    for name, text in files.items():
        write_atomically(out_dir / name, text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help=f"training rows (default {DATA.relative_to(REPO)})")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT.relative_to(REPO)})")
    args = parser.parse_args()
    build(args.data, args.out)


if __name__ == "__main__":
    main()
