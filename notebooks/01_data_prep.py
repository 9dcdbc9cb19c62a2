# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Data prep
#
# We fine-tune a tiny Llama on a toy instruction set (`data/tiny_instructions.jsonl`, written by
# `data/make_tiny_instructions.py`): each row asks to reverse, sort or copy a few words, or to give
# the first or last one, in the Alpaca columns `instruction` / `input` / `output`. The answer always
# follows from the input, so the model has something to learn beyond the prompt template.
#
# This notebook formats the rows with the Alpaca prompt Unsloth's notebooks use and holds out a few
# rows to measure the loss on text the model never trains on. `02_lora_setup` loads the model and
# adds LoRA adapters, `03_train` trains. Each notebook runs the ones before it, so any of them runs
# alone in Jupyter; `python pipeline.py export` turns all three into one script for `torchrun`.

# %% tags=["notebook-only"]
# Jupyter only; the exported script does this in its own first cell. Paths below are relative to
# this folder (notebooks/), where Jupyter starts kernels and where the exported script runs its cells.
# nbddp's runtime then provides `unsloth`: the real one on a GPU where it is installed, otherwise
# a Transformers+PEFT stand-in with the same API, so this also runs on a laptop CPU.
from nbddp import runtime

ddp = runtime.setup(backend="auto", script=None)

# %% tags=["parameters"]
data_path = "../data/tiny_instructions.jsonl"  # Alpaca-style rows: instruction, input, output
model_name = "../models/tiny-llama"  # whose tokenizer (and EOS token) the texts are written for
eval_rows = 200  # rows held out for the evaluation loss

# %% [markdown]
# ### Tokenizer
# The formatted texts must end with the model's end-of-sequence token, or the fine-tuned model never
# learns to stop. Only the tokenizer is needed here; `02_lora_setup` loads the model. `require_model`
# first says plainly when `model_name` is neither a local model folder nor a model the Hugging Face
# cache or Hub has (Transformers' own error comes after a minute of retries and names neither).

# %%
from transformers import AutoTokenizer
from nbddp.model_names import require_model

require_model(model_name)
tokenizer = AutoTokenizer.from_pretrained(model_name)
EOS_TOKEN = tokenizer.eos_token  # appended to every training text

# %% [markdown]
# ### Prompt
# Unsloth's Alpaca template, word for word. The tiny model's tokenizer was built from exactly these
# texts (`models/build_tiny_llama.py`), so every word has its own token.

# %%
alpaca_prompt = """Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.

### Instruction:
{}

### Input:
{}

### Response:
{}"""

def formatting_prompts_func(examples):
    """For `dataset.map(batched = True)`: one training text per row, ending with the EOS token."""
    texts = [
        alpaca_prompt.format(instruction, input_text, output) + EOS_TOKEN
        for instruction, input_text, output in zip(examples["instruction"], examples["input"], examples["output"])
    ]
    return {"text": texts}

# %% [markdown]
# ### Load, format, split
# The data is a local JSON-lines file, so no hub is involved. `require_file` says plainly when `data_path`
# is no file (with the nearest file name), and `require_fields` names the first row that lacks a column
# the prompt needs (`data/x.jsonl row 17: missing "output"`), instead of tracebacks from inside
# `load_dataset` or `map`. The split is seeded: every process of a distributed run, and every
# rerun, holds out the same rows. (Tagged `main-process-first`: in the exported script the first
# process fills the datasets cache and the others then read it.)

# %% tags=["main-process-first"]
from datasets import load_dataset
from nbddp.runtime.inputs.data import require_file, require_fields

require_file(data_path)
dataset = load_dataset("json", data_files = data_path, split = "train")
require_fields(dataset, ["instruction", "input", "output"], source = data_path)
dataset = dataset.map(formatting_prompts_func, batched = True,)
split = dataset.train_test_split(test_size = eval_rows, seed = 3407)
train_dataset, eval_dataset = split["train"], split["test"]

# %% tags=["notebook-only"]
print(f"{len(train_dataset)} training rows, {len(eval_dataset)} held out")
print(train_dataset[0]["text"])
train_dataset.to_pandas().head()
