"""The docs say what the repository holds: every relative link resolves to a file and heading, and the tests
CONTRIBUTING.md tells a contributor to run exist. (The sweep's tables: tests/tools/test_generated_docs.py.)"""
import argparse
import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", "CONTRIBUTING.md", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
         "bench/results/HISTORY.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[`*]", "", heading.lstrip("#").strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_reach_a_file_and_heading(page):
    broken = []
    for target in LINK.findall((ROOT / page).read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, heading = target.partition("#")
        file = (ROOT / page).parent / path if path else ROOT / page
        if not file.exists() or (heading and file.suffix == ".md" and heading not in
                                 {anchor(line) for line in file.read_text().splitlines() if line.startswith("#")}):
            broken.append(target)
    assert broken == []


def test_the_tests_contributing_names_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    named = set(re.findall(r"tests/[\w/*]+\.py", text))
    assert len(named) > 10
    assert [name for name in sorted(named) if not list(ROOT.glob(name))] == []


# What the docs name: repository paths, nbddp's modules (and the names in them), and pipeline.py's commands with
# their options. Checked on every page a reader is sent to, so a moved module or a renamed option fails here.
NAMED_IN = ["README.md", "CONTRIBUTING.md", *(p.relative_to(ROOT).as_posix() for p in sorted(ROOT.glob("docs/*.md")))]
NBDDP = ROOT / "nbddp"
CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")  # markdown's: `a`, ``a `b` c``
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
PATH_TOKEN = re.compile(r"[\w.*-]+(?:/[\w.*-]*)+")
PLACEHOLDER = re.compile(r"^[A-Z]{1,3}(_|$|\.)")  # NN_name.ipynb, DIR, OUT
SUFFIXES = tuple(f".{suffix}" for suffix in ("py", "md", "json", "jsonl", "yaml", "yml", "toml", "txt", "ipynb", "sh",
                                             "png", "html", "log", "gz"))
# A dotted name rooted in nbddp: `nbddp.x.y`, or a room's short form as the docs write it (`runtime.setup`).
ROOMS = {"runtime": "nbddp.runtime", "export": "nbddp.export", "orchestration": "nbddp.orchestration",
         "formats": "nbddp.formats", "fallback": "nbddp.fallback", "examples": "nbddp.examples",
         "rewrites": "nbddp.export.rewrites", "nbddp": "nbddp"}
DOTTED = re.compile(r"(?<![\w./-])(?:" + "|".join(ROOMS) + r")(?:\.[A-Za-z_]\w*)+")
# `pipeline.py CMD`, or `nbddp CMD` where a command line starts (not the prose of a message: `nbddp does not ...`).
COMMAND = re.compile(r"(?:\bpipeline\.py|(?:^|&&)\s*nbddp|%nbddp)\s+([a-z][\w-]*)([^`\n#&|;)]*)")
SCRIPT_MODULE = re.compile(r"python3? -m (\w[\w.]*)")
MAX_CELL = 350  # characters in a table cell


def spans(page: str) -> tuple[list[str], str]:
    """The page's code: its inline code spans and fenced blocks' lines (one string each), and its prose without
    them. A span may wrap within a paragraph, not across a table's rows."""
    text = (ROOT / page).read_text()
    units = []
    for paragraph in FENCE.sub("", text).split("\n\n"):
        units += paragraph.splitlines() if paragraph.lstrip().startswith("|") else [paragraph.replace("\n", " ")]
    inline = [match[2].strip() for unit in units for match in CODE_SPAN.finditer(unit)]
    blocks = [line for block in FENCE.findall(text) for line in block.splitlines()[1:-1]]
    return inline + blocks, "\n".join(CODE_SPAN.sub(" ", unit) for unit in units)


def claims_a_repo_path(token: str) -> bool:
    """Whether the token names a file of this repository rather than one a run writes (`runs/...`, `outputs/...`)
    or a placeholder (`notebooks/NN_name.ipynb`, `DIR/out`): its first folder is one of the repository's, or it is a
    module or folder of one of nbddp's packages (`trainer/fsdp.py`, `smoke/`)."""
    parts = token.split("/")
    if token.startswith(("/", "..", "~")) or any(PLACEHOLDER.match(part) for part in parts):
        return False
    packages = {p.parent.name for p in NBDDP.rglob("__init__.py")}
    return ((ROOT / parts[0]).is_dir() and (not parts[0].startswith(".") or parts[0] == ".ci")
            or parts[0] in packages and token.endswith((".py", "/")))


def missing_paths(page: str) -> list[str]:
    """The repository paths a page names (a code span that is one path, or a file or folder in its prose) that
    exist neither from the root, nor the page's folder, nor any of nbddp's packages (the docs write
    `runtime/backend.py` for nbddp/runtime/backend.py); `*` globs."""
    code, prose = spans(page)
    tokens = {span for span in code if PATH_TOKEN.fullmatch(span)}
    tokens |= {token.rstrip(".,:") for token in PATH_TOKEN.findall(prose)
               if token.rstrip(".,:").endswith(("/", *SUFFIXES))}
    bases = [ROOT, (ROOT / page).parent, *(p.parent for p in NBDDP.rglob("__init__.py"))]
    return sorted(token for token in tokens if claims_a_repo_path(token)
                  and not any(list(base.glob(token.rstrip("/"))) for base in bases))


def bound_names(body) -> set[str]:
    """The names a module's or class's body binds: functions, classes, assignments, imports."""
    names = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


@functools.cache
def module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def module_file(dotted: str) -> Path | None:
    path = ROOT / dotted.replace(".", "/")
    return next((p for p in (path.with_suffix(".py"), path / "__init__.py") if p.is_file()), None)


def class_has(tree: ast.Module, node: ast.ClassDef, name: str) -> bool:
    """`name` bound in the class or a base; a base from outside nbddp (`Exception`) may bind anything."""
    for base in (base.id for base in node.bases if isinstance(base, ast.Name)):
        origin = next((module_tree(file) for statement in tree.body if isinstance(statement, ast.ImportFrom)
                       and statement.module and statement.module.startswith("nbddp")
                       and base in {alias.asname or alias.name for alias in statement.names}
                       and (file := module_file(statement.module))), tree)
        defined = [n for n in origin.body if isinstance(n, ast.ClassDef) and n.name == base]
        if not defined or class_has(origin, defined[0], name):
            return True
    return name in bound_names(node.body) or any(not isinstance(base, ast.Name) for base in node.bases)


def dotted_name_exists(dotted: str) -> bool:
    """`nbddp.a.b.name[.attribute]`: a.b a package or module file, `name` bound in it, and an attribute bound in
    the class `name` is (read from the source; nothing is imported)."""
    root, *rest = dotted.split(".")
    parts = [*ROOMS[root].split("."), *rest]
    path, index = ROOT, 0
    while index < len(parts) and ((path / parts[index]).is_dir() or (path / f"{parts[index]}.py").is_file()):
        path, index = path / parts[index], index + 1
    if index == len(parts):
        return True
    tree = module_tree(path / "__init__.py" if path.is_dir() else path.with_suffix(".py"))
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == parts[index]]
    return parts[index] in bound_names(tree.body) and (
        index + 1 == len(parts) or not classes or class_has(tree, classes[0], parts[index + 1]))


