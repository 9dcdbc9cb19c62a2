"""Checks on data before a notebook loads and formats it, so a bad path or row is named instead of failing deep
in `load_dataset` or `map`.

    from nbddp.runtime.inputs.data import require_file, require_fields
    require_file(data_path)  # DataError: data file 'data/tiny.jsonl': no such file (did you mean ...?)
    require_fields(dataset, ["instruction", "input", "output"], source=data_path)
    # DataError: data/x.jsonl row 17: missing "output"

`load_dataset("json", data_files=path)` answers a missing file with a FileNotFoundError from deep in
`datasets` (about forty frames) that names the absolute path but not the parameter or a near miss.

A JSON-lines file whose row lacks a key loads with None in that row's column (the key of other rows),
and a formatting function then fails on it with a TypeError far from the row; a key no row has is no
column at all, a KeyError inside `dataset.map`.
"""
import glob
from pathlib import Path

from nbddp.errors import DataError
from nbddp.runtime.inputs.near_miss import closest_sibling


def require_file(path: str) -> None:
    """Raise DataError naming `path` when it is not a file (a glob pattern: when it matches no file)."""
    if glob.has_magic(path):
        if not any(Path(match).is_file() for match in glob.glob(path, recursive=True)):
            raise DataError(f"data files {path!r}: the pattern matches no file")
        return
    file = Path(path).expanduser()
    if file.is_file():
        return
    if file.exists():
        raise DataError(f"data file {path!r}: a directory, not a file")
    raise DataError(f"data file {path!r}: no such file{closest_sibling(file, Path.is_file)}")


def require_fields(dataset, fields, source: str) -> None:
    """Raise DataError naming `source` and the first row (1-based) where one of `fields` is missing or null.

    `dataset` is a `datasets.Dataset`; `source` is what the user knows it by (its file path).
    """
    missing_columns = [field for field in fields if field not in dataset.column_names]
    if missing_columns:
        have = _quoted(dataset.column_names) or "none"
        raise DataError(f"{source}: no row has {_quoted(missing_columns)} (the rows' fields: {have})")
    columns = dataset.with_format("arrow")  # nulls are counted in Arrow, without reading rows into Python
    for field in fields:
        column = columns[field]
        if column.null_count:
            row = column.is_null().index(True).as_py() + 1
            raise DataError(f'{source} row {row}: missing "{field}" ({column.null_count} of {len(column)} rows lack it)')


def _quoted(names) -> str:
    return ", ".join(f'"{name}"' for name in names)
