"""The hf backend's `unsloth.chat_templates`: Unsloth's chat templates, its ShareGPT converter, and its loss on the
answers only, with Unsloth 2026.10.9's signatures and results (unsloth/chat_templates.py, unsloth_zoo/dataset_utils.py).

    from unsloth.chat_templates import get_chat_template, standardize_sharegpt, train_on_responses_only
    tokenizer = get_chat_template(tokenizer, chat_template="llama-3.1")
    dataset = standardize_sharegpt(dataset)       # {"from": "human", "value": ...} -> {"role": "user", "content": ...}
    trainer = train_on_responses_only(trainer)    # the markers read from the chat template

- `get_chat_template` sets `tokenizer.chat_template` to a template of Unsloth's table (unsloth_chat_templates.json,
  which tools/extract_chat_templates.py reads out of Unsloth's wheel) or to a `(template, stop_word)` pair, wrapped to
  read ShareGPT keys when `mapping` names them, its `{system_message}` filled. Where the table says so (chatml and
  the gemma family) and `map_eos_token` is on, the EOS token is renamed to the template's stop word, or swapped with
  it when the vocabulary has both, so that the turns end with a token the model has weights for; gemma_chatml renames
  `<start_of_turn>`/`<eos>` to ChatML's. Unlike Unsloth it changes the tokenizer in place rather than rebuilding one,
  so it keeps its other settings (the fallback's `model_max_length`, the padding side). A template token missing from
  the vocabulary is left as text that tokenizes into pieces, as with Unsloth.
- `standardize_sharegpt` (= `standardize_data_formats`) rewrites a "conversations" column's turns to role/content.
- `train_on_responses_only` labels the tokens from just after each response marker to the end of the answer (its
  EOS token included; the next instruction marker, turn opener, BOS or response marker ends it otherwise), -100
  elsewhere, in the trainer's tokenized datasets; rows left with no label are dropped, since their loss would be 0/0.
  TRL's collator pads a `labels` column as it is. Markers not given are read from the chat template, and
  `force_match=False` matches them loosely, as Unsloth does (chat_markers.py).

`to_sharegpt`, the dataset-level `apply_chat_template` (with its Ollama Modelfile) and `remove_special_tokens` are
in sharegpt.py, and importable from here as from Unsloth's module.

Not here: datasets that the trainer left untokenized, vision collators, `mask_out_tokens`, saving patches, and
Unsloth's test helpers (`test_chat_templates`, ...); importing one is bad input that says what to do instead.
"""
import itertools
import json
import warnings
from importlib import resources

from nbddp import log
from nbddp.errors import DataError, UsageError
from nbddp.fallback.chat_markers import Marker, marker_tokens, template_markers, turn_ends
from nbddp.fallback.sharegpt import escape_jinja_literal
# unsloth.chat_templates' dataset helpers, which sharegpt.py holds
from nbddp.fallback.sharegpt import (apply_chat_template, construct_chat_template, get_ollama_eos_tokens,  # noqa: F401
                                     remove_special_tokens, to_sharegpt)

TABLE = json.loads(resources.files("nbddp.fallback").joinpath("unsloth_chat_templates.json").read_text("utf-8"))
CHAT_TEMPLATES = TABLE["chat_templates"]
DEFAULT_MAPPING = {"role": "role", "content": "content", "user": "user", "assistant": "assistant"}
IGNORE_INDEX = -100  # the label that cross-entropy skips

# `unsloth.chat_templates`' public names that the fallback does not have.
UNSLOTH_ONLY = ("test_chat_templates", "test_hf_gguf_equivalence", "test_construct_chat_template")


