"""setuptools' build, plus the starter project that `nbddp new` copies, as package data (nbddp/starter/ in the wheel).

The starter is this repository's default job: the stage notebooks with their jupytext pairs, the instruction data and
the tiny Llama's config and tokenizer. They stay where the clone runs them (notebooks/, data/, models/tiny-llama/):
the build copies them into the wheel instead of the repository keeping a second copy inside nbddp/.
"""
import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
STARTER = runpy.run_path(str(ROOT / "nbddp" / "starter_files.py"))["STARTER"]


class BuildWithStarter(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "nbddp" / "starter"
        for folder, patterns in STARTER.items():
            for pattern in patterns:
                for path in sorted((ROOT / folder).glob(pattern)):
                    (target / folder).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target / folder / path.name)


setup(cmdclass={"build_py": BuildWithStarter})
