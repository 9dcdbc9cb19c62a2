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

A vision notebook that sets one of Unsloth's templates on the processor (`get_chat_template(processor, "gemma-3")`)
writes that template's image placeholder (`<start_of_image>`) where the tiny Llava's processor looks for `<image>`;
`vision_variant` makes a copy of the tiny Llava whose image token is the template's (`image_token`).
"""
import json
import os
import re
import shutil
from pathlib import Path

TINY_IMAGE_TOKEN = "<image>"  # models/tiny-vision's processor_config.json
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


def image_token(template_names: list[str]) -> str | None:
    """The image placeholder that the first of Unsloth's templates named here writes, if it writes one."""
    table = json.loads((Path(__file__).resolve().parent.parent / "nbddp" / "runtime" /
                        "unsloth_chat_templates.json").read_text(encoding="utf-8"))
    for name in template_names:
        entry = table["chat_templates"].get(name)
        template = table["templates"].get(entry["template"], "") if isinstance(entry, dict) else ""
        found = re.search(r"item\['type'\] == 'image' -%}\s*\{\{-? '([^']+)' -?\}\}", template)
        if found:
            return found[1]
    return None


def vision_variant(source: Path, token: str, folder: Path) -> Path:
    """A copy of the tiny vision model in `folder` with `token` in place of its image token (same id), made once."""
    if token == TINY_IMAGE_TOKEN:
        return source
    target = folder / f"{source.name}-{re.sub(r'[^A-Za-z0-9]+', '_', token).strip('_')}"
    if not target.is_dir():
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for path in sorted(p for p in source.iterdir() if p.is_file()):
            (staging / path.name).write_text(path.read_text(encoding="utf-8").replace(TINY_IMAGE_TOKEN, token),
                                             encoding="utf-8")
        staging.rename(target)
    return target
