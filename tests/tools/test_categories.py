"""tools/categories.py and tools/notebook_facts.py: what a notebook does, read from its code cells.

The cells are cut down from unslothai/notebooks (bdda2efc): the lines each rule reads, as those notebooks write them.
"""
import json

import pytest

from tools.categories import classify
from tools.notebook_facts import read_facts

INSTALL = "%%capture\n!pip install unsloth\n"
LOAD = ('from unsloth import FastLanguageModel\n'
        'model, tokenizer = FastLanguageModel.from_pretrained(\n'
        '    model_name = "unsloth/Meta-Llama-3.1-8B", max_seq_length = 2048, load_in_4bit = True)\n')
ALPACA = ('alpaca_prompt = """Below is an instruction.\n\n### Instruction:\n{}\n\n### Input:\n{}\n\n'
          '### Response:\n{}"""\n')
SFT = ("from trl import SFTConfig, SFTTrainer\n"
       "trainer = SFTTrainer(model = model, tokenizer = tokenizer, train_dataset = dataset,\n"
       "    args = SFTConfig(max_steps = 60, output_dir = 'outputs'))\n")
TRAIN = "trainer_stats = trainer.train()\n"
GRPO = ("from trl import GRPOConfig, GRPOTrainer\n"
        "trainer = GRPOTrainer(model = model, processing_class = tokenizer, reward_funcs = [match_format],\n"
        "    args = GRPOConfig(max_steps = 100), train_dataset = dataset)\n")
VISION_LOAD = ('from unsloth import FastVisionModel\n'
               'model, tokenizer = FastVisionModel.from_pretrained("unsloth/gemma-3-4b-pt", load_in_4bit = True)\n')


def write_notebook(path, *cells):
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                "cells": [{"cell_type": "markdown", "metadata": {}, "source": "# A notebook"}]
                + [{"cell_type": "code", "metadata": {}, "source": cell, "outputs": [], "execution_count": None}
                   for cell in cells]}
    path.write_text(json.dumps(notebook))
    return path


@pytest.fixture
def facts_of(tmp_path):
    return lambda *cells: read_facts(write_notebook(tmp_path / "nb.ipynb", *cells))


@pytest.mark.parametrize("cells, category", [
    ((INSTALL, LOAD, ALPACA, SFT, TRAIN), "alpaca-sft"),
    ((LOAD, ALPACA, "from unsloth.chat_templates import get_chat_template\n"
                    "tokenizer = get_chat_template(tokenizer, chat_template = 'llama-3')\n", SFT, TRAIN),
     "conversational-sft"),  # Llama3_(8B)-Ollama: an Alpaca dataset turned into chats
    ((LOAD, "texts = [tokenizer.apply_chat_template(c, tokenize = False) for c in convos]\n", SFT, TRAIN),
     "conversational-sft"),
    ((LOAD.replace("load_in_4bit = True", "load_in_4bit = True, fast_inference = True"), GRPO, TRAIN), "grpo-vllm"),
    ((LOAD, GRPO, TRAIN), "grpo"),
    ((VISION_LOAD, GRPO, TRAIN), "grpo"),  # Gemma3_(4B)-Vision-GRPO: the trainer decides
    ((VISION_LOAD, "from unsloth.trainer import UnslothVisionDataCollator\n", SFT, TRAIN), "vision"),
    (("from unsloth import FastModel\nmodel, tokenizer = FastModel.from_pretrained('unsloth/Muse')\n",
      "collator = UnslothVisionDataCollator(model, tokenizer)\n", SFT, TRAIN), "vision"),
    ((LOAD, "from trl import DPOTrainer\ntrainer = DPOTrainer(model = model, ref_model = None)\n", TRAIN), "dpo-orpo"),
    ((LOAD, "dataset = dataset.cast_column('audio', Audio(sampling_rate = 16000))\n", SFT, TRAIN), "audio"),
    ((LOAD, "from snac import SNAC\nsnac_model = SNAC.from_pretrained('hubertsiuzdak/snac_24khz')\n",
      "trainer = Trainer(model = model, train_dataset = dataset)\n", TRAIN), "audio"),  # Orpheus_(3B)-TTS
    ((LOAD, "from unsloth import UnslothTrainer\ntrainer = UnslothTrainer(model = model, args = args)\n", TRAIN),
     "continued-pretraining"),
    ((LOAD, "model = FastLanguageModel.get_peft_model(model, target_modules = ['q_proj', 'embed_tokens'])\n",
      SFT, TRAIN), "continued-pretraining"),
    ((LOAD, "outputs = model.generate(**inputs, max_new_tokens = 64)\n"), "other"),  # inference only
    ((LOAD, "model.train()\nloss.backward()\nopt.step()\n"), "other"),  # DiffusionGemma: a loop of its own
    (("from unsloth import FastModel\nfrom transformers import AutoModelForSequenceClassification\n"
      "model, tokenizer = FastModel.from_pretrained('unsloth/ModernBERT-large',\n"
      "    auto_model = AutoModelForSequenceClassification)\n",
      "trainer = Trainer(model = model, args = args)\n", TRAIN), "other"),  # bert_classification
])
def test_classify(facts_of, cells, category):
    assert classify(facts_of(*cells)) == category


