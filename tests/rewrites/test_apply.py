import pytest

from nbddp.export.rewrites import apply
from nbddp.export.rewrites.base import CellLocation, ExportContext

LOCATION = CellLocation("notebooks/01_data_prep.ipynb", 2)


def test_apply_converts_magics_before_anything_else():
    code, changes = apply("%%capture\n!pip install unsloth\nimport os\n", LOCATION, ExportContext())
    assert code == "# nbddp: dropped %%capture\n# nbddp: dropped !pip install unsloth\nimport os\n"
    assert [str(change) for change in changes] == [
        "notebooks/01_data_prep.ipynb, cell 2, line 1: [convert-magics] dropped `%%capture`; its body is kept",
        "notebooks/01_data_prep.ipynb, cell 2, line 2: [convert-magics] dropped `!pip install unsloth`"
        " (install packages before running the script)",
    ]


# The code cells of Unsloth's Alpaca fine-tuning notebook (Llama 3.1 8B), as published.
UNSLOTH_ALPACA_CELLS = [
    '''%%capture
import os
if "COLAB_" not in "".join(os.environ.keys()):
    !pip install unsloth
else:
    # Do this only in Colab notebooks! Otherwise use pip install unsloth
    !pip install --no-deps bitsandbytes accelerate xformers==0.0.29.post3 peft trl triton cut_cross_entropy unsloth_zoo
    !pip install sentencepiece protobuf "datasets>=3.4.1" huggingface_hub hf_transfer
    !pip install --no-deps unsloth''',
    '''from unsloth import FastLanguageModel
import torch
max_seq_length = 2048 # Choose any! We auto support RoPE Scaling internally!
dtype = None # None for auto detection. Float16 for Tesla T4, V100, Bfloat16 for Ampere+
load_in_4bit = True # Use 4bit quantization to reduce memory usage. Can be False.

# 4bit pre quantized models we support for 4x faster downloading + no OOMs.
fourbit_models = [
    "unsloth/Meta-Llama-3.1-8B-bnb-4bit",      # Llama-3.1 2x faster
    "unsloth/Mistral-Small-Instruct-2409",     # Mistral 22b 2x faster!
] # More models at https://huggingface.co/unsloth

model, tokenizer = FastLanguageModel.from_pretrained(
    model_name = "unsloth/Meta-Llama-3.1-8B",
    max_seq_length = max_seq_length,
    dtype = dtype,
    load_in_4bit = load_in_4bit,
    # token = "hf_...", # use one if using gated models like meta-llama/Llama-2-7b-hf
)''',
    '''model = FastLanguageModel.get_peft_model(
    model,
    r = 16, # Choose any number > 0 ! Suggested 8, 16, 32, 64, 128
    target_modules = ["q_proj", "k_proj", "v_proj", "o_proj",
                      "gate_proj", "up_proj", "down_proj",],
    lora_alpha = 16,
    lora_dropout = 0, # Supports any, but = 0 is optimized
    bias = "none",    # Supports any, but = "none" is optimized
    # [NEW] "unsloth" uses 30% less VRAM, fits 2x larger batch sizes!
    use_gradient_checkpointing = "unsloth", # True or "unsloth" for very long context
    random_state = 3407,
    use_rslora = False,  # We support rank stabilized LoRA
    loftq_config = None, # And LoftQ
)''',
    '''alpaca_prompt = """Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.

### Instruction:
{}

### Input:
{}

### Response:
{}"""

EOS_TOKEN = tokenizer.eos_token # Must add EOS_TOKEN
def formatting_prompts_func(examples):
    instructions = examples["instruction"]
    inputs       = examples["input"]
    outputs      = examples["output"]
    texts = []
    for instruction, input, output in zip(instructions, inputs, outputs):
        # Must add EOS_TOKEN, otherwise your generation will go on forever!
        text = alpaca_prompt.format(instruction, input, output) + EOS_TOKEN
        texts.append(text)
    return { "text" : texts, }
pass

from datasets import load_dataset
dataset = load_dataset("yahma/alpaca-cleaned", split = "train")
dataset = dataset.map(formatting_prompts_func, batched = True,)''',
    '''from trl import SFTTrainer
from transformers import TrainingArguments
from unsloth import is_bfloat16_supported

trainer = SFTTrainer(
    model = model,
    tokenizer = tokenizer,
    train_dataset = dataset,
    dataset_text_field = "text",
    max_seq_length = max_seq_length,
    dataset_num_proc = 2,
    packing = False, # Can make training 5x faster for short sequences.
    args = TrainingArguments(
        per_device_train_batch_size = 2,
        gradient_accumulation_steps = 4,
        warmup_steps = 5,
        # num_train_epochs = 1, # Set this for 1 full training run.
        max_steps = 60,
        learning_rate = 2e-4,
        fp16 = not is_bfloat16_supported(),
        bf16 = is_bfloat16_supported(),
        logging_steps = 1,
        optim = "adamw_8bit",
        weight_decay = 0.01,
        lr_scheduler_type = "linear",
        seed = 3407,
        output_dir = "outputs",
        report_to = "none", # Use this for WandB etc
    ),
)''',
    '''#@title Show current memory stats
gpu_stats = torch.cuda.get_device_properties(0)
start_gpu_memory = round(torch.cuda.max_memory_reserved() / 1024 / 1024 / 1024, 3)
max_memory = round(gpu_stats.total_memory / 1024 / 1024 / 1024, 3)
print(f"GPU = {gpu_stats.name}. Max memory = {max_memory} GB.")
print(f"{start_gpu_memory} GB of memory reserved.")''',
    "trainer_stats = trainer.train()",
    '''# alpaca_prompt = Copied from above
FastLanguageModel.for_inference(model) # Enable native 2x faster inference
inputs = tokenizer(
[
    alpaca_prompt.format(
        "Continue the fibonnaci sequence.", # instruction
        "1, 1, 2, 3, 5, 8", # input
        "", # output - leave this blank for generation!
    )
], return_tensors = "pt").to("cuda")

outputs = model.generate(**inputs, max_new_tokens = 64, use_cache = True)
tokenizer.batch_decode(outputs)''',
    '''model.save_pretrained("lora_model")  # Local saving
tokenizer.save_pretrained("lora_model")
# model.push_to_hub("your_name/lora_model", token = "...") # Online saving
# tokenizer.push_to_hub("your_name/lora_model", token = "...") # Online saving''',
    '''if False:
    from unsloth import FastLanguageModel
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name = "lora_model", # YOUR MODEL YOU USED FOR TRAINING
        max_seq_length = max_seq_length,
        dtype = dtype,
        load_in_4bit = load_in_4bit,
    )
    FastLanguageModel.for_inference(model) # Enable native 2x faster inference''',
    '''# Merge to 16bit
if False: model.save_pretrained_merged("model", tokenizer, save_method = "merged_16bit",)
if False: model.push_to_hub_merged("hf/model", tokenizer, save_method = "merged_16bit", token = "")''',
]


