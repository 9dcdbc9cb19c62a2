"""Where each line of the generated script came from: `[notebook, cell, line]` or None (nbddp wrote it); and the
hashes that say whether the script is still what export wrote from those notebooks."""
import difflib
import hashlib
import json

from nbddp.export.rewrites.base import CellLocation


def align_origins(original: str, rewritten: str, location: CellLocation) -> list:
    """The origin of each line of `rewritten`, by difflib alignment of stripped lines with `original`.

    Unchanged lines map to themselves; lines a rewrite moved (an import hoisted above another) map to
    where they were; lines a rewrite changed map to the line they replace (the block's last line when it
    grew); lines nbddp added map to the nearest original line above, or None at the top of the cell.
    """
    old_lines = [line.strip() for line in original.splitlines()]
    new_lines = [line.strip() for line in rewritten.splitlines()]
    opcodes = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_opcodes()
    # Lines that left their place: difflib sees a move as an insert here and a delete (or replace) there.
    left = {}
    for tag, i1, i2, _, _ in opcodes:
        if tag in ("delete", "replace"):
            for index in range(i1, i2):
                left.setdefault(old_lines[index], []).append(index + 1)
    origin: list = []
    for tag, i1, i2, j1, j2 in opcodes:
        for offset in range(j2 - j1):
            if tag != "equal" and left.get(new_lines[j1 + offset]):
                line = left[new_lines[j1 + offset]].pop(0)
            elif tag == "insert":
                line = i1  # 1-based number of the original line just above (0: none)
            else:  # equal or replace; a delete has no new lines
                line = min(i1 + offset, i2 - 1) + 1
            origin.append([location.notebook, location.cell, line] if line else None)
    return origin


def sourcemap_text(script_name: str, script_text: str, cells, stages) -> str:
    """The source map JSON (one line per cell) of a script whose cells, in order, are `cells`, exported from
    `stages`: with the sha256 of `script_text` (`recorded_sha256`) and of each stage's content.

    Cell markers are the `# %%` lines jupytext wrote; the script was checked to read back as
    exactly these cells, so there is one marker per cell.
    """
    markers = [
        number
        for number, line in enumerate(script_text.splitlines(), start=1)
        if line == "# %%" or line.startswith("# %% ")
    ]
    entries = [
        json.dumps({"title": cell.label, "first_line": marker + 1, "origin": cell.origin}, ensure_ascii=False)
        for marker, cell in zip(markers, cells, strict=True)
    ]
    cells_json = ",\n  ".join(entries)
    notebooks = json.dumps({stage.path: stage.content_sha256 for stage in stages}, ensure_ascii=False, indent=2)
    return (f'{{"script": {json.dumps(script_name)},\n "script_sha256": "{sha256(script_text)}",\n'
            f' "notebooks": {notebooks.replace(chr(10), chr(10) + " ")},\n "cells": [\n  {cells_json}\n ]}}\n')


def recorded_sha256(sourcemap: str) -> str | None:
    """The script's sha256 that the source map text `sourcemap` records; None when it records none."""
    try:
        recorded = json.loads(sourcemap).get("script_sha256")
    except (ValueError, AttributeError):  # not JSON; JSON but not an object
        return None
    return recorded if isinstance(recorded, str) else None


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
