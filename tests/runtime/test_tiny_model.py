import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from nbddp.examples import tiny_model
from nbddp.examples.tiny_model import ensure_weights


def weights(directory):
    return load_file(Path(directory) / "model.safetensors")


def test_builds_once_into_the_cache(tiny_llama_dir, model_cache):
    first = ensure_weights(str(tiny_llama_dir))
    built_at = os.stat(Path(first) / "model.safetensors").st_mtime_ns
    second = ensure_weights(str(tiny_llama_dir))
    assert first == second
    assert Path(first).parent == model_cache
    assert os.stat(Path(second) / "model.safetensors").st_mtime_ns == built_at  # not rebuilt
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (Path(first) / name).read_bytes() == (tiny_llama_dir / name).read_bytes()
    assert not list(tiny_llama_dir.glob("*.safetensors"))  # the source directory is left alone


def test_weights_are_the_same_every_time(tiny_llama_dir, model_cache, tmp_path, monkeypatch):
    first = weights(ensure_weights(str(tiny_llama_dir)))
    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path / "another-cache"))
    second = weights(ensure_weights(str(tiny_llama_dir)))
    assert first.keys() == second.keys() and len(first) > 0
    for name in first:
        assert first[name].dtype == second[name].dtype
        assert first[name].equal(second[name]), name


def test_a_different_config_is_a_different_model(tiny_llama_dir, model_cache):
    first = ensure_weights(str(tiny_llama_dir))
    config = tiny_llama_dir / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1'))
    assert ensure_weights(str(tiny_llama_dir)) != first


def test_a_rank_that_loses_the_race_keeps_the_winners_model(tiny_llama_dir, model_cache):
    target = Path(ensure_weights(str(tiny_llama_dir)))
    built = weights(target)
    tiny_model._build(tiny_llama_dir, target)  # as if another rank finished first
    assert weights(target).keys() == built.keys()
    assert sorted(path.name for path in model_cache.iterdir()) == [target.name]  # no staging left behind


def test_other_names_come_back_unchanged(tiny_llama_dir, model_cache, tmp_path):
    assert ensure_weights("unsloth/Llama-3.2-1B-Instruct") == "unsloth/Llama-3.2-1B-Instruct"
    with_weights = Path(ensure_weights(str(tiny_llama_dir)))
    assert ensure_weights(str(with_weights)) == str(with_weights)
    assert ensure_weights(str(tmp_path)) == str(tmp_path)  # no config.json


def test_a_vision_language_config_is_built_as_one(model_cache):
    from transformers import AutoModelForImageTextToText

    repository_model = Path(__file__).resolve().parents[2] / "models" / "tiny-vision"
    model = AutoModelForImageTextToText.from_pretrained(ensure_weights(str(repository_model)))
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert any("vision_tower." in name for name in weights(ensure_weights(str(repository_model))))



def test_a_text_to_speech_config_is_built_as_the_class_it_names(model_cache):
    """models/tiny-csm: CsmForConditionalGeneration, which no Auto class of text or images loads."""
    from transformers import CsmForConditionalGeneration

    repository_model = Path(__file__).resolve().parents[2] / "models" / "tiny-csm"
    model = CsmForConditionalGeneration.from_pretrained(ensure_weights(str(repository_model)))
    assert any(name.startswith("codec_model.") for name in weights(ensure_weights(str(repository_model))))
    assert model.config.num_codebooks == 4

def test_a_rank_other_than_0_builds_the_weights_too(tiny_llama_dir, model_cache, monkeypatch):
    """Transformers 5's save_pretrained writes nothing on rank 1 of a process group; the cache must not be left
    with a model without weights (the second machine's first rank builds it on a two-machine job)."""
    mixin = pytest.importorskip("transformers.distributed.mixin", reason="Transformers 4 saves on every rank")
    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)
    assert weights(Path(ensure_weights(str(tiny_llama_dir))))
