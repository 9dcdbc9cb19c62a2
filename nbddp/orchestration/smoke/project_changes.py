"""What a smoke run changed in the project outside runs/: what the runtime's smoke sandbox does not redirect.

The sandbox redirects what the notebook's Python code saves; a `!` command runs where it says (later cells read
what it made), and so do `os.makedirs`, `Path.write_text` and the like. `pipeline.py smoke` lists the project before
and after the kernel runs and names what changed, so nothing of the user's changes unsaid.

Listed: files and folders under the project (the folder that holds the notebooks' folder), by size and
modification time. Left out: the runs folder (the one holding the smoke run's), hidden entries (`.git`, `.venv`),
virtual environments, folders Python and Jupyter write on their own (`__pycache__`, `.ipynb_checkpoints`) and
Unsloth's `unsloth_compiled_cache` (its compiled kernels, in the working directory of every run). A project over
MAX_ENTRIES entries is not listed: one line says so.
"""

import os
from pathlib import Path

MAX_ENTRIES = 20_000
SKIPPED = {"__pycache__", ".ipynb_checkpoints", "unsloth_compiled_cache"}
SHOWN = 10  # paths named in the report; the rest are counted


def snapshot(root, run_dir) -> dict | None:
    """`{relative path: (size, mtime_ns) or "folder"}` for the project under `root`, less the folder of it that
    holds `run_dir` (runs/); None when it has more than MAX_ENTRIES entries."""
    root, runs = Path(root), Path(run_dir).resolve()
    entries = {}
    for folder, names, files in os.walk(root):
        names[:] = [name for name in names if _listed(Path(folder) / name, runs)]
        for name in names:
            entries[os.path.relpath(os.path.join(folder, name), root)] = "folder"
        for name in files:
            path = os.path.join(folder, name)
            if not name.startswith("."):
                try:
                    stat = os.lstat(path)
                except OSError:
                    continue
                entries[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
        if len(entries) > MAX_ENTRIES:
            return None
    return entries


def changes(before: dict, after: dict) -> list[str]:
    """`path (created|changed|removed)` for each entry that differs, in path order."""
    differ = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
    return [f"{path} ({'created' if path not in before else 'removed' if path not in after else 'changed'})"
            for path in sorted(differ)]


def report(root, changed: list[str]) -> str | None:
    """The smoke run's paragraph about `changed`, or None when nothing changed."""
    if not changed:
        return None
    shown = ", ".join(changed[:SHOWN]) + (f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else "")
    return (f"smoke: the notebook changed {len(changed)} path(s) in {root} outside runs/, which nbddp does not "
            f"redirect (`!` commands, os.makedirs, Path.write_text): {shown}. The training run will do it again.")


def _listed(path: Path, runs: Path) -> bool:
    if path.name.startswith(".") or path.name in SKIPPED or path.is_symlink():
        return False
    return not runs.is_relative_to(path.resolve()) and not (path / "pyvenv.cfg").exists()
