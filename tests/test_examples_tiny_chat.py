"""models/tiny-chat (config and tokenizer) and models/build_tiny_chat.py, which wrote it."""
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "tiny-chat"
BUILDER = REPO / "models" / "build_tiny_chat.py"
TABLE = json.loads((REPO / "nbddp" / "fallback"
                    / "unsloth_chat_templates.json").read_text(encoding="utf-8"))


def load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_chat", BUILDER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL), local_files_only=True)


@pytest.mark.parametrize("token", ["<|start_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<start_of_turn>",
                                   "<end_of_turn>", "<|turn>", "<turn|>", "<|user|>", "<|end|>", "<|im_sep|>", "[INST]",
                                   "<|start|>", "<|message|>", "<|return|>"])
def test_the_chat_families_tokens_are_single_tokens(tokenizer, token):
    (token_id,) = tokenizer(token, add_special_tokens=False).input_ids
    assert tokenizer.convert_ids_to_tokens(token_id) == token


def test_every_stop_word_of_unsloths_table_is_a_token(tokenizer):
    stop_words = {entry["stop_word"] for entry in TABLE["chat_templates"].values()} - {"eos_token"}
    assert all(len(tokenizer(word, add_special_tokens=False).input_ids) == 1 for word in stop_words)


def test_any_text_round_trips(tokenizer):
    text = "<|im_start|>user\nCafé, naïve 😁 中文\t{x}<|im_end|>\n"
    ids = tokenizer(text).input_ids
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == tokenizer.bos_token + text


def test_small_vocabulary_and_a_config_that_fits_it(tokenizer):
    config = json.loads((MODEL / "config.json").read_text(encoding="utf-8"))
    assert config["vocab_size"] == len(tokenizer) <= load_builder().VOCAB_SIZE
    special = (tokenizer.unk_token, tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token)
    assert special == ("<unk>", "<pad>", "<s>", "</s>")
    assert [config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]] == [1, 2, 3]


def test_its_own_chat_template_is_unsloths_chatml(tokenizer):
    assert tokenizer.chat_template == TABLE["templates"]["chatml"]
