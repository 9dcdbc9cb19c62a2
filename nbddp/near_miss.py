"""What a path that does not exist probably meant: the closest name beside it, for bad-input messages.

    f"no such directory{closest_sibling(Path('models/tyny-llama'), Path.is_dir)}"
    # no such directory (did you mean 'models/tiny-llama'?)
"""
import difflib
from pathlib import Path


def closest_sibling(path: Path, kind) -> str:
    """' (did you mean '<sibling>'?)' for the entry of `path`'s folder, of `kind` (Path.is_dir, Path.is_file), whose
    name is closest to `path`'s; ' (<folder> does not exist either)' without the folder (and, for a relative path,
    where it was read from: the notebooks' folder, in a generated script); '' when nothing is close."""
    if not path.parent.is_dir():
        where = "" if path.is_absolute() else f"; relative paths are read from {Path.cwd()}, where the cells run"
        return f" ({path.parent} does not exist either{where})"
    siblings = [entry.name for entry in path.parent.iterdir() if kind(entry)]
    close = difflib.get_close_matches(path.name, siblings, n=1)
    return f" (did you mean {str(path.parent / close[0])!r}?)" if close else ""