def test_an_alpaca_prompt_in_a_comment_is_not_read(facts_of):
    assert classify(facts_of(LOAD, "# ### Instruction: see the Alpaca notebook\n", SFT, TRAIN)) == "conversational-sft"


def test_model_ids_from_loader_calls_and_model_name_variables(facts_of):
    facts = facts_of(
        INSTALL,
        LOAD,
        'fourbit_models = ["unsloth/Llama-3.3-70B-Instruct-bnb-4bit"]  # listed, not loaded\n',
        'XCODEC2_MODEL_NAME = "HKUST-Audio/xcodec2"\n',
        'MODEL_ID = "unsloth/Qwen3-0.6B"\nOTHER = "unsloth/not-loaded"\n'
        'model, tokenizer = FastLanguageModel.from_pretrained(model_name = MODEL_ID)\n',
        'processor = AutoProcessor.from_pretrained("unsloth/csm-1b")\n'
        'model.save_pretrained("lora_model")\nmodel = AutoModel.from_pretrained("lora_model")\n',
    )
    assert facts.model_ids == ["unsloth/Meta-Llama-3.1-8B", "HKUST-Audio/xcodec2", "unsloth/csm-1b",
                               "unsloth/Qwen3-0.6B"]


def test_dataset_ids_leave_out_builders(facts_of):
    facts = facts_of('from datasets import load_dataset\n'
                     'dataset = load_dataset("openai/gsm8k", "main", split = "train")\n'
                     'sheet = load_dataset("csv", data_files = {"train": url})\n'
                     'other = load_dataset(path = "unsloth/LaTeX_OCR", split = "train")\n')
    assert facts.dataset_ids == ["openai/gsm8k", "unsloth/LaTeX_OCR"]


def test_a_cell_that_does_not_parse_leaves_the_others_read(facts_of):
    facts = facts_of(LOAD, "def broken(:\n    pass\n", SFT, TRAIN)
    assert "SFTTrainer" in facts.calls and facts.trains_with_a_trainer()


def test_the_auto_model_classes_a_loader_is_given(facts_of):
    facts = facts_of('model, tokenizer = FastVisionModel.from_pretrained("unsloth/PaddleOCR-VL", '
                     'auto_model = AutoModelForCausalLM, trust_remote_code = True)\n'
                     'other = FastModel.from_pretrained("x/y", auto_model = transformers.AutoModelForCausalLM)\n')
    assert facts.auto_models == ["AutoModelForCausalLM", "transformers.AutoModelForCausalLM"]


@pytest.mark.parametrize("cells, video", [
    # Muse_Glimmer_(30B)-Vision: reads the processor's video token
    (('print("video token:", processor.video_token, processor.video_token_id)\n',), True),
    # Muse_Glimmer_(30B)-Multimodal: its video processor, and video parts
    (("video_processor = processor.video_processor\n",), True),
    (('part = {"type": "video", "video": row["video"]["path"]}\n',), True),
    # ERNIE_4_5_VL_28B_A3B_PT_Vision: an empty videos list and a "video_url" type it looks for
    (('inputs = processor(text = [text_prompt], images = [image], videos = [], return_tensors = "pt")\n'
      'needs = part.get("type") in ["image_url", "video_url"]\n'), False),
    ((VISION_LOAD, "from unsloth.trainer import UnslothVisionDataCollator\n", SFT, TRAIN), False),
])
def test_a_notebook_uses_video_when_it_reads_the_processors_video_parts_or_writes_a_video_part(facts_of, cells, video):
    assert facts_of(*cells).uses_video() is video