def export_alpaca():
    cells = []
    for number, source in enumerate(UNSLOTH_ALPACA_CELLS, start=1):
        code, changes = apply(source, CellLocation("notebooks/alpaca.ipynb", number), ExportContext())
        compile(code, f"cell {number}", "exec")
        cells.append((code, changes))
    return cells


def test_unsloth_alpaca_notebook_becomes_ddp_safe_python():
    cells = export_alpaca()
    codes = [code for code, _ in cells]
    rewrites = [sorted({change.rewrite for change in changes}) for _, changes in cells]
    compile("\n".join(codes), "train.py", "exec")

    assert "!pip" not in "".join(line.partition("#")[0] for line in codes[0].splitlines())  # in comments only
    assert "    pass  # nbddp: dropped !pip install unsloth\n" in codes[0]
    assert "    load_in_4bit = load_in_4bit,\n    # token" in codes[1]
    assert "device_map = ddp.device_map(),\n)" in codes[1]  # spaced as the author spaces the other keywords
    assert codes[2] == UNSLOTH_ALPACA_CELLS[2]  # get_peft_model needs nothing
    assert 'with ddp.main_process_first():\n    dataset = load_dataset("yahma/alpaca-cleaned"' in codes[3]
    assert "\n\n### Instruction:\n{}\n\n" in codes[3]  # the prompt template is untouched
    assert codes[4].startswith("from unsloth import is_bfloat16_supported\nfrom trl import SFTTrainer\n")
    for rewritten in (
        "processing_class = tokenizer,",
        "dataset_num_proc = ddp.cap_num_proc(2),",
        "fp16 = ddp.gpu_only(not is_bfloat16_supported()),",
        "bf16 = ddp.gpu_only(is_bfloat16_supported()),",
        'optim = ddp.optimizer("adamw_8bit"),',
        "ddp_find_unused_parameters = False,\n        average_tokens_across_devices = True,\n    ),",
    ):
        assert rewritten in codes[4]
    assert 'if ddp.is_main_process:\n    print(f"GPU = ' in codes[5]
    # a collective, so not guarded; it resumes from the checkpoint the runtime chooses
    assert codes[6] == "trainer_stats = trainer.train(resume_from_checkpoint=ddp.checkpoint_to_resume(trainer))"
    assert codes[7].startswith("# alpaca_prompt = Copied from above\nif ddp.is_main_process:\n    FastLanguageModel")
    assert '], return_tensors = "pt").to(ddp.device)' in codes[7] and codes[7].endswith("\nddp.barrier()")
    assert "\n    ddp.show(tokenizer.batch_decode(outputs))\n" in codes[7]  # what the notebook showed after generating
    assert codes[8].startswith('if ddp.is_main_process:\n    model.save_pretrained("lora_model")  # Local saving\n')
    assert "\nddp.barrier()\n" in codes[8]
    assert codes[9].startswith("if ddp.is_main_process:\n    if False:\n") and "device_map = ddp.device_map()" in codes[9]
    assert "if False:\n    if ddp.is_main_process:\n        model.save_pretrained_merged(" in codes[10]

    assert rewrites == [
        ["convert-magics"],
        ["inject-device-map"],
        [],
        ["run-datasets-main-process-first"],
        ["hoist-unsloth-import", "plan-training-args", "record-metrics", "rename-trainer-tokenizer",
         "run-overrides", "set-ddp-training-args"],
        ["guard-rank0-side-effects", "replace-cuda-device"],
        ["resume-from-checkpoint"],
        ["guard-inference-cell", "replace-cuda-device", "show-cell-result"],
        ["guard-rank0-side-effects"],
        ["guard-inference-cell", "inject-device-map"],
        ["guard-rank0-side-effects"],
    ]


