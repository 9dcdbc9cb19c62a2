"""tools/notebook_sweep.py: which notebooks it takes, which it runs, and one real sweep of two small notebooks."""
import json
import sys

import pytest

from nbddp.errors import UsageError
from tools import notebook_sweep
from tools.notebook_facts import read_facts
from tools.notebook_sweep import sample, select_notebooks, slug

ALPACA_CELLS = [
    "%%capture\n!pip install unsloth\n",
    'from unsloth import FastLanguageModel\n'
    'model, tokenizer = FastLanguageModel.from_pretrained(model_name = "unsloth/Llama-3.2-1B",\n'
    '    max_seq_length = 256, dtype = None, load_in_4bit = True)\n'
    'model = FastLanguageModel.get_peft_model(model, r = 8, lora_alpha = 16, random_state = 3407)\n',
    'alpaca_prompt = """### Instruction:\n{}\n\n### Input:\n{}\n\n### Response:\n{}"""\n'
    'EOS_TOKEN = tokenizer.eos_token\n'
    'def formatting_prompts_func(examples):\n'
    '    texts = [alpaca_prompt.format(i, x, o) + EOS_TOKEN for i, x, o in\n'
    '             zip(examples["instruction"], examples["input"], examples["output"])]\n'
    '    return {"text": texts}\n'
    'from datasets import load_dataset\n'
    'dataset = load_dataset("unsloth/alpaca-cleaned", split = "train")\n'
    'dataset = dataset.map(formatting_prompts_func, batched = True)\n',
    'from trl import SFTConfig, SFTTrainer\n'
    'trainer = SFTTrainer(model = model, tokenizer = tokenizer, train_dataset = dataset,\n'
    '    args = SFTConfig(dataset_text_field = "text", per_device_train_batch_size = 2,\n'
    '                     gradient_accumulation_steps = 2, max_steps = 60, output_dir = "outputs",\n'
    '                     report_to = "none"))\n',
    "trainer_stats = trainer.train()\n",
]


def write_notebook(path, cells):
    path.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": source, "outputs": [],
                   "execution_count": None} for i, source in enumerate(cells)]}))


@pytest.fixture
def nb_folder(tmp_path):
    folder = tmp_path / "nb"
    folder.mkdir()
    for name in ("Llama3_(8B)-Alpaca", "AMD-Llama3_(8B)-Alpaca", "Kaggle-Qwen3", "Desktop-Gemma", "Qwen3_(4B)-GRPO"):
        write_notebook(folder / f"{name}.ipynb", ALPACA_CELLS)
    return folder


def test_select_leaves_out_the_platform_copies(nb_folder):
    assert [p.stem for p in select_notebooks(nb_folder, None)] == ["Llama3_(8B)-Alpaca", "Qwen3_(4B)-GRPO"]
    assert [p.stem for p in select_notebooks(nb_folder, ["Qwen3_(4B)-GRPO.ipynb"])] == ["Qwen3_(4B)-GRPO"]


def test_an_unknown_name_is_refused_with_the_closest(nb_folder):
    with pytest.raises(UsageError, match=r"'Qwen3-GRPO' \(closest: Qwen3_\(4B\)-GRPO\)"):
        select_notebooks(nb_folder, ["Qwen3-GRPO"])
    with pytest.raises(UsageError, match="no such folder"):
        select_notebooks(nb_folder / "missing", None)


def test_sample_takes_n_of_each_category_the_same_every_time(tmp_path):
    categories = {tmp_path / f"sft-{i}.ipynb": "alpaca-sft" for i in range(6)}
    categories.update({tmp_path / f"rl-{i}.ipynb": "grpo" for i in range(2)})
    chosen = sample(categories, 3)
    assert sum(p.name.startswith("sft") for p in chosen) == 3 and sum(p.name.startswith("rl") for p in chosen) == 2
    assert sample(dict(reversed(categories.items())), 3) == chosen


def test_slug_has_no_spaces():
    assert slug("HuggingFace Course-Qwen3_(4B)-GRPO") == "HuggingFace_Course-Qwen3_(4B)-GRPO"


