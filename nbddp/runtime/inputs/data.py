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

A line that is no JSON object (torn, `[1, 2, 3]`) makes `load_dataset("json", ...)` fail with a
DatasetGenerationError ("Trailing data"), an ArrowInvalid or a TypeError ("'str' object is not a mapping") that
names neither the file nor the line. `register` wraps `datasets.load_dataset` so that such a failure is a
DataError naming the file, the line and how it begins (`bad_json_line`); the files are read only then.
"""
import functools
import glob
import json
from pathlib import Path

from nbddp import patches
from nbddp.errors import DataError
from nbddp.near_miss import closest_sibling


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


def register() -> None:
    """Wrap `datasets.load_dataset` (and `datasets.load.load_dataset`): see the module's docstring."""
    import datasets
    import datasets.load

    for owner in (datasets, datasets.load):
        patches.wrap("json-data-lines", owner, "load_dataset", _named_bad_lines)


def _named_bad_lines(original):
    from datasets.exceptions import DatasetGenerationError

    @functools.wraps(original)
    def load_dataset(path, *args, **kwargs):
        try:
            return original(path, *args, **kwargs)
        except (DatasetGenerationError, TypeError, ValueError):  # ArrowInvalid is a ValueError
            data_files = kwargs.get("data_files", args[2] if len(args) > 2 else None)  # after name, data_dir
            bad = bad_json_line(_local_files(data_files)) if path == "json" else None
            if bad is None:
                raise
            raise DataError(bad) from None

    return load_dataset


def bad_json_line(paths) -> str | None:
    """What is wrong with the first line of the JSON-lines files at `paths` that is no JSON object: the file, the
    line number, why and how the line begins; None when every line is one (or a file is one JSON document)."""
    for path in paths:
        with open(path, "rb") as stream:
            for number, raw in enumerate(stream, start=1):
                why = _not_an_object(raw)
                if why is None:
                    continue
                if number == 1 and _one_document(path):  # a .json file, not JSON lines
                    break
                begins = raw.decode("utf-8", errors="replace").rstrip("\r\n")[:60]
                return (f"{path}, line {number}: {why}; the line begins {begins!r}. Each line of a JSON-lines "
                        "data file is one JSON object ({...}) with a row's fields: fix or remove that line")
    return None


def _not_an_object(raw: bytes) -> str | None:
    if not raw.strip():
        return None
    try:
        value = json.loads(raw.decode("utf-8").rstrip("\r\n"))
    except UnicodeDecodeError as error:
        return f"not UTF-8 text ({error.reason} at byte {error.start + 1})"
    except json.JSONDecodeError as error:
        return f"not JSON ({error.msg}: column {error.colno})"
    return None if isinstance(value, dict) else f"a JSON {type(value).__name__}, not an object"


def _one_document(path) -> bool:
    try:
        json.loads(Path(path).read_bytes().decode("utf-8"))
    except ValueError:  # UnicodeDecodeError too
        return False
    return True


def _local_files(data_files) -> list[str]:
    """The existing local files `data_files` (a path or pattern, a list of them, or a dict of splits) names."""
    if isinstance(data_files, dict):
        return [path for value in data_files.values() for path in _local_files(value)]
    if isinstance(data_files, (str, Path)):
        data_files = [data_files]
    if not isinstance(data_files, (list, tuple)):
        return []
    found = []
    for pattern in map(str, data_files):
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        found += [match for match in matches if Path(match).is_file()]
    return found


def _quoted(names) -> str:
    return ", ".join(f'"{name}"' for name in names)