def __getattr__(name):
    # `from unsloth.chat_templates import test_chat_templates` ends here (PEP 562); an error other than
    # AttributeError reaches the user as it is, instead of Python's bare "cannot import name".
    if name in UNSLOTH_ONLY:
        raise UsageError(
            f"unsloth.chat_templates.{name} is Unsloth's test of its own templates against the hub's tokenizers; "
            "nbddp's Transformers+PEFT fallback (--backend hf) does not have it. Leave the call out, or run on a GPU "
            "with Unsloth installed (--backend unsloth)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_chat_template(
    tokenizer,
    chat_template="chatml",
    mapping=DEFAULT_MAPPING,
    map_eos_token=True,
    system_message=None,
    patch_saving=True,  # Unsloth's saving patches: none here
    use_zoo_tokenizer_patch=None,  # which of Unsloth's tokenizer patches to use: none here
):
    """`tokenizer` with `chat_template` (a name of Unsloth's table, or `(template, stop_word)`) as its chat template;
    a vision model's processor comes back with it set on the processor and its tokenizer."""
    from transformers import ProcessorMixin

    if type(map_eos_token) is not bool:
        raise UsageError(f"get_chat_template: map_eos_token must be True or False, not {map_eos_token!r}")
    processor = None
    if isinstance(tokenizer, ProcessorMixin):
        processor, tokenizer = tokenizer, tokenizer.tokenizer
    is_gemma = type(tokenizer).__name__.startswith("Gemma")
    if is_gemma and chat_template == "chatml":
        chat_template = "gemma_chatml"
    if isinstance(chat_template, (list, tuple)):
        if len(chat_template) != 2 or not all(isinstance(part, str) for part in chat_template):
            raise UsageError("get_chat_template: a chat_template given as a tuple must be (template, stop_word), two "
                             'strings, e.g. (my_jinja_template, "eos_token")')
        name, template = chat_template[0].lower(), chat_template[0]
        same_pad_token = False  # Unsloth remaps no token for a template of one's own
    elif isinstance(chat_template, str) and chat_template in CHAT_TEMPLATES:
        name, entry = chat_template.lower(), CHAT_TEMPLATES[chat_template]
        template = TABLE["templates"][entry["template"]]
        if name in TABLE["gemma4_empty_thought"]["names"] and any(map(_primes_empty_thought, (processor, tokenizer))):
            template = TABLE["gemma4_empty_thought"]["template"]
        map_eos_token = map_eos_token and entry["map_eos_token"]  # the table can veto the renaming, not force it
        if not map_eos_token and entry["map_eos_token"] and entry["token_mapping"]:
            warnings.warn(f"get_chat_template: {chat_template} builds {entry['stop_word']} by renaming tokens, so "
                          "map_eos_token=False cannot be honoured", stacklevel=2)
            map_eos_token = True
        same_pad_token = _remap_tokens(tokenizer, entry["token_mapping"], entry["stop_word"], map_eos_token)
    else:
        raise UsageError(
            f"get_chat_template: chat_template={chat_template!r} is not one of Unsloth "
            f"{TABLE['unsloth_version']}'s templates ({', '.join(CHAT_TEMPLATES)}); give one of those names, or your "
            'own as a (jinja_template, stop_word) tuple, e.g. (template, "eos_token")')
    if is_gemma and not template.startswith(("{{ bos_token }}", "{{- bos_token }}")):
        template = "{{ bos_token }}" + template  # Gemma's loss is far higher without its BOS
    if mapping != DEFAULT_MAPPING:
        template = _reading_sharegpt_keys(mapping) + template
    tokenizer.chat_template = _with_system_message(template, name, system_message)
    if same_pad_token:
        tokenizer.pad_token = tokenizer.eos_token
    if processor is None:
        return tokenizer
    processor.chat_template = tokenizer.chat_template  # what the processor renders with
    return processor


