"""The table of run settings (nbddp.formats.run_settings) is the only place a setting is written: every command
takes the options the table gives it, the scripts' parameters are the table's, and docs/settings.md is what the table
renders."""
import argparse
import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest

from nbddp import cli, runtime
from nbddp.formats import run_settings
from nbddp.formats.script_parameters import NBDDP_PARAMETERS
from nbddp.orchestration.launch.launch import LaunchOptions

ROOT = Path(__file__).resolve().parents[2]
VERBS = ("smoke", "run", "launch", "regress")


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
              if sum(dest in taken[other] for other in VERBS) > 1 or dest in NBDDP_PARAMETERS}
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
    assert list(NBDDP_PARAMETERS) == names == ["backend", "resume", "batch_layout", "strategy", "workdir"]
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
