"""The rooms stay apart where a process loads them: orchestration's commands and the runtime the generated script
imports load neither the export room's libcst and jupytext nor each other's heavy parts."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module, absent", [
    ("nbddp.orchestration.smoke.smoke", ("libcst", "nbddp.export")),
    ("nbddp.orchestration.launch.launch", ("libcst", "nbddp.export")),
    ("nbddp.orchestration.run", ("libcst", "nbddp.export")),
    ("nbddp.cli", ("libcst", "nbddp.export")),  # every command's start; export and new load it when they run
    ("nbddp.runtime", ("libcst", "jupytext", "papermill", "nbddp.export", "nbddp.orchestration")),
    ("nbddp.formats.sourcemap", ("libcst", "torch", "nbddp.export", "nbddp.runtime", "nbddp.orchestration")),
    ("nbddp.formats.metrics", ("torch", "nbddp.export", "nbddp.runtime", "nbddp.orchestration")),
])
def test_a_room_loads_without_the_others(module, absent):
    code = f"import sys, {module}; print(sorted(name for name in {absent!r} if name in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_no_runtime_module_loads_the_export_or_orchestration_rooms():
    # Every module of every runtime room, not just the package the generated script imports.
    code = ("import pkgutil, importlib, sys, nbddp.runtime as r\n"
            "for m in pkgutil.walk_packages(r.__path__, 'nbddp.runtime.'): importlib.import_module(m.name)\n"
            "print(sorted(n for n in ('libcst', 'jupytext', 'papermill', 'nbddp.export', 'nbddp.orchestration') "
            "if n in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert result.stdout.strip() == "[]"