def _primes_empty_thought(holder) -> bool:
    """Whether the tokenizer's (or processor's) own template opens an empty thought channel (Gemma-4 26B-A4B, 31B),
    so that Unsloth's gemma-4 templates get the variant that adds it to answers without thinking."""
    template = getattr(holder, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or template.endswith(TABLE["templates"]["gemma-4-thinking"]):
        return False
    return "<|channel>thought\\n<channel|>" in template or "<|channel>thought\n<channel|>" in template


def _remap_tokens(tokenizer, token_mapping, stop_word: str, map_eos_token: bool) -> bool:
    """Rename tokens as Unsloth's table says (ids unchanged); True when the pad token was EOS and must follow it."""
    if not getattr(tokenizer, "is_fast", False):
        return False  # Unsloth leaves a slow tokenizer's vocabulary alone
    vocab = tokenizer.get_vocab()
    eos = tokenizer.eos_token
    renames = {}
    if token_mapping:
        for old, new in token_mapping.items():
            if new in vocab:
                log.info(f"nbddp: get_chat_template: {new} is already a token; not renaming {old} to it")
            elif old not in vocab:
                raise UsageError(
                    f"get_chat_template: the template renames the token {old} to {new}, but {old} is not in this "
                    f"tokenizer's vocabulary (the table's entry is for Gemma tokenizers); choose a chat_template "
                    "whose tokens this tokenizer has, e.g. chatml")
            else:
                renames[old] = new
        if not renames:  # every new name already a token: Unsloth keeps the tokenizer as it is
            return False
        if map_eos_token and stop_word not in token_mapping.values():
            renames[eos] = stop_word
    elif map_eos_token and stop_word != "eos_token":
        log.info(f"nbddp: get_chat_template: the EOS token {eos} is renamed {stop_word}")
        renames = {eos: stop_word, stop_word: eos} if stop_word in vocab else {eos: stop_word}
    else:
        return False
    same_pad_token = tokenizer.pad_token == eos
    _rename_in_backend(tokenizer, renames)
    if map_eos_token:
        tokenizer.eos_token = stop_word
    return same_pad_token


def _rename_in_backend(tokenizer, renames: dict) -> None:
    """Rename tokens everywhere in the fast tokenizer's `tokenizers` JSON (vocabulary, added tokens, templates)."""
    from tokenizers import Tokenizer

    def rename(value):
        if isinstance(value, str):
            return renames.get(value, value)
        if isinstance(value, list):
            return [rename(item) for item in value]
        if isinstance(value, dict):
            return {renames.get(key, key): rename(item) for key, item in value.items()}
        return value

    backend = tokenizer.backend_tokenizer
    renamed = Tokenizer.from_str(json.dumps(rename(json.loads(backend.to_str()))))
    renamed.encode_special_tokens = backend.encode_special_tokens
    tokenizer._tokenizer = renamed


def _reading_sharegpt_keys(mapping: dict) -> str:
    """Jinja that turns messages keyed as `mapping` says (ShareGPT's from/value, human/gpt) into role/content."""
    role, content, user, assistant = (
        "'" + escape_jinja_literal(mapping[key]) + "'" for key in ("role", "content", "user", "assistant"))
    return (
        "{%- if 'role' not in messages[0] -%}"
        "{%- set sharegpt = namespace(messages = []) -%}"
        "{%- for message in messages -%}"
        "{%- set role = {" + user + " : 'user', " + assistant + " : 'assistant'}"
        ".get(message[" + role + "], message[" + role + "]) -%}"
        "{%- set sharegpt.messages = sharegpt.messages + "
        "[dict(message, role = role, content = message[" + content + "])] -%}"
        "{%- endfor -%}"
        "{%- set messages = sharegpt.messages -%}"
        "{%- endif %}"
    )


def _with_system_message(template: str, name: str, system_message) -> str:
    """`template` with its `{system_message}` filled: `system_message`, else the table's default for `name`."""
    default = CHAT_TEMPLATES[name]["default_system_message"] if name in CHAT_TEMPLATES else None
    if default is None and "{system_message}" in template:
        if system_message is None:
            raise UsageError("get_chat_template: the chat template has a {system_message} placeholder and no default "
                             "system message; pass system_message=\"...\"")
        return template.replace("{system_message}", system_message)
    if default is None:
        if system_message is not None:
            warnings.warn(f"get_chat_template: {name} has no default system message to change; put the system "
                          "message in your data", stacklevel=3)
        return template
    message = default if system_message is None else system_message
    return template.replace("{system_message}", escape_jinja_literal(message))


def standardize_data_formats(
    dataset,
    tokenizer=None,
    aliases_for_system=("system",),
    aliases_for_user=("user", "human", "input"),
    aliases_for_assistant=("gpt", "assistant", "output"),
    batch_size=1000,
    num_proc=None,
):
    """`dataset` with each turn of its "conversations" column as {"role": system|user|assistant, "content": text};
    a dataset without that column comes back as it is. Which key is the role is read off the first 10 rows."""
    from datasets import IterableDataset

    if "conversations" not in next(iter(dataset)):
        return dataset
    values = {}
    for row in itertools.islice(dataset, 10):
        for message in row["conversations"]:
            for key, value in message.items():
                if not isinstance(value, str):
                    raise DataError(f"standardize_sharegpt: a turn's {key!r} is {type(value).__name__}, not text; "
                                    "only conversations of text turns can be standardized")
                values.setdefault(key, []).append(value)
    if len(values) != 2:
        raise DataError(f"standardize_sharegpt: the turns have the keys {sorted(values)}; each turn needs exactly "
                        "two, a role and its text (ShareGPT's from/value)")
    role_key, content_key = _role_and_content_keys(values, [*aliases_for_system, *aliases_for_user, *aliases_for_assistant])
    aliases = {}
    for group, role in ((aliases_for_system, "system"), (aliases_for_user, "user"), (aliases_for_assistant, "assistant")):
        for alias in group:
            known = aliases.setdefault(_normalized(alias), role)
            if known != role:
                raise UsageError(f"standardize_sharegpt: the alias {alias!r} would mean both {known} and {role} "
                                 "(aliases are compared without case and surrounding spaces); give each role its own")
    is_vlm = hasattr(tokenizer, "image_processor") or hasattr(tokenizer, "tokenizer")

    def role(message):
        name = aliases.get(_normalized(message[role_key]))
        if name is None:
            raise DataError(f"standardize_sharegpt: the role {message[role_key]!r} is in no alias list; pass it in "
                            "aliases_for_user=, aliases_for_assistant= or aliases_for_system=")
        return name

    def standardize(batch):
        return {"conversations": [
            [{"role": role(message),
              "content": [{"type": "text", "text": message[content_key]}] if is_vlm else message[content_key]}
             for message in conversation]
            for conversation in batch["conversations"]
        ]}

    if isinstance(dataset, IterableDataset):
        return dataset.map(standardize, batched=True, batch_size=batch_size)
    return dataset.map(standardize, batched=True, batch_size=batch_size, num_proc=num_proc,
                       desc="Standardizing formats")


standardize_sharegpt = standardize_data_formats


def _role_and_content_keys(values: dict, all_aliases) -> tuple[str, str]:
    """(role key, text key) of the turns: the key whose values are all aliases; if both or neither are, the one named
    role or from, else the key with fewer distinct values."""
    aliases = {_normalized(alias) for alias in all_aliases}
    first, second = values
    alias_keys = [key for key in values if {_normalized(value) for value in values[key]} <= aliases]
    named_keys = [key for key in values if str(key).strip().lower() in ("role", "from")]
    if len(alias_keys) == 1:
        role_key = alias_keys[0]
    elif len(alias_keys) == 2 and len(named_keys) == 1:
        role_key = named_keys[0]
    else:
        role_key = first if len(set(values[first])) < len(set(values[second])) else second
    return role_key, second if role_key == first else first


def _normalized(role: str) -> str:
    return role.strip().lower()


def train_on_responses_only(
    trainer,
    instruction_part=None,
    response_part=None,
    force_match=True,
    tokenizer=None,
    return_function=False,
    num_proc=None,
    last_response_only=False,
):
    """Mask everything but the responses in `trainer`'s datasets; returns `trainer` (or, if asked, the batch function)."""
    tokenizer = tokenizer or trainer.processing_class
    if instruction_part is None and response_part is None:
        instruction_part, response_part = template_markers(tokenizer)
        log.info(f"nbddp: train_on_responses_only: instruction_part={instruction_part!r}, "
                 f"response_part={response_part!r} (read from the chat template)")
    elif instruction_part is None or response_part is None:
        raise UsageError("train_on_responses_only: give both instruction_part and response_part, or neither to "
                         "read them from the chat template")
    instruction = _marker(instruction_part, "instruction_part", tokenizer, force_match)
    response = _marker(response_part, "response_part", tokenizer, force_match)
    # A marker trimmed to the opener all roles share (gpt-oss "<|start|>") would match every turn: keep it whole.
    if response.core == instruction.core[: len(response.core)] and response.right:
        response = Marker(response.core + response.right, response.left)
    if instruction.core == response.core[: len(instruction.core)] and instruction.right:
        instruction = Marker(instruction.core + instruction.right, instruction.left)
    ends = turn_ends(tokenizer, instruction, response)

    def add_response_labels(batch):
        old_labels = batch["labels"] if "labels" in batch else batch["input_ids"]
        return {"labels": [response_labels(ids, labels, instruction, response, ends, last_response_only)
                           for ids, labels in zip(batch["input_ids"], old_labels)]}

    if return_function:
        return add_response_labels

    def relabel(dataset, name):
        dataset = dataset.map(add_response_labels, batched=True, num_proc=num_proc)
        kept = dataset.filter(lambda row: any(label != IGNORE_INDEX for label in row["labels"]), num_proc=num_proc)
        if len(kept) == 0:
            raise UsageError(f"train_on_responses_only: no row of {name} contains response_part {response_part!r}; "
                             "pass the markers your chat template writes (or neither, to read them from it)")
        if len(kept) < len(dataset):
            log.info(f"nbddp: dropped {len(dataset) - len(kept)} of {len(dataset)} rows of {name} with no response to "
                     "train on")
        return kept

    trainer.train_dataset = relabel(trainer.train_dataset, "train_dataset")
    if isinstance(trainer.eval_dataset, dict):
        trainer.eval_dataset = {key: relabel(split, f"eval_dataset[{key!r}]") for key, split in trainer.eval_dataset.items()}
    elif trainer.eval_dataset is not None:
        trainer.eval_dataset = relabel(trainer.eval_dataset, "eval_dataset")
    return trainer


def _marker(text: str, name: str, tokenizer, force_match: bool) -> Marker:
    marker = marker_tokens(text, tokenizer, force_match)
    if not marker.core:
        retry = "" if force_match else ", or force_match=True"
        raise UsageError(f"train_on_responses_only: {name} {text!r} gives no token ids to match; pass another "
                         f"marker, or neither marker to read both from the chat template{retry}")
    return marker


def response_labels(input_ids, labels, instruction: Marker, response: Marker, ends, last_response_only=False) -> list[int]:
    """`labels` inside the answers (see the module docstring); IGNORE_INDEX elsewhere."""
    spans = response_spans(list(input_ids), instruction, response, ends)
    masked = [IGNORE_INDEX] * len(input_ids)
    for start, end in spans[-1:] if last_response_only else spans:
        masked[start:end] = labels[start:end]
    return masked


def response_spans(ids: list[int], instruction: Marker, response: Marker, ends) -> list[tuple[int, int]]:
    """(start, end) of each answer in `ids`, by Unsloth's scan (unsloth_zoo's `_train_on_responses_only`)."""
    spans, n, j = [], len(ids), 0
    while j < n:
        if response.at(ids, j):
            start = j = response.extend_right(ids, j + len(response.core))
            while j < n:
                token = ids[j]
                if token == ends.eos_id:  # the answer's EOS is trained on
                    spans.append((start, j + 1))
                    break
                opener = ends.opener
                opens_a_turn = opener and token == opener[0] and tuple(ids[j : j + len(opener)]) == opener
                if token == ends.bos_id or opens_a_turn or response.at(ids, j):
                    spans.append((start, j))
                    j -= 1  # look at this token again: it may start the next answer
                    break
                if j == n - 1 or instruction.at(ids, j):
                    end = instruction.extend_left(ids, j)
                    if end != n - 1:
                        j = instruction.extend_right(ids, j + len(instruction.core)) - 1
                    else:
                        end = n
                    spans.append((start, end))
                    break
                j += 1
        j += 1
    return spans
