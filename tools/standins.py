"""Local stand-ins for the hub: a folder named like each model and dataset id a notebook loads.

    names = model_standin_names(["unsloth/Llama-3.2-3B-Instruct"])
    # ["unsloth/Llama-3.2-3B-Instruct", "unsloth/Llama-3.2-3B-Instruct-bnb-4bit",
    #  "unsloth/Llama-3.2-3B-Instruct-unsloth-bnb-4bit"]
    assemble(run_dir, names, model_folder, dataset_folders)

Transformers and datasets read a local folder named like the id before they ask the hub, so the notebook runs
unchanged from `run_dir`. With `load_in_4bit=True` Unsloth loads `unsloth/X` as its pre-quantized
`unsloth/X-unsloth-bnb-4bit` or `unsloth/X-bnb-4bit` (unsloth/models/mapper.py), and with `load_in_4bit=False`
a `-bnb-4bit` name as `unsloth/X`: every `unsloth/` id gets all three names. Each name is a symbolic link to the
tiny model that fits the notebook (`model_source`), and each dataset id to its generated stand-in.
"""
import os
from pathlib import Path

QUANTIZED_SUFFIXES = ("-unsloth-bnb-4bit", "-bnb-4bit")  # longest first: both end in -bnb-4bit
TEXT_MODELS = ("models/tiny-chat", "models/tiny-llama")  # the first that exists; tiny-chat has chat tokens
VISION_MODELS = ("models/tiny-vision",)


def model_standin_names(model_ids: list[str]) -> list[str]:
    """The ids themselves and, for Unsloth's, the names its loader maps them to; sorted, without repeats."""
    names = set(model_ids)
    for model_id in model_ids:
        if model_id.startswith("unsloth/"):
            base = next((model_id.removesuffix(s) for s in QUANTIZED_SUFFIXES if model_id.endswith(s)), model_id)
            names.update(base + suffix for suffix in ("", *QUANTIZED_SUFFIXES))
    return sorted(names)


def model_source(repo: Path, vision: bool) -> Path | None:
    """The tiny model folder (config and tokenizer) to stand in for a notebook's models, or None if not built yet."""
    candidates = VISION_MODELS if vision else TEXT_MODELS
    return next((repo / name for name in candidates if (repo / name / "config.json").is_file()), None)


def assemble(run_dir: Path, model_names: list[str], model_folder: Path | None, dataset_folders: dict[str, Path]):
    """Fill `run_dir` with links named like the ids: each model name to `model_folder`, each dataset id to its folder.

    Namespace folders (`unsloth/`) are real folders, so models and datasets of one namespace sit side by side.
    """
    targets = {name: model_folder for name in model_names if model_folder is not None}
    targets.update(dataset_folders)
    for name, target in targets.items():
        link = run_dir / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink(Path(target).resolve(), link, target_is_directory=True)