@pytest.mark.e2e
def test_sweep_runs_a_notebook_on_stand_ins_and_reports_a_failing_one(tmp_path, monkeypatch):
    """Two notebooks as Unsloth writes them, loading hub ids: one trains its (capped) steps on 2 CPU processes;
    the other stops in a cell, and the table gives that exception with its cell. Both run at once (--jobs 2) and
    keep the order they were named in."""
    monkeypatch.setenv("NBDDP_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "nb"
    folder.mkdir()
    write_notebook(folder / "Tiny-Alpaca.ipynb", ALPACA_CELLS)
    write_notebook(folder / "Tiny Broken.ipynb", ALPACA_CELLS[:2] + ['raise ValueError("planted")\n'])
    results = tmp_path / "results"
    status = notebook_sweep.main(["--notebooks", str(folder), "--notebooks-commit", "abc1234", "--only",
                                  "Tiny-Alpaca", "Tiny Broken", "--jobs", "2", "--steps", "2", "--timeout", "300",
                                  "--work", str(tmp_path / "work"), "--results", str(results)])
    assert status == 0
    summary = json.loads((results / "summary.json").read_text())
    assert [row["notebook"] for row in summary["notebooks"]] == ["Tiny-Alpaca", "Tiny Broken"]
    by_name = {row["notebook"]: row for row in summary["notebooks"]}
    assert by_name["Tiny-Alpaca"]["passed"], by_name["Tiny-Alpaca"]["error"]
    assert by_name["Tiny Broken"]["ran"] and not by_name["Tiny Broken"]["passed"]
    assert by_name["Tiny Broken"]["error"] == "ValueError: planted [01_nb.ipynb, cell 3, line 1]"
    assert summary["environment"]["notebooks"].startswith("unslothai/notebooks abc1234")
    run = tmp_path / "work" / "Tiny-Alpaca"  # the stand-ins beside the notebook, where its cells run
    assert (run / "unsloth" / "Llama-3.2-1B-unsloth-bnb-4bit").is_symlink()
    records = [json.loads(line) for line in (run / "outputs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("event") == "end"] == [2]  # NBDDP_MAX_STEPS, not the notebook's 60
    assert (results / "logs" / "Tiny_Broken" / "run.stderr").is_file()
    markdown = (results / "summary.md").read_text()
    assert "| alpaca-sft | 1 | 1 | 1 | 1 | 1 |" in markdown and "| other | 1 | 1 | 1 | 1 | 0 |" in markdown


def test_each_notebook_runs_on_the_stack_its_install_cell_pins(tmp_path):
    """A --stack runs the notebooks whose install cell pins all its versions (the one with the most pins, when
    several fit), before --notebooks-python (Transformers 4.x, TRL 0.x) and --python (the rest)."""
    pythons = {}
    for name in ("main", "nb", "muse-a", "muse-b", "muse"):
        pythons[name] = tmp_path / name / "python"
        pythons[name].parent.mkdir()
        pythons[name].symlink_to(sys.executable)
    args = notebook_sweep.build_parser().parse_args([
        "--python", str(pythons["main"]), "--notebooks-python", str(pythons["nb"]),
        "--stack", f"transformers==5.15.0={pythons['muse']}",
        "--stack", f"transformers==5.15.0 trl==0.22.2={pythons['muse-a']}",
        "--stack", f" transformers==5.15.0  trl==1.9.2 = {pythons['muse-b']}"])
    installs = {"sft": "!pip install transformers==5.15.0\n!pip install --no-deps trl==0.22.2\n",
                "grpo": "!pip install --no-deps trl==1.9.2\n!pip install transformers==5.15.0\n",
                "trl-0.25": "!pip install transformers==5.15.0 trl==0.25.0\n",
                "old": "!pip install transformers==4.56.2 trl==0.22.2\n", "new": "!pip install unsloth\n"}
    chosen = {}
    for name, install in installs.items():
        write_notebook(tmp_path / f"{name}.ipynb", [install] + ALPACA_CELLS[1:])
        chosen[name] = notebook_sweep.stack_for(read_facts(tmp_path / f"{name}.ipynb"), args)
    assert chosen == {"sft": ("transformers==5.15.0 trl==0.22.2", str(pythons["muse-a"])),
                      "grpo": ("transformers==5.15.0 trl==1.9.2", str(pythons["muse-b"])),
                      "trl-0.25": ("transformers==5.15.0", str(pythons["muse"])),
                      "old": ("notebooks", str(pythons["nb"])), "new": ("main", str(pythons["main"]))}


@pytest.mark.parametrize("value, message", [
    ("transformers==5.15.0", "give the pins, then = and"),
    ("peft==0.21.2=python3", "peft: the sweep matches only"),
    ("trl==0.22.2 trl==1.9.2=python3", "trl pinned twice"),
    ("trl==0.22.2=/no/such/python", "no such interpreter")])
def test_a_stack_flag_that_is_not_pins_and_an_interpreter_is_refused(value, message, capsys):
    with pytest.raises(SystemExit) as exited:
        notebook_sweep.build_parser().parse_args(["--stack", value])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_a_stack_whose_interpreter_has_other_versions_is_refused():
    stack = notebook_sweep.parse_stack(f"transformers==5.15.0 trl==0.22.2={sys.executable}")
    with pytest.raises(UsageError, match=r"has transformers 5\.17\.0, not 5\.15\.0"):
        notebook_sweep.check_stack(stack, {"transformers": "5.17.0", "trl": "0.22.2"})
    notebook_sweep.check_stack(stack, {"transformers": "5.15.0", "trl": "0.22.2", "torch": "2.13.0"})
