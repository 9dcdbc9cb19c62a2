"""Where a line of the generated script came from, read from `<script>.sourcemap.json` (format: docs/design.md).

    {"script": "train.py",
     "cells": [{"title": "01_data_prep.ipynb cell 3", "first_line": 41,
                "origin": [["notebooks/01_data_prep.ipynb", 3, 1], null, ...]}]}

`origin[i]` is the `[notebook, cell, line]` that script line `first_line + i` came from, or null for a
line nbddp wrote. Plain JSON and the standard library only, so any room can read the same file.
"""
import json
import os
from typing import NamedTuple


class Origin(NamedTuple):
    """A line of a notebook: the path as given, the 1-based cell (markdown counted) and the 1-based line."""

    notebook: str
    cell: int
    line: int

    def __str__(self):
        return f"{self.notebook}, cell {self.cell}, line {self.line}"


class ScriptLine(NamedTuple):
    """What the source map says about one script line: the title of its cell and its origin (None: nbddp's)."""

    cell_title: str
    origin: Origin | None


def sourcemap_path(script: str) -> str:
    """`generated/train.py` -> `generated/train.sourcemap.json`."""
    return os.path.splitext(script)[0] + ".sourcemap.json"


def load(path: str) -> dict | None:
    """The parsed source map, or None when there is no file at `path`."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        return None


def lookup(sourcemap: dict, line: int) -> ScriptLine | None:
    """What `sourcemap` says about 1-based script `line`; None for a line outside every cell's source."""
    for cell in sourcemap["cells"]:
        index = line - cell["first_line"]
        if 0 <= index < len(cell["origin"]):
            origin = cell["origin"][index]
            return ScriptLine(cell["title"], Origin(*origin) if origin else None)
    return None
