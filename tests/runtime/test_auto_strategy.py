"""--strategy auto (nbddp/runtime/trainer/auto_strategy.py) and the model it reads from the script before any cell
runs (nbddp/runtime/inputs/model_loader.py). FSDP itself runs only on GPUs (bench/fsdp_gpu.sh); here the choice."""
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nbddp.runtime.inputs.model_loader import planned_model
from nbddp.runtime.trainer import auto_strategy

GENERATED = Path(__file__).parents[2] / "generated" / "train.py"
# Llama-3 widths (config.json of meta-llama/Meta-Llama-3-8B and -70B)
LLAMA_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256}
LLAMA_70B = {**LLAMA_8B, "num_hidden_layers": 80, "hidden_size": 8192, "intermediate_size": 28672,
             "num_attention_heads": 64}
H200_GIB = 139.8

UNSLOTH_CELLS = textwrap.dedent('''
    from unsloth import FastLanguageModel
    max_seq_length = 2048
    load_in_4bit = False
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name = "unsloth/Meta-Llama-3.1-70B",
        max_seq_length = max_seq_length,
        dtype = None,
        load_in_4bit = load_in_4bit,
    )
    model = FastLanguageModel.get_peft_model(model, r = 32, lora_alpha = 32)
    from trl import SFTConfig
    args = SFTConfig(per_device_train_batch_size = 2, gradient_accumulation_steps = 4)
''')


def parameters_of(script_text):
    """The script's globals right after its parameters cell, as setup sees them."""
    namespace = {}
    exec(script_text.split("# %% nbddp setup")[0], namespace)
    return namespace


def test_the_example_scripts_model_is_known_before_its_cells_run():
    text = GENERATED.read_text()
    planned = planned_model(text, parameters_of(text))
    # model_name = model_path, bound to ensure_weights(model_name): the parameter's model
    assert planned.loader == "FastLanguageModel.from_pretrained" and not planned.unknown
    assert planned.arguments == {"model_name": "../models/tiny-llama", "max_seq_length": 256, "load_in_4bit": False,
                                 "load_in_8bit": False, "full_finetuning": False}
    assert (planned.lora_r, planned.micro_batch) == (16, 4)
    assert text.splitlines()[planned.line - 1].startswith("model, tokenizer = FastLanguageModel.from_pretrained(")


def test_flags_given_to_the_script_count():
    text = GENERATED.read_text()
    namespace = parameters_of(text) | {"model_name": "/models/big", "load_in_4bit": True, "max_seq_length": 4096}
    planned = planned_model(text, namespace)
    assert planned.arguments["model_name"] == "/models/big" and planned.arguments["load_in_4bit"] is True
    assert planned.arguments["max_seq_length"] == 4096


def test_an_unsloth_notebooks_literals_and_unsloths_defaults():
    planned = planned_model(UNSLOTH_CELLS, {})
    assert planned.arguments == {"model_name": "unsloth/Meta-Llama-3.1-70B", "max_seq_length": 2048,
                                 "load_in_4bit": False, "load_in_8bit": False, "full_finetuning": False}
    assert (planned.lora_r, planned.micro_batch) == (32, 2)
    bare = planned_model('model, tok = FastModel.from_pretrained("unsloth/gemma-3-4b-it")\n', {})
    assert bare.arguments["load_in_4bit"] is True and bare.arguments["max_seq_length"] == 2048  # Unsloth's defaults
    assert (bare.lora_r, bare.micro_batch) == (16, None)


@pytest.mark.parametrize("cells, unknown", [
    ('name = pick()\nFastLanguageModel.from_pretrained(model_name=name)\n', {"model_name": "name"}),
    ('name = "a"\nname = "b"\nFastLanguageModel.from_pretrained(model_name=name)\n', {"model_name": "name"}),
    ('for name in ["a"]:\n    pass\nname = "b"\nFastLanguageModel.from_pretrained(name)\n', {"model_name": "name"}),
    ('FastLanguageModel.from_pretrained("a", **options)\n',
     {"max_seq_length": "**options", "load_in_4bit": "**options", "load_in_8bit": "**options",
      "full_finetuning": "**options"}),
    ('FastLanguageModel.from_pretrained("a", 2048, torch.float16, flag)\n', {"load_in_4bit": "flag"}),  # dtype: no matter
])
def test_what_a_cell_computes_is_unknown(cells, unknown):
    assert planned_model(cells, {}).unknown == unknown


def test_a_script_without_an_unsloth_loader_has_no_planned_model():
    assert planned_model("model = AutoModelForCausalLM.from_pretrained('gpt2')\n", {}) is None


def planned(config_name="unsloth/Meta-Llama-3.1-70B", **arguments):
    plan = planned_model(UNSLOTH_CELLS, {})
    return SimpleNamespace(**{**vars(plan), "arguments": {**plan.arguments, "model_name": config_name, **arguments}})


def test_a_model_that_fits_one_gpu_trains_under_ddp():
    choice = auto_strategy.decide(planned(), LLAMA_8B, H200_GIB, world_size=8, unsloth=True)
    assert choice.strategy == "ddp" and not choice.warning
    assert "fits, so a whole model on every GPU" in choice.reason
    assert "against 118.8 GiB (85% of the 139.8 GiB GPU)" in choice.reason


def test_a_full_finetuning_stays_on_ddp_which_fsdp_refuses():
    choice = auto_strategy.decide(planned(full_finetuning=True), LLAMA_70B, H200_GIB, world_size=2, unsloth=True)
    assert choice.strategy == "ddp" and "sets full_finetuning=True, and under FSDP nbddp trains LoRA" in choice.reason


