"""What a notebook's code does, read from its syntax trees: the calls it makes and the literals it passes.

    facts = read_facts(Path("nb/Llama3.1_(8B)-Alpaca.ipynb"))
    "SFTTrainer" in facts.calls, facts.keyword_true("fast_inference"), facts.model_ids, facts.dataset_ids

Each code cell goes through IPython's own input transformer (`!pip`, `%%capture` become Python) and is parsed
alone; a cell that still does not parse (a newer Python's syntax) is left out, so its facts are missing.
"""
import ast
import dataclasses
import json
import re
from pathlib import Path

from IPython.core.inputtransformer2 import TransformerManager

# `load_dataset("csv", data_files=...)` names a builder, not a dataset on the hub.
DATASET_BUILDERS = frozenset({"csv", "json", "parquet", "text", "arrow", "pandas", "imagefolder", "audiofolder",
                              "videofolder", "webdataset", "sql"})
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
URL = re.compile(r"^https?://[^\s/]+/\S+$")  # a string that is a whole URL with a path: what a cell may fetch
VIDEO_NAMES = frozenset({"video_token", "video_token_id", "video_processor"})  # an image+video processor's
PINNED = ("transformers", "trl")  # the packages whose pins `pins` reads
PIN = re.compile(rf"(?<![\w-])({'|'.join(PINNED)})==(\d[\w.]*)")  # in an install cell: `!pip install trl==0.22.2`


@dataclasses.dataclass
class NotebookFacts:
    calls: set[str]  # called names, bare and dotted: "SFTTrainer", "from_pretrained", "FastVisionModel.from_pretrained"
    names: set[str]  # every name and attribute the code reads: "AutoModelForSequenceClassification", "SNAC"
    keywords: dict[str, list]  # keyword argument name -> the literal values passed for it (non-literals left out)
    strings: list[str]  # every string literal
    model_ids: list[str]  # hub-style ids the notebook loads a model or tokenizer from, in order of appearance
    dataset_ids: list[str]  # hub ids passed to load_dataset, in order of appearance
    pins: dict[str, str]  # package -> the version the install cell pins: {"transformers": "4.56.2", "trl": "0.22.2"}
    chat_templates: list[str]  # the templates get_chat_template is given: get_chat_template(processor, "gemma-3")
    auto_models: list[str]  # the classes from_pretrained is given as auto_model: ["AutoModelForCausalLM"]
    urls: list[str]  # the string literals that are http(s) URLs with a path, in order, without repeats

    def keyword_true(self, name: str) -> bool:
        return True in self.keywords.get(name, [])

    def loads_vision_model(self) -> bool:
        """FastVisionModel, or Unsloth's vision collator (which a FastModel notebook uses on images)."""
        return "FastVisionModel.from_pretrained" in self.calls or "UnslothVisionDataCollator" in self.names

    def uses_video(self) -> bool:
        """Reads a processor's video attributes (`processor.video_token`, `.video_token_id`, `.video_processor`) or
        writes a `{"type": "video"}` part: an image+video model's notebook."""
        return bool(VIDEO_NAMES & self.names) or "video" in self.strings

    def trains_with_a_trainer(self) -> bool:
        """A `<...trainer...>.train()` call: `trainer.train()`, `grpo_trainer.train()`."""
        return any(call.endswith(".train") and "trainer" in call.lower() for call in self.calls)

    def pins_old_stack(self) -> bool:
        """The install cell pins Transformers 4.x or TRL 0.x: the notebook was written for the stack of
        requirements-notebooks.txt (TRL's config keywords changed most across its 1.0)."""
        return self.pins.get("transformers", "").startswith("4.") or self.pins.get("trl", "").startswith("0.")

    def pins_all(self, pins: dict[str, str]) -> bool:
        """The install cell pins each of `pins` (package -> version) to that version: the sweep's --stack fits."""
        return all(self.pins.get(package) == version for package, version in pins.items())

    def mentions(self, text: str) -> bool:
        return any(text in string for string in self.strings)


def code_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [_source(cell) for cell in cells if cell.get("cell_type") == "code"]


def read_facts(notebook: Path) -> NotebookFacts:
    facts = NotebookFacts(set(), set(), {}, [], [], [], {}, [], [], [])
    transformer = TransformerManager()
    assigned, loaded = {}, []  # variable -> the strings assigned to it; variables a loader was given
    for source in code_cells(notebook):
        try:
            tree = ast.parse(transformer.transform_cell(source))
        except SyntaxError:
            continue
        _collect(tree, facts, assigned, loaded)
    for string in facts.strings:
        for package, version in PIN.findall(string):
            facts.pins.setdefault(package, version)
    facts.urls = [string for string in dict.fromkeys(facts.strings) if URL.match(string)]
    for variable in loaded:  # MODEL_ID = "unsloth/Qwen3-0.6B"; from_pretrained(model_name = MODEL_ID)
        for value in assigned.get(variable, []):
            _add_id(facts.model_ids, value)
    return facts


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _collect(tree: ast.AST, facts: NotebookFacts, assigned: dict[str, list[str]], loaded: list[str]) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            facts.strings.append(node.value)
        elif isinstance(node, ast.Name):
            facts.names.add(node.id)
        elif isinstance(node, ast.Attribute):
            facts.names.add(node.attr)
        elif isinstance(node, ast.Call):
            loaded += _collect_call(node, facts)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and (value := _literal_string(node.value)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(value)
                    if target.id.lower().endswith("model_name"):
                        _add_id(facts.model_ids, value)


def _collect_call(node: ast.Call, facts: NotebookFacts) -> list[str]:
    """Record the call; return the variables it loads a model from (`from_pretrained(MODEL_ID)`)."""
    name = _dotted(node.func)
    if name is None:
        return []
    facts.calls.add(name)
    facts.calls.add(name.rsplit(".", 1)[-1])
    for keyword in node.keywords:
        if keyword.arg is not None:
            try:
                facts.keywords.setdefault(keyword.arg, []).append(ast.literal_eval(keyword.value))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
    first = _literal_string(node.args[0]) if node.args else None
    if name.rsplit(".", 1)[-1] == "get_chat_template":
        given = [k.value for k in node.keywords if k.arg == "chat_template"] + node.args[1:2]
        facts.chat_templates += [value for value in map(_literal_string, given) if value]
    if name.endswith("from_pretrained"):
        facts.auto_models += [class_name for k in node.keywords if k.arg == "auto_model"
                              if (class_name := _dotted(k.value)) and class_name not in facts.auto_models]
        keyword_names = ("model_name", "pretrained_model_name_or_path")
        given = [k.value for k in node.keywords if k.arg in keyword_names] + node.args[:1]
        for value in given:
            _add_id(facts.model_ids, _literal_string(value))
        return [value.id for value in given if isinstance(value, ast.Name)]
    if name.rsplit(".", 1)[-1] == "load_dataset":
        keyword_path = next((_literal_string(k.value) for k in node.keywords if k.arg == "path"), None)
        dataset = first or keyword_path
        if dataset not in DATASET_BUILDERS:
            _add_id(facts.dataset_ids, dataset)
    return []


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain; for a call on anything else (`x().f`), its last attribute."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return None


def _literal_string(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _add_id(ids: list[str], value: str | None) -> None:
    if value and HUB_ID.match(value) and value not in ids:
        ids.append(value)
