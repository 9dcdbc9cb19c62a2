"""A tiny Llama that ships only its config and tokenizer, like the repo's test model."""
import pytest

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]


def write_tiny_llama(directory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{word: index + 3 for index, word in enumerate(WORDS)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                        model_input_names=["input_ids", "attention_mask"])  # as Llama's: no token_type_ids
    tokenizer.save_pretrained(directory)
    LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    ).save_pretrained(directory)
    return directory


@pytest.fixture
def tiny_llama_dir(tmp_path):
    return write_tiny_llama(tmp_path / "tiny-llama")


@pytest.fixture
def model_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("NBDDP_CACHE", str(cache))
    return cache


@pytest.fixture
def tiny_model_path(tiny_llama_dir, model_cache):
    """The tiny Llama with its weights built, as `FastLanguageModel.from_pretrained` takes it."""
    from nbddp.examples.tiny_model import ensure_weights

    return ensure_weights(str(tiny_llama_dir))


@pytest.fixture
def backend_patches_undone_after():
    """Every patch nbddp applied (nbddp/patches.py), during the test or before it, undone after it: a later
    test must meet the libraries' own classes."""
    yield
    from nbddp import patches

    patches.undo()
