"""Local stand-ins for the files notebooks fetch by URL, not by hub id: a book's text, a CSV, an image, a sound.

    standins = build(Path("work/urls"), ["https://www.gutenberg.org/ebooks/2701.txt.utf-8"])
    # {"https://www.gutenberg.org/ebooks/2701.txt.utf-8":
    #      (Path("work/urls/www.gutenberg.org/ebooks/2701.txt.utf-8"), "text/plain; charset=utf-8")}
    environment(standins, pythonpath)  # NBDDP_SWEEP_URLS and a PYTHONPATH with HOOK first, for the run

A URL whose path matches a pattern of KINDS gets a file under `root` named like it (host, then path), written by
code, deterministically, in the shape the notebooks read: a CSV with the columns its notebooks use, an image in
the format its name says, a short book for a `.txt`, a WAV tone for a sound (decoders read it by its header,
whatever the name). In the run, HOOK's sitecustomize answers urllib, requests, httpx and datasets for exactly
these URLs from their files; any other URL fails as it does without the sweep (no network).
"""
import csv
import hashlib
import json
import os
import random
import re
from pathlib import Path
from urllib.parse import urlsplit

from nbddp.formats.run_settings import ENV
from tools import standin_datasets

HOOK = Path(__file__).resolve().parent / "standin_hook"  # holds the runs' sitecustomize.py


def _csv(columns: dict):
    """A CSV with a header row and standin_datasets.ROWS rows: column name -> its value for a row (rng, i)."""
    def write(rng: random.Random, path: Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(columns)
            writer.writerows([value(rng, i) for value in columns.values()] for i in range(standin_datasets.ROWS))
    return write


def _image(image_format: str):
    def write(rng: random.Random, path: Path) -> None:
        standin_datasets._image(rng, path.stem, (96, 96)).save(path, format=image_format)
    return write


def _sound(rng: random.Random, path: Path) -> None:
    path.write_bytes(standin_datasets._wav(**standin_datasets._tone(rng, 1.0)))


def _book(rng: random.Random, path: Path) -> None:
    chapters = [f"CHAPTER {n}\n\n" + "\n\n".join(standin_datasets._words(rng, 20, 60).capitalize() + "."
                                                 for _ in range(5)) for n in range(1, 6)]
    path.write_text(f"The Stand-in Book of {path.name}\n\n" + "\n\n\n".join(chapters) + "\n", encoding="utf-8")


# (pattern of the URL's path, content type, writer(rng, path)); the first match wins.
KINDS = (
    # Granite4.0: load_dataset("csv", data_files=url, column_names=["snippet", "recommendation"], skiprows=1)
    (r"/Support-Bot-Recommendation/.+/support_recs\.csv$", "text/csv; charset=utf-8",
     _csv({"snippet": lambda rng, i: standin_datasets._words(rng) + "?",
           "recommendation": lambda rng, i: standin_datasets._words(rng) + "."})),
    (r"\.jpe?g$", "image/jpeg", _image("JPEG")),
    (r"\.png$", "image/png", _image("PNG")),
    (r"\.(mp3|wav|flac)$", "audio/wav", _sound),
    (r"\.txt(\.utf-8)?$", "text/plain; charset=utf-8", _book),  # Project Gutenberg's books: /ebooks/2701.txt.utf-8
)


def build(root: Path, urls) -> dict[str, tuple[Path, str]]:
    """Write the stand-in of each URL that KINDS knows under `root` (replacing an older one):
    URL -> (its file, its content type). Other URLs are left out."""
    standins = {}
    for url in dict.fromkeys(urls):
        parts = urlsplit(url)
        kind = next((k for k in KINDS if re.search(k[0], parts.path)), None)
        if kind is None:
            continue
        _, content_type, write = kind
        name = parts.path.lstrip("/") or "index"
        if parts.query:  # export?format=csv&gid=0: one file per query
            name += "-" + hashlib.sha256(parts.query.encode()).hexdigest()[:12]
        path = root / parts.netloc / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write(random.Random(url), path)
        standins[url] = (path, content_type)
    return standins


def environment(standins: dict[str, tuple[Path, str]], pythonpath: str | None) -> dict[str, str]:
    """The variables that make a run answer `standins` (HOOK's sitecustomize.py): none when there are none."""
    if not standins:
        return {}
    return {ENV.SWEEP_URLS: json.dumps({url: [str(path), kind] for url, (path, kind) in standins.items()}),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK), pythonpath]))}
