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
# # 03 · Train
#
# Supervised fine-tuning of the LoRA adapters with TRL's `SFTTrainer`, as in Unsloth's notebooks. The
# held-out loss is measured before the first step and every `eval_steps` steps, so the curve shows
# what the adapters learned beyond the starting point. The defaults train in about a minute on two
# CPU cores.

# %% tags=["notebook-only"]
# Jupyter only: run the data prep and model setup first, so this notebook also runs on its own.
# %run 02_lora_setup.ipynb

# %% tags=["parameters"]
max_steps = 300  # optimizer steps; set num_train_epochs instead for full passes over the data
learning_rate = 2e-3  # high for LoRA, because the tiny model starts from random weights
gradient_accumulation_steps = 2  # global batch = this * per-device batch * number of processes
warmup_steps = 10
eval_steps = 100  # held-out loss every this many steps (and before the first)
optim = "adamw_torch"  # "adamw_8bit" saves memory on a GPU (bitsandbytes)
output_dir = "../outputs"
seed = 3407
save_steps = 0  # a checkpoint every this many steps in <output_dir>/checkpoint-N/ (0: none), to resume from
save_total_limit = 2  # checkpoints kept: the newest ones

# %% [markdown]
# ### Trainer
# Logs go to the console every step, to TensorBoard (`<output_dir>/runs/`) and, through nbddp's
# `MetricsCallback`, to `<output_dir>/metrics.jsonl`, which the loss plot below and `pipeline.py run`
# read. Mixed precision needs a GPU: bfloat16 where it is supported, else float16; float32 on CPU.
# With `save_steps` > 0 a checkpoint lands in `<output_dir>/checkpoint-N/` every `save_steps` steps
# (the newest `save_total_limit` are kept); the exported script run with `--resume true` continues
# from the last one that every process finished writing.

# %%
from trl import SFTConfig, SFTTrainer
from unsloth import is_bfloat16_supported
from nbddp.runtime.reporting.metrics import MetricsCallback

trainer = SFTTrainer(
    model = model,
    processing_class = tokenizer,
    train_dataset = train_dataset,
    eval_dataset = eval_dataset,
    args = SFTConfig(
        dataset_text_field = "text",
        max_length = max_seq_length,
        packing = False,  # one row per sequence
        per_device_train_batch_size = per_device_train_batch_size,
        gradient_accumulation_steps = gradient_accumulation_steps,
        warmup_steps = warmup_steps,
        max_steps = max_steps,
        learning_rate = learning_rate,
        fp16 = torch.cuda.is_available() and not is_bfloat16_supported(),
        bf16 = is_bfloat16_supported(),
        logging_steps = 1,
        eval_strategy = "steps",
        eval_steps = eval_steps,
        eval_on_start = True,  # the held-out loss before training, to compare against
        optim = optim,
        weight_decay = 0.01,
        lr_scheduler_type = "linear",
        seed = seed,
        output_dir = output_dir,
        save_strategy = "steps" if save_steps else "no",  # checkpoints to resume from; the adapters are saved below
        save_steps = save_steps,
        save_total_limit = save_total_limit,
        report_to = "tensorboard",
    ),
    callbacks = [MetricsCallback(f"{output_dir}/metrics.jsonl")],
)

# %%
trainer_stats = trainer.train()

# %% [markdown]
# ### Held-out loss
# The loss on the rows held out in `01_data_prep`, after the last step.

# %%
eval_metrics = trainer.evaluate()
print(f"held-out loss after {trainer.state.global_step} steps: {eval_metrics['eval_loss']:.4f}")

# %% [markdown]
# ### Save
# Only the LoRA adapters are saved (a few hundred kilobytes), with the tokenizer next to them.

# %%
model.save_pretrained(f"{output_dir}/lora_adapter")
tokenizer.save_pretrained(f"{output_dir}/lora_adapter")
print(f"saved the adapters and tokenizer to {output_dir}/lora_adapter")

# %% [markdown]
# ### Inference
# Ask the fine-tuned model a few held-out questions: the prompt is the instruction and input, with
# the response left blank for the model to write.

# %%
FastLanguageModel.for_inference(model)  # generation mode (and left padding)
for row in eval_dataset.select(range(3)):
    inputs = tokenizer(
    [
        alpaca_prompt.format(
            row["instruction"],
            row["input"],
            "",  # the response: left for the model to write
        )
    ], return_tensors = "pt").to(model.device)
    outputs = model.generate(**inputs, max_new_tokens = 16, use_cache = True)
    answer = tokenizer.batch_decode(outputs[:, inputs["input_ids"].shape[1]:], skip_special_tokens = True)[0]
    print(f"{row['instruction']} {row['input']!r} -> {answer!r} (expected {row['output']!r})")

# %% [markdown]
# ### Loss curve
# Training loss at every step and held-out loss at every evaluation, from `metrics.jsonl`.

# %% tags=["notebook-only"]
import json
import matplotlib.pyplot as plt

with open(f"{output_dir}/metrics.jsonl") as lines:
    records = [json.loads(line) for line in lines]
train_points = [(r["step"], r["loss"]) for r in records if "loss" in r]
eval_points = [(r["step"], r["eval_loss"]) for r in records if r.get("event") == "eval"]
plt.plot(*zip(*train_points), label = "training loss", alpha = 0.6)
plt.plot(*zip(*eval_points), "o-", label = "held-out loss")
plt.xlabel("step")
plt.ylabel("loss")
plt.yscale("log")
plt.legend()
plt.show()
