"""The hf backend's dataset helpers of `unsloth.chat_templates`: `to_sharegpt` and the dataset-level
`apply_chat_template`, ported from Unsloth 2026.10.9 (unsloth/chat_templates.py) with its results:

    dataset = to_sharegpt(dataset, merged_prompt="{instruction}[[\\nYour input is:\\n{input}]]",
                          output_column_name="output", conversation_extension=3)
    dataset = standardize_sharegpt(dataset)
    dataset = apply_chat_template(dataset, tokenizer=tokenizer, chat_template=ALPACA_LIKE)  # a "text" column

- `to_sharegpt` merges columns into one instruction by `merged_prompt` (`{column}`s; a `[[...]]` part is left out
  where its first column is empty), writes each row as a ShareGPT human/gpt pair in "conversations", and with
  `conversation_extension=N` appends to each row the rows of N-1 seeded shuffles of the dataset.
- `construct_chat_template` turns a template written with `{SYSTEM}`, `{INPUT}` and `{OUTPUT}` (two example turns,
  or one, which Unsloth's fallback search reads) into a Jinja chat template and an Ollama Modelfile; the EOS token is
  appended to the answers when the template ends none with it.
- `apply_chat_template(dataset, tokenizer, chat_template)` sets that template on the tokenizer (and its Modelfile as
  `tokenizer._ollama_modelfile`) and renders each row's "conversations" into "text".

Unsloth's errors are bad input here (UsageError, naming the argument); its messages are kept.
"""
import logging
import re

from nbddp.errors import DataError, UsageError

logger = logging.getLogger(__name__)

# The prompt is rendered with str.format, so `{{` / `}}` are literal braces, not columns.
ESCAPED_BRACES = re.compile(r"\{\{|\}\}")
COLUMN = re.compile(r"\{(.+?)\}")

LLAMA3_TEMPLATE = """<|begin_of_text|><|start_header_id|>system<|end_header_id|>

{SYSTEM}<|eot_id|><|start_header_id|>user<|end_header_id|>

{INPUT}<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{OUTPUT}<|eot_id|><|start_header_id|>user<|end_header_id|>

{INPUT}<|eot_id|><|start_header_id|>assistant<|end_header_id|>

{OUTPUT}<|eot_id|>"""
DEFAULT_SYSTEM_MESSAGE = \
    "Below are some instructions that describe some tasks. Write responses that appropriately complete each request."
TWO_EXAMPLES = (
    "Unsloth: Your prompt template must have 2 examples showing the user input {INPUT} and the assistant output "
    "{OUTPUT}\n\nFor example what is not allowed is just:\n### Input:\\n{INPUT}\\n\\n### Response:\\n{OUTPUT}\\n\n\n"
    "What is required is 2x of this:\n### Input:\\n{INPUT}\\n\\n### Response:\\n{OUTPUT}\\n"
    "### Input:\\n{INPUT}\\n\\n### Response:\\n{OUTPUT}\\n")


def escape_jinja_literal(text: str) -> str:
    """`text` as the inside of a quoted Jinja string literal (chat_templates' templates use it too)."""
    return text.replace("\\", "\\\\").replace("'", "\\'").replace('"', '\\"').replace("\r", "\\r")


def _column_names_in(text: str) -> list[str]:
    return COLUMN.findall(ESCAPED_BRACES.sub("", text))


def _parse_combined_prompt(combined_prompt: str, dataset):
    """(the columns `combined_prompt` names, its pieces: plain text, or ((start, end), "[[...]]") optional parts)."""
    possible_columns = _column_names_in(combined_prompt)
    dataset_columns = set(dataset.column_names)
    for column in possible_columns:
        if column not in dataset_columns:
            raise UsageError(f"to_sharegpt: merged_prompt includes '{column}' but this does not exist in the "
                             f"dataset. Only allowed columns are {list(dataset_columns)}")
    optional = [(match.span(), match.group(0))
                for match in re.finditer(r"\[\[.+?\]\]", combined_prompt, flags=re.DOTALL | re.MULTILINE)]
    if not optional:
        return possible_columns, [combined_prompt]
    pieces = []
    if optional[0][0][0] != 0:
        pieces.append(combined_prompt[: optional[0][0][0]])
    for left, right in zip(optional[:-1], optional[1:]):
        pieces.append(left)
        if left[0][1] != right[0][0]:
            pieces.append(combined_prompt[left[0][1] : right[0][0]])
    pieces.append(optional[-1])
    if optional[-1][0][1] != len(combined_prompt):
        pieces.append(combined_prompt[optional[-1][0][1] :])
    return possible_columns, pieces


