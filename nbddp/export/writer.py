"""Writing generated/: all files or none, never over a script someone edited by hand."""
import os
import tempfile
from pathlib import Path

from nbddp.errors import NbddpError, UsageError
from nbddp.export.script import edited_by_hand


def check_out_dir(out: Path) -> None:
    """Raise UsageError, naming `--out`, unless `out` is a folder export can write in, or can be made in one.
    Creates nothing: a missing `out` is judged by the deepest folder of it that exists."""
    where = f"--out {out.as_posix()}"
    path = out.absolute()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        raise UsageError(f"{where}: {'a file' if existing == path else f'{existing} is a file'}, not a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):  # nameless: gone when closed
            pass
    except OSError as error:
        raise UsageError(f"{where}: cannot write in {existing} ({error.strerror})") from None


def refuse_hand_edited(script_path: Path) -> None:
    """Raise when the existing script's body no longer matches the hash export recorded in it."""
    if script_path.is_file() and edited_by_hand(script_path.read_text(encoding="utf-8")):
        raise NbddpError(
            f"{script_path.as_posix()} was edited by hand (its body no longer matches its nbddp-body-sha256); "
            "use --force to overwrite (your edits will be lost; move them into the notebooks)"
        )


def stale_files(contents: dict, script_path: Path) -> list[str]:
    """One line per file of `contents` (path -> text) that differs on disk from its text, saying how."""
    stale = []
    for path, text in contents.items():
        if not path.is_file():
            stale.append(f"{path.as_posix()} is missing")
            continue
        on_disk = path.read_text(encoding="utf-8")
        if on_disk == text:
            continue
        if path == script_path and edited_by_hand(on_disk):
            stale.append(f"{path.as_posix()} was edited by hand (export needs --force to overwrite it)")
        else:
            stale.append(f"{path.as_posix()} differs from what export writes")
    return stale


def write_files(contents: dict) -> None:
    """Write each text (path -> text) to a temporary file beside its path, then move them all into place,
    so an error while writing leaves the old files as they were."""
    temporaries = {}
    try:
        for path, text in contents.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.tmp")
            temporary.write_text(text, encoding="utf-8", newline="\n")
            temporaries[path] = temporary
        for path, temporary in temporaries.items():
            os.replace(temporary, path)
    finally:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)
