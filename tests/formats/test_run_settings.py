"""The table of run settings (nbddp.formats.run_settings) is the only place a setting or an NBDDP_ variable is
written: the code and the docs name no variable the table lacks, nbddp and pipeline.py spell none (not even in a
docstring, a comment or a Python name) outside the table, bench and tools none in code outside its allowed readers,
every command takes the options the table gives it, the scripts' parameters are the table's, and docs/settings.md is
what the table renders."""
import argparse
import ast
import dataclasses
import inspect
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from nbddp import cli, runtime
from nbddp.formats import run_settings
from nbddp.formats.script_parameters import OWN_PARAMETERS
from nbddp.orchestration.launch.launch import LaunchOptions

ROOT = Path(__file__).resolve().parents[2]
OWN = ["nbddp", "pipeline.py"]  # nbddp itself: only the table spells a variable, anywhere in a file
SCANNED = [*OWN, "bench", "tools"]
VARIABLE = re.compile(r"NBDDP_[A-Z0-9_]*[A-Z0-9]")
TABLE = "nbddp/formats/run_settings.py"
# The files besides the table that may spell a variable in code, and why.
READERS = {
    # Python imports it at every interpreter's start in a sweep's run, before (and whether or not) nbddp imports.
    "tools/standin_hook/sitecustomize.py",
}
VERBS = ("smoke", "run", "launch", "regress")


def python_files(names=SCANNED):
    for name in names:
        path = ROOT / name
        yield from [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def docstrings(tree) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled(path):
    """(line, name, in code) for each NBDDP_ name in `path`'s strings and comments; `in code`: in a string that is
    no docstring (a Python name such as NBDDP_NOTEBOOK, or one inside an f-string's braces, is no string)."""
    source = path.read_text()
    tree = ast.parse(source)
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in VARIABLE.findall(node.value):
                yield node.lineno, name, id(node) not in skip
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            for name in VARIABLE.findall(token.string):
                yield token.start[0], name, False


def test_every_variable_the_code_names_is_in_the_table():
    known = {entry.env for entry in run_settings.SETTINGS if entry.env}
    unknown = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in python_files()
               for line, name, _ in spelled(path) if name not in known]
    assert unknown == [], "add these variables to nbddp/formats/run_settings.py, or fix the name"


def test_every_variable_the_docs_name_is_in_the_table():
    known = {entry.env for entry in run_settings.SETTINGS if entry.env}
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    unknown = {f"{page.relative_to(ROOT)}: {name}" for page in pages for name in VARIABLE.findall(page.read_text())
               if name not in known}
    assert sorted(unknown) == [], "a variable the table lacks: fix the page, or add the setting to the table"


def test_nbddp_spells_a_variable_only_in_the_table():
    # Everywhere else a docstring, comment or message names the setting ("the run setting `max_steps`", or the
    # option a user types) and code reads the name from the table (run_settings.ENV.<NAME>); a Python name
    # starting NBDDP_ would hide a spelled variable from this check, so none is allowed either.
    spelling = [path.relative_to(ROOT).as_posix() for path in python_files(OWN) if run_settings.PREFIX in
                path.read_text()]
    assert spelling == [TABLE], ("name the setting instead: 'the run setting `max_steps`' in prose, "
                                 "run_settings.ENV.MAX_STEPS in code")


def test_only_the_table_and_its_readers_spell_a_variable_in_code():
    allowed = {TABLE, *READERS}
    outside = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in python_files() for line, name, in_code in
               spelled(path) if in_code and path.relative_to(ROOT).as_posix() not in allowed]
    assert outside == [], "read the name from the table instead: run_settings.ENV.<NAME>"
    assert len(allowed) <= 3


def test_the_scan_sees_a_variable_in_code_and_not_a_python_name(tmp_path):
    path = tmp_path / "example.py"
    path.write_text('"""NBDDP_IN_DOCS."""\nNBDDP_NOTEBOOK = 1  # NBDDP_IN_COMMENT\n'
                    'x = f"{NBDDP_NOTEBOOK} NBDDP_IN_CODE"\n')
    assert sorted(spelled(path)) == [(1, "NBDDP_IN_DOCS", False), (2, "NBDDP_IN_COMMENT", False),
                                     (3, "NBDDP_IN_CODE", True)]


def test_env_names_each_variable_once():
    variables = [entry.env for entry in run_settings.SETTINGS if entry.env]
    assert len(variables) == len(set(variables)) and all(name.startswith(run_settings.PREFIX) for name in variables)
    assert run_settings.ENV.MAX_STEPS == run_settings.env_name("max_steps") == "NBDDP_MAX_STEPS"
    with pytest.raises(KeyError):
        run_settings.setting("no_such_setting")


def subcommands() -> dict:
    parser = cli.build_parser()
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction)).choices


def options(command) -> dict:
    """{dest: its option strings} of a command's parser."""
    found = {}
    for action in command._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            found.setdefault(action.dest, []).extend(action.option_strings)
    return found


@pytest.mark.parametrize("verb", VERBS)
def test_each_command_takes_every_option_the_table_gives_it(verb):
    taken = options(subcommands()[verb])
    for entry in run_settings.for_command(verb):
        assert sorted(taken.get(entry.destination(), [])) == sorted(entry.option_strings()), entry.name


def test_an_option_of_several_commands_is_a_setting_of_the_table():
    # One that two commands take, or that names a script parameter, is a run setting: written once, in the table.
    commands = subcommands()
    taken = {verb: options(commands[verb]) for verb in VERBS}
    shared = {dest for verb in VERBS for dest in taken[verb]
              if sum(dest in taken[other] for other in VERBS) > 1 or dest in OWN_PARAMETERS}
    table = {entry.destination(): entry for entry in run_settings.SETTINGS}
    missing = sorted(f"{verb} {dest}" for verb in VERBS for dest in shared & taken[verb].keys()
                     if dest not in table or verb not in table[dest].commands)
    assert missing == []


def test_smoke_run_and_launch_take_the_batch_layout_and_the_strategy():
    for verb in ("smoke", "run", "launch"):
        assert {"--batch-layout", "--strategy"} <= {option for strings in options(subcommands()[verb]).values()
                                                    for option in strings}


def test_the_scripts_parameters_are_the_tables():
    names = [entry.name for entry in run_settings.script_parameters()]
    assert list(OWN_PARAMETERS) == names == ["backend", "resume", "batch_layout", "strategy", "workdir"]
    keywords = inspect.signature(runtime.setup).parameters  # a notebook's own setup cell passes them as keywords
    assert {name: keywords[name].default for name in names} == {
        entry.name: entry.default for entry in run_settings.script_parameters()}


def test_the_exported_script_has_the_tables_parameter_lines():
    script = (ROOT / "generated" / "train.py").read_text()
    workdir = re.search(r"^workdir = (.*?)  #", script, re.MULTILINE).group(1)
    assert "\n".join(run_settings.script_parameter_lines(json.dumps(json.loads(workdir)))) in script


def test_torchruns_world_defaults_are_the_tables():
    fields = {"nproc": "nproc_per_node"}
    world = [entry for entry in run_settings.SETTINGS if entry.commands == run_settings.TORCHRUN_COMMANDS]
    assert {fields.get(field.name, field.name): field.default for field in dataclasses.fields(LaunchOptions)} == {
        entry.name: entry.default for entry in world}


def test_docs_settings_is_what_the_table_renders():
    assert (ROOT / "docs" / "settings.md").read_text() == run_settings.markdown(), (
        "regenerate: .venv/bin/python -c 'from nbddp.formats import run_settings; "
        "print(run_settings.markdown(), end=\"\")' > docs/settings.md")
