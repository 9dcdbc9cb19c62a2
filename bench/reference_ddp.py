"""Hand-written reference for the benchmarks: the example pipeline's training, written directly for torchrun.

    torchrun --standalone --nproc_per_node 2 bench/reference_ddp.py \
        --model_name /tmp/bench/models/llama3-8b --data_path /tmp/bench/data/fixed_2048.jsonl --max_steps 25

What an expert writes by hand with plain Unsloth + TRL: join the process group, import Unsloth before
transformers/trl/peft, load the whole model onto this rank's GPU, LoRA on every linear layer, Alpaca
formatting plus EOS, SFTTrainer with DDP told that every parameter gets a gradient. The flags and
their defaults are the example notebooks' parameters, and the work is theirs (seeded hold-out split,
evaluation before the first step and every eval_steps, TensorBoard logging every step, final
evaluation, adapters saved by rank 0), so both scripts train the same way; the notebooks' three
sample generations at the end are left out (they run after the timed steps). One extra flag,
--use_gradient_checkpointing (unsloth | true | false; default unsloth, as Unsloth's notebooks write it).
"""
import argparse
import contextlib
import os

import torch
import torch.distributed as dist

ALPACA_PROMPT = """Below is an instruction that describes a task, paired with an input that provides further context. Write a response that appropriately completes the request.

### Instruction:
{}

### Input:
{}

### Response:
{}"""


def checkpointing_mode(text):
    """--use_gradient_checkpointing: unsloth (offloaded), true or false."""
    value = text.strip().lower()
    if value == "unsloth":
        return "unsloth"
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected unsloth, true or false, not {text!r}")


def boolean(text):
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--data_path", default="data/tiny_instructions.jsonl")
    parser.add_argument("--model_name", required=True)
    parser.add_argument("--eval_rows", type=int, default=200)
    parser.add_argument("--max_seq_length", type=int, default=256)
    parser.add_argument("--load_in_4bit", type=boolean, default=False)
    parser.add_argument("--lora_r", type=int, default=16)
    parser.add_argument("--lora_alpha", type=int, default=16)
    parser.add_argument("--use_gradient_checkpointing", type=checkpointing_mode, default="unsloth")
    parser.add_argument("--max_steps", type=int, default=300)
    parser.add_argument("--learning_rate", type=float, default=2e-3)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--warmup_steps", type=int, default=10)
    parser.add_argument("--eval_steps", type=int, default=100)
    parser.add_argument("--optim", default="adamw_torch")
    parser.add_argument("--output_dir", default="outputs")
    parser.add_argument("--seed", type=int, default=3407)
    return parser.parse_args()


@contextlib.contextmanager
def rank0_first():
    """Rank 0 fills the datasets cache, then the other ranks read it."""
    distributed = dist.is_initialized()
    if distributed and dist.get_rank() != 0:
        dist.barrier()
    yield
    if distributed and dist.get_rank() == 0:
        dist.barrier()


def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        torch.cuda.set_device(local_rank)  # before NCCL, so no rank opens a context on GPU 0
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))

    from unsloth import FastLanguageModel  # before transformers/trl/peft: Unsloth patches them on import
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=args.model_name,
        max_seq_length=args.max_seq_length,
        dtype=None,  # bf16 where supported
        load_in_4bit=args.load_in_4bit,
        device_map={"": local_rank},
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r=args.lora_r,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        lora_alpha=args.lora_alpha,
        lora_dropout=0,
        bias="none",
        use_gradient_checkpointing=args.use_gradient_checkpointing,
        random_state=3407,
    )

    eos = tokenizer.eos_token
    with rank0_first():
        dataset = load_dataset("json", data_files=args.data_path, split="train")
        dataset = dataset.map(
            lambda rows: {"text": [ALPACA_PROMPT.format(i, x, o) + eos
                                   for i, x, o in zip(rows["instruction"], rows["input"], rows["output"])]},
            batched=True,
        )
        split = dataset.train_test_split(test_size=args.eval_rows, seed=3407)

    trainer = SFTTrainer(
        model=model,
        processing_class=tokenizer,
        train_dataset=split["train"],
        eval_dataset=split["test"],
        args=SFTConfig(
            dataset_text_field="text",
            max_length=args.max_seq_length,
            packing=False,
            per_device_train_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            warmup_steps=args.warmup_steps,
            max_steps=args.max_steps,
            learning_rate=args.learning_rate,
            bf16=True,
            logging_steps=1,
            eval_strategy="steps",
            eval_steps=args.eval_steps,
            eval_on_start=True,
            optim=args.optim,
            weight_decay=0.01,
            lr_scheduler_type="linear",
            seed=args.seed,
            output_dir=args.output_dir,
            save_strategy="no",
            report_to="tensorboard",
            ddp_find_unused_parameters=False,  # LoRA on every linear layer: every adapter gets a gradient
        ),
    )
    trainer.train()
    trainer.evaluate()
    if int(os.environ.get("RANK", 0)) == 0:
        model.save_pretrained(f"{args.output_dir}/lora_adapter")
        tokenizer.save_pretrained(f"{args.output_dir}/lora_adapter")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
