"""models/tiny-llama (config and tokenizer) and models/build_tiny_llama.py, which wrote it."""
import ast
import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "tiny-llama"
BUILDER = REPO / "models" / "build_tiny_llama.py"
DATA = REPO / "data" / "tiny_instructions.jsonl"


def load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_llama", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def notebook_alpaca_prompt(path):
    """The string literal assigned to `alpaca_prompt` in the notebook's code cells."""
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code" or "alpaca_prompt =" not in cell.source:
            continue
        for statement in ast.parse(cell.source).body:
            if isinstance(statement, ast.Assign) and getattr(statement.targets[0], "id", None) == "alpaca_prompt":
                return ast.literal_eval(statement.value)
    raise AssertionError(f"no alpaca_prompt in {path}")


def rows():
    return [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL), local_files_only=True)


@pytest.mark.parametrize("notebook", ["notebooks/01_data_prep.ipynb", "tests/fixtures/unsloth_style/01_finetune.ipynb"])
def test_notebooks_use_the_template_the_tokenizer_was_built_from(notebook):
    assert notebook_alpaca_prompt(REPO / notebook) == load_builder().ALPACA_PROMPT


def test_special_tokens(tokenizer):
    assert (tokenizer.unk_token, tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == (
        "<unk>", "<pad>", "<s>", "</s>"
    )
    assert [tokenizer.unk_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id] == [0, 1, 2, 3]
    assert tokenizer.padding_side == "right"


def test_the_tokenizer_returns_what_a_llama_takes(tokenizer):
    # transformers 4.x's PreTrainedTokenizerFast adds token_type_ids by default, which generate() refuses.
    assert sorted(tokenizer("the cat", return_tensors="pt")) == ["attention_mask", "input_ids"]


def test_a_formatted_row_round_trips(tokenizer):
    row = rows()[0]
    text = load_builder().ALPACA_PROMPT.format(row["instruction"], row["input"], row["output"]) + tokenizer.eos_token

    ids = tokenizer(text).input_ids

    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == tokenizer.bos_token + text
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.removesuffix(tokenizer.eos_token)
    # one token per word of the answer, whatever its position
    answer = tokenizer(row["output"], add_special_tokens=False).input_ids
    assert len(answer) == len(row["output"].split())


def test_unknown_words_become_unk(tokenizer):
    ids = tokenizer("zebra apple", add_special_tokens=False).input_ids
    assert ids[0] == tokenizer.unk_token_id and ids[1] != tokenizer.unk_token_id


def test_every_row_tokenizes_without_unk_and_fits(tokenizer):
    template = load_builder().ALPACA_PROMPT
    config = json.loads((MODEL / "config.json").read_text())
    texts = [template.format(row["instruction"], row["input"], row["output"]) + tokenizer.eos_token for row in rows()]

    encoded = tokenizer(texts).input_ids

    assert all(tokenizer.unk_token_id not in ids for ids in encoded)
    assert max(map(len, encoded)) < 128 < config["max_position_embeddings"]


def test_config_is_a_small_llama_matching_the_tokenizer(tokenizer):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(MODEL), local_files_only=True)
    assert config.architectures == ["LlamaForCausalLM"] and config.model_type == "llama"
    assert 64 <= config.hidden_size <= 128 and 2 <= config.num_hidden_layers <= 4
    assert config.num_attention_heads == 4 and config.intermediate_size == 4 * config.hidden_size
    assert config.max_position_embeddings == 512 and config.tie_word_embeddings is False
    assert config.vocab_size == len(tokenizer)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
