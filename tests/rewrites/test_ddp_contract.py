"""The contract between the rooms: every `ddp.<name>` a rewrite can write into a script is an attribute of the
runtime's `DistributedContext`, the object `runtime.setup` returns as `ddp`. Only end-to-end runs would notice a
rewrite that emits a name the runtime lacks, and only for the notebooks they run."""
import ast
import re
from pathlib import Path

from nbddp.runtime.context import DistributedContext

REWRITES = Path(__file__).resolve().parents[2] / "nbddp" / "export" / "rewrites"
IN_TEXT = re.compile(r"\bddp\.([A-Za-z_]\w*)")  # "ddp.main_process_first()", in code a rewrite parses
BUILDERS = {"ddp_call": 0, "is_ddp_call": 1, "wrap_keyword": 2}  # ddp_blocks' helpers: the argument naming it


def emitted_names() -> dict[str, set[str]]:
    """name -> the rewrite modules that write or match `ddp.<name>`."""
    found = {}
    for path in sorted(REWRITES.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = IN_TEXT.findall(node.value)
            elif isinstance(node, ast.Call):
                callee = getattr(node.func, "id", getattr(node.func, "attr", None))
                if callee in BUILDERS and len(node.args) > BUILDERS[callee]:
                    argument = node.args[BUILDERS[callee]]
                    names = [argument.value] if isinstance(argument, ast.Constant) else []
                elif callee == "Attribute":  # cst.Attribute(value=cst.Name("ddp"), attr=cst.Name("device"))
                    keywords = {k.arg: k.value for k in node.keywords}
                    if _name_literal(keywords.get("value")) == "ddp" and _name_literal(keywords.get("attr")):
                        names = [_name_literal(keywords["attr"])]
            for name in names:
                found.setdefault(name, set()).add(path.name)
    return found


def _name_literal(node) -> str | None:
    """"x" of `cst.Name("x")` / `m.Name("x")`."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Name" and node.args:
        first = node.args[0]
        return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
    return None


def test_the_scan_finds_what_the_rewrites_emit():
    names = emitted_names()
    assert {"device_map", "main_process_first", "barrier", "show", "device", "training_args"} <= set(names)


def test_every_ddp_name_a_rewrite_emits_exists_on_the_runtime_object():
    ddp = DistributedContext()  # one process on CPU, as a script without torchrun has it
    missing = {name: sorted(modules) for name, modules in emitted_names().items() if not hasattr(ddp, name)}
    assert missing == {}, f"ddp.<name> written by rewrites but not on DistributedContext: {missing}"
