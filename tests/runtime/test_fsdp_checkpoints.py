"""Checkpoints written under --strategy fsdp are complete, and resumed, by the same marker as DDP's.

Trainer under FSDP writes other files than under DDP (transformers' Trainer._save_checkpoint, accelerate's
save_fsdp_model and save_fsdp_optimizer): with the full state dict that nbddp's FSDP settings ask for, rank 0 writes
`pytorch_model_fsdp.bin` and `optimizer.bin`; with a sharded state dict (a notebook's own fsdp_config), every rank
writes its part of `pytorch_model_fsdp_0/` and `optimizer_0/` (torch.distributed.checkpoint). accelerate runs FSDP
only on GPUs, so here the folders are laid out as Trainer writes them (bench/fsdp_gpu.sh resumes a real one)."""
from pathlib import Path

import pytest

from nbddp.formats import checkpoint_markers
from nbddp.runtime.trainer import training_checkpoints

# what every checkpoint of a PEFT model holds beside the model and optimizer state (Trainer._save_checkpoint)
COMMON = ["adapter_model.safetensors", "adapter_config.json", "README.md", "scheduler.pt", "trainer_state.json",
          "training_args.bin", "rng_state_0.pth", "rng_state_1.pth"]
FULL = ["pytorch_model_fsdp.bin", "optimizer.bin"]
SHARDED = ["pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp_0/__0_0.distcp", "pytorch_model_fsdp_0/__1_0.distcp",
           "optimizer_0/.metadata", "optimizer_0/__0_0.distcp", "optimizer_0/__1_0.distcp"]


# whole files of the formats a resume checks (checkpoint_markers.damage): an empty JSON object, a safetensors file
WHOLE = {".json": b"{}", ".safetensors": (2).to_bytes(8, "little") + b"{}"}


def lay_out(folder, step, files):
    checkpoint = folder / f"checkpoint-{step}"
    for name in files:
        (checkpoint / name).parent.mkdir(parents=True, exist_ok=True)
        (checkpoint / name).write_bytes(WHOLE.get(Path(name).suffix, b"state"))
    return checkpoint


@pytest.fixture
def trainer(markers_registered, tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "outputs"), report_to=[], use_cpu=True, save_steps=5)
    return Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_path), args=args)


@pytest.fixture
def markers_registered(monkeypatch):
    from transformers import Trainer, trainer

    monkeypatch.setattr(trainer, "DEFAULT_CALLBACKS", list(trainer.DEFAULT_CALLBACKS))
    for name in ("train", "_save_checkpoint", "_get_output_dir"):
        monkeypatch.setattr(Trainer, name, vars(Trainer)[name])
    monkeypatch.setattr(training_checkpoints, "_trainers_per_output_dir", {})
    training_checkpoints.register()


@pytest.mark.parametrize("state_files", [FULL, SHARDED], ids=["full state dict", "sharded state dict"])
def test_a_complete_fsdp_checkpoint_is_resumed_and_a_half_written_one_removed(trainer, tmp_path, state_files, capsys):
    outputs = tmp_path / "outputs"
    complete = lay_out(outputs, 5, COMMON + state_files)
    checkpoint_markers.mark_complete(complete, 5, world_size=2)  # rank 0, once every rank has written its part
    half = lay_out(outputs, 10, COMMON[:2] + state_files[:2])  # stopped while the ranks wrote their shards
    assert [path.name for path in checkpoint_markers.incomplete_dirs(outputs)] == ["checkpoint-10"]

    chosen = training_checkpoints.resume_point(trainer, "--resume", world_size=2)
    assert chosen == str(complete) and not half.exists()
    assert f"nbddp: --resume: resuming from {complete} (step 5)" in capsys.readouterr().out
    # Transformers takes it for an FSDP checkpoint: one it loads only under FSDP (this trainer is not)
    with pytest.raises(ValueError, match="is only supported when using PyTorch FSDP"):
        trainer._load_from_checkpoint(chosen)


def test_rotation_deletes_a_sharded_checkpoint_whole(tmp_path):
    outputs = tmp_path / "outputs"
    for step in (5, 10, 15):
        checkpoint_markers.mark_complete(lay_out(outputs, step, COMMON + SHARDED), step, world_size=2)
    deleted = checkpoint_markers.rotate(outputs, keep=2)
    assert deleted == [outputs / "checkpoint-5"] and not (outputs / "checkpoint-5").exists()
    assert [c.step for c in checkpoint_markers.complete_checkpoints(outputs)] == [10, 15]
