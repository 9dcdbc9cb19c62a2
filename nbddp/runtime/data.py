"""Checks on a dataset before a notebook formats it, so a bad row is named instead of failing deep in `map`.

    from nbddp.runtime.data import require_fields
    require_fields(dataset, ["instruction", "input", "output"], source=data_path)
    # DataError: data/x.jsonl row 17: missing "output"

A JSON-lines file whose row lacks a key loads with None in that row's column (the key of other rows),
and a formatting function then fails on it with a TypeError far from the row; a key no row has is no
column at all, a KeyError inside `dataset.map`.
"""
from nbddp.errors import DataError


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
