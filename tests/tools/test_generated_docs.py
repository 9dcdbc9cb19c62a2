"""tools/generated_docs.py: docs/rewrites.md and docs/compatibility.md's tables are what the rewrites and the committed
sweep results say."""
import json

import pytest

from nbddp.export.rewrites import catalogue
from tools import generated_docs


def test_the_committed_pages_are_what_the_generator_writes():
    # On failure: python -m tools.generated_docs, and review the diff.
    assert [path.name for path in generated_docs.stale()] == []


def test_the_rewrites_page_lists_every_rewrite_in_exports_order():
    page = generated_docs.rewrites_page()
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert headings == [name for name, _ in catalogue()]
    assert "`nbddp/export/rewrites/use_tqdm_auto.py`, `UseTqdmAuto`" in page


def test_the_cpu_table_is_the_committed_summarys_counts():
    counts = json.loads((generated_docs.RESULTS / "cpu" / "summary.json").read_text())["counts"]
    rows = {}
    for line in generated_docs.counts_table("cpu", limited=True).splitlines()[2:]:
        name, *cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[name] = cells
    expected = {generated_docs.CATEGORY_NAMES[category]: [str(c["notebooks"]), str(c["passed"]), str(c["limited"]),
                                                          f"{c['passed']} of {c['notebooks'] - c['limited']}"]
                for category, c in counts.items()}
    assert rows == expected
    assert rows["all"] == ["177", "114", "50", "114 of 127"]


def test_fill_replaces_each_region_and_keeps_the_prose():
    text = "prose\n<!-- generated: a -->\nold\n<!-- end generated: a -->\nmore prose\n"
    assert generated_docs.fill(text, {"a": "new"}) == \
        "prose\n<!-- generated: a -->\nnew\n<!-- end generated: a -->\nmore prose\n"


@pytest.mark.parametrize("regions", [{}, {"a": "x", "b": "y"}, {"c": "x"}])
def test_fill_refuses_a_page_whose_regions_are_not_the_generators(regions):
    with pytest.raises(ValueError, match="generated regions"):
        generated_docs.fill("<!-- generated: a -->\n<!-- end generated: a -->\n", regions)
