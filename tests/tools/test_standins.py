"""tools/standins.py and tools/standin_datasets.py: folders named like hub ids, which load like the hub's."""
import os
import sys
from pathlib import Path

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


def test_a_video_notebook_gets_the_tiny_video_and_other_vision_notebooks_the_tiny_llava():
    repo = Path(__file__).resolve().parents[2]
    muse = ["unsloth/Muse-Glimmer-30B-unsloth-bnb-4bit"]
    assert model_source(repo, vision=True, model_ids=muse, video=True) == repo / "models" / "tiny-video"
    assert model_source(repo, vision=True, model_ids=["unsloth/Qwen2-VL-7B-Instruct"]) == repo / "models" / "tiny-vision"
    assert model_source(repo, vision=False, model_ids=muse, video=True) == repo / "models" / "tiny-chat"


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


def test_video_clips_are_mp4_files_typed_as_video_by_their_paths(load_from):
    pytest.importorskip("torchcodec.encoders", exc_type=ImportError)
    from datasets import Video
    from torchcodec.decoders import VideoDecoder

    rows = load_from("XinNUS/Temporal_Caption_Bench", split="train[:64]")
    assert isinstance(rows.features["video"], Video) and len(rows) == 64
    path = rows.cast_column("video", Video(decode=False))[0]["video"]["path"]
    assert path.endswith(".mp4") and len(VideoDecoder(path)) == 8  # 4 s at 2 frames per second


