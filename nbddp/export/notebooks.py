"""Read the stage notebooks `NN_name.ipynb` of a pipeline, in file-name order, checking cell tags."""
import difflib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.warnings import MissingIDFieldWarning

from nbddp.errors import NotebookError
from nbddp.export.rewrites.base import CellLocation

STAGE_GLOB = "[0-9][0-9]_*.ipynb"
CELL_IDS_MINOR = 5  # nbformat 4.5 added cell ids

# What each tag a notebook author sets tells export (shown by `pipeline.py export --help`).
TAG_MEANINGS = {
    "parameters": "papermill's; each name becomes a typed --flag of the script",
    "notebook-only": "exploration, plots, displays: left out of the script",
    "rank0": "runs on global rank 0 only, then all ranks meet at a barrier",
    "main-process-first": "local rank 0 runs it first, the other ranks then reuse its cache",
}
# `injected-parameters` is papermill's own tag for the cell it injects; export drops that cell.
KNOWN_TAGS = (*TAG_MEANINGS, "injected-parameters")

# Tags that say contradictory things about one cell.
EXCLUSIVE_TAGS = (("parameters", "rank0"), ("parameters", "main-process-first"), ("rank0", "main-process-first"))


@dataclass(frozen=True)
class SourceCell:
    """One cell of a stage notebook, as export sees it."""

    location: CellLocation  # notebook path as given and 1-based cell number (markdown cells counted)
    cell_type: str  # "code", "markdown" or "raw"
    source: str
    tags: frozenset


@dataclass(frozen=True)
class Stage:
    """One stage notebook: its path as given, its cells, and the hash of what export reads from it."""

    path: str
    cells: tuple
    content_sha256: str

    @property
    def name(self):
        return Path(self.path).name


def read_stages(directory, relative_to=None) -> list[Stage]:
    """All stage notebooks in `directory`, in file-name order, named by their paths from the folder `relative_to`
    (None: as found in `directory`). An error: an empty pipeline, a stage name that is no
    readable file (a dangling symbolic link), or, beside stages, a notebook whose name starts with a digit but is
    not NN_name.ipynb (`3_eval`, `03-eval`, `100_report`): export would leave it out without a word."""
    directory = Path(directory)
    if directory.is_file():
        raise NotebookError(directory.as_posix(), "a notebook, where a folder of stage notebooks was expected",
                            hint=f"put it in a folder as a stage: mkdir my_notebooks && cp '{directory}' "
                                 "my_notebooks/01_finetune.ipynb, then --notebooks my_notebooks")
    if not directory.is_dir():
        raise NotebookError(directory.as_posix(), f"no such folder ({directory.absolute()})",
                            hint="export reads the stage notebooks (01_name.ipynb, ...) from there: run nbddp in your "
                                 "project's folder, start a project with `nbddp new my-project`, or name the "
                                 "notebooks' folder: `nbddp export --notebooks PATH`")
    paths = sorted(directory.glob(STAGE_GLOB), key=lambda path: path.name)
    for path in paths:
        if not path.is_file():
            what = f"a symbolic link to {os.readlink(path)}, which does not exist" if path.is_symlink() else "not a file"
            raise NotebookError(path.as_posix(), f"{what}: export cannot read this stage",
                                hint="point it at the notebook, or remove it to leave the stage out")
    if not paths:
        others = sorted(path.name for path in directory.glob("*.ipynb"))
        found = f"; found {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}, not named so" if others else ""
        raise NotebookError(
            directory.as_posix(),
            "no stage notebooks found",
            hint=f"stages are files named NN_name.ipynb (01_data_prep.ipynb, 02_lora_setup.ipynb, ...){found}",
        )
    misnamed = sorted(path.name for path in directory.glob("[0-9]*.ipynb") if path not in paths)
    if misnamed:
        raise NotebookError(
            directory.as_posix(),
            f"{', '.join(misnamed)}: named like a stage but not NN_name.ipynb, so export would leave "
            f"{'it' if len(misnamed) == 1 else 'them'} out",
            hint="a stage's name is two digits, an underscore and a name (03_train.ipynb); rename a notebook so to "
                 "make it a stage, or so that its name does not start with a digit to leave it out",
        )
    return [read_stage(path, relative_to) for path in paths]