def test_changes_name_the_lines_the_author_wrote():
    cells = export_alpaca()
    located = {(change.location.cell, change.line, change.rewrite) for _, changes in cells for change in changes}
    assert {
        (1, 4, "convert-magics"),  # !pip install unsloth
        (2, 13, "inject-device-map"),  # FastLanguageModel.from_pretrained(
        (4, 27, "run-datasets-main-process-first"),  # dataset = dataset.map(...)
        (5, 3, "hoist-unsloth-import"),
        (5, 7, "rename-trainer-tokenizer"),
        (5, 23, "set-ddp-training-args"),  # optim = "adamw_8bit"
        (6, 5, "guard-rank0-side-effects"),  # the first print
        (8, 10, "replace-cuda-device"),  # ], return_tensors = "pt").to("cuda")
        (8, 2, "guard-inference-cell"),
        (9, 1, "guard-rank0-side-effects"),
        (11, 2, "guard-rank0-side-effects"),
    } <= located


def test_applying_twice_changes_nothing_more():
    for number, (code, _) in enumerate(export_alpaca(), start=1):
        again, _ = apply(code, CellLocation("notebooks/alpaca.ipynb", number), ExportContext())
        assert again == code


@pytest.mark.parametrize("cell", ["", "\n", "# only a comment"])
def test_cells_without_code_come_back_as_they_are(cell):
    assert apply(cell, LOCATION, ExportContext()) == (cell, [])


def test_changes_after_lines_a_rewrite_added_keep_the_authors_line_numbers():
    source = 'x = 1\nds = load_dataset("x")\nds = ds.map(f)\n\nprint(ds)\nmodel.cuda()\n'
    _, changes = apply(source, LOCATION, ExportContext())
    assert [(change.line, change.rewrite) for change in changes] == [
        (6, "replace-cuda-device"),
        (6, "show-cell-result"),  # Jupyter shows the model that `model.cuda()` returns
        (2, "run-datasets-main-process-first"),
        (3, "run-datasets-main-process-first"),
        (5, "guard-rank0-side-effects"),
    ]
