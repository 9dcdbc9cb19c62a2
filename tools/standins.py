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

A text notebook gets the chat template of its model's family from Unsloth's table (`family_template`, a Gemma 4
id -> "gemma-4"), as the real tokenizer would bring its own: the markers a notebook hands `train_on_responses_only`
and the message shapes it renders (a Gemma 4 notebook's list of content parts) are the family's; `text_variant`
makes that copy of the tiny chat model. A vision notebook that sets one of Unsloth's templates on the processor
(`get_chat_template(processor, "gemma-3")`) writes that template's image placeholder (`<start_of_image>`) where the tiny Llava's processor looks for `<image>`;
`vision_variant` makes a copy of the tiny Llava whose image token is the template's (`image_token`).
"""
import functools
import json
import os
import re
import shutil
from pathlib import Path

TINY_IMAGE_TOKEN = "<image>"  # models/tiny-vision's processor_config.json
TABLE = Path(__file__).resolve().parent.parent / "nbddp" / "runtime" / "unsloth_chat_templates.json"
# A model id's family (its lowercased id matches the pattern) -> the template of Unsloth's table its tokenizer has;
# the first match wins. Families whose template the table lacks keep the tiny chat model's ChatML.
# None: a model whose own template no family's matches (FunctionGemma's takes tool calls and roles Gemma 3's refuses);
# its stand-in keeps tiny-chat's template, which takes any role.
FAMILIES = ((r"functiongemma", None), (r"gemma-?4", "gemma-4"), (r"gemma-?3n", "gemma-3n"),
            (r"gemma-?3|medgemma", "gemma-3"),
            (r"gemma", "gemma"), (r"qwen-?3", "qwen-3"), (r"qwen|qwq", "qwen-2.5"), (r"llama-?3", "llama-3.1"),
            (r"phi-?4", "phi-4"), (r"phi-?3", "phi-3"), (r"mistral|ministral|magistral|pixtral|devstral", "mistral"),
            (r"gpt-oss", "gpt-oss"), (r"lfm-?2", "lfm-2"))
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


@functools.cache
def _table() -> dict:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def _template(name: str) -> str:
    """The text of the table's template `name` ("" when the table has none)."""
    table = _table()
    entry = table["chat_templates"].get(name)
    return table["templates"].get(entry["template"], "") if isinstance(entry, dict) else ""


def family_template(model_ids: list[str]) -> str | None:
    """The table's template of the first model id whose family it knows (None: tiny-chat's own)."""
    for model_id in model_ids:
        for pattern, name in FAMILIES:
            if re.search(pattern, model_id.lower()) and (name is None or _template(name)):
                return name
    return None


def text_variant(source: Path, template_name: str, folder: Path) -> Path:
    """A copy of the tiny chat model in `folder` whose tokenizer's chat template is the table's `template_name`."""
    target = folder / f"{source.name}-{template_name}"
    if not target.is_dir():
        staging = _staging(target)
        for path in sorted(p for p in source.iterdir() if p.is_file()):
            shutil.copyfile(path, staging / path.name)
        config = json.loads((staging / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["chat_template"] = _template(template_name)
        (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        staging.rename(target)
    return target


def _staging(target: Path) -> Path:
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def image_token(template_names: list[str]) -> str | None:
    """The image placeholder that the first of Unsloth's templates named here writes, if it writes one."""
    for name in template_names:
        template = _template(name)
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
        staging = _staging(target)
        for path in sorted(p for p in source.iterdir() if p.is_file()):
            (staging / path.name).write_text(path.read_text(encoding="utf-8").replace(TINY_IMAGE_TOKEN, token),
                                             encoding="utf-8")
        staging.rename(target)
    return target
