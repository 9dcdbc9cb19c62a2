"""The epilog of `pipeline.py export --help`: the cell tags and every rewrite, from the code that applies them."""
import textwrap

from nbddp.export.notebooks import TAG_MEANINGS
from nbddp.export.rewrites import catalogue

WIDTH = 100


def export_epilog() -> str:
    lines = ["cell tags (in Jupyter: the cell's tags; in the paired .py: # %% tags=[\"rank0\"]):"]
    lines += _entries(TAG_MEANINGS.items())
    lines += ["", "what export rewrites, in this order (every change is reported with notebook, cell and line):"]
    lines += _entries(catalogue())
    return "\n".join(lines)


def _entries(pairs) -> list[str]:
    pairs = list(pairs)
    column = max(len(name) for name, _ in pairs) + 4
    return [textwrap.fill(text, WIDTH, initial_indent=f"  {name}".ljust(column), subsequent_indent=" " * column)
            for name, text in pairs]
