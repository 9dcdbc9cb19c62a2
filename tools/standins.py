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
`vision_variant` makes a copy of the tiny Llava whose image token is the template's (`image_token`). A vision
family whose processor brings a template of its own, which its notebooks train on (PaddleOCR-VL's `User: ...
\nAssistant: ...`), gets that template and image token (`own_vision_template`) the same way. A family neither tiny
model can stand in for (Whisper, a speech-to-text model; Orpheus, whose token ids go past tiny-chat's vocabulary;
Sesame's CSM, a text-to-speech model) has its own tiny model (`FAMILY_MODELS`). Orpheus's notebook decodes what the
model generates as SNAC code frames, which random weights never write: `speaking_orpheus_variant` sets the built
tiny Orpheus's weights so that it does (`ORPHEUS_SPEECH`).
"""
import functools
import json
import os
import re
import shutil
from pathlib import Path

TINY_IMAGE_TOKEN = "<image>"  # models/tiny-vision's processor_config.json
TABLE = Path(__file__).resolve().parent.parent / "nbddp" / "fallback" / "unsloth_chat_templates.json"
# A model id's family (its lowercased id matches the pattern) -> the template of Unsloth's table its tokenizer has;
# the first match wins. Families whose template the table lacks keep the tiny chat model's ChatML.
# None: a model whose own template no family's matches (FunctionGemma's takes tool calls and roles Gemma 3's refuses);
# its stand-in keeps tiny-chat's template, which takes any role.
FAMILIES = ((r"functiongemma", None), (r"gemma-?4", "gemma-4"), (r"gemma-?3n", "gemma-3n"),
            (r"gemma-?3|medgemma", "gemma-3"),
            (r"gemma", "gemma"), (r"qwen-?3", "qwen-3"), (r"qwen|qwq", "qwen-2.5"), (r"llama-?3", "llama-3.1"),
            (r"phi-?4", "phi-4"), (r"phi-?3", "phi-3"), (r"mistral|ministral|magistral|pixtral|devstral", "mistral"),
            (r"gpt-oss", "gpt-oss"), (r"lfm-?2", "lfm-2"), (r"ernie-?4\.?5", "ernie-4.5"))
# Families whose template Unsloth's table lacks: the template their own tokenizer ships with.
OWN_TEMPLATES = {
    # ERNIE 4.5's tokenizer (transformers' models/ernie4_5 DEFAULT_CHAT_TEMPLATE, baidu/ERNIE-4.5-*-PT)
    "ernie-4.5": (
        '{%- if not add_generation_prompt is defined -%}\n    {%- set add_generation_prompt = true -%}\n{%- endif -%}\n'
        '{%- if not cls_token is defined -%}\n    {%- set cls_token = "<|begin_of_sentence|>" -%}\n{%- endif -%}\n'
        '{%- if not sep_token is defined -%}\n    {%- set sep_token = "<|end_of_sentence|>" -%}\n{%- endif -%}\n'
        '{{- cls_token -}}\n{%- for message in messages -%}\n    {%- if message["role"] == "user" -%}\n'
        '        {{- "User: " + message["content"] + "\\n" -}}\n    {%- elif message["role"] == "assistant" -%}\n'
        '        {{- "Assistant: " + message["content"] + sep_token -}}\n    {%- elif message["role"] == "system" -%}\n'
        '        {{- message["content"] + "\\n" -}}\n    {%- endif -%}\n{%- endfor -%}\n'
        '{%- if add_generation_prompt -%}\n    {{- "Assistant: " -}}\n{%- endif -%}'),
}
# Models whose own template also takes a message's content as a list of text parts, as multimodal models' do
# (Qwen3.5, Magistral Small 2509): their notebooks prompt with [{"type": "text", "text": ...}], which the family's
# text-only template would concatenate as a string.
TEXT_PARTS_MODELS = r"qwen-?3\.[56]|magistral-small-2509"
# Jinja put before such a template: each list content becomes the text of its text parts.
TEXT_PARTS_PRELUDE = (
    "{%- set flat = namespace(messages = []) -%}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is not defined or message['content'] is string or message['content'] is none -%}"
    "{%- set flat.messages = flat.messages + [message] -%}"
    "{%- else -%}"
    "{%- set text = namespace(value = '') -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}"
    "{%- set text.value = text.value + part['text'] -%}"
    "{%- endfor -%}"
    "{%- set flat.messages = flat.messages + [dict(message, content = text.value)] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set messages = flat.messages -%}"
)
# The model code of remote_code_variant: the tiny Llava under a name of its own.
REMOTE_MODULE, REMOTE_CLASS = "modeling_tiny_vision", "TinyVisionForCausalLM"
REMOTE_CODE = f'''from transformers import LlavaForConditionalGeneration


class {REMOTE_CLASS}(LlavaForConditionalGeneration):
    """models/tiny-vision's Llava, loaded by AutoModelForCausalLM through config.json's auto_map."""
'''
# Vision models whose processor's own template (Unsloth's table has none) notebooks train on: the family's pattern,
# name, template, and image token (what the processor expands; the template may write markers around it).
OWN_VISION_TEMPLATES = (
    # PaddleOCR-VL's chat_template.jinja (PaddlePaddle/PaddleOCR-VL): "User: <image>OCR:\nAssistant: ...</s>"
    (r"paddleocr-vl", "paddleocr-vl", (
        '{%- if not add_generation_prompt is defined -%}\n    {%- set add_generation_prompt = true -%}\n{%- endif -%}\n'
        '{%- if not cls_token is defined -%}\n    {%- set cls_token = "<|begin_of_sentence|>" -%}\n{%- endif -%}\n'
        '{%- if not eos_token is defined -%}\n    {%- set eos_token = "</s>" -%}\n{%- endif -%}\n'
        '{%- if not image_token is defined -%}\n'
        '    {%- set image_token = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>" -%}\n{%- endif -%}\n'
        '{{- cls_token -}}\n{%- for message in messages -%}\n    {%- if message["role"] == "user" -%}\n'
        '        {{- "User: " -}}\n        {%- for content in message["content"] -%}\n'
        '            {%- if content["type"] == "image" -%}\n                {{ image_token }}\n'
        '            {%- endif -%}\n        {%- endfor -%}\n        {%- for content in message["content"] -%}\n'
        '            {%- if content["type"] == "text" -%}\n                {{ content["text"] }}\n'
        '            {%- endif -%}\n        {%- endfor -%}\n        {{ "\\n" -}}\n'
        '    {%- elif message["role"] == "assistant" -%}\n        {{- "Assistant: " -}}\n'
        '        {%- for content in message["content"] -%}\n            {%- if content["type"] == "text" -%}\n'
        '                {{ content["text"] }}\n            {%- endif -%}\n        {%- endfor -%}\n'
        '        {{ eos_token -}}\n    {%- elif message["role"] == "system" -%}\n'
        '        {%- for content in message["content"] -%}\n            {%- if content["type"] == "text" -%}\n'
        '                {{ content["text"] + "\\n" }}\n            {%- endif -%}\n        {%- endfor -%}\n'
        '    {%- endif -%}\n{%- endfor -%}\n'
        '{%- if add_generation_prompt -%}\n    {{- "Assistant: " -}}\n{%- endif -%}'),
     "<|IMAGE_PLACEHOLDER|>"),
)
# Muse Glimmer's "ATEM" chat format, as its notebooks show it rendered (Muse_Glimmer_(30B)-Conversational's "Data
# Prep", -GRPO's "The Muse Glimmer chat format"; the model's own template file is not on this machine): each turn
# `<|start|>ROLE<|message|>...<|eot|>`, the assistant's addressed `to=self` (reasoning_content, closed by <|eom|>) or
# `to=user`, a system turn with `Reasoning strength: <level>.` (default high), and a generation prompt that stops
# after `<|start|>assistant`. Its tokenizer's bos and eos are <|begin_of_text|> and <|end_of_text|>, and <|start|>,
# <|message|>, <|eom|> and <|eot|> are special tokens (the GRPO notebook's rewards read completions without them).
MUSE_GLIMMER_MODELS = r"muse-?glimmer"
MUSE_GLIMMER_TEMPLATE = (
    '{{- bos_token -}}\n{%- set reasoning_strength = reasoning_strength | default("high") -%}\n'
    '{%- if messages and messages[0]["role"] == "system" -%}\n    {%- set system = messages[0]["content"] -%}\n'
    '    {%- set messages = messages[1:] -%}\n{%- else -%}\n    {%- set system = "You are a helpful AI assistant." -%}\n'
    '{%- endif -%}\n{{- "<|start|>system<|message|>" + system + "\\nKnowledge cutoff: 2026-01-04.\\n\\n'
    'Reasoning strength: " + reasoning_strength + ".\\n\\n# Valid recipients: \\"self\\", \\"user\\".<|eot|>" -}}\n'
    '{%- for message in messages -%}\n    {%- if message["role"] == "assistant" -%}\n'
    '        {%- if message["reasoning_content"] -%}\n'
    '            {{- "<|start|>assistant to=self<|message|>" + message["reasoning_content"] + "<|eom|>" -}}\n'
    '        {%- endif -%}\n        {{- "<|start|>assistant to=user<|message|>" + message["content"] + "<|eot|>" -}}\n'
    '    {%- else -%}\n        {{- "<|start|>" + message["role"] + "<|message|>" + message["content"] + "<|eot|>" -}}\n'
    '    {%- endif -%}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{- "<|start|>assistant" -}}\n{%- endif -%}')
MUSE_GLIMMER_RENAMED = {"<s>": "<|begin_of_text|>", "</s>": "<|end_of_text|>"}  # tiny-chat's bos and eos, same ids
MUSE_GLIMMER_ADDED = ("<|eom|>", "<|eot|>")  # tiny-chat has <|start|> and <|message|> already
QUANTIZED_SUFFIXES = ("-unsloth-bnb-4bit", "-bnb-4bit")  # longest first: both end in -bnb-4bit
TEXT_MODELS = ("models/tiny-chat", "models/tiny-llama")  # the first that exists; tiny-chat has chat tokens
VISION_MODELS = ("models/tiny-vision",)
VIDEO_MODELS = ("models/tiny-video",)  # Qwen2-VL: an image token, a video token and a video processor
# Families that neither stands in for, by a pattern of the model id: their own tiny model.
# Orpheus writes token ids past any text vocabulary (its SNAC audio codes): models/build_tiny_orpheus.py; Sesame's
# CSM is a text-to-speech model with a codec of its own: models/build_tiny_csm.py.
FAMILY_MODELS = ((r"whisper", "models/tiny-whisper"), (r"orpheus", "models/tiny-orpheus"),
                 (r"(^|/)csm-", "models/tiny-csm"))


def model_standin_names(model_ids: list[str]) -> list[str]:
    """The ids themselves and, for Unsloth's, the names its loader maps them to; sorted, without repeats."""
    names = set(model_ids)
    for model_id in model_ids:
        if model_id.startswith("unsloth/"):
            base = next((model_id.removesuffix(s) for s in QUANTIZED_SUFFIXES if model_id.endswith(s)), model_id)
            names.update(base + suffix for suffix in ("", *QUANTIZED_SUFFIXES))
    return sorted(names)


def model_source(repo: Path, vision: bool, model_ids: list[str] = (), video: bool = False) -> Path | None:
    """The tiny model folder (config and tokenizer) to stand in for a notebook's models, or None if not built yet:
    FAMILY_MODELS' for a model id of such a family, else a video one for a vision notebook that uses videos
    (`video`: NotebookFacts.uses_video), else a vision or text one."""
    candidates = next(((name,) for pattern, name in FAMILY_MODELS
                       if any(re.search(pattern, model_id.lower()) for model_id in model_ids)),
                      (VIDEO_MODELS if video else VISION_MODELS) if vision else TEXT_MODELS)
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
    """The text of the table's template `name`, or of OWN_TEMPLATES' ("" when neither has it)."""
    if name in OWN_TEMPLATES:
        return OWN_TEMPLATES[name]
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


def takes_text_parts(model_ids: list[str]) -> bool:
    """Whether a model id is one of TEXT_PARTS_MODELS."""
    return any(re.search(TEXT_PARTS_MODELS, model_id.lower()) for model_id in model_ids)


def text_variant(source: Path, template_name: str, folder: Path, text_parts=False) -> Path:
    """A copy of the tiny chat model in `folder` whose tokenizer's chat template is the table's `template_name`
    (with `text_parts`, after TEXT_PARTS_PRELUDE)."""
    def change(staging):
        config = json.loads((staging / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["chat_template"] = (TEXT_PARTS_PRELUDE if text_parts else "") + _template(template_name)
        (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")

    return _variant(source, folder / f"{source.name}-{template_name}{'-text-parts' if text_parts else ''}", change)


def _variant(source: Path, target: Path, change) -> Path:
    """`target`: a copy of the files of `source` that `change(folder)` then edits, written whole or not at all."""
    if not target.is_dir():
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for path in sorted(p for p in source.iterdir() if p.is_file()):
            shutil.copyfile(path, staging / path.name)
        change(staging)
        staging.rename(target)
    return target


def image_token(template_names: list[str]) -> str | None:
    """The image placeholder that the first of Unsloth's templates named here writes, if it writes one."""
    for name in template_names:
        template = _template(name)
        found = re.search(r"item\['type'\] == 'image' -%}\s*\{\{-? '([^']+)' -?\}\}", template)
        if found:
            return found[1]
    return None


def remote_code_variant(source: Path, auto_class: str, folder: Path) -> Path:
    """A copy of the tiny vision model in `folder` that `auto_class` (AutoModelForCausalLM) loads with
    `trust_remote_code=True`, through its config's `auto_map`, as the remote-code vision models that register only
    that class do (ERNIE-4.5-VL, PaddleOCR-VL; Unsloth loads them with the notebook's `auto_model`)."""
    def change(staging):
        config = json.loads((staging / "config.json").read_text(encoding="utf-8"))
        config["auto_map"] = {auto_class: f"{REMOTE_MODULE}.{REMOTE_CLASS}"}
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (staging / f"{REMOTE_MODULE}.py").write_text(REMOTE_CODE, encoding="utf-8")

    return _variant(source, folder / f"{source.name}-{auto_class}", change)


def own_vision_template(model_ids: list[str]) -> tuple[str, str, str] | None:
    """`(name, template, image token)` of OWN_VISION_TEMPLATES for the first model id of such a family, else None."""
    for model_id in model_ids:
        for pattern, name, template, token in OWN_VISION_TEMPLATES:
            if re.search(pattern, model_id.lower()):
                return name, template, token
    return None


def vision_variant(source: Path, token: str, folder: Path, template: tuple[str, str] | None = None) -> Path:
    """A copy of the tiny vision model in `folder` with `token` in place of its image token (same id), made once;
    with `template` (name, text), whose chat template is that text."""
    if token == TINY_IMAGE_TOKEN and template is None:
        return source
    suffix = template[0] if template else re.sub(r'[^A-Za-z0-9]+', '_', token).strip('_')
    def change(staging):
        for path in sorted(staging.iterdir()):
            path.write_text(path.read_text(encoding="utf-8").replace(TINY_IMAGE_TOKEN, token), encoding="utf-8")
        if template:
            (staging / "chat_template.jinja").write_text(template[1], encoding="utf-8")

    return _variant(source, folder / f"{source.name}-{suffix}", change)


def is_muse_glimmer(model_ids: list[str]) -> bool:
    """Whether a model id is Muse Glimmer's (MUSE_GLIMMER_MODELS)."""
    return any(re.search(MUSE_GLIMMER_MODELS, model_id.lower()) for model_id in model_ids)


def muse_glimmer_variant(source: Path, folder: Path) -> Path:
    """A copy of the tiny chat model in `folder` with Muse Glimmer's tokenizer: its ATEM template, its bos and eos
    (tiny-chat's <s> and </s> renamed, same ids) and MUSE_GLIMMER_ADDED as special tokens after the vocabulary, which
    the config's vocab_size grows to hold."""
    def change(staging):
        for path in sorted(staging.iterdir()):
            text = path.read_text(encoding="utf-8")
            for old, new in MUSE_GLIMMER_RENAMED.items():
                text = text.replace(json.dumps(old), json.dumps(new))
            path.write_text(text, encoding="utf-8")
        model_config = json.loads((staging / "config.json").read_text(encoding="utf-8"))
        tokenizer = json.loads((staging / "tokenizer.json").read_text(encoding="utf-8"))
        tokenizer_config = json.loads((staging / "tokenizer_config.json").read_text(encoding="utf-8"))
        for token in MUSE_GLIMMER_ADDED:
            entry = {"content": token, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            tokenizer["added_tokens"].append({"id": model_config["vocab_size"], **entry})
            tokenizer_config["added_tokens_decoder"][str(model_config["vocab_size"])] = entry
            model_config["vocab_size"] += 1
        tokenizer_config["chat_template"] = MUSE_GLIMMER_TEMPLATE
        for name, value in (("config.json", model_config), ("tokenizer.json", tokenizer),
                            ("tokenizer_config.json", tokenizer_config)):
            (staging / name).write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    return _variant(source, folder / f"{source.name}-muse-glimmer", change)


# Orpheus's generation grammar, as its notebook parses it: after the prompt, start of speech (128257), then frames
# of 7 SNAC codes, the k-th of a frame among ids 128266 + k * 4096 + [0, 4096).
ORPHEUS_SPEECH = {"start_of_speech": 128257, "codes_start": 128266, "frame": 7, "codebook_size": 4096}


def speaking_orpheus_variant(weights_folder: Path, folder: Path) -> Path:
    """A copy of the built tiny Orpheus (`weights_folder`, whose embeddings are tied) that writes ORPHEUS_SPEECH:
    each token's embedding is the unit vector of its class (a frame position, start of speech, or any other id),
    the first layer's MLP turns it into the next class's (other -> start of speech -> position 0 -> 1 ... -> 6 -> 0),
    attention and the second layer add nothing, so every next id is sampled from its class alone. LoRA training
    of a few steps leaves those margins (about 45 logits) as they were."""
    def change(staging):
        import torch
        from safetensors.torch import load_file, save_file

        config = json.loads((staging / "config.json").read_text(encoding="utf-8"))
        weights = load_file(staging / "model.safetensors")
        hidden, classes = config["hidden_size"], ORPHEUS_SPEECH["frame"] + 2  # the frame's positions, start, other
        start, other = classes - 2, classes - 1
        following = {**{k: (k + 1) % ORPHEUS_SPEECH["frame"] for k in range(ORPHEUS_SPEECH["frame"])},
                     other: start, start: 0}
        token_class = torch.full((config["vocab_size"],), other)
        codes = torch.arange(ORPHEUS_SPEECH["frame"] * ORPHEUS_SPEECH["codebook_size"])
        token_class[ORPHEUS_SPEECH["codes_start"] + codes] = codes // ORPHEUS_SPEECH["codebook_size"]
        token_class[ORPHEUS_SPEECH["start_of_speech"]] = start
        scale = 4.0
        weights["model.embed_tokens.weight"] = scale * torch.nn.functional.one_hot(token_class, hidden).float()
        activation = torch.nn.functional.silu(torch.tensor(hidden ** 0.5)) * hidden ** 0.5  # a class unit's, normed
        for layer in range(config["num_hidden_layers"]):
            prefix = f"model.layers.{layer}."
            for name in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                weights[prefix + name + ".weight"].zero_()
            for name in ("input_layernorm", "post_attention_layernorm"):
                weights[prefix + name + ".weight"].fill_(1.0)
        for unit, (now, then) in enumerate(following.items()):
            weights["model.layers.0.mlp.gate_proj.weight"][unit, now] = 1.0
            weights["model.layers.0.mlp.up_proj.weight"][unit, now] = 1.0
            weights["model.layers.0.mlp.down_proj.weight"][then, unit] = scale / activation
            weights["model.layers.0.mlp.down_proj.weight"][now, unit] = -scale / activation
        weights["model.norm.weight"].fill_(1.0)
        save_file(weights, staging / "model.safetensors", metadata={"format": "pt"})

    return _variant(weights_folder, folder / f"{weights_folder.name}-speaking", change)
