"""nbddp as a tool in one's own project: the built wheel, installed into a fresh virtual environment away from this
repository, makes a starter project, exports it and runs it (smoke run, then torchrun on 2 CPU processes).

The fresh environment borrows the dependencies of the one running the tests through a .pth line (site does not run
the .pth files of a folder added that way, so the editable install of this repository stays out of it), and every
command starts in a temporary folder without PYTHONPATH: only the wheel's nbddp can be imported.
"""
import email.parser
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
QUICK = ["-p", "max_steps", "4", "-p", "eval_steps", "2", "-p", "eval_rows", "16"]


def run(command, cwd, timeout=300, **environment):
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(command, cwd=cwd, env={**env, **environment}, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """nbddp's wheel, built from this repository."""
    work = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", str(REPO),
         "-w", str(work)], cwd=work)
    (built,) = work.glob("nbddp-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel):
    """The bin/ folder of a fresh virtual environment holding nbddp installed from its wheel."""
    work = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "venv", str(work / "venv")], cwd=work)
    bin_dir = work / "venv" / "bin"
    purelib = run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                  cwd=work).strip()
    (Path(purelib) / "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)], cwd=work)
    return bin_dir


@pytest.mark.e2e
def test_the_wheel_declares_the_tested_ranges(wheel):
    # What pip installs is the wheel's metadata, not pyproject.toml: its torch, transformers, trl, accelerate and
    # datasets ranges are the releases nbddp's patches were tested on, so the first run warns about none of them.
    from test_install_metadata import declared_ranges

    from nbddp import patches

    with zipfile.ZipFile(wheel) as archive:
        (name,) = [entry for entry in archive.namelist() if entry.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    requirements = [line.split(";")[0] for line in metadata.get_all("Requires-Dist")]
    assert declared_ranges(requirements) == {library: patches.tested_range(library) for library in patches.TESTED}


@pytest.mark.e2e
def test_the_wheel_ships_the_training_arguments_schemas(wheel):
    # A first `--set` check on a pinned stack reads them, instead of a child process importing transformers.
    folder = "nbddp/runtime/inputs/schemas/"
    shipped = sorted(folder + path.name for path in (REPO / folder).glob("*.json"))
    with zipfile.ZipFile(wheel) as archive:
        assert shipped and sorted(name for name in archive.namelist() if name.startswith(folder)) == shipped


@pytest.mark.e2e
def test_the_installed_command_makes_exports_and_runs_a_project_outside_the_repository(installed, tmp_path):
    where = run([str(installed / "python"), "-c", "import nbddp; print(nbddp.__file__)"], cwd=tmp_path)
    assert Path(where.strip()).is_relative_to(installed.parent) and not Path(where.strip()).is_relative_to(REPO)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert run([str(installed / "nbddp"), "--version"], cwd=tmp_path).strip() == f"nbddp {version}"

    printed = run([str(installed / "nbddp"), "new", "project"], cwd=tmp_path)
    project = tmp_path / "project"
    assert "next: cd project && nbddp run" in printed
    assert (project / "models" / "tiny-llama" / "tokenizer.json").is_file()
    assert (project / "data" / "tiny_instructions.jsonl").read_bytes() == (REPO / "data" / "tiny_instructions.jsonl").read_bytes()
    assert run([str(installed / "nbddp"), "export", "--check"], cwd=project).startswith("generated is up to date")

    summary = run([str(installed / "nbddp"), "run", "--nproc-per-node", "2", *QUICK], cwd=project, timeout=600)
    assert "smoke: ok" in summary
    assert [path.name for path in (project / "runs").iterdir()], "the run wrote no run folder"


@pytest.mark.e2e
def test_new_refuses_a_folder_that_holds_anything(installed, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    result = subprocess.run([str(installed / "nbddp"), "new", "mine"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "not empty" in result.stderr and "nothing of yours is overwritten" in result.stderr
    assert [path.name for path in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine"]  # no staging folder left behind
