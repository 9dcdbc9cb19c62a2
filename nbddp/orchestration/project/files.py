"""Result files are written whole or not at all: to a temp file beside the target, then os.replace. And `shown`:
a path as messages name it; `require_script`: the generated script a command runs, or what to do without one."""

import contextlib
import json
import os
import uuid
from pathlib import Path

from nbddp.errors import UsageError


@contextlib.contextmanager
def replacing(path):
    """Yield a temp path to write; on success it replaces `path`, on error it is removed."""
    path = Path(path)
    # Named, not created: the writer creates it, with the usual permissions (mkstemp's are 0600).
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield temp
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def write_text(path, text):
    with replacing(path) as temp:
        temp.write_text(text, encoding="utf-8")


def write_json(path, data):
    write_text(path, json.dumps(data, indent=2) + "\n")


def shown(path) -> str:
    """`path` from the working directory when it lies below it (`runs/...`), else absolute."""
    path = Path(path).absolute()
    return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)


def require_script(script) -> None:
    """UsageError unless the generated `script` is a file: export it first, or, in a folder without notebooks/ (not
    a project's), name the folder and how to get a project: `nbddp new`, or `export --notebooks` elsewhere."""
    if Path(script).is_file():
        return
    if Path("notebooks").is_dir():
        raise UsageError(f"--script {script}: no such file (run `python pipeline.py export` first)")
    raise UsageError(f"--script {script}: no such file, and no notebooks/ folder either in {Path.cwd()}, which is no "
                     "nbddp project's folder: cd into yours, start one with `nbddp new my-project` (then cd "
                     "my-project && nbddp run), or export notebooks kept elsewhere: `nbddp export --notebooks PATH` "
                     "(then `nbddp run` here)")