def test_video_clips_without_torchcodec_leave_the_id_without_a_stand_in(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchcodec.encoders", None)  # its import raises ImportError
    assert standin_datasets.build(tmp_path, "XinNUS/Temporal_Caption_Bench") is None
    assert not (tmp_path / "XinNUS" / "Temporal_Caption_Bench").exists()


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


TINY_CHAT = Path(__file__).resolve().parents[2] / "models" / "tiny-chat"


def test_ernie_gets_its_own_tokenizers_template_which_the_table_lacks(tmp_path):
    from transformers import AutoTokenizer

    assert standins.family_template(["unsloth/ERNIE-4.5-21B-A3B-PT"]) == "ernie-4.5"
    tokenizer = AutoTokenizer.from_pretrained(standins.text_variant(TINY_CHAT, "ernie-4.5", tmp_path))
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Q"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "<|begin_of_sentence|>User: Hi\nAssistant: Hello<|end_of_sentence|>User: Q\nAssistant: ")


def test_muse_glimmers_stand_in_renders_atem_as_its_notebooks_show_it(tmp_path):
    # Muse_Glimmer_(30B)-GRPO finds its reply channel in the template ("substring not found" with tiny-chat's ChatML)
    # and reads completions decoded without the markers, its special tokens.
    from transformers import AutoConfig, AutoTokenizer

    assert standins.is_muse_glimmer(["unsloth/Muse-Glimmer-30B-unsloth-bnb-4bit"])
    assert not standins.is_muse_glimmer(["unsloth/Llama-3.2-3B-Instruct"])
    folder = standins.muse_glimmer_variant(TINY_CHAT, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "user", "content": "What is 17 times 23?"},
            {"role": "assistant", "content": "391", "reasoning_content": "17*23 = 391."}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == (
        '<|begin_of_text|><|start|>system<|message|>You are a helpful AI assistant.\nKnowledge cutoff: 2026-01-04.\n\n'
        'Reasoning strength: high.\n\n# Valid recipients: "self", "user".<|eot|><|start|>user<|message|>What is 17 times '
        "23?<|eot|><|start|>assistant to=self<|message|>17*23 = 391.<|eom|><|start|>assistant to=user<|message|>391<|eot|>")
    prompt = tokenizer.apply_chat_template([{"role": "system", "content": "Solve."}, {"role": "user", "content": "Q"}],
                                           tokenize=False, add_generation_prompt=True, reasoning_strength="low")
    assert "Solve.\nKnowledge" in prompt and "Reasoning strength: low." in prompt
    assert prompt.endswith("<|eot|><|start|>user<|message|>Q<|eot|><|start|>assistant")
    completion = " to=self<|message|>48 / 2 = 24.<|eom|><|start|>assistant to=user<|message|>72<|eot|>"
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == " to=self48 / 2 = 24.assistant to=user72"
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|begin_of_text|>", "<|end_of_text|>")
    assert tokenizer.convert_tokens_to_ids(["<|eom|>", "<|eot|>"]) == [494, 495]
    assert AutoConfig.from_pretrained(folder).vocab_size == 496 == len(tokenizer)


def test_a_multimodal_models_stand_in_renders_text_parts_as_its_own_template_does(tmp_path):
    from transformers import AutoTokenizer

    assert standins.takes_text_parts(["unsloth/Qwen3.5-27B"])
    assert standins.takes_text_parts(["unsloth/Magistral-Small-2509-unsloth-bnb-4bit"])
    assert not standins.takes_text_parts(["unsloth/Qwen3-4B", "unsloth/Magistral-Small-2506"])
    for family in ("qwen-3", "mistral"):
        tokenizer = AutoTokenizer.from_pretrained(standins.text_variant(TINY_CHAT, family, tmp_path, text_parts=True))
        parts = [{"role": "user", "content": [{"type": "text", "text": "Solve "}, {"type": "text", "text": "x."}]}]
        text = [{"role": "user", "content": "Solve x."}, {"role": "assistant", "content": "1"}]
        assert tokenizer.apply_chat_template(parts, tokenize=False, add_generation_prompt=True) == \
            tokenizer.apply_chat_template(text[:1], tokenize=False, add_generation_prompt=True)
        plain = AutoTokenizer.from_pretrained(standins.text_variant(TINY_CHAT, family, tmp_path))
        assert tokenizer.apply_chat_template(text, tokenize=False) == plain.apply_chat_template(text, tokenize=False)


def test_a_remote_code_vision_models_stand_in_loads_with_auto_model_for_causal_lm(tmp_path, monkeypatch):
    """ERNIE-4.5-VL and PaddleOCR-VL register only AutoModelForCausalLM, which their notebooks pass as auto_model."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path / "cache"))
    from nbddp.examples.tiny_model import ensure_weights

    source = model_source(Path(__file__).resolve().parents[2], vision=True)
    folder = ensure_weights(str(standins.remote_code_variant(source, "AutoModelForCausalLM", tmp_path)))
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    assert type(model).__name__ == standins.REMOTE_CLASS and hasattr(model.config, "vision_config")


def test_paddleocr_vl_gets_its_processors_template_whose_answers_train_on_responses_only_finds(tmp_path, monkeypatch):
    """Its notebook masks all but the answers with instruction_part="User:", response_part="\\nAssistant:"."""
    from PIL import Image
    from transformers import AutoProcessor

    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path / "cache"))
    from nbddp.fallback.models import FastVisionModel
    from nbddp.fallback.vision_collator import UnslothVisionDataCollator
    from nbddp.examples.tiny_model import ensure_weights

    name, template, token = standins.own_vision_template(["unsloth/PaddleOCR-VL"])
    assert standins.own_vision_template(["unsloth/Qwen2.5-VL-7B-Instruct"]) is None
    source = model_source(Path(__file__).resolve().parents[2], vision=True)
    folder = ensure_weights(str(standins.vision_variant(source, token, tmp_path, (name, template))))
    processor = AutoProcessor.from_pretrained(folder)
    chat = [{"role": "user", "content": [{"type": "text", "text": "OCR:"}, {"type": "image"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "x^2"}]}]
    for render in (processor.apply_chat_template, processor.tokenizer.apply_chat_template):
        assert render(chat, tokenize=False) == ("<|begin_of_sentence|>User: <|IMAGE_START|><|IMAGE_PLACEHOLDER|>"
                                                "<|IMAGE_END|>OCR:\nAssistant: x^2<|end|>")
    model, processor = FastVisionModel.from_pretrained(folder, load_in_4bit=False)
    collator = UnslothVisionDataCollator(model, processor, train_on_responses_only=True, instruction_part="User:",
                                         response_part="\nAssistant:")
    chat[0]["content"][1]["image"] = Image.new("RGB", (32, 32))
    labels = collator([{"messages": chat}])["labels"][0]
    assert processor.tokenizer.decode(labels[labels != -100]) == " x^2<|end|>"


def test_whisper_gets_the_tiny_whisper():
    repo = Path(__file__).resolve().parents[2]
    assert model_source(repo, vision=False, model_ids=["unsloth/whisper-large-v3"]) == repo / "models" / "tiny-whisper"
    assert model_source(repo, vision=False, model_ids=["unsloth/Llama-3.2-1B"]) == repo / "models" / "tiny-chat"
