"""`to_sharegpt` and the dataset-level `apply_chat_template` on the hf backend (nbddp/fallback/sharegpt.py),
against Unsloth's own functions: their source in the pinned wheel's unsloth/chat_templates.py, run without the
rest of Unsloth (which needs a GPU)."""
import ast
import logging
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from datasets import Dataset

from nbddp.errors import UsageError
from nbddp.runtime import backend as backends
from nbddp.fallback import sharegpt
from tools.extract_chat_templates import SOURCE, download_wheel, pinned_version

TINY_CHAT = Path(__file__).resolve().parents[2] / "models" / "tiny-chat"
UNSLOTH_FUNCTIONS = ("_escape_jinja_literal", "_column_names_in", "_parse_combined_prompt", "_create_formatter",
                     "to_sharegpt", "get_ollama_eos_tokens", "construct_chat_template", "apply_chat_template")
ALPACA = Dataset.from_dict({
    "instruction": ["Add the numbers.", "Name a colour.", "Say hi.", "Count to three."],
    "input": ["2 and 3", "", None, "starting at one"],
    "output": ["5", "Blue.", "Hi!", "1, 2, 3"],
})
MERGED_PROMPT = "{instruction}[[\nYour input is:\n{input}]]"
# Llama3_(8B)-Ollama's template: one example, read by Unsloth's fallback search
NOTEBOOK_TEMPLATE = """Below are some instructions that describe some tasks. Write responses that appropriately complete each request.

### Instruction:
{INPUT}

### Response:
{OUTPUT}"""
CHATML_TEMPLATE = """<|im_start|>system
{SYSTEM}<|im_end|>
<|im_start|>user
{INPUT}<|im_end|>
<|im_start|>assistant
{OUTPUT}<|im_end|>
<|im_start|>user
{INPUT}<|im_end|>
<|im_start|>assistant
{OUTPUT}<|im_end|>
"""
TEMPLATES = [NOTEBOOK_TEMPLATE, CHATML_TEMPLATE, sharegpt.LLAMA3_TEMPLATE, "{SYSTEM}\nUSER: {INPUT}\nASSISTANT: {OUTPUT}\n",
             "Q: {INPUT}\nA: {OUTPUT}\n\nQ: {INPUT}\nA: {OUTPUT}\n\n",
             "USER: {INPUT}\nASSISTANT: {OUTPUT}\nUSER: {INPUT}\nASSISTANT: {OUTPUT}\n  "]  # the last: both refuse it


@pytest.fixture(scope="module")
def unsloth_functions(tmp_path_factory):
    """Unsloth's own to_sharegpt & co., executed from the pinned wheel's source."""
    try:
        wheel = download_wheel(pinned_version(), tmp_path_factory.mktemp("wheel"))
    except subprocess.CalledProcessError:
        pytest.skip(f"pip could not download unsloth=={pinned_version()}: no package index reachable")
    with zipfile.ZipFile(wheel) as archive:
        body = ast.parse(archive.read(SOURCE).decode("utf-8")).body
    wanted = [node for node in body if (isinstance(node, ast.FunctionDef) and node.name in UNSLOTH_FUNCTIONS)
              or (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) in ("_ESCAPED_BRACES_RE", "_COLUMN_RE"))]
    from transformers import ProcessorMixin

    namespace = {"re": re, "logger": logging.getLogger("unsloth"), "ProcessorMixin": ProcessorMixin}
    exec(compile(ast.Module(wanted, type_ignores=[]), SOURCE, "exec"), namespace)
    assert set(UNSLOTH_FUNCTIONS) <= set(namespace)
    return namespace


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_CHAT)


@pytest.mark.parametrize("options", [
    {"merged_prompt": MERGED_PROMPT, "conversation_extension": 3},
    {"merged_prompt": "[[Input: {input}\n]]Do: {instruction}", "remove_unused_columns": False},
    {"merged_column_name": "instruction", "output_column_name": "output", "conversation_extension": 2,
     "remove_unused_columns": False},
])
def test_to_sharegpt_gives_unsloths_rows(unsloth_functions, options):
    ours = sharegpt.to_sharegpt(ALPACA, **options)
    assert ours.to_list() == unsloth_functions["to_sharegpt"](ALPACA, **options).to_list()
    assert ours.num_rows == ALPACA.num_rows


def test_to_sharegpt_merges_the_optional_part_only_where_its_column_has_text():
    rows = sharegpt.to_sharegpt(ALPACA, merged_prompt=MERGED_PROMPT)["conversations"]
    assert rows[0] == [{"from": "human", "value": "Add the numbers.\nYour input is:\n2 and 3"}, {"from": "gpt", "value": "5"}]
    assert rows[1][0]["value"] == "Name a colour." and rows[2][0]["value"] == "Say hi."


@pytest.mark.parametrize("template", TEMPLATES)
def test_construct_chat_template_gives_unsloths_template_and_modelfile(unsloth_functions, template):
    def outcome(construct, refusal):
        try:
            return construct(tokenizer(), template)
        except refusal:
            return "refused"

    ours = outcome(sharegpt.construct_chat_template, UsageError)
    assert ours == outcome(unsloth_functions["construct_chat_template"], RuntimeError)
    assert (ours == "refused") == (template == TEMPLATES[-1])


def test_apply_chat_template_renders_the_conversations_as_unsloths_does(unsloth_functions):
    chats = sharegpt.to_sharegpt(ALPACA, merged_prompt=MERGED_PROMPT, conversation_extension=2)
    from nbddp.fallback.chat_templates import standardize_sharegpt

    chats = standardize_sharegpt(chats)
    ours, theirs = tokenizer(), tokenizer()
    texts = sharegpt.apply_chat_template(chats, tokenizer=ours, chat_template=NOTEBOOK_TEMPLATE)["text"]
    assert texts == unsloth_functions["apply_chat_template"](chats, tokenizer=theirs, chat_template=NOTEBOOK_TEMPLATE)["text"]
    assert texts[0].startswith("<s>Below are some instructions") and "### Response:\n5</s>" in texts[0]
    assert ours.chat_template == theirs.chat_template and ours._ollama_modelfile == theirs._ollama_modelfile


def test_a_template_without_output_is_bad_input():
    with pytest.raises(UsageError, match=r"chat_template must contain \{OUTPUT\}"):
        sharegpt.construct_chat_template(tokenizer(), "### Instruction:\n{INPUT}\n")
    with pytest.raises(UsageError, match="'nope' but this does not exist in the dataset"):
        sharegpt.to_sharegpt(ALPACA, merged_prompt="{nope}")


@pytest.fixture
def hf_backend_active(monkeypatch, backend_patches_undone_after):
    for name in ("unsloth", "unsloth.chat_templates"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    backends.activate("hf")


def test_the_notebook_imports_them_from_unsloth(hf_backend_active):
    from unsloth import apply_chat_template, standardize_sharegpt, to_sharegpt
    from unsloth.chat_templates import remove_special_tokens

    assert to_sharegpt is sharegpt.to_sharegpt and apply_chat_template is sharegpt.apply_chat_template
    dataset = apply_chat_template(standardize_sharegpt(to_sharegpt(ALPACA, merged_prompt=MERGED_PROMPT)),
                                  tokenizer=tokenizer(), chat_template=NOTEBOOK_TEMPLATE)
    assert "text" in dataset.column_names
    assert remove_special_tokens(tokenizer(), "<s>Hi") == "Hi"
