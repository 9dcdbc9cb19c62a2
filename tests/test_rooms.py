"""The rooms stay apart where a process loads them: orchestration's commands and the runtime the generated script
imports load neither the export room's libcst and jupytext nor each other's heavy parts."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module, absent", [
    ("nbddp.orchestration.smoke", ("libcst", "nbddp.export")),
    ("nbddp.orchestration.launch", ("libcst", "nbddp.export")),
    ("nbddp.orchestration.run", ("libcst", "nbddp.export")),
    ("nbddp.runtime", ("libcst", "jupytext", "papermill", "nbddp.export", "nbddp.orchestration")),
    ("nbddp.formats.sourcemap", ("libcst", "torch", "nbddp.export", "nbddp.runtime", "nbddp.orchestration")),
    ("nbddp.formats.metrics", ("torch", "nbddp.export", "nbddp.runtime", "nbddp.orchestration")),
])
def test_a_room_loads_without_the_others(module, absent):
    code = f"import sys, {module}; print(sorted(name for name in {absent!r} if name in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
