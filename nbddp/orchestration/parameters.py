"""Parameters of a generated script: defaults from its `parameters` cell, typed overrides from -p / -f;
and the training-argument overrides of `--set NAME=VALUE`, for the processes we start.

`-p` values are typed by the rule the script's own `--name VALUE` flags use (nbddp.formats.parameters.typed):
the default's type decides, so `-p max_steps 3` is the int 3 and `-p lr 2e-4` the float 0.0002. `--set` lines
are checked before any work as the runtime will type them (training_overrides, in a child process that sees no
GPU), and reach the children as the run setting `set` (an environment variable).
"""

import difflib
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from nbddp.errors import NbddpError, NotebookError, UsageError
from nbddp.formats.parameters import ParametersCellError, checked, read_cell, read_script, typed
from nbddp.formats.script_parameters import (  # nbddp's own, in every script
    BATCH_LAYOUT, OWN_PARAMETERS, STRATEGIES, STRATEGY, WORKDIR)
from nbddp.orchestration import environment
from nbddp.runtime import working_directory
from nbddp.runtime.inputs import training_overrides
from nbddp.runtime.memory import batch_plan

PARAMETERS_TAG = "parameters"
CHECK_TIMEOUT_S = 300  # the --set check's child: importing transformers and trl, seconds


def read_defaults(notebook, path):
    """`{name: default}` from the cell tagged `parameters` of `notebook` (read from `path`)."""
    for index, cell in enumerate(notebook.cells, start=1):
        if cell.cell_type == "code" and PARAMETERS_TAG in cell.metadata.get("tags", []):
            return _literal_assignments(cell.source, path, index)
    raise NotebookError(path, "no cell is tagged `parameters`", hint="re-run `python pipeline.py export`")


def with_absolute_paths(script, defaults, values):
    """`values` (parameters for `script`) with `workdir` (when the script has one) and a relative `output_dir` made
    absolute, as the script's cells will read them: so a kernel, whose working directory is ours, changes into the
    notebooks' folder, and we find the output_dir the cells write to."""
    values = dict(values)
    workdir = values.get(WORKDIR, defaults.get(WORKDIR, ""))
    cells = working_directory.folder(workdir, script) if workdir else None  # the runtime's own reading of it
    if cells is not None:
        values[WORKDIR] = cells
    if isinstance(values.get("output_dir"), str):
        values["output_dir"] = os.path.normpath(os.path.join(cells or os.getcwd(), values["output_dir"]))
    return values


def check_paths(script, defaults, values, labels=None):
    """UsageError for a relative path among `values` (the user's parameters for `script`) that names nothing from
    the folder where the cells run and read it from (the notebooks', the script's `workdir`) but names something
    from this process's working directory: the user meant that one, and the message spells it from the cells'
    folder. `labels`: {name: how the user gave it}, `-p NAME` by default (`-f FILE: NAME`, `--NAME`)."""
    workdir = values.get(WORKDIR, defaults.get(WORKDIR, ""))
    cells = working_directory.folder(workdir, script) if workdir else os.getcwd()
    for name, value in values.items():
        if name == WORKDIR or not isinstance(value, str) or not value or os.path.isabs(value):
            continue
        if _names_something(os.path.join(cells, value)) or not _names_something(value):
            continue
        spelled = os.path.relpath(os.path.abspath(value), cells)
        label = (labels or {}).get(name, f"-p {name}")
        source, _, _ = label.partition(": ")
        fix = f"write `{name}: {spelled}` in {source.removeprefix('-f ')}" if label.startswith("-f ") else \
            f"use {label} {spelled}"
        raise UsageError(f"{label} {value}: the cells run in {cells} (the notebooks' folder) and read a relative path "
                         f"from there, where {value} names nothing; the {value} in {os.getcwd()} is {spelled} from "
                         f"there: {fix} (or an absolute path)")


def check_script_flag_paths(script, script_args):
    """`check_paths` for the script's own `--NAME VALUE` flags that launch passes on (`-- --data_path x.jsonl`);
    nothing for a script that cannot be read (launch reports that)."""
    try:
        defaults = {parameter.name: parameter.default for parameter in read_script(script)}
    except (OSError, ParametersCellError):
        return
    values = {}
    for index, word in enumerate(script_args):
        name, equals, text = word.removeprefix("--").partition("=")
        if word.startswith("--") and name in defaults and (equals or index + 1 < len(script_args)):
            values[name] = text if equals else script_args[index + 1]
    check_paths(script, defaults, values, {name: f"--{name}" for name in values})


def _names_something(path):
    """A file or folder is at `path`, or, for a glob pattern (a data file's `data/*.jsonl`), it matches one."""
    return os.path.exists(path) or (glob.has_magic(path) and bool(glob.glob(path)))


