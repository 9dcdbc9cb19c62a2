"""The source map `<script>.sourcemap.json`: where each line of a generated script came from, and the hashes that
say whether the script is still what export wrote. Export writes it beside the script (`sourcemap_text`); the
script's excepthook (nbddp.runtime.reporting.tracebacks) and the orchestration's failure reports and freshness check
read it (`SourceMap`).

    {"script": "train.py",
     "script_sha256": "<sha256 of train.py's text>",
     "notebooks": {"notebooks/01_data_prep.ipynb": "<sha256 of what export reads from it>", ...},
     "cells": [{"title": "01_data_prep.ipynb cell 3", "first_line": 41,
                "origin": [["notebooks/01_data_prep.ipynb", 3, 1], null, ...]}]}

`script_sha256` is export's hand-edit check (docs/design.md, export). A notebook's hash is of what export reads from
it (every cell's type, tags and source), not the file bytes: re-running a notebook changes its outputs, not the map;
a change to a cell the script leaves out (`notebook-only`) changes no line of the script, but the map, so
`export --check` sees it.

One entry per cell of the generated file in order (markdown included, so the index equals the cell index jupytext
gives when it reads the script as a notebook). `first_line` is the 1-based script line of the cell's first source
line; `origin[i]` is where script line `first_line + i` came from (`[notebook, cell, line]`: the notebook path as
given, the 1-based cell, markdown counted, and the 1-based line) or `null` for lines nbddp wrote. Lines a rewrite
changed map to the original line they replace (difflib alignment on stripped lines, `align_origins`); lines added
inside a cell (a rank0 guard's `ddp.barrier()`) map to the nearest original line above, or `null` at the cell's
top. `title` is the cell's jupytext title, `nbddp header` and `parameters` for the two untitled cells. The file
holds one cell per line.

Standard library only, so every room can read the same file.
"""
import difflib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Location:
    """A place to show the user: a notebook's 1-based cell and line (None: not known), or, for what nbddp wrote or
    a script without a map, the generated script itself (cell None and its line, or its notebook view's cell)."""

    notebook: str
    cell: int | None
    line: int | None

    def __str__(self):
        """`notebooks/03_train.ipynb, cell 4, line 2`, as a NotebookError names it; unknown parts left out."""
        parts = (("cell", self.cell), ("line", self.line))
        return ", ".join([self.notebook, *(f"{name} {number}" for name, number in parts if number is not None)])


@dataclass(frozen=True)
class ScriptLine:
    """What the source map says about one script line: the title of its cell and its origin (None: nbddp's)."""

    cell_title: str
    origin: Location | None


def sourcemap_path(script) -> Path:
    """`generated/train.py` -> `generated/train.sourcemap.json`."""
    script = Path(script)
    return script.with_name(f"{script.stem}.sourcemap.json")


def align_origins(original: str, rewritten: str, location) -> list:
    """The origin of each line of `rewritten`, by difflib alignment of stripped lines with `original`; `location`
    (export's CellLocation) has the `notebook` and the `cell` they are in.

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
    """The source map JSON (one line per cell) of a script whose cells, in order, are `cells` (each with its
    `label`, the title, and `origin`), exported from `stages` (each with its `path` and `content_sha256`): with the
    sha256 of `script_text` (`recorded_sha256`) and of each stage's content.

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


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def recorded_sha256(sourcemap: str) -> str | None:
    """The script's sha256 that the source map text `sourcemap` records; None when it records none."""
    try:
        recorded = json.loads(sourcemap).get("script_sha256")
    except (ValueError, AttributeError):  # not JSON; JSON but not an object
        return None
    return recorded if isinstance(recorded, str) else None


class SourceMapError(ValueError):
    """The file at a source map's path is not one: not JSON, or not the shape above."""


@dataclass(frozen=True)
class SourceMap:
    """The source map of `script` (the path as given): its `cells` entries, none when there is no map."""

    script: str
    cells: list

    @classmethod
    def for_script(cls, script) -> "SourceMap":
        """The map beside `script`, or an empty map (locations stay in the script) when there is none;
        SourceMapError when the file there is malformed (checked up front, so a map written by another version
        fails here, with a reason, rather than inside an excepthook); OSError when it cannot be read."""
        try:
            with open(sourcemap_path(script), encoding="utf-8") as file:
                mapping = json.load(file)
        except FileNotFoundError:
            return cls(str(script), [])
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            raise SourceMapError(f"not JSON ({error})") from error
        _check_shape(mapping)
        return cls(str(script), mapping["cells"])

    def lookup(self, line: int) -> ScriptLine | None:
        """What the map says about 1-based script `line`; None for a line outside every cell's source."""
        for entry in self.cells:
            index = line - entry["first_line"]
            if 0 <= index < len(entry["origin"]):
                origin = entry["origin"][index]
                return ScriptLine(entry["title"], Location(*origin) if origin else None)
        return None

    def locate(self, cell_index: int, line: int | None = None) -> Location:
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
        return Location(*origin)

    def notebook_dir(self) -> str | None:
        """The folder of the stage notebooks the script was exported from (export reads one; the map names them
        from the folder above the script's), absolute; None for an empty map."""
        origins = (origin for entry in self.cells for origin in entry["origin"] if origin)
        first = next(origins, None)
        project = Path(self.script).absolute().parent.parent
        return str(Path(os.path.normpath(project / first[0])).parent) if first else None

    def _first_origin(self, entry) -> Location:
        """The cell a whole script cell came from, when no line is known: its first mapped line's cell."""
        for origin in entry["origin"]:
            if origin is not None:
                return Location(origin[0], origin[1], None)
        return Location(self.script, None, entry["first_line"])


def _check_shape(mapping) -> None:
    """Raise SourceMapError unless `mapping` has the shape that `SourceMap` reads."""
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
