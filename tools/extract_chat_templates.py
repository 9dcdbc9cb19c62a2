"""Write nbddp/fallback/unsloth_chat_templates.json: Unsloth's table of chat templates, read from its wheel.

The hf backend's `get_chat_template` (nbddp/fallback/chat_templates.py) reads that file, so its templates are
Unsloth's own text, never retyped. The wheel is the `unsloth==` pin of pyproject.toml's `unsloth` extra:

    python tools/extract_chat_templates.py                 # pip-download that wheel, rewrite the json
    python tools/extract_chat_templates.py --wheel W.whl   # read a wheel already on disk
    python tools/extract_chat_templates.py --check         # exit 1 if the committed json is not what it writes

unsloth/chat_templates.py builds the table when imported (`CHAT_TEMPLATES[name] = (template, stop_word,
map_eos_token, ollama_modelfile)`, `DEFAULT_SYSTEM_MESSAGE[name] = ...`), partly by string operations, and importing
it needs Unsloth's GPU stack. So its module-level statements from `CHAT_TEMPLATES = {}` up to `def get_chat_template`
run alone, without the functions among them, and `_ollama_template` (Ollama Modelfiles, not kept) returns None. A
statement that needs anything else stops this script with a NameError: read the new module and update the script.
"""
import argparse
import ast
import json
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "nbddp" / "fallback" / "unsloth_chat_templates.json"
SOURCE = "unsloth/chat_templates.py"


def pinned_version(pyproject=REPO / "pyproject.toml") -> str:
    """The version in `unsloth==VERSION` of pyproject.toml's `unsloth` extra."""
    extra = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]["unsloth"]
    (version,) = [requirement.split("==", 1)[1] for requirement in extra if requirement.startswith("unsloth==")]
    return version


def download_wheel(version: str, directory: Path) -> Path:
    """`pip download unsloth==version --no-deps` into `directory`; the wheel's path."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", f"unsloth=={version}", "--no-deps", "--only-binary", ":all:",
         "--quiet", "--dest", str(directory)],
        check=True,
    )
    (wheel,) = directory.glob(f"unsloth-{version}-*.whl")
    return wheel


def table_namespace(source: str) -> dict:
    """The module-level names that unsloth/chat_templates.py's table statements define."""
    body = ast.parse(source).body
    start = next(i for i, node in enumerate(body) if isinstance(node, ast.Assign)
                 and ast.unparse(node.targets[0]) == "CHAT_TEMPLATES")
    end = next(i for i, node in enumerate(body) if isinstance(node, ast.FunctionDef) and node.name == "get_chat_template")
    statements = [node for node in body[start:end] if not isinstance(node, ast.FunctionDef)]
    namespace = {"_ollama_template": lambda name: None}
    exec(compile(ast.Module(statements, type_ignores=[]), SOURCE, "exec"), namespace)
    return namespace


def extract(wheel: Path) -> dict:
    """The json's content: each name's template (stored once per distinct text), stop word and flags."""
    version = wheel.name.split("-")[1]  # unsloth-VERSION-py3-none-any.whl
    with zipfile.ZipFile(wheel) as archive:
        namespace = table_namespace(archive.read(SOURCE).decode("utf-8"))
    texts, chat_templates = {}, {}
    for name, (template, stop_word, map_eos_token, _ollama) in namespace["CHAT_TEMPLATES"].items():
        token_mapping = None
        if isinstance(stop_word, tuple):  # gemma_chatml: ({old token: new token}, stop word)
            token_mapping, stop_word = stop_word
        key = next((known for known, text in texts.items() if text == template), name)
        texts[key] = template
        chat_templates[name] = {
            "template": key,
            "stop_word": stop_word,
            "token_mapping": token_mapping,
            "map_eos_token": map_eos_token,
            "default_system_message": namespace["DEFAULT_SYSTEM_MESSAGE"][name],
        }
    return {
        "unsloth_version": version,
        "source": SOURCE,
        "chat_templates": chat_templates,
        "templates": texts,
        # Used instead of the gemma-4 templates when the tokenizer's own template primes an empty thought channel.
        "gemma4_empty_thought": {
            "names": list(namespace["GEMMA4_TEMPLATE_NAMES"]),
            "template": namespace["gemma4_empty_thought_template"],
        },
    }


def dump_json(value) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="the unsloth wheel to read (default: pip-download the pinned one)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the json to write (default {OUT.relative_to(REPO)})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if --out differs")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        text = dump_json(extract(args.wheel or download_wheel(pinned_version(), Path(scratch))))
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
        if current != text:
            print(f"{args.out} differs from what {Path(__file__).name} writes now", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8", newline="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