def missing_modules(page: str) -> list[str]:
    """The nbddp modules and names a page names that do not exist."""
    code, prose = spans(page)
    names = {name for text in [*code, prose] for name in DOTTED.findall(text) if not name.endswith(SUFFIXES)}
    return sorted(name for name in names if not dotted_name_exists(name))


@pytest.fixture(scope="module")
def commands():
    """pipeline.py's subcommands -> the option strings each takes."""
    from nbddp import cli

    (subparsers,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: {option for action in parser._actions for option in action.option_strings}
            for name, parser in subparsers.choices.items()}


def missing_commands(page: str, commands: dict) -> list[tuple[str, str]]:
    """The (subcommand, "") and (subcommand, option) pairs a page's code names that pipeline.py lacks, and the
    ("python -m", module) of this repository's modules it runs that do not exist."""
    named, code = set(), spans(page)[0]
    for match in (match for text in code for match in COMMAND.finditer(text)):
        named.add((match[1], ""))
        for word in match[2].split():
            if word == "--":  # what follows goes to the script
                break
            if word.startswith("-") and word != "-":
                named.add((match[1], word.split("=")[0]))
    missing = {(command, option) for command, option in named
               if command not in commands or option and option not in commands[command]}
    for module in {name for text in code for name in SCRIPT_MODULE.findall(text)}:
        path = ROOT / module.replace(".", "/")
        if (ROOT / module.split(".")[0]).is_dir() and not (path.with_suffix(".py").is_file()
                                                           or (path / "__main__.py").is_file()):
            missing.add(("python -m", module))  # this repository's modules only, not pytest or venv
    return sorted(missing)


@pytest.mark.parametrize("page", NAMED_IN)
def test_the_paths_a_page_names_exist(page):
    assert missing_paths(page) == []


@pytest.mark.parametrize("page", NAMED_IN)
def test_the_modules_and_names_a_page_names_exist(page):
    assert missing_modules(page) == []


@pytest.mark.parametrize("page", NAMED_IN)
def test_the_commands_and_options_a_page_names_exist(page, commands):
    assert missing_commands(page, commands) == []


def test_the_checks_find_what_does_not_exist(tmp_path, commands):
    page = tmp_path / "page.md"
    page.write_text("Stale: `nbddp/runtime/backends/`, `runtime/flags.py` and tests/test_gone.py; "
                    "`nbddp.runtime.heartbeat`, `runtime.setup_all`, `nbddp.runtime.context.DistributedContext.gone`.\n"
                    "Fine: `runtime/inputs/flags.py`, `runs/<time>-run/`, `outputs/checkpoint-4`, `DIR/out/train.py`, "
                    "`nbddp.runtime.context.DistributedContext.shell` (a base's), `nbddp.errors.UsageError.args`.\n\n"
                    "```bash\npython pipeline.py run --no-such-option -p max_steps 3 -- --max_steps 3\n"
                    "python pipeline.py deploy\npython -m tools.gone && python -m tools.notebook_sweep\n```\n")
    assert missing_paths(str(page)) == ["nbddp/runtime/backends/", "runtime/flags.py", "tests/test_gone.py"]
    assert missing_modules(str(page)) == [
        "nbddp.runtime.context.DistributedContext.gone", "nbddp.runtime.heartbeat", "runtime.setup_all"]
    assert missing_commands(str(page), commands) == [("deploy", ""), ("python -m", "tools.gone"),
                                                     ("run", "--no-such-option")]


@pytest.mark.parametrize("page", NAMED_IN)
def test_table_cells_stay_readable(page):
    # A cell of several hundred characters is a paragraph squeezed into a column: a short cell, and the rest below.
    long = [(number, len(cell)) for number, line in enumerate((ROOT / page).read_text().splitlines(), 1)
            if line.startswith("|") for cell in line.strip("|").split(" | ") if len(cell.strip()) > MAX_CELL]
    assert long == []