def _create_formatter(possible_columns, pieces, user_column_name):
    """The batch function that writes the merged prompt of each row into `user_column_name`."""
    columns = list(dict.fromkeys(possible_columns))
    parts, templates = [], []
    for j, piece in enumerate(pieces):
        if isinstance(piece, str):
            templates.append(("required", _column_names_in(piece)))
            parts.append(piece)
            continue
        prompt = piece[1][2:-2]
        needed = _column_names_in(prompt)
        if not needed:
            raise UsageError("to_sharegpt: an optional [[...]] block of merged_prompt must contain at least 1 {column}")
        name = f"__optional_{j}__"
        templates.append(("optional", name, prompt, needed))
        parts.append("{" + name + "}")
    merged_prompt = "".join(parts)

    def combined_prompt(examples):
        first_key = next(iter(examples.keys()), None)
        if first_key is None:
            return {user_column_name: []}
        texts = []
        for row in range(len(examples[first_key])):
            # a missing (None) value is "", not the word "None"
            values = {column: "" if (value := examples[column][row]) is None else value for column in columns}
            formatted = {}
            for template in templates:
                if template[0] == "required":
                    formatted.update({column: values[column] for column in template[1]})
                    continue
                _, name, prompt, needed = template
                formatted[name] = prompt.format(**{c: values[c] for c in needed}) if values[needed[0]] != "" else ""
            texts.append(merged_prompt.format(**formatted))
        return {user_column_name: texts}

    return combined_prompt


def to_sharegpt(
    dataset,
    merged_prompt="",
    merged_column_name="instruction",
    output_column_name="output",
    remove_unused_columns=True,
    conversation_extension=1,
    random_state=3407,
):
    """`dataset` as ShareGPT conversations (one human and one gpt turn per row, or `conversation_extension` rows
    packed into one); see the module docstring."""
    from datasets import concatenate_datasets

    if "conversations" in dataset.column_names and isinstance(dataset[0]["conversations"], list):
        raise UsageError("to_sharegpt: the dataset is probably already in ShareGPT format (its 'conversations' "
                         "column holds lists); pass it to standardize_sharegpt instead")
    if merged_prompt:
        possible_columns, pieces = _parse_combined_prompt(merged_prompt, dataset)
        dataset = dataset.map(_create_formatter(possible_columns, pieces, merged_column_name), batched=True,
                              desc="Merging columns")
    elif merged_column_name not in dataset.column_names:
        raise UsageError(f"to_sharegpt needs an input column named '{merged_column_name}', but the dataset has "
                         f"{dataset.column_names}. Pass `merged_column_name` to name the existing column, or "
                         "`merged_prompt` to build the input from several")

    def as_sharegpt(examples):
        users, assistants = examples[merged_column_name], examples[output_column_name]
        return {"conversations": [
            [{"from": "human", "value": "" if user is None else str(user)},
             {"from": "gpt", "value": "" if assistant is None else str(assistant)}]
            for user, assistant in zip(users, assistants)]}

    dataset = dataset.map(as_sharegpt, batched=True, desc="Converting to ShareGPT",
                          remove_columns=dataset.column_names if remove_unused_columns else None)
    n_extensions = max(conversation_extension - 1, 0)
    if n_extensions == 0:
        return dataset
    dataset = dataset.rename_columns({"conversations": "conversations0"})
    copies = [dataset]
    for j in range(1, n_extensions + 1):
        shuffled = dataset.shuffle(seed=random_state + j).rename_columns({"conversations0": f"conversations{j}"})
        copies.append(shuffled.select_columns([f"conversations{j}"]))  # the other columns stay on copy 0
    dataset = concatenate_datasets(copies, axis=1)
    conversation_columns = [f"conversations{j}" for j in range(n_extensions + 1)]

    def combine(examples):
        return {"conversations": [[turn for conversation in conversations for turn in conversation]
                                  for conversations in zip(*(examples[c] for c in conversation_columns))]}

    return dataset.map(combine, batched=True, desc="Extending conversations",
                       remove_columns=dataset.column_names if remove_unused_columns else conversation_columns)