def test_a_16_bit_70b_does_not_fit_one_h200_so_fsdp_shards_it():
    choice = auto_strategy.decide(planned(), LLAMA_70B, H200_GIB, world_size=2, unsloth=True)
    assert choice.strategy == "fsdp"
    assert choice.reason.startswith("one rank's estimated peak 1") and "sharded across the 2 processes" in choice.reason
    line = auto_strategy.describe(choice)
    assert line.startswith("nbddp: --strategy auto: fsdp: one rank's estimated peak ")
    assert "'unsloth/Meta-Llama-3.1-70B' 16-bit, LoRA r 32, seq 2048, micro batch 2" in line


def test_one_process_has_nothing_to_shard_across():
    choice = auto_strategy.decide(planned(), LLAMA_70B, H200_GIB, world_size=1, unsloth=True)
    assert choice.strategy == "ddp" and choice.warning
    assert "one process has nothing to shard across; run on 2+ GPUs" in choice.reason


def test_a_4bit_model_that_does_not_fit_is_sharded_and_an_8bit_one_stays_on_ddp_saying_what_to_do():
    choice = auto_strategy.decide(planned(load_in_4bit=True), LLAMA_70B, 24.0, world_size=4, unsloth=True)
    assert choice.strategy == "fsdp" and "4-bit" in choice.reason and "sharded across the 4 processes" in choice.reason
    prequantized = auto_strategy.decide(planned("unsloth/llama-3-70b-bnb-4bit"), LLAMA_70B, 24.0, 4, unsloth=True)
    assert prequantized.strategy == "fsdp" and "4-bit" in prequantized.reason
    choice = auto_strategy.decide(planned(load_in_8bit=True), LLAMA_70B, 24.0, world_size=4, unsloth=True)
    assert choice.strategy == "ddp" and choice.warning
    assert "8-bit" in choice.reason and "FSDP does not shard bitsandbytes' 8-bit weights" in choice.reason
    assert auto_strategy.describe(choice).startswith("nbddp: warning: --strategy auto: ddp: ")


def test_an_unknown_micro_batch_is_sized_at_one_row_and_said():
    plan = planned()
    plan.micro_batch = None
    choice = auto_strategy.decide(plan, LLAMA_8B, H200_GIB, 2, unsloth=False)
    assert "micro batch 1 (not known before the cells run: 1 assumed)" in choice.reason


def test_a_mixture_of_experts_is_not_sized():
    choice = auto_strategy.decide(planned(), {**LLAMA_8B, "num_experts": 128}, H200_GIB, 2, unsloth=True)
    assert choice.strategy == "ddp" and "not a dense decoder's" in choice.reason


@pytest.fixture
def one_gpu(monkeypatch):
    """torch sees one CUDA device of an H200's size (nothing else of CUDA is touched by the choice)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(total_memory=int(H200_GIB * 2 ** 30)))
    monkeypatch.setattr(auto_strategy, "_unsloth_backend", lambda backend: True)


def write_script(folder, cells):
    script = folder / "train.py"
    script.write_text(cells)
    return str(script)


def test_the_choice_reads_the_models_config_from_its_folder(one_gpu, tmp_path, monkeypatch):
    model = tmp_path / "big"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_70B))
    monkeypatch.chdir(tmp_path)  # setup has entered the cells' folder
    script = write_script(tmp_path, UNSLOTH_CELLS.replace('"unsloth/Meta-Llama-3.1-70B"', '"big"'))
    assert auto_strategy.choose(script, {}, "auto", world_size=2, local_rank=0).strategy == "fsdp"
    assert auto_strategy.choose(script, {}, "unsloth", world_size=2, local_rank=0).reason.endswith(
        "does not fit, and --backend unsloth does not shard (FSDP takes --backend auto or hf)")


def test_a_model_not_known_before_loading_trains_under_ddp_saying_why(one_gpu, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    computed = write_script(tmp_path, "name = choose()\nFastLanguageModel.from_pretrained(model_name=name)\n")
    choice = auto_strategy.choose(computed, {}, "auto", 2, 0)
    assert choice.strategy == "ddp"
    assert choice.reason.startswith(f"FastLanguageModel.from_pretrained ({computed}, line 2) is given model_name=name, "
                                    "known only when that cell runs")
    absent = write_script(tmp_path, UNSLOTH_CELLS.replace("unsloth/Meta-Llama-3.1-70B", "nobody/not-cached"))
    assert auto_strategy.choose(absent, {}, "auto", 2, 0).reason.startswith(
        "no config.json for 'nobody/not-cached' (")
    assert "in a local folder or the Hugging Face cache (nothing is downloaded" in \
        auto_strategy.choose(absent, {}, "auto", 2, 0).reason
    assert auto_strategy.choose(None, None, "auto", 2, 0).reason.startswith("no script file to read the model from (a notebook kernel")


def test_the_example_on_a_gpu_trains_under_ddp(one_gpu, monkeypatch):
    monkeypatch.chdir(GENERATED.parents[1] / "notebooks")  # the script's workdir
    text = GENERATED.read_text()
    choice = auto_strategy.choose(str(GENERATED), parameters_of(text), "auto", world_size=1, local_rank=0)
    assert choice.strategy == "ddp" and "fits, so a whole model on every GPU" in choice.reason
    assert "'../models/tiny-llama' 16-bit, LoRA r 16, seq 256, micro batch 4" in choice.reason


def test_without_a_gpu_it_is_ddp(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto_strategy.choose(str(GENERATED), {}, "auto", 2, 0).reason == \
        "no CUDA GPU, and accelerate runs FSDP only on GPUs"
