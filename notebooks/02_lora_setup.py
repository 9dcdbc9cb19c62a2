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
# # 02 · Model and LoRA adapters
#
# Load the tiny Llama the way Unsloth's notebooks load any model, then add LoRA adapters to every
# linear layer of its blocks, so training updates a few percent of the parameters.

# %% tags=["notebook-only"]
# Jupyter only: run the data prep first, so this notebook also runs on its own.
# %run 01_data_prep.ipynb

# %% tags=["parameters"]
max_seq_length = 256  # the longest formatted row is about 70 tokens
per_device_train_batch_size = 4  # rows per process and step (03_train's trainer); here for the memory estimate
dtype = None  # None for auto detection: float32 on CPU, bfloat16 or float16 on a GPU
load_in_4bit = False  # True on a GPU: QLoRA (4-bit base weights through bitsandbytes)
lora_r = 16  # LoRA rank: the adapters' width
lora_alpha = 16  # adapter output scale is lora_alpha / lora_r
use_gradient_checkpointing = "auto"  # auto | unsloth | true | false: auto takes the fastest that fits in memory

# %% [markdown]
# ### Weights
# `models/tiny-llama` ships only its config and tokenizer. `ensure_weights` builds its (random,
# seeded) weights once into a local cache and returns that folder; any other model name, a hub id
# for instance, comes back unchanged. (Tagged `main-process-first`: in a distributed run the first
# process builds the weights and the others load them.)

# %% tags=["main-process-first"]
from nbddp.examples.tiny_model import ensure_weights

model_path = ensure_weights(model_name)

# %%
from unsloth import FastLanguageModel
import torch

model, tokenizer = FastLanguageModel.from_pretrained(
    model_name = model_path,
    max_seq_length = max_seq_length,
    dtype = dtype,
    load_in_4bit = load_in_4bit,
)

# %% [markdown]
# ### Gradient checkpointing
# Recomputing each layer's activations in the backward pass saves memory and costs time (about a
# third more compute); Unsloth's `"unsloth"` mode also moves the layer inputs to host memory, which
# saves a little more and costs a little more. `"auto"` estimates the peak memory of each mode for
# this model, LoRA rank, batch and sequence length, and takes the cheapest that fits the GPU (on a
# CPU: none). The choice is printed with its estimates, and compared with the measured peak after
# the first training step.

# %%
from nbddp.runtime.memory.gradient_checkpointing import choose_gradient_checkpointing

gradient_checkpointing = choose_gradient_checkpointing(
    use_gradient_checkpointing,
    model,
    max_seq_length = max_seq_length,
    per_device_train_batch_size = per_device_train_batch_size,
    lora_r = lora_r,
)

# %% [markdown]
# ### LoRA adapters
# Adapters on the attention and MLP projections. `random_state` seeds their initialisation, so every
# process of a distributed run starts from the same adapters.

# %%
model = FastLanguageModel.get_peft_model(
    model,
    r = lora_r,
    target_modules = ["q_proj", "k_proj", "v_proj", "o_proj",
                      "gate_proj", "up_proj", "down_proj",],
    lora_alpha = lora_alpha,
    lora_dropout = 0,  # 0 takes Unsloth's fast path
    bias = "none",  # likewise
    use_gradient_checkpointing = gradient_checkpointing,  # False, True or "unsloth": chosen above
    random_state = 3407,
    use_rslora = False,
    loftq_config = None,
)

# %% tags=["notebook-only"]
model.print_trainable_parameters()
