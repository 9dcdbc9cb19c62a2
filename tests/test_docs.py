"""The docs say what the repository holds: README's sweep table is the committed sweep's counts, every relative link
resolves to a file and heading, and the tests CONTRIBUTING.md tells a contributor to run exist."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "CONTRIBUTING.md", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
         "bench/results/HISTORY.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
README_CATEGORIES = {  # README's row name -> the sweep's category
    "Alpaca-style SFT": "alpaca-sft", "conversational SFT": "conversational-sft",
    "continued pretraining": "continued-pretraining", "DPO / ORPO": "dpo-orpo", "GRPO without vLLM": "grpo",
    "GRPO with vLLM": "grpo-vllm", "vision": "vision", "audio / TTS": "audio",
    "other (embeddings, classification, inference, tools)": "other", "all": "all",
}


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[`*]", "", heading.lstrip("#").strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_readme_sweep_table_is_the_committed_summary():
    counts = json.loads((ROOT / "tools/sweep_results/cpu/summary.json").read_text())["counts"]
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] in README_CATEGORIES and len(cells) == 5:
            rows[README_CATEGORIES[cells[0]]] = cells[1:]
    expected = {}
    for category, c in counts.items():
        rest = c["notebooks"] - c["limited"]
        expected[category] = [str(c["notebooks"]), str(c["passed"]), str(c["limited"]), f"{c['passed']} of {rest}"]
    assert rows == expected


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
