"""pyproject.toml's dependency ranges hold on both supported stacks, and the pre-commit hook runs on what it should."""

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

# The GPU host's versions where they differ from requirements.txt: docs/performance.md ("Hardware and software")
# and `pip list` on the lent H200 host (2026-12-01); .gpu-site/site.tgz adds the notebook stack at requirements.txt's pins.
GPU_HOST = {"torch": "2.11.0+cu130", "peft": "0.21.0", "pyyaml": "6.0.3", "pytest": "9.1.1",
            "huggingface-hub": "1.33.0", "httpx": "0.28.1"}


def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements_pins(name="requirements.txt") -> dict[str, str]:
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def check_stack(pins: dict[str, str], requirements: list[str], complete=True) -> list[str]:
    """The requirements that `pins` does not satisfy, or (when `complete`) names it lacks."""
    failures = []
    for requirement in map(Requirement, requirements):
        version = pins.get(canonicalize_name(requirement.name))
        if version is None and not complete:
            continue
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            failures.append(f"{requirement} (stack has {version})")
    return failures


def test_requirements_txt_pins_satisfy_the_ranges():
    """`pip install -r requirements.txt` ends with `-e .`: its pins must fall inside pyproject's ranges.

    What it does not pin (huggingface-hub, httpx: Transformers' own requirements) pip takes within the range."""
    requirements = project()["dependencies"] + project()["optional-dependencies"]["dev"]
    assert check_stack(requirements_pins(), requirements, complete=False) == []


def test_the_notebooks_stack_satisfies_the_ranges():
    """requirements-notebooks.txt: the transformers 4.56.2 / trl 0.22.2 stack Unsloth's notebooks pin, the rest as
    requirements.txt (the same names, so nothing is left for pip to pick differently)."""
    pins = requirements_pins("requirements-notebooks.txt")
    assert (pins["transformers"], pins["trl"], pins["huggingface-hub"]) == ("4.56.2", "0.22.2", "0.35.3")
    assert set(requirements_pins()) <= set(pins)
    assert check_stack(pins, project()["dependencies"], complete=False) == []


def test_gpu_host_versions_satisfy_the_ranges():
    stack = requirements_pins() | {canonicalize_name(name): version for name, version in GPU_HOST.items()}
    assert check_stack(stack, project()["dependencies"]) == []


def declared_ranges(requirements) -> dict[str, str]:
    """{name: its version range, in `patches.tested_range`'s form} for each requirement naming a library the
    runtime patches: `>=4.56.2,<5.18` reads `>=4.56,<5.18` (the tested releases are major.minor), `==2026.10.9`
    `>=2026.10,<2026.11`."""
    from packaging.version import Version

    from nbddp import patches

    ranges = {}
    for requirement in map(Requirement, requirements):
        if requirement.name not in patches.TESTED:
            continue
        bounds = {spec.operator: Version(spec.version).release for spec in requirement.specifier}
        low, high = bounds.get(">=", bounds.get("==")), bounds.get("<")
        if "==" in bounds:
            high = (low[0], low[1] + 1)
        ranges[requirement.name] = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    return ranges


def test_the_declared_ranges_are_the_tested_ones():
    # An installed nbddp gets only the releases its patches were tested on: its first run never warns about them
    # (nbddp/patches.py, TESTED), and its warning's advice is this same range.
    from nbddp import patches

    declared = declared_ranges(project()["dependencies"] + project()["optional-dependencies"]["unsloth"])
    assert declared == {library: patches.tested_range(library) for library in patches.TESTED}
    assert declared["torch"] == ">=2.11,<2.14"
    (torch,) = [Requirement(r) for r in project()["dependencies"] if Requirement(r).name == "torch"]
    assert not any(s.operator == "==" for s in torch.specifier)  # the index chooses the build: CPU or CUDA


def test_every_stack_the_suite_runs_is_a_tested_one():
    from nbddp import patches

    stacks = [requirements_pins(), requirements_pins("requirements-notebooks.txt"),
              requirements_pins() | {canonicalize_name(name): version for name, version in GPU_HOST.items()}]
    for pins in stacks:
        assert check_stack(pins, [f"{library}{patches.tested_range(library)}" for library in patches.TESTED],
                           complete=False) == []


def test_readme_and_the_commands_help_give_the_same_install_commands():
    from nbddp import cli

    readme = (ROOT / "README.md").read_text()
    commands = [line.split(": ", 1)[1] for line in cli.WORKFLOW.splitlines() if line.startswith(("  CPU: ", "  GPU: "))]
    assert commands == ["pip install --extra-index-url https://download.pytorch.org/whl/cpu /path/to/nbddp-clone",
                        "pip install '/path/to/nbddp-clone[unsloth]'"]
    assert all(f"\n{command}\n" in readme for command in commands)


def test_unsloth_extra_is_the_guides_gpu_install():
    guide = (ROOT / "docs" / "guide.md").read_text()
    (line,) = [line for line in guide.splitlines() if re.match(r"\S*pip install unsloth==", line)]
    assert sorted(line.split()[2:]) == sorted(project()["optional-dependencies"]["unsloth"])


def test_pre_commit_hook_runs_export_check_on_notebooks_and_generated_files():
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert (hook["id"], hook["entry"], hook["language"], hook["pass_filenames"]) == (
        "nbddp-export-check", "nbddp export --check", "python", False)
    files = re.compile(hook["files"])  # pre-commit matches with re.search on the path from the repository root
    assert all(files.search(p) for p in ("notebooks/01_data_prep.ipynb", "nbs/a.ipynb", "generated/train.py"))
    assert not any(files.search(p) for p in ("README.md", "nbddp/cli.py", "notebooks/01_data_prep.py"))
