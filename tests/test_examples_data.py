"""data/make_tiny_instructions.py and the file it wrote, data/tiny_instructions.jsonl."""
import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GENERATOR = REPO / "data" / "make_tiny_instructions.py"
DATA = REPO / "data" / "tiny_instructions.jsonl"


def load_generator():
    spec = importlib.util.spec_from_file_location("make_tiny_instructions", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed_rows():
    return [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]


def test_regenerating_gives_the_committed_bytes(tmp_path):
    out = tmp_path / "rows.jsonl"
    subprocess.run([sys.executable, str(GENERATOR), "--out", str(out)], check=True)
    assert out.read_bytes() == DATA.read_bytes()


def test_other_seed_other_rows():
    generator = load_generator()
    assert generator.make_rows(50, seed=1) == generator.make_rows(50, seed=1)
    assert generator.make_rows(50, seed=1) != generator.make_rows(50, seed=2)


def test_file_is_small_alpaca_jsonl():
    rows = committed_rows()
    assert DATA.stat().st_size < 1_000_000
    assert len(rows) == 3000
    assert all(list(row) == ["instruction", "input", "output"] for row in rows)


def test_every_answer_follows_from_its_input():
    generator = load_generator()
    for row in committed_rows():
        words = row["input"].split()
        assert generator.MIN_WORDS <= len(words) <= generator.MAX_WORDS
        assert len(set(words)) == len(words) and set(words) <= set(generator.WORDS)
        assert row["output"] == " ".join(generator.TASKS[row["instruction"]](words))


def test_tasks_are_balanced():
    counts = Counter(row["instruction"] for row in committed_rows())
    assert set(counts) == set(load_generator().TASKS)
    assert min(counts.values()) > 0.8 * max(counts.values())
