import sys
import textwrap
from pathlib import Path

import pytest

# bench/ is a folder of scripts run from the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# A stand-in for generated/train.py: transformers' Trainer on a tiny random Llama, fixed-length rows,
# on the CPU; it reads the two flags it needs and ignores the rest, as the harness passes many.
TRAIN_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    def flag(name):
        return sys.argv[sys.argv.index(name) + 1]

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    ids = torch.randint(4, 64, (32, 16)).tolist()
    data = Dataset.from_dict({"input_ids": ids, "labels": ids})
    args = TrainingArguments(output_dir=flag("--output_dir"), max_steps=int(flag("--max_steps")),
                             per_device_train_batch_size=2, report_to="none", use_cpu=True, save_strategy="no")
    Trainer(model=model, args=args, train_dataset=data).train()
    print("script finished", __name__)
    # gloo's workers can abort a rank during interpreter finalization ("terminate called without an
    # active exception"): end as ddp.shutdown() does (see nbddp.runtime.ddp_core).
    if torch.distributed.is_initialized():
        from nbddp.runtime.ddp_core import exit_without_finalization

        torch.distributed.destroy_process_group()
        exit_without_finalization()
""")


@pytest.fixture
def tiny_train_script(tmp_path):
    script = tmp_path / "tiny_train.py"
    script.write_text(TRAIN_SCRIPT)
    return script
