"""The rooms stay apart where a process loads them: orchestration's commands and the runtime the generated script
imports load neither the export room's libcst and jupytext nor each other's heavy parts. And nbddp's modules import
each other without a circle, and without another module's private names."""
import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

NBDDP = Path(__file__).resolve().parent.parent / "nbddp"


@pytest.mark.parametrize("module, absent", [
    ("nbddp.orchestration.smoke.smoke", ("libcst", "nbddp.export")),
    ("nbddp.orchestration.launch.launch", ("libcst", "nbddp.export")),
    ("nbddp.orchestration.run", ("libcst", "nbddp.export")),
    ("nbddp.cli", ("libcst", "nbddp.export")),  # every command's start; export and new load it when they run
    ("nbddp.runtime", ("libcst", "jupytext", "papermill", "nbddp.export", "nbddp.orchestration")),
    ("nbddp.examples.tiny_model", ("torch", "transformers", "nbddp.runtime", "nbddp.fallback")),
    ("nbddp.formats.sourcemap", ("libcst", "torch", "nbddp.export", "nbddp.runtime", "nbddp.orchestration")),
    ("nbddp.formats.metrics", ("torch", "nbddp.export", "nbddp.runtime", "nbddp.orchestration")),
])
def test_a_room_loads_without_the_others(module, absent):
    code = f"import sys, {module}; print(sorted(name for name in {absent!r} if name in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("package", ["nbddp.runtime", "nbddp.fallback"])
def test_no_runtime_or_fallback_module_loads_the_export_or_orchestration_rooms(package):
    # Every module of every runtime room (and of the fallback it installs), not just the package the script imports.
    code = (f"import pkgutil, importlib, sys, {package} as r\n"
            f"for m in pkgutil.walk_packages(r.__path__, '{package}.'): importlib.import_module(m.name)\n"
            "print(sorted(n for n in ('libcst', 'jupytext', 'papermill', 'nbddp.export', 'nbddp.orchestration') "
            "if n in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert result.stdout.strip() == "[]"


def nbddp_modules() -> dict:
    """Every module of nbddp: its dotted name -> its syntax tree."""
    modules = {}
    for path in NBDDP.rglob("*.py"):
        parts = path.relative_to(NBDDP.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = ast.parse(path.read_text())
    return modules


def imported(modules: dict, tree) -> set[str]:
    """The nbddp modules `tree` imports, inside functions too: `from nbddp.a import b` imports module nbddp.a.b where
    there is one, else nbddp.a."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("nbddp")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.startswith("nbddp"):
            found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                      for alias in node.names}
    return found


def test_nbddps_modules_import_each_other_without_a_circle():
    # An import inside a function counts: moved there to dodge a circle, it leaves the circle. A module's import of
    # its own package (`import nbddp`, for its folder) does not: Python loads a package before its modules anyway.
    modules = nbddp_modules()
    graph = {name: {module for module in imported(modules, tree) if not name.startswith(f"{module}.")} - {name}
             for name, tree in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import circle: {' -> '.join(error.args[1])}")


def test_no_module_imports_another_modules_private_names():
    # `from nbddp.a import _helper`, or `a._helper` of an imported nbddp module: what two modules share is public.
    modules = nbddp_modules()
    private = []
    for name, tree in modules.items():
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.startswith("nbddp"):
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in modules:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{name}:{node.lineno}: {node.module}.{alias.name}")
        private += [f"{name}:{node.lineno}: {aliases[node.value.id]}.{node.attr}" for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert private == []


def test_the_fallback_imports_nothing_of_the_runtime():
    # The arrows go one way: the runtime chooses and activates the fallback (runtime/backend.py); the fallback, a
    # library of its own, uses only nbddp's shared modules (patches, rank, model_names, ...), inside functions too.
    modules = nbddp_modules()
    back = sorted(f"{name} -> {module}" for name, tree in modules.items() if name.startswith("nbddp.fallback")
                  for module in imported(modules, tree) if module.startswith("nbddp.runtime"))
    assert back == []


def test_the_shared_modules_import_none_of_the_rooms():
    # What the rooms share beside them (nbddp/patches.py, rank.py, model_names.py, ...: one file each at the top of
    # nbddp/, docs/design.md) stays below every room, inside functions too.
    modules = nbddp_modules()
    rooms = ("nbddp.export", "nbddp.runtime", "nbddp.fallback", "nbddp.orchestration", "nbddp.cli")
    shared = [name for name in modules if name.count(".") == 1 and not name.startswith(rooms)
              and name not in ("nbddp.__main__", "nbddp.examples", "nbddp.formats")]
    up = sorted(f"{name} -> {module}" for name in shared for module in imported(modules, modules[name])
                if module.startswith(rooms))
    assert "nbddp.patches" in shared and up == []
