"""The docs say what the repository holds: every relative link resolves to a file and heading, and the tests
CONTRIBUTING.md tells a contributor to run exist. (The sweep's tables: tests/tools/test_generated_docs.py.)"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "CONTRIBUTING.md", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
         "bench/results/HISTORY.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[`*]", "", heading.lstrip("#").strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_reach_a_file_and_heading(page):
    broken = []
    for target in LINK.findall((ROOT / page).read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, heading = target.partition("#")
        file = (ROOT / page).parent / path if path else ROOT / page
        if not file.exists() or (heading and file.suffix == ".md" and heading not in
                                 {anchor(line) for line in file.read_text().splitlines() if line.startswith("#")}):
            broken.append(target)
    assert broken == []


def test_the_tests_contributing_names_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    named = set(re.findall(r"tests/[\w/*]+\.py", text))
    assert len(named) > 10
    assert [name for name in sorted(named) if not list(ROOT.glob(name))] == []
