"""No line nbddp writes in the generated script is longer than 120 characters: a longer line is the author's own
(it maps, through the source map, to a notebook line that was already that long)."""
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from nbddp.export import export

REPO = Path(__file__).resolve().parent.parent
FIXTURES = sorted(path.parent for path in (REPO / "tests" / "fixtures").glob("*/**/[0-9][0-9]_*.ipynb"))
WIDTH = 120


def too_long_lines(project: Path) -> list[str]:
    """The lines of `project`/generated/train.py over WIDTH that no notebook line over WIDTH stands behind."""
    lines = (project / "generated" / "train.py").read_text(encoding="utf-8").splitlines()
    sourcemap = json.loads((project / "generated" / "train.sourcemap.json").read_text(encoding="utf-8"))
    origins = {cell["first_line"] + index: origin for cell in sourcemap["cells"]
               for index, origin in enumerate(cell["origin"])}
    notebooks = {}
    found = []
    for number, line in enumerate(lines, start=1):
        origin = origins.get(number)
        if len(line) <= WIDTH:
            continue
        if origin is not None:
            notebook = notebooks.setdefault(origin[0], nbformat.read(project / origin[0], as_version=4))
            if len(notebook.cells[origin[1] - 1].source.splitlines()[origin[2] - 1]) > WIDTH:
                continue
        found.append(f"train.py:{number} ({len(line)} characters): {line[:80]}...")
    return found


def test_the_generated_script_has_no_long_line_nbddp_wrote():
    assert too_long_lines(REPO) == []


def test_there_are_fixtures_to_check():
    assert {path.name for path in FIXTURES} >= {"unsloth_style", "vision", "grpo"}


@pytest.mark.parametrize("notebooks", FIXTURES, ids=lambda path: path.name)
def test_an_export_of_a_fixture_has_no_long_line_nbddp_wrote(tmp_path, notebooks):
    shutil.copytree(notebooks, tmp_path / "notebooks", ignore=shutil.ignore_patterns("*.py"))
    export(tmp_path / "notebooks", tmp_path / "generated")
    assert too_long_lines(tmp_path) == []