def project_folder(values):
    """The project around the notebooks' folder, where the cells' relative paths lead: the parent of `values`'
    workdir (made absolute by `with_absolute_paths`), or the working directory for a script without one."""
    return Path(values[WORKDIR]).parent if values.get(WORKDIR) else Path.cwd()


def _literal_assignments(source, path, cell):
    try:
        return {parameter.name: parameter.default for parameter in read_cell(source)}
    except ParametersCellError as error:
        message = (f"`{error.name}` is not a literal" if error.name else
                   "the parameters cell may hold only `name = literal` lines")
        raise NotebookError(path, message, cell, error.line) from None


def load_parameter_file(path):
    """The `{name: value}` mapping in the YAML file given with -f."""
    try:
        with open(path, encoding="utf-8") as stream:
            values = yaml.safe_load(stream)
    except OSError as error:
        raise UsageError(f"-f {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise UsageError(f"-f {path}: not valid YAML ({error})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise UsageError(f"-f {path}: expected a mapping of parameter names to values")
    return values


def resolve(defaults, file_values=None, flag_values=(), file_label="-f"):
    """Overrides typed like `defaults`: the -f file's values first, then each `-p NAME VALUE` on top."""
    overrides = {}
    for name, value in (file_values or {}).items():
        _check_known(name, defaults, f"{file_label}: {name}")
        overrides[name] = check_type(name, value, defaults[name], f"{file_label}: {name}")
    for name, text in flag_values:
        _check_known(name, defaults, f"-p {name}")
        overrides[name] = parse_flag(name, text, defaults[name])
    return overrides


def _check_known(name, defaults, where):
    if name in defaults:
        return
    if not defaults.keys() - OWN_PARAMETERS:
        raise UsageError(f"{where}: unknown parameter `{name}`: the notebooks define no parameters "
                         "(tag a cell `parameters` to make its assignments parameters)")
    close = difflib.get_close_matches(name, defaults, n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    known = ", ".join(sorted(defaults))
    raise UsageError(f"{where}: unknown parameter `{name}` ({hint}the script's parameters: {known})")


def parse_flag(name, text, default):
    """The value of `-p NAME TEXT`, typed from `default` as the script types its `--NAME TEXT`."""
    try:
        return typed(name, default, text)
    except ValueError as error:
        raise UsageError(f"-p {name}: {error}") from None


def check_type(name, value, default, where):
    """`value` (already typed, e.g. by YAML) checked against the default's type (ints widen to float) and by the
    rules the script's flags apply (formats.parameters.checked)."""
    if default is None:
        return value
    if isinstance(default, bool) or isinstance(value, bool):
        matches = isinstance(default, bool) and isinstance(value, bool)
    elif isinstance(default, float) and isinstance(value, int):
        value, matches = float(value), True
    else:
        matches = isinstance(value, type(default))
    if not matches:
        raise UsageError(f"{where}: expected {type(default).__name__} like the default {default!r}, got {value!r}")
    try:
        return checked(name, value)
    except ValueError as error:
        raise UsageError(f"{where}: {error}") from None


def as_script_flags(overrides):
    """`--name VALUE` arguments for the generated script; its runtime parses VALUE back by the default's type."""
    flags = []
    for name, value in overrides.items():
        flags += [f"--{name}", _flag_text(value)]
    return flags


def _flag_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    # None, numbers, lists and dicts as Python literals, which the runtime reads with ast.literal_eval.
    return repr(value)


def with_batch_layout(defaults, overrides, batch_layout):
    """`overrides` plus the `batch_layout` parameter from `--batch-layout` (None: the script's own default)."""
    if batch_layout is None:
        return overrides
    batch_layout = checked_batch_layout(batch_layout)
    if BATCH_LAYOUT not in defaults:
        raise UsageError(f"--batch-layout {batch_layout}: the script has no `{BATCH_LAYOUT}` parameter "
                         "(exported by an older nbddp: run `python pipeline.py export`)")
    return overrides | {BATCH_LAYOUT: batch_layout}


def batch_layout_flags(batch_layout):
    """The script flag for `--batch-layout` (none for None: the script's own default)."""
    return [] if batch_layout is None else as_script_flags({BATCH_LAYOUT: checked_batch_layout(batch_layout)})


def checked_batch_layout(text):
    """A `--batch-layout` value: notebook, per-device, auto, or a micro batch size N (the runtime's batch_plan)."""
    try:
        return str(batch_plan.parse_layout(text))  # the runtime's reading, which the script applies
    except UsageError:
        raise UsageError(f"--batch-layout {text}: expected one of {', '.join(batch_plan.LAYOUTS)} or a micro batch "
                         "size (a whole number from 1)") from None


def with_strategy(defaults, overrides, strategy):
    """`overrides` plus the `strategy` parameter from `--strategy` (None: the script's own default)."""
    if strategy is None:
        return overrides
    strategy = checked_strategy(strategy)
    if STRATEGY not in defaults:
        raise UsageError(f"--strategy {strategy}: the script has no `{STRATEGY}` parameter (exported by an older "
                         "nbddp: run `python pipeline.py export`)")
    return overrides | {STRATEGY: strategy}


def strategy_flags(strategy):
    """The script flag for `--strategy` (none for None: the script's own default)."""
    return [] if strategy is None else as_script_flags({STRATEGY: checked_strategy(strategy)})


def checked_strategy(text):
    """A `--strategy` value: ddp, fsdp or auto (the runtime's trainer.fsdp and trainer.auto_strategy)."""
    if text not in STRATEGIES:
        raise UsageError(f"--strategy {text}: expected one of {', '.join(STRATEGIES)} (ddp: a whole model on every "
                         "GPU; fsdp: the model sharded across them; auto: fsdp when the memory estimate says one GPU "
                         "cannot hold it)")
    return text


def check_overrides(groups, environ=None):
    """Check each group `(where, lines)` of `NAME=VALUE` lines (`--set`, a regression case's `set:`), and the lines
    the environment's run setting `set` already holds, as the runtime will type them; UsageError naming `where` and the
    line. The names, types and ranges are checked here from the training arguments' cached or shipped schema
    (training_overrides.cached_schema), else in one child process that sees no GPU and writes that schema: on a GPU
    host, importing transformers' TrainingArguments initialises CUDA (seen on an H200), which the parent must never
    do, and it takes seconds."""
    environ = os.environ if environ is None else environ
    own = training_overrides.environment_value([], environ).splitlines()
    groups = [(f"{training_overrides.ENV} line", own), *((where, list(lines)) for where, lines in groups)]
    for where, lines in groups:
        training_overrides.environment_value(lines, environ={}, where=where)  # one NAME=VALUE line each, here
    groups = [[where, lines] for where, lines in groups if lines]
    if not groups or _checked_from_schema(groups):
        return
    command = [sys.executable, "-c", "import sys; from nbddp.runtime.inputs import training_overrides as t; "
                                     "sys.exit(t.main(sys.argv[1:]))", json.dumps(groups),
               str(training_overrides.schema_path())]
    env = environment.child_environment(cuda_visible_devices="", environ=environ)
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NbddpError(f"checking the --set overrides took over {CHECK_TIMEOUT_S} s (importing transformers)") from None
    message = result.stdout.strip().splitlines()[-1:] or result.stderr.strip().splitlines()[-1:] or [""]
    if result.returncode == UsageError.exit_status and result.stdout.strip():
        raise UsageError(message[0])
    if result.returncode != 0:
        raise NbddpError(f"checking the --set overrides failed (exit status {result.returncode}): {message[0]}")


def _checked_from_schema(groups):
    """True when the cached schema checked every group (raising its UsageError); False without one, or for a field
    only Transformers' own parser can type."""
    schema = training_overrides.cached_schema()
    if schema is None:
        return False
    try:
        for where, lines in groups:
            training_overrides.check([training_overrides.parse_line(line, where) for line in lines], where, schema)
    except training_overrides.NeedsTransformers:
        return False
    return True


def training_overrides_environment(*line_groups, environ=None):
    """The run setting `set` for a child process, {its variable: lines}: the lines the environment holds, then each
    group of `NAME=VALUE` lines, a later line winning; {} when there are none. Checks nothing: `check_overrides`
    does."""
    environ = os.environ if environ is None else environ
    value = training_overrides.environment_value([line for lines in line_groups for line in lines], environ)
    return {training_overrides.ENV: value} if value else {}


def checked_overrides_environment(lines, environ=None):
    """The run setting `set` for the children from `--set` lines, checked first (with the environment's own) as the
    runtime will type them; {} without any here or in the environment."""
    check_overrides([(training_overrides.FLAG, lines)], environ)
    return training_overrides_environment(lines, environ=environ)


def suite_override_lines(overrides):
    """`set: {name: value}` of a regression case as `NAME=VALUE` lines: bools as true/false, lists as their
    items separated by spaces (a list field's text), anything else as YAML wrote it."""
    lines = []
    for name, value in overrides.items():
        items = value if isinstance(value, list) else [value]
        lines.append(f"{name}={' '.join(_flag_text(item) if isinstance(item, bool) else str(item) for item in items)}")
    return lines
