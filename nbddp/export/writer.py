"""Writing generated/: all files or none, never over a script someone edited by hand."""
import os
import tempfile
from pathlib import Path

from nbddp.errors import NbddpError, UsageError
from nbddp.formats.sourcemap import recorded_sha256, sha256


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


def edited_by_hand(script_path: Path, sourcemap_path: Path) -> bool:
    """True when the script no longer has the sha256 that its source map records (or the map records none and the
    script is not an unedited export of an nbddp that kept the hash in the header)."""
    try:
        recorded = recorded_sha256(sourcemap_path.read_text(encoding="utf-8"))
    except OSError:  # no map beside it
        recorded = None
    text = script_path.read_text(encoding="utf-8")
    return recorded != sha256(text) and not (recorded is None and _unedited_before_the_map(text))


LEGACY_HASH_LINE = "# nbddp-body-sha256: "  # exports until 2026-12: the hash of the cells after the header


def _unedited_before_the_map(text: str) -> bool:
    """An export written before the source map held the script's hash, which its body still matches."""
    lines = text.splitlines(keepends=True)
    at = next((number for number, line in enumerate(lines) if line.startswith(LEGACY_HASH_LINE)), None)
    if at is None:
        return False
    body = next((number for number in range(at + 1, len(lines)) if lines[number].startswith("# %%")), len(lines))
    return lines[at][len(LEGACY_HASH_LINE):].strip() == sha256("".join(lines[body:]))


def refuse_hand_edited(script_path: Path, sourcemap_path: Path) -> None:
    """Raise when the existing script is not the one its source map records: edited by hand, or not export's."""
    if script_path.is_file() and edited_by_hand(script_path, sourcemap_path):
        raise NbddpError(
            f"{script_path.as_posix()} was edited by hand (it no longer has the sha256 that "
            f"{sourcemap_path.name} beside it records); "
            "use --force to overwrite (your edits will be lost; move them into the notebooks)"
        )


def stale_files(contents: dict, script_path: Path, sourcemap_path: Path) -> list[str]:
    """One line per file of `contents` (path -> text) that differs on disk from its text, saying how."""
    stale = []
    for path, text in contents.items():
        if not path.is_file():
            stale.append(f"{path.as_posix()} is missing")
            continue
        on_disk = path.read_text(encoding="utf-8")
        if on_disk == text:
            continue
        if path == script_path and edited_by_hand(script_path, sourcemap_path):
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
