import importlib.util
import json
from pathlib import Path

import pytest

from bench import make_data, reference_ddp

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seq_len", [300, 1024])
def test_every_row_tokenizes_to_exactly_seq_len(tmp_path, seq_len):
    from tokenizers import Tokenizer

    out = make_data.write_rows(tmp_path / "rows.jsonl", seq_len, rows=5, seed=1)
    tokenizer = Tokenizer.from_file(str(make_data.TOKENIZER))
    prompt = make_data.alpaca_prompt()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        encoding = tokenizer.encode(make_data.training_text(row, prompt))
        assert len(encoding.ids) == seq_len
        assert encoding.tokens[0] == "<s>" and encoding.tokens[-1] == "</s>"
        assert "<unk>" not in encoding.tokens


def test_same_seed_same_file(tmp_path):
    a = make_data.write_rows(tmp_path / "a.jsonl", 200, rows=3, seed=7).read_text()
    b = make_data.write_rows(tmp_path / "b.jsonl", 200, rows=3, seed=7).read_text()
    assert a == b


def test_too_short_a_sequence_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="shorter than the template"):
        make_data.write_rows(tmp_path / "rows.jsonl", 10, rows=1)


def test_reference_script_formats_rows_like_the_notebooks():
    assert reference_ddp.ALPACA_PROMPT == make_data.alpaca_prompt()
