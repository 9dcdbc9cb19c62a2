"""`nbddp new DIR`: a starter project to run and then make one's own, written into a new or empty folder.

    nbddp new my-finetune && cd my-finetune && nbddp run

DIR gets the default job of nbddp's repository: the stage notebooks with their jupytext pairs (notebooks/), the
instruction data (data/), the tiny Llama's config and tokenizer (models/tiny-llama/; weights are made from the config
on first use) and generated/train.py exported from them. An installed nbddp carries them as package data
(nbddp/starter/, written by setup.py); a clone or an editable install reads them from the repository. Nothing in DIR
is ever overwritten: a folder that holds anything is refused, and files are written into a temporary sibling that
is renamed into place at the end, so a failure leaves no half-written project.
"""
import contextlib
import os
import secrets
import shutil
from pathlib import Path

import nbddp
from nbddp.errors import UsageError
from nbddp.starter_files import STARTER


def starter_root() -> Path:
    """The folder holding the starter's files: the wheel's package data, else the repository nbddp runs from."""
    package = Path(nbddp.__file__).resolve().parent
    installed = package / "starter"
    return installed if installed.is_dir() else package.parent


def new_project(directory) -> Path:
    """Write the starter project into `directory` (absent or empty) and export it; returns its generated script."""
    target = Path(directory)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        what = "a folder that is not empty" if target.is_dir() else "a file"
        raise UsageError(f"nbddp new {directory}: {target} is {what}; nbddp new writes only into a new or empty "
                         "folder, so nothing of yours is overwritten: give another name")
    source = starter_root()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.nbddp-new-{secrets.token_hex(4)}"
    staging.mkdir()  # with the user's umask, unlike tempfile.mkdtemp's 0700
    try:
        for folder, patterns in STARTER.items():
            files = sorted(path for pattern in patterns for path in (source / folder).glob(pattern))
            if not files:
                raise UsageError(f"nbddp new: this nbddp has no starter files in {source / folder}; reinstall it "
                                 "(pip install --force-reinstall <clone or git URL>)")
            (staging / folder).mkdir(parents=True)
            for path in files:
                shutil.copyfile(path, staging / folder / path.name)
        from nbddp.export import export  # the export room (libcst): for this command only, not every command's start

        with contextlib.chdir(staging):  # the script names its notebooks as `nbddp export` in DIR would
            export("notebooks", "generated")
        if target.is_dir():
            target.rmdir()  # empty, checked above; os.replace needs the name free
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target / "generated" / "train.py"