def get_ollama_eos_tokens(tokenizer, extra_eos_tokens=()) -> list[str]:
    """The stop words of the Modelfile: the tokenizer's added tokens but BOS, families of numbered ones by their
    shared prefix, and `extra_eos_tokens`."""
    extra_eos_tokens = list(extra_eos_tokens)
    skip = set(extra_eos_tokens)
    # longest first, never through a set: the loop below rewrites the joined text as it goes
    added = sorted((token for token in dict.fromkeys(map(str, tokenizer.added_tokens_decoder.values()))
                    if token not in skip), key=len, reverse=True)
    if getattr(tokenizer, "bos_token", None) is not None:
        added = [token for token in added if token != tokenizer.bos_token]
    repeated = []
    joined = "\x01\x00".join(added)
    for token in added:
        n = len(token)
        count = joined.count(token[: n // 2])
        if count > 2:  # longer than half the token: <|reserved_special_token_0|> vs _1|>
            for j in range(n // 2 + 1, n):
                if joined.count(token[:j]) < count:
                    j -= 1
                    joined = joined.replace(token[:j], "")
                    repeated.append(token[:j])
                    break
    final = [old for old, new in zip(added, joined.split("\x01\x00")) if old == new] + extra_eos_tokens + repeated
    return [token for token in final
            if not (token.count("\n") == len(token) or token.count("\u2581") == len(token)
                    or (token.startswith("<") and len(token) <= 2) or (token.startswith("</") and len(token) == 3))]


def construct_chat_template(tokenizer=None, chat_template=LLAMA3_TEMPLATE,
                            default_system_message=DEFAULT_SYSTEM_MESSAGE, extra_eos_tokens=None):
    """(Ollama Modelfile, Jinja chat template, instruction part, response part) of a `{SYSTEM}`/`{INPUT}`/`{OUTPUT}`
    template (see the module docstring)."""
    from transformers import ProcessorMixin

    chat_template = chat_template.lstrip()  # trailing whitespace may belong to the repeated example
    if tokenizer is None:
        raise UsageError("apply_chat_template: pass tokenizer=, the tokenizer the template is for")
    if isinstance(tokenizer, ProcessorMixin):
        tokenizer = tokenizer.tokenizer
    original_extra_eos_tokens = [] if extra_eos_tokens is None else [extra_eos_tokens] \
        if isinstance(extra_eos_tokens, str) else list(extra_eos_tokens)
    extra_eos_tokens = _eos_tokens(tokenizer, original_extra_eos_tokens, chat_template)
    count_eos = sum(len(re.findall(r"{OUTPUT}" + re.escape(eos), chat_template)) for eos in extra_eos_tokens)
    try:
        system_part, input_part, output_part = _two_examples(chat_template, extra_eos_tokens)
    except UsageError:
        stripped = chat_template.rstrip()  # accidental trailing whitespace (Unsloth #992): retry once without it
        if stripped != chat_template:
            try:
                return construct_chat_template(tokenizer=tokenizer, chat_template=stripped,
                                               default_system_message=default_system_message,
                                               extra_eos_tokens=original_extra_eos_tokens)
            except UsageError:
                pass
        system_part, input_part, output_part = _one_example(chat_template)
    if count_eos == 0:
        logger.warning("Unsloth: We automatically added an EOS token to stop endless generations.")
        output_part = output_part + extra_eos_tokens[0]

    always_bos_token = tokenizer("A").input_ids[0] == getattr(tokenizer, "bos_token_id", None)
    has_bos_token = always_bos_token and system_part.startswith(tokenizer.bos_token)
    modelfile = _ollama_modelfile(tokenizer, system_part[len(tokenizer.bos_token):] if has_bos_token else system_part,
                                  input_part, output_part, extra_eos_tokens)
    jinja_template, system_line = _jinja_template(tokenizer, system_part, input_part, output_part,
                                                  default_system_message, has_bos_token, always_bos_token)
    input_index, output_index = input_part.find("{INPUT}"), output_part.find("{OUTPUT}")
    if input_index == -1 or output_index == -1:
        raise UsageError(f"apply_chat_template: the {'instruction' if input_index == -1 else 'response'} section of "
                         f"the template must contain the {'{INPUT}' if input_index == -1 else '{OUTPUT}'} placeholder")
    return modelfile + system_line, jinja_template, input_part[:input_index], output_part[:output_index]


def _eos_tokens(tokenizer, extra_eos_tokens: list, chat_template: str) -> list[str]:
    """The tokens that end a response: the tokenizer's EOS first, then `extra_eos_tokens` (each must be one token),
    and Llama-3 instruct's <|eot_id|>; UsageError when there is none, or one is not a token."""
    vocab = tokenizer.get_vocab()
    for extra_eos in extra_eos_tokens:
        if not isinstance(extra_eos, str) or extra_eos not in vocab:
            raise UsageError(f"apply_chat_template: extra_eos_tokens' {extra_eos!r} is not a single token of the "
                             "tokenizer")
    tokens = ([tokenizer.eos_token] if tokenizer.eos_token is not None else []) + list(extra_eos_tokens)
    if not tokens:
        raise UsageError("apply_chat_template: the tokenizer has no EOS token; give one in extra_eos_tokens=")
    tokenizer_name = tokenizer.name_or_path.lower()
    if tokenizer_name.startswith(("unsloth/llama-3-8b-instruct", "unsloth/llama-3-70b-instruct")):
        tokens.append("<|eot_id|>")
    elif ("<|eot_id|>" in tokens or "<|eot_id|>" in chat_template) and \
            tokenizer_name.startswith(("unsloth/llama-3-8b", "unsloth/llama-3-70b")):
        logger.warning("Unsloth: Base llama-3 models did not train <|eot_id|>.\n"
                       "Please use the instruct version or use <|end_of_text|>")
    return list(dict.fromkeys(tokens))  # not a set: the first is the EOS appended to a response without one


def _ollama_modelfile(tokenizer, system_part, input_part, output_part, eos_tokens) -> str:
    """Ollama's Modelfile for the parts (the system part without its BOS token)."""
    if "{SYSTEM}" in system_part:
        system_modelfile = "{{ if .System }}" + system_part.replace("{SYSTEM}", "{{ .System }}") + "{{ end }}"
    else:
        system_modelfile = system_part
    input_modelfile = "{{ if .Prompt }}" + input_part.replace("{INPUT}", "{{ .Prompt }}") + "{{ end }}"
    output_modelfile = output_part.replace("{OUTPUT}", "{{ .Response }}")
    ollama_eos = "\n".join(f'PARAMETER stop "{eos}"' for eos in get_ollama_eos_tokens(tokenizer, eos_tokens))
    ollama_eos += "\nPARAMETER temperature 1.5\nPARAMETER min_p 0.1"  # against gibberish
    return ('FROM {__FILE_LOCATION__}\n\nTEMPLATE """' + system_modelfile + input_modelfile + output_modelfile
            + '"""\n\n' + ollama_eos)


def _jinja_template(tokenizer, system_part, input_part, output_part, default_system_message, has_bos_token,
                    always_bos_token) -> tuple[str, str]:
    """(the Jinja chat template, the Modelfile's SYSTEM line for a default system message, or "")."""
    input_jinja, output_jinja = _jinja_expression(input_part, "{INPUT}"), _jinja_expression(output_part, "{OUTPUT}")
    jinja_template = (
        "{% for message in loop_messages %}"
        "{% if message['role'] == 'user' %}{{ " + input_jinja + " }}"
        "{% elif message['role'] == 'assistant' %}{{ " + output_jinja + " }}"
        "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '" + escape_jinja_literal(output_part[: output_part.find("{OUTPUT}")])
        + "' }}{% endif %}")
    system_line = ""
    if system_part:
        if has_bos_token:  # strip the BOS while raw: an escaped one no longer matches
            system_part = system_part.replace(tokenizer.bos_token, "", 1)
        system_expression = _jinja_expression(system_part, "{SYSTEM}", "messages[0]['content']").replace("{SYSTEM}", "")
        partial_system = ("{% if messages[0]['role'] == 'system' %}{{ " + system_expression + " }}"
                          "{% set loop_messages = messages[1:] %}")
        if default_system_message is not None:
            full_system = escape_jinja_literal(system_part.replace("{SYSTEM}", default_system_message))
            if "{SYSTEM}" in system_part:
                system_line = '\nSYSTEM "' + default_system_message + '"'
            partial_system += "{% else %}{{ '" + full_system + "' }}{% set loop_messages = messages %}{% endif %}"
        elif "{SYSTEM}" in system_part:
            partial_system += "{% else %}{% set loop_messages = messages %}{% endif %}"
        else:  # a static prefix on both branches, so that the collapse below makes it unconditional
            partial_system += "{% else %}{{ " + system_expression + " }}{% set loop_messages = messages %}{% endif %}"
        jinja_template = partial_system + jinja_template
        if has_bos_token:
            jinja_template = "{{ bos_token }}" + jinja_template
    if "{% set loop_messages = messages %}" not in jinja_template:
        jinja_template = jinja_template.replace("{% for message in loop_messages %}",
                                                "{% for message in messages %}", 1)
    jinja_template = re.sub(  # a system part that is the same either way: written once
        r"\{\% if messages\[0\]\['role'\] \=\= 'system' \%\}\{\{ '(.*?)' \}\}"
        r"\{\% set loop\_messages \= messages\[1\:\] \%\}"
        r"\{\% else \%\}\{\{ '\1' \}\}\{\% set loop\_messages \= messages \%\}\{\% endif \%\}"
        r"\{\% for message in loop\_messages \%\}",
        r"{{ '\1' }}{% for message in messages %}", jinja_template, flags=re.MULTILINE | re.DOTALL)
    if always_bos_token and not jinja_template.startswith(("{{ bos_token }}", "{{- bos_token }}")):
        jinja_template = "{{ bos_token }}" + jinja_template
    return jinja_template, system_line


def _two_examples(chat_template: str, eos_tokens: list[str]) -> tuple[str, str, str]:
    """(system, input, output) parts of a template that shows two example turns; UsageError if it does not."""
    j = len(chat_template) - 1  # the longest tail that also occurs earlier: the second example
    at_least_one = False
    while j > 0:
        if chat_template.rfind(chat_template[j:], 0, j) == -1:
            break
        j -= 1
        at_least_one = True
    if j <= 0 or not at_least_one:
        raise UsageError(TWO_EXAMPLES)
    j += 1
    left, right = chat_template[:j], chat_template[j:]
    if right.count("{INPUT}") != 1 or right.count("{OUTPUT}") != 1:
        raise UsageError(TWO_EXAMPLES)
    # regex alternations prefer the first match, so match prefix tokens last
    eos_regex = "|".join(f"(?:{re.escape(eos)})" for eos in sorted(eos_tokens, key=len, reverse=True))
    input_ends = list(re.finditer(r"\{INPUT\}[\s\n]{0,}" + (f"(?:{eos_regex})?" if eos_regex else ""), right))
    if len(input_ends) != 1:
        raise UsageError(TWO_EXAMPLES)
    input_end = input_ends[0].span(0)[1]
    input_part, output_part = right[:input_end], right[input_end:]
    where_system = left.find(input_part)
    system_part = left[: where_system if where_system != -1 else len(left)]
    if system_part + input_part + output_part != left:
        raise UsageError(
            "Unsloth: The prompt template you provided isn't correct. You gave:\n"
            f"{(system_part + input_part + output_part).replace(chr(10), chr(92) + 'n')}\n\n"
            f"But we require the following:\n{left.replace(chr(10), chr(92) + 'n')}")
    return system_part, input_part, output_part


def _one_example(chat_template: str) -> tuple[str, str, str]:
    """(system, input, output) parts read as Unsloth's fallback does: by the text after {OUTPUT}."""
    output_pos, input_pos = chat_template.find("{OUTPUT}"), chat_template.find("{INPUT}")
    if output_pos == -1 or input_pos == -1:
        missing = " and ".join(name for name, pos in (("{INPUT}", input_pos), ("{OUTPUT}", output_pos)) if pos == -1)
        raise UsageError(f"apply_chat_template: chat_template must contain {missing} placeholder(s). "
                         f"Got: {chat_template[:200]!r}")
    ending = re.escape(chat_template[output_pos + len("{OUTPUT}") :])
    found = re.findall("{INPUT}" + ending + "(.+?{OUTPUT}" + ending + ")", chat_template,
                       flags=re.DOTALL | re.MULTILINE)
    if not found:
        raise UsageError("apply_chat_template: could not recover a two-example structure from chat_template. Provide "
                         "exactly two {INPUT}/{OUTPUT} pairs (and optionally {SYSTEM}). "
                         f"Got: {chat_template[:200]!r}")
    response_part = found[0]
    separator = None
    for j in range(1, len(response_part)):
        match = next(re.finditer("(" + re.escape(response_part[:j]) + ").+?\\{INPUT\\}", chat_template,
                                 flags=re.DOTALL | re.MULTILINE), None)
        if match is None:
            break
        separator = match.group(1)
    if separator is None:
        raise UsageError("apply_chat_template: could not locate a separator between examples in chat_template. "
                         "Provide exactly two {INPUT}/{OUTPUT} pairs (and optionally {SYSTEM}). "
                         f"Got: {chat_template[:200]!r}")
    response_start = chat_template.find(response_part)
    start_instruction = max(chat_template[:response_start].rfind(separator), 0)
    instruction_part = chat_template[start_instruction:response_start]
    system_part = chat_template[: chat_template.find(instruction_part + response_part)]
    return system_part, instruction_part, response_part


def _jinja_expression(part: str, which: str, content="message['content']") -> str:
    """`part` as a Jinja expression: its literal pieces quoted, `which` replaced by `content`."""
    part = which.join(escape_jinja_literal(piece) for piece in part.split(which))
    if part.endswith(which):
        part = "'" + part[: part.find(which)] + f"' + {content}"
    elif part.startswith(which):
        part = f"{content} + '" + part[len(which) :] + "'"
    else:
        part = "'" + part.replace(which, f"' + {content} + '") + "'"
    return part[5:] if part.startswith("'' + ") else part


def remove_special_tokens(tokenizer, prompt: str) -> str:
    """`prompt` without the BOS token it starts with (which tokenizing would double)."""
    bos_token = getattr(tokenizer, "bos_token", None)
    return prompt[len(bos_token) :] if bos_token is not None and prompt.startswith(bos_token) else prompt


def apply_chat_template(dataset, tokenizer=None, chat_template=LLAMA3_TEMPLATE,
                        default_system_message=DEFAULT_SYSTEM_MESSAGE, extra_eos_tokens=None):
    """`dataset` with a "text" column: each row's "conversations" rendered with the template that
    `construct_chat_template` makes of `chat_template`, which becomes the tokenizer's (and its processor's)."""
    modelfile, jinja_template, input_part, output_part = construct_chat_template(
        tokenizer=tokenizer, chat_template=chat_template, default_system_message=default_system_message,
        extra_eos_tokens=extra_eos_tokens)
    if "conversations" not in dataset.column_names:
        raise DataError(f"apply_chat_template: the dataset has no 'conversations' column (its columns: "
                        f"{dataset.column_names}); make one with to_sharegpt and standardize_sharegpt first")

    def formatting_prompts_func(examples):
        return {"text": [tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=False)
                         for convo in examples["conversations"]]}

    holders = [tokenizer] + ([tokenizer.tokenizer] if hasattr(tokenizer, "tokenizer") else [])
    for holder in holders:
        holder.chat_template = jinja_template
        holder._ollama_modelfile = modelfile
        holder._unsloth_input_part = input_part
        holder._unsloth_output_part = output_part
    return dataset.map(formatting_prompts_func, batched=True)
