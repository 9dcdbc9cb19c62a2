"""Write data/tiny_instructions.jsonl: a small Alpaca-style instruction set that a tiny model can learn.

Each row asks for one word-list operation (reverse, sort, copy, first word, last word) on 3-8 words
drawn from a 40-word vocabulary, so the answer follows from the input and the loss can keep falling
well below the template's. Same seed, same bytes:

    python data/make_tiny_instructions.py                      # 3000 rows, seed 3407
    python data/make_tiny_instructions.py --out /tmp/x.jsonl   # e.g. to compare with the committed file
"""
import argparse
import json
import os
import random
import tempfile
from pathlib import Path

WORDS = (
    "apple bird boat bread cat cloud cup dog door fish "
    "flower fox frog hat horse house key lamp leaf lion "
    "moon mouse owl pear pen rain ring river road rock "
    "rose sand ship shoe star stone sun tree wolf wind"
).split()

# instruction -> what the answer is, given the input words
TASKS = {
    "Reverse the words.": lambda words: words[::-1],
    "Sort the words.": sorted,
    "Copy the words.": list,
    "Give the first word.": lambda words: words[:1],
    "Give the last word.": lambda words: words[-1:],
}

MIN_WORDS, MAX_WORDS = 3, 8


def make_rows(count, seed):
    """`count` rows {"instruction", "input", "output"}, drawn with a private generator seeded by `seed`."""
    rng = random.Random(seed)
    instructions = sorted(TASKS)
    rows = []
    for _ in range(count):
        instruction = rng.choice(instructions)
        words = rng.sample(WORDS, rng.randint(MIN_WORDS, MAX_WORDS))
        rows.append({"instruction": instruction, "input": " ".join(words), "output": " ".join(TASKS[instruction](words))})
    return rows


def write_jsonl(rows, path):
    """Write one JSON object a line, through a temporary file so a reader never sees half a file."""
    path = Path(path)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="\n", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        for row in rows:
            tmp.write(json.dumps(row) + "\n")
    os.chmod(tmp.name, 0o644)  # a temporary file starts private
    os.replace(tmp.name, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000, help="how many rows (default 3000)")
    parser.add_argument("--seed", type=int, default=3407, help="random seed (default 3407)")
    parser.add_argument("--out", default=Path(__file__).with_name("tiny_instructions.jsonl"), help="output .jsonl path")
    args = parser.parse_args()
    write_jsonl(make_rows(args.rows, args.seed), args.out)


if __name__ == "__main__":
    main()
