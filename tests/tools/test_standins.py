"""tools/standins.py and tools/standin_datasets.py: folders named like hub ids, which load like the hub's."""
import os

import pytest

from tools import standin_datasets
from tools import standins
from tools.standins import assemble, model_source, model_standin_names


@pytest.mark.parametrize("model_id", ["unsloth/Llama-3.2-3B-Instruct", "unsloth/Llama-3.2-3B-Instruct-bnb-4bit",
                                      "unsloth/Llama-3.2-3B-Instruct-unsloth-bnb-4bit"])
def test_an_unsloth_id_gets_the_names_its_loader_maps_it_to(model_id):
    assert model_standin_names([model_id]) == ["unsloth/Llama-3.2-3B-Instruct",
                                               "unsloth/Llama-3.2-3B-Instruct-bnb-4bit",
                                               "unsloth/Llama-3.2-3B-Instruct-unsloth-bnb-4bit"]


def test_other_ids_stand_for_themselves():
    assert model_standin_names(["openai/whisper-large-v3", "unsloth/csm-1b", "openai/whisper-large-v3"]) == [
        "openai/whisper-large-v3", "unsloth/csm-1b", "unsloth/csm-1b-bnb-4bit", "unsloth/csm-1b-unsloth-bnb-4bit"]


def test_assemble_links_models_and_datasets_of_one_namespace_side_by_side(tmp_path):
    model, dataset = tmp_path / "tiny", tmp_path / "data" / "alpaca"
    model.mkdir()
    dataset.mkdir(parents=True)
    run = tmp_path / "run"
    assemble(run, ["unsloth/Llama-3.2-1B", "meta/x"], model, {"unsloth/alpaca-cleaned": dataset})
    assemble(run, ["unsloth/Llama-3.2-1B"], model, {})  # again: the links are replaced, not an error
    assert os.readlink(run / "unsloth" / "Llama-3.2-1B") == str(model)
    assert os.readlink(run / "meta" / "x") == str(model)
    assert os.readlink(run / "unsloth" / "alpaca-cleaned") == str(dataset)
    assert not (run / "unsloth").is_symlink()


def test_model_source_takes_the_first_model_folder_that_exists(tmp_path):
    assert model_source(tmp_path, vision=False) is None
    for name in ("tiny-llama", "tiny-chat"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    assert model_source(tmp_path, vision=False) == tmp_path / "models" / "tiny-chat"
    assert model_source(tmp_path, vision=True) is None


def test_a_dataset_without_a_layout_gets_no_stand_in(tmp_path):
    assert standin_datasets.build(tmp_path, "someone/unknown") is None
    assert not any(tmp_path.iterdir())


@pytest.fixture
def load_from(monkeypatch, tmp_path):
    """load_dataset as a notebook runs it from the folder that holds the stand-ins, the hub offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)

    def load(dataset_id, *args, **kwargs):
        from datasets import load_dataset

        standin_datasets.build(tmp_path, dataset_id)
        return load_dataset(dataset_id, *args, **kwargs)
    return load


def test_gsm8k_loads_by_its_config_and_split_with_answers_after_hashes(load_from):
    rows = load_from("openai/gsm8k", "main", split="train")
    assert rows.column_names == ["question", "answer"] and len(rows) == standin_datasets.ROWS
    assert all(row["answer"].split("#### ")[1].isdigit() for row in rows)
    assert rows[0] != rows[1]


def test_latex_ocr_holds_images(load_from):
    from PIL import Image

    rows = load_from("unsloth/LaTeX_OCR", split="train")
    assert isinstance(rows[0]["image"], Image.Image) and rows[0]["text"]


def test_audio_is_typed_as_audio(load_from):
    from datasets import Audio

    assert isinstance(load_from("Etherll/kaira", split="train").features["audio"], Audio)


def test_stand_ins_are_the_same_every_time(tmp_path):
    first = standin_datasets.build(tmp_path / "a", "mlabonne/FineTome-100k")
    second = standin_datasets.build(tmp_path / "b", "mlabonne/FineTome-100k")
    files = sorted(p.relative_to(first) for p in first.rglob("*.parquet"))
    assert files and files == sorted(p.relative_to(second) for p in second.rglob("*.parquet"))
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)


def test_a_model_family_gets_its_template_from_the_table_and_functiongemma_keeps_tiny_chats():
    assert standins.family_template(["unsloth/gemma-3-270m-it"]) == "gemma-3"
    assert standins.family_template(["unsloth/Qwen3-4B"]) == "qwen-3"
    # FunctionGemma's own template takes tool calls and roles that Gemma 3's refuses
    assert standins.family_template(["unsloth/functiongemma-270m-it"]) is None
    assert standins.family_template(["some/unknown-model"]) is None
