"""The names of the libraries' API that the rewrites recognise live in one module, vocabulary.py: no rewrite defines
a vocabulary name again, repeats a name of another module's name sets in its own, or tests a callee's name for
"Trainer" itself (vocabulary's is_trainer_class and holds_trainer do)."""
import ast
from pathlib import Path

REWRITES = Path(__file__).resolve().parents[2] / "nbddp" / "export" / "rewrites"
VOCABULARY = "vocabulary.py"


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def defined_names(path: Path) -> set[str]:
    """The names a module assigns, or defines a function or class for, at its top level."""
    names = set()
    for node in _module(path).body:
        if isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def name_sets(path: Path) -> dict[str, set[str]]:
    """The strings of each top-level `NAME = {...}` / `(...)` / `[...]` / `frozenset({...})` / `{key: ...}`."""
    found = {}
    for node in _module(path).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "frozenset" and value.args:
            value = value.args[0]
        elements = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
        strings = {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if strings:
            found[node.targets[0].id] = strings
    return found


def trainer_tests(path: Path) -> list[int]:
    """Lines where code (not a docstring) writes the string "Trainer" or "trainer" by itself."""
    module = _module(path)
    docstrings = {id(node.value) for node in ast.walk(module) if isinstance(node, ast.Expr)}
    return [node.lineno for node in ast.walk(module) if isinstance(node, ast.Constant)
            and node.value in ("Trainer", "trainer") and id(node) not in docstrings]


def rewrite_modules() -> list[Path]:
    return [path for path in sorted(REWRITES.glob("*.py")) if path.name != VOCABULARY]


def test_the_scans_see_the_vocabulary():
    assert {"UNSLOTH_LOADERS", "TRAINING_ARGUMENTS", "is_trainer_class", "holds_trainer"} <= defined_names(
        REWRITES / VOCABULARY)
    assert "FastLanguageModel" in name_sets(REWRITES / VOCABULARY)["UNSLOTH_LOADERS"]
    assert trainer_tests(REWRITES / VOCABULARY)  # its own tests write "Trainer" and "trainer"


def test_no_rewrite_defines_a_vocabulary_name_again():
    vocabulary = defined_names(REWRITES / VOCABULARY)
    again = {path.name: sorted(defined_names(path) & vocabulary) for path in rewrite_modules()}
    assert {name: names for name, names in again.items() if names} == {}, "import them from vocabulary.py"


def test_a_recognised_name_is_listed_in_one_module_only():
    owners = {}
    for path in sorted(REWRITES.glob("*.py")):
        for set_name, strings in name_sets(path).items():
            for string in strings:
                owners.setdefault(string, set()).add(f"{path.name}:{set_name}")
    twice = {string: sorted(where) for string, where in owners.items() if len({w.split(":")[0] for w in where}) > 1}
    assert twice == {}, "a name two rewrites recognise belongs in vocabulary.py"


def test_no_rewrite_tests_for_a_trainer_by_name_itself():
    found = {path.name: trainer_tests(path) for path in rewrite_modules()}
    assert {name: lines for name, lines in found.items() if lines} == {}, (
        "use vocabulary.is_trainer_class (class names) or vocabulary.holds_trainer (variable names)")
