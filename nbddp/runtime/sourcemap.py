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


class SourceMapError(ValueError):
    """The file at a source map's path is not one: not JSON, or not the shape above."""


def load(path: str) -> dict | None:
    """The parsed source map, or None when there is no file at `path`; SourceMapError when it is malformed."""
    try:
        with open(path, encoding="utf-8") as file:
            mapping = json.load(file)
    except FileNotFoundError:
        return None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise SourceMapError(f"not JSON ({error})") from error
    _check_shape(mapping)
    return mapping


def lookup(sourcemap: dict, line: int) -> ScriptLine | None:
    """What `sourcemap` says about 1-based script `line`; None for a line outside every cell's source."""
    for cell in sourcemap["cells"]:
        index = line - cell["first_line"]
        if 0 <= index < len(cell["origin"]):
            origin = cell["origin"][index]
            return ScriptLine(cell["title"], Origin(*origin) if origin else None)
    return None


def _check_shape(mapping) -> None:
    """Raise SourceMapError unless `mapping` has the shape that `lookup` reads (checked up front, so a map
    written by another version fails here, with a reason, rather than inside an excepthook)."""
    cells = mapping.get("cells") if isinstance(mapping, dict) else None
    if not isinstance(cells, list):
        raise SourceMapError('no "cells" list')
    for index, cell in enumerate(cells):
        if not (
            isinstance(cell, dict)
            and isinstance(cell.get("title"), str)
            and type(cell.get("first_line")) is int
            and isinstance(cell.get("origin"), list)
            and all(_is_origin(origin) for origin in cell["origin"])
        ):
            raise SourceMapError(f'cell {index} is not {{"title": str, "first_line": int, "origin": [...]}}')


def _is_origin(origin) -> bool:
    """null, or [notebook, cell, line]."""
    return origin is None or (
        isinstance(origin, list)
        and len(origin) == 3
        and isinstance(origin[0], str)
        and all(type(number) is int for number in origin[1:])
    )
