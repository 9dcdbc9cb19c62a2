"""The model a generated script will load, read from the script's source at setup, before any of its cells runs.

`--strategy auto` must choose between DDP and FSDP before the backend (and so before the model exists): it reads
the script's first Unsloth loader call (`FastLanguageModel.from_pretrained(...)`, `FastModel`, `FastVisionModel`),
the first `get_peft_model(r=...)` and the first `per_device_train_batch_size=` keyword. An argument is known when
it is a literal, or a name the script binds once (outside functions) to a literal, to nbddp's `ensure_weights(x)`
(which loads x's config: the same model), or as a parameter, whose value is the namespace's (flags applied).
Anything else is computed by a cell, so unknown here. Arguments left out take Unsloth's defaults.
"""
import ast
from dataclasses import dataclass

LOADERS = ("FastLanguageModel", "FastModel", "FastVisionModel")
POSITIONS = ("model_name", "max_seq_length", "dtype", "load_in_4bit", "load_in_8bit")  # Unsloth's from_pretrained
# the arguments that size the model, with Unsloth's defaults (dtype does not: 16-bit training either way), and
# full_finetuning, which FSDP refuses (nbddp.fallback.fsdp.refuse_full_finetuning)
LOADER_ARGUMENTS = {"model_name": None, "max_seq_length": 2048, "load_in_4bit": True, "load_in_8bit": False,
                    "full_finetuning": False}
LORA_R = 16  # get_peft_model's default r


@dataclass(frozen=True)
class PlannedModel:
    """What the script says of its model: the loader call (`loader`, its 1-based script `line`), its `arguments`
    (LOADER_ARGUMENTS' names -> values) and, in `unknown`, for each argument a cell computes, the expression the
    script gives it; the LoRA rank `lora_r` and the `micro_batch` (per_device_train_batch_size), None when not
    known before the cells run."""

    loader: str
    line: int
    arguments: dict
    unknown: dict
    lora_r: int | None
    micro_batch: int | None


def planned_model(source: str, namespace: dict) -> PlannedModel | None:
    """The model `source` (a generated script's text) loads first, resolved against `namespace` (its globals
    after the parameters cell); None when it has no Unsloth loader call."""
    tree = ast.parse(source)
    calls = [node for node in _outside_functions(tree) if isinstance(node, ast.Call)]
    loader = next((call for call in calls if _is_loader(call)), None)
    if loader is None:
        return None
    bindings = _bindings(tree)
    given = dict(zip(POSITIONS, loader.args)) | {keyword.arg: keyword.value for keyword in loader.keywords}
    splat = given.pop(None, None)  # **kwargs: may hold any argument left out
    arguments, unknown = {}, {}
    for name, default in LOADER_ARGUMENTS.items():
        node = given.get(name)
        if node is None and splat is None:
            arguments[name] = default
            continue
        known, value = _resolve(node, bindings, namespace) if node is not None else (False, None)
        if known:
            arguments[name] = value
        else:  # computed by a cell
            unknown[name] = ast.unparse(node) if node is not None else "**" + ast.unparse(splat)
    peft = next((call for call in calls if _called(call) == "get_peft_model"), None)
    r = (_keyword(peft, "r") if peft else None) or ast.Constant(LORA_R)
    batch = next(filter(None, (_keyword(call, "per_device_train_batch_size") for call in calls)), None)
    lora_r, micro_batch = (_resolve(node, bindings, namespace) if node else (False, None) for node in (r, batch))
    return PlannedModel(f"{loader.func.value.id}.from_pretrained", loader.lineno, arguments, unknown,
                        lora_r[1] if lora_r[0] else None, micro_batch[1] if micro_batch[0] else None)


def _keyword(call: ast.Call, name: str):
    return next((keyword.value for keyword in call.keywords if keyword.arg == name), None)


def _is_loader(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "from_pretrained" and isinstance(func.value, ast.Name)
            and func.value.id in LOADERS)


def _called(call: ast.Call) -> str | None:
    """The name a call calls: `f(...)` and `x.f(...)` both "f"."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _outside_functions(tree):
    """Every node of `tree` but those inside function and class bodies and lambdas, in source order."""
    pending = [tree]
    while pending:
        node = pending.pop(0)
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            pending[:0] = list(ast.iter_child_nodes(node))


def _bindings(tree) -> dict[str, list]:
    """name -> what binds it outside functions: the value of each `name = value`, None for any other binding."""
    found, simple = {}, set()  # simple: the target nodes of `name = value`, counted with their value
    for node in _outside_functions(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found.setdefault(node.targets[0].id, []).append(node.value)
            simple.add(id(node.targets[0]))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in simple:
            found.setdefault(node.id, []).append(None)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(None)
        elif isinstance(node, ast.alias):
            found.setdefault((node.asname or node.name).split(".")[0], []).append(None)
    return found


def _resolve(node, bindings, namespace, seen=()) -> tuple[bool, object]:
    """(True, the value) of expression `node` when it is known before the cells run (see the module), else
    (False, None)."""
    if isinstance(node, ast.Name):
        values = bindings.get(node.id, [])
        if len(values) != 1 or values[0] is None or node.id in seen:
            return False, None
        if node.id in namespace:  # a parameter: its value, flags applied
            return True, namespace[node.id]
        return _resolve(values[0], bindings, namespace, (*seen, node.id))
    if isinstance(node, ast.Call) and _called(node) == "ensure_weights" and len(node.args) == 1 and not node.keywords:
        return _resolve(node.args[0], bindings, namespace, seen)
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # not a literal
        return False, None
