"""Where a line of the generated script came from, read from the source map export writes beside it.

Format (docs/design.md): `{"script": "train.py", "cells": [{"title", "first_line", "origin": [...]}]}`,
one entry per cell of the script as jupytext reads it; `origin[i]` is `[notebook, cell, line]` for
script line `first_line + i`, or null for a line nbddp wrote.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Location:
    """A place to show the user: a source notebook cell and line, or a line of the generated script."""

    notebook: str
    cell: int | None
    line: int | None


def sourcemap_path(script):
    """`generated/train.py` -> `generated/train.sourcemap.json`."""
    script = Path(script)
    return script.with_name(f"{script.stem}.sourcemap.json")


class SourceMap:
    def __init__(self, script, cells):
        self.script = str(script)
        self.cells = cells

    @classmethod
    def for_script(cls, script):
        """The map beside `script`, or an empty map (locations stay in the script) when there is none."""
        path = sourcemap_path(script)
        if not path.exists():
            return cls(script, [])
        with open(path, encoding="utf-8") as stream:
            return cls(script, json.load(stream)["cells"])

    def notebook_dir(self):
        """The folder of the stage notebooks the script was exported from (export reads one; the map names them
        from the folder above the script's), absolute; None for an empty map."""
        origins = (origin for entry in self.cells for origin in entry["origin"] if origin)
        first = next(origins, None)
        project = Path(self.script).absolute().parent.parent
        return str(Path(os.path.normpath(project / first[0])).parent) if first else None

    def locate(self, cell_index, line=None):
        """Where line `line` (1-based) of script cell `cell_index` (0-based, jupytext's order) came from."""
        if cell_index >= len(self.cells):
            # No map entry: point into the generated script's notebook view, 1-based like NotebookError.
            return Location(self.script, cell_index + 1, line)
        entry = self.cells[cell_index]
        if line is None:
            return self._first_origin(entry)
        origin = entry["origin"][line - 1] if 0 < line <= len(entry["origin"]) else None
        if origin is None:
            return Location(self.script, None, entry["first_line"] + line - 1)
        notebook, cell, source_line = origin
        return Location(notebook, cell, source_line)

    def _first_origin(self, entry):
        """The cell a whole script cell came from, when no line is known: its first mapped line's cell."""
        for origin in entry["origin"]:
            if origin is not None:
                return Location(origin[0], origin[1], None)
        return Location(self.script, None, entry["first_line"])
