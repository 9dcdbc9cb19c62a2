"""Build a random-initialised bf16 model folder for a bench shape, on the GPU host (never committed).

    python -m bench.materialize --shape llama3-8b --out /tmp/bench-models/llama3-8b

The folder holds bench/configs/<shape>/config.json (special token ids taken from the tiny
tokenizer), that tokenizer's files (model_max_length raised to the shape's context), and
safetensors weights from transformers' own seeded init, made on the GPU. Running it again with
the same shape and seed does nothing. Random token ids stay below the tiny tokenizer's vocabulary,
which is far smaller than the model's.
"""
import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "bench" / "configs"
TOKENIZER = REPO / "models" / "tiny-llama"
TOKENIZER_FILES = ("tokenizer.json", "special_tokens_map.json")
STAMP = "bench_materialized.json"


def shape_config(shape):
    """The committed config of `shape` with the tiny tokenizer's special token ids."""
    config = json.loads((CONFIGS / shape / "config.json").read_text())
    tiny = json.loads((TOKENIZER / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config[key] = tiny[key]
    return config


def stamp_for(shape, seed, config):
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return {"shape": shape, "seed": seed, "config_sha256": digest}


def write_tokenizer(out_dir, max_length):
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER / name, out_dir / name)
    tokenizer_config = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    tokenizer_config["model_max_length"] = max_length
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")


def write_weights(out_dir, config, seed):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**config), dtype=torch.bfloat16)
    model.save_pretrained(out_dir, max_shard_size="5GB")
    del model
    torch.cuda.empty_cache()


def materialize(shape, out_dir, seed=0):
    """Write the model folder unless an identical one is already there; returns its path."""
    out_dir = Path(out_dir)
    config = shape_config(shape)
    stamp = stamp_for(shape, seed, config)
    if (out_dir / STAMP).exists() and json.loads((out_dir / STAMP).read_text()) == stamp:
        return out_dir
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    write_weights(partial, config, seed)
    write_tokenizer(partial, config["max_position_embeddings"])
    (partial / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(partial, out_dir)
    return out_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, choices=sorted(p.name for p in CONFIGS.iterdir()))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(materialize(args.shape, args.out, args.seed))


if __name__ == "__main__":
    main()
