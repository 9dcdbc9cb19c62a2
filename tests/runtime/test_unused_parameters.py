"""unused_parameters: which parameters lie outside the language model (unit), and the tiny vision model with LoRA on
its vision tower, trained on text by 2 gloo processes, without gradient accumulation and with it: DDP stops without
the patch, and with it the losses are those of 1 process at the same global batch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbddp.examples.tiny_model import ensure_weights
from nbddp.runtime.trainer.unused_parameters import trainable_outside_language_model

REPO = Path(__file__).resolve().parents[2]
ALL_Q_PROJ = ["q_proj", "v_proj"]  # in the CLIP tower and the Llama text model alike

# The model and a text-only Trainer as a GRPO notebook of a vision model has them; prints each step's loss as JSON.
SCRIPT = r'''
import json, sys
from nbddp import runtime
ddp = runtime.setup(backend="hf", script=None)
from unsloth import FastVisionModel
import torch
from datasets import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments
if sys.argv[2] == "unpatched":
    from nbddp import patches
    assert patches.is_patched(Trainer.__init__, "unused-tower-adapters")
    Trainer.__init__ = Trainer.__init__.__wrapped__
model, processor = FastVisionModel.from_pretrained(sys.argv[1], load_in_4bit=False)
model = FastVisionModel.get_peft_model(model, r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                       use_gradient_checkpointing=False, random_state=0)
tokenizer = processor.tokenizer
rows = [tokenizer(f"row {i}: " + "abc " * (i % 5 + 1)) for i in range(16)]
dataset = Dataset.from_list([{"input_ids": r["input_ids"], "labels": r["input_ids"]} for r in rows])
per_device, accumulation = int(sys.argv[3]), int(sys.argv[5])
args = TrainingArguments(output_dir=sys.argv[4], per_device_train_batch_size=per_device, max_steps=3,
                         gradient_accumulation_steps=accumulation,
                         learning_rate=1e-2, logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                         ddp_find_unused_parameters=False, seed=0, data_seed=0)

class Losses(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and "loss" in logs:
            print("LOSS", json.dumps(logs["loss"]), flush=True)

def collate(batch):
    longest = max(len(row["input_ids"]) for row in batch)
    ids = torch.tensor([row["input_ids"] + [tokenizer.pad_token_id] * (longest - len(row["input_ids"])) for row in batch])
    labels = torch.tensor([row["labels"] + [-100] * (longest - len(row["labels"])) for row in batch])
    return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}
Trainer(model=model, args=args, train_dataset=dataset, data_collator=collate, callbacks=[Losses()]).train()
ddp.shutdown()
'''


@pytest.fixture(scope="module")
def tiny_vision():
    return ensure_weights(str(REPO / "models" / "tiny-vision"))


def lora_model(path, **flags):
    from nbddp.fallback.models import FastVisionModel

    model, _ = FastVisionModel.from_pretrained(path, load_in_4bit=False)
    return FastVisionModel.get_peft_model(model, r=4, lora_alpha=4, use_gradient_checkpointing=False, **flags)


def test_tower_adapters_lie_outside_the_language_model(tiny_vision):
    outside = trainable_outside_language_model(lora_model(tiny_vision, target_modules=ALL_Q_PROJ))
    assert outside and all("vision_tower" in name and "lora_" in name for name in outside)


def test_language_only_adapters_and_text_models_have_none(tiny_vision):
    from nbddp.fallback.models import FastLanguageModel

    assert trainable_outside_language_model(lora_model(tiny_vision, finetune_vision_layers=False)) == []
    model, _ = FastLanguageModel.from_pretrained(ensure_weights(str(REPO / "models" / "tiny-llama")),
                                                 load_in_4bit=False)
    assert trainable_outside_language_model(FastLanguageModel.get_peft_model(model, r=4)) == []


def train(tmp_path, tiny_vision, nproc, variant, accumulation):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    per_device = str(2 // nproc)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
               str(script), tiny_vision, variant, per_device, str(tmp_path / f"out-{nproc}-{variant}"),
               str(accumulation)]
    result = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    losses = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("LOSS ")]
    return result, losses


@pytest.mark.e2e
@pytest.mark.parametrize("accumulation, chosen", [(1, "static_graph=True"), (2, "find_unused_parameters=True")])
def test_two_processes_train_a_vision_model_on_text_as_one_does(tmp_path, tiny_vision, accumulation, chosen):
    unpatched, _ = train(tmp_path, tiny_vision, 2, "unpatched", accumulation)
    assert unpatched.returncode != 0
    assert "Expected to have finished reduction in the prior iteration" in unpatched.stderr

    one, one_losses = train(tmp_path, tiny_vision, 1, "patched", accumulation)
    two, two_losses = train(tmp_path, tiny_vision, 2, "patched", accumulation)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-3000:] + two.stderr[-3000:]
    assert two.stdout.count(f"DDP runs with {chosen}") == 1
    assert len(one_losses) == len(two_losses) == 3
    assert two_losses == pytest.approx(one_losses, abs=1e-5)


@pytest.mark.parametrize("accumulation, static, search", [(1, True, False), (2, False, True)])
def test_static_graph_without_gradient_accumulation_else_the_search(accumulation, static, search):
    """torch fails a static graph under no_sync() (pytorch#143580), which gradient accumulation uses."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedDataParallelKwargs

    from nbddp.runtime.trainer.unused_parameters import wrap_for_unused_parameters

    accelerator = SimpleNamespace(ddp_handler=DistributedDataParallelKwargs(), is_main_process=True,
                                  prepare_model=lambda model: model)
    trainer = SimpleNamespace(accelerator=accelerator, args=SimpleNamespace(gradient_accumulation_steps=accumulation))
    wrap_for_unused_parameters(trainer, ["model.vision_tower.q_proj.lora_A.default.weight"])
    assert accelerator.prepare_model("model") == "model"
    assert accelerator.ddp_handler.static_graph is static
    assert accelerator.ddp_handler.find_unused_parameters is search


def test_a_speech_models_codec_adapters_lie_outside_the_language_model():
    """Sesame's CSM: LoRA on every q_proj reaches its Mimi codec, which encodes the audio without gradients; its
    get_decoder() is the whole model."""
    from transformers import CsmForConditionalGeneration

    from nbddp.fallback.models import FastModel

    model, _ = FastModel.from_pretrained(ensure_weights(str(REPO / "models" / "tiny-csm")), load_in_4bit=False,
                                         auto_model=CsmForConditionalGeneration)
    model = FastModel.get_peft_model(model, r=4, lora_alpha=4, target_modules=ALL_Q_PROJ,
                                     use_gradient_checkpointing=False)
    outside = trainable_outside_language_model(model)
    assert outside and all(".codec_model." in name and "lora_" in name for name in outside)
