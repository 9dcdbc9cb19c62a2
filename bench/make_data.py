"""Write a bench data file whose every row, formatted as the notebooks format it, is exactly seq_len tokens.

    python -m bench.make_data --seq-len 2048 --rows 1024 --out /tmp/bench-data/fixed_2048.jsonl

Rows have the columns of data/tiny_instructions.jsonl (instruction, input, output). The text the
notebooks train on is the Alpaca template filled with a row, followed by EOS
(`models/build_tiny_llama.py`'s ALPACA_PROMPT, which a test keeps equal to the notebook's); the
tiny tokenizer puts BOS in front. The input is a run of vocabulary words (seeded), lengthened until
that text is exactly seq_len tokens, so every micro batch carries the same number of real tokens
and no padding.
"""
import argparse
import importlib.util
import json
import os
import random
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "models" / "tiny-llama" / "tokenizer.json"
EOS = "</s>"
INSTRUCTION = "Copy the words."


def alpaca_prompt():
    spec = importlib.util.spec_from_file_location("build_tiny_llama", REPO / "models" / "build_tiny_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ALPACA_PROMPT


def training_text(row, prompt):
    return prompt.format(row["instruction"], row["input"], row["output"]) + EOS


def vocabulary_words(tokenizer):
    """Words that are one token both with and without a leading space (a row's first word has none),
    sorted so that the seeded choice is reproducible."""
    vocab = tokenizer.get_vocab()
    return sorted(t for t in vocab if t.isalpha() and " " + t in vocab)


def fixed_length_row(tokenizer, prompt, words, seq_len, rng):
    """A row whose training text tokenizes to exactly seq_len tokens (each added word is one token)."""
    output = " ".join(rng.choice(words) for _ in range(8))
    count = 0
    for _ in range(8):
        row = {"instruction": INSTRUCTION, "input": " ".join(rng.choice(words) for _ in range(count)), "output": output}
        length = len(tokenizer.encode(training_text(row, prompt)).ids)
        if length == seq_len:
            return row
        count += seq_len - length
        if count < 0:
            raise ValueError(f"seq_len {seq_len} is shorter than the template alone ({length} tokens)")
    raise ValueError(f"could not reach exactly {seq_len} tokens (last try {length})")


def write_rows(out, seq_len, rows, seed=0):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    prompt = alpaca_prompt()
    words = vocabulary_words(tokenizer)
    rng = random.Random(seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with open(partial, "w", encoding="utf-8") as lines:
        for _ in range(rows):
            lines.write(json.dumps(fixed_length_row(tokenizer, prompt, words, seq_len, rng)) + "\n")
    os.replace(partial, out)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    print(write_rows(args.out, args.seq_len, args.rows, args.seed))


if __name__ == "__main__":
    main()