def read_stage(path, relative_to=None) -> Stage:
    path = Path(path)
    notebook = _read_notebook(path)
    name = Path(os.path.relpath(os.path.abspath(path), relative_to)) if relative_to is not None else path
    cells = tuple(
        SourceCell(
            location=CellLocation(name.as_posix(), number),
            cell_type=cell.cell_type,
            source=cell.source,
            tags=_checked_tags(name.as_posix(), number, cell.cell_type, cell.metadata.get("tags", [])),
        )
        for number, cell in enumerate(notebook.cells, start=1)
    )
    return Stage(name.as_posix(), cells, _content_sha256(cells))


def _read_notebook(path: Path):
    where = path.as_posix()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise NotebookError(where, f"not UTF-8 text: {err.reason} at byte {err.start}") from err
    # json first: nbformat's own error for bad JSON does not say where the problem is.
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise NotebookError(
            where, f"not valid JSON: {err.msg} at line {err.lineno}, column {err.colno} of the file"
        ) from err
    if not isinstance(data, dict):
        raise NotebookError(where, "not a notebook: the file's JSON is not an object")
    # A 4.5 cell without an id: Jupyter gives it one when it opens the notebook, and so does nbformat (reading,
    # validating), with a warning for whoever writes the file (three lines on stderr of every export otherwise).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingIDFieldWarning)
        return _read_and_validate(text, where)


def _read_and_validate(text, where):
    try:
        notebook = nbformat.reads(text, as_version=4)
        if notebook.nbformat_minor < CELL_IDS_MINOR and any("id" in cell for cell in notebook.cells):
            # Colab and other editors write cell ids (nbformat 4.5) into notebooks marked 4.0-4.4; Jupyter opens
            # them, so read them as 4.5 notebooks, whose schema still checks every id.
            notebook.nbformat_minor = CELL_IDS_MINOR
        for cell in notebook.cells:
            if cell.cell_type == "code":
                # Export never reads outputs, and Colab saves some that the schema refuses (`metadata` in a
                # stream output): a notebook Jupyter opens must not be refused for them.
                cell.outputs = []
        nbformat.validate(notebook)
    except nbformat.ValidationError as err:
        path_in_notebook = list(err.absolute_path)
        cell = path_in_notebook[1] + 1 if path_in_notebook[:1] == ["cells"] and len(path_in_notebook) > 1 else None
        raise NotebookError(where, f"not a valid notebook: {err.message}", cell=cell) from err
    except nbformat.NBFormatError as err:
        raise NotebookError(where, f"not a valid notebook: {err}") from err
    return notebook


def _checked_tags(notebook: str, cell: int, cell_type: str, tags) -> frozenset:
    for tag in tags:
        if tag not in KNOWN_TAGS:
            close = difflib.get_close_matches(tag, KNOWN_TAGS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known tags: {', '.join(KNOWN_TAGS)}"
            raise NotebookError(notebook, f"unknown cell tag {tag!r}", cell=cell, hint=hint)
    for first, second in EXCLUSIVE_TAGS:
        if first in tags and second in tags:
            raise NotebookError(notebook, f"a cell cannot be tagged both {first!r} and {second!r}", cell=cell)
    if "parameters" in tags and cell_type != "code":
        raise NotebookError(notebook, f"only a code cell can be tagged 'parameters', not a {cell_type} cell", cell=cell)
    return frozenset(tags)


def _content_sha256(cells) -> str:
    """Hash of what export reads (types, tags, sources): re-running a notebook changes outputs, not this."""
    content = [[cell.cell_type, sorted(cell.tags), cell.source] for cell in cells]
    return hashlib.sha256(json.dumps(content, ensure_ascii=False).encode("utf-8")).hexdigest()
