"""Command-line overrides for the parameters of a generated script: `--rows 500 --backend hf`.

Each parameter becomes one `--name VALUE` flag typed like its default (nbddp.formats.parameters.typed, the rule
orchestration's `-p` uses too); `--help` shows the comment that follows its assignment in the script's parameters
cell (the notebook author's words) and the notebook that defines it, the `# 01_data_prep.ipynb` line above it there
(`defined_in`; both read by nbddp.formats.parameters.read_cell). Inside a Jupyter
kernel (papermill's smoke run) nothing is parsed: `sys.argv` is the kernel's own there, and papermill
injects the parameters itself. Either way, once the values are final, a parameter named `output_dir`
(Trainer's name, which smoke and run set too) and the run setting `output_dir` (which `ddp.output_dir` puts in the
training arguments) are checked before any work (`preflight`). A parameter named `dtype` (Unsloth's, for the model's
weights) takes None or a dtype name: what FastLanguageModel and the hf backend accept.

Every script, with a parameters cell or without, also takes `--set NAME=VALUE` (repeatable): a keyword of the
training arguments the notebook builds. Its lines go to the run setting `set` (an environment variable), where the
runtime reads them (`training_overrides`; `pipeline.py` passes its own `--set` to the script the same way); never
into the script's globals, where a `set` would hide the builtin.
"""
import argparse
import difflib
import os
import sys
from datetime import timedelta

from nbddp.errors import UsageError
from nbddp.formats.parameters import (DTYPE, DTYPES, OWN_NOTEBOOK, SCRIPT_CELL_MARKER, Parameter, ParametersCellError,
                                     read_script, typed)
from nbddp.runtime import working_directory
from nbddp.runtime.inputs import preflight, training_overrides
from nbddp.runtime.memory import batch_plan
from nbddp.formats.run_settings import ENV, setting
from nbddp.formats.script_parameters import WORKDIR

BACKEND_CHOICES = setting("backend").choices
PARAMETERS_MARKER = SCRIPT_CELL_MARKER  # the parameters cell's first line, as jupytext writes it
OUTPUT_DIR = "output_dir"
OUTPUT_DIR_VARIABLE = ENV.OUTPUT_DIR
TIMEOUT_VARIABLE = ENV.TIMEOUT_S
DEFAULT_TIMEOUT_S = setting("timeout_s").default
# argparse's dest for --set: not a Python name, so it can never be mistaken for (or collide with) a parameter.
SET_DEST = "nbddp --set"

def running_in_kernel() -> bool:
    """True inside a Jupyter kernel, where flags come from papermill rather than the command line."""
    # Only an IPython kernel imports ipykernel's application and creates its singleton; checking the
    # singleton (not just the import) keeps a script that merely imports ipykernel in script mode.
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    return kernelapp is not None and kernelapp.IPKernelApp.initialized()


def apply_flags(namespace: dict, defined_in: dict[str, str]) -> None:
    """Override the parameters in `namespace` from `sys.argv[1:]` (script mode only), then check `output_dir` and
    the run setting `output_dir`.

    `namespace`: the script's globals as its parameters cell left them (`runtime.setup` calls this first), so an
    `output_dir` there is the parameter. `defined_in` maps each parameter name to the notebook that defines it
    (shown in `--help`; see `defined_in`).
    An unknown flag, a value of the wrong type, a `--set` that is not NAME=VALUE or an unusable output_dir exits
    with status 2, naming the flag; in a kernel, an unusable output_dir raises UsageError instead. `--set` lines
    are appended to the run setting `set` in os.environ; whether their names and values fit a training argument is
    checked by `runtime.setup` (that needs transformers, which may only be imported after Unsloth).
    """
    script_mode = not running_in_kernel()
    if script_mode:
        values = vars(_parse(_build_parser(namespace, defined_in), defined_in))
        override_lines = values.pop(SET_DEST)
        if override_lines:
            os.environ[training_overrides.ENV] = training_overrides.environment_value(override_lines)
        given = {name: values[name] for name in batch_plan.BATCH_KEYWORDS if name in values and _given(name)}
        if given:  # per-process values, as in Hugging Face's scripts (batch_plan)
            os.environ[batch_plan.PER_PROCESS] = batch_plan.per_process_environment(given)
        namespace.update(values)
    output_dirs = {OUTPUT_DIR: namespace[OUTPUT_DIR]} if OUTPUT_DIR in namespace else {}
    if os.environ.get(OUTPUT_DIR_VARIABLE):
        output_dirs[OUTPUT_DIR_VARIABLE] = os.environ[OUTPUT_DIR_VARIABLE]
    cells = working_directory.folder(namespace.get(WORKDIR, ""), namespace.get("__file__"))
    if os.path.isdir(cells) and OUTPUT_DIR in output_dirs:  # the cells, which run there, read it from there
        output_dirs[OUTPUT_DIR] = os.path.join(cells, output_dirs[OUTPUT_DIR])
    try:
        for name, output_dir in output_dirs.items():
            preflight.check_output_dir(output_dir, name)
    except UsageError as error:
        if not script_mode:
            raise
        print(f"nbddp: error: {error}", file=sys.stderr)
        sys.exit(error.exit_status)


def _given(name: str) -> bool:
    """`--name` is on the command line (as `--name VALUE` or `--name=VALUE`), not left at its default."""
    return any(word == f"--{name}" or word.startswith(f"--{name}=") for word in sys.argv[1:])


def defined_in(script: str | None) -> dict[str, str]:
    """{name: the notebook that defines it} for each parameter of the generated `script`, in order: the assignments
    of its parameters cell, each under the last `# <notebook>` line above it ("?" under none). {} when there is no
    readable script (a kernel, stdin) or no parameters cell; a cell of anything but `name = literal` lines exits
    with status 2 naming the script's line (in a kernel: raises UsageError)."""
    try:
        parameters = _parameters_cell(script)
    except UsageError as error:
        if running_in_kernel():
            raise
        print(f"nbddp: error: {error}", file=sys.stderr)
        sys.exit(error.exit_status)
    return {parameter.name: parameter.notebook or "?" for parameter in parameters}


def _parameters_cell(script: str | None) -> list[Parameter]:
    """The `read_script` of `script`; [] when there is no readable script or no parameters cell. UsageError naming
    the script's line for a cell it cannot read."""
    try:
        return read_script(script)
    except (OSError, TypeError):  # TypeError: no __file__ (None)
        return []
    except ParametersCellError as error:
        raise UsageError(f"{script}, line {error.line}, in the parameters cell: {error}") from None


def process_group_timeout() -> timedelta:
    """The run setting `timeout_s`: how long the process group's collectives wait for a slow rank (1800 s unless set).
    Raises UsageError unless it is a number of seconds above 0."""
    text = os.environ.get(TIMEOUT_VARIABLE, str(DEFAULT_TIMEOUT_S))
    try:
        timeout = timedelta(seconds=float(text))
    except (ValueError, OverflowError):  # not a number; nan; inf or too large for a timedelta
        timeout = None
    if timeout is None or timeout <= timedelta(0):
        raise UsageError(f"{TIMEOUT_VARIABLE}={text!r}: expected a number of seconds above 0, how long a collective "
                         f"waits for a slow rank (default {DEFAULT_TIMEOUT_S})")
    return timeout


def _parse(parser: argparse.ArgumentParser, defined_in: dict[str, str]) -> argparse.Namespace:
    """argparse's parse_args, with a hint on what an unknown flag might have meant."""
    values, unknown = parser.parse_known_args(sys.argv[1:])
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{_unknown_hint(unknown, defined_in)}")
    return values


def _unknown_hint(unknown: list[str], defined_in: dict[str, str]) -> str:
    notebook_parameters = [name for name, notebook in defined_in.items() if notebook != OWN_NOTEBOOK]
    if not notebook_parameters:
        return " (the notebooks define no parameters: tag a cell `parameters` to make its assignments flags)"
    flags = [f"--{name}" for name in defined_in]
    for word in unknown:
        close = difflib.get_close_matches(word.split("=")[0], flags, n=1) if word.startswith("--") else []
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


def _build_parser(namespace: dict, defined_in: dict[str, str]) -> argparse.ArgumentParser:
    script = sys.argv[0] or "train.py"  # as the user typed it, e.g. generated/train.py
    parser = argparse.ArgumentParser(
        prog=os.path.basename(script),
        description=(
            "Fine-tuning script generated by nbddp from notebooks; every flag overrides a notebook parameter,\n"
            "and --set NAME=VALUE a keyword of its training arguments (TrainingArguments, SFTConfig, ...).\n"
            f"  one process:  python {script} [--name VALUE ...] [--set NAME=VALUE ...]\n"
            f"  N processes:  torchrun --nproc_per_node N {script} [--name VALUE ...] [--set NAME=VALUE ...]"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--row 5` must be an unknown flag, not a silent `--rows 5`
    )
    comments = assignment_comments(namespace.get("__file__"), defined_in)
    for name, notebook in defined_in.items():
        default = namespace[name]
        choices = BACKEND_CHOICES if name == "backend" else None
        is_dtype = name == DTYPE and (default is None or default in DTYPES)
        origin = f"default: {default!r} (from {notebook})"
        parser.add_argument(
            f"--{name}",
            type=_typed(name, default),
            default=default,
            choices=choices,
            metavar=None if choices else _metavar(default, is_dtype),  # argparse shows the choices instead
            help=(f"{comments[name]}; {origin}" if name in comments else origin).replace("%", "%%"),  # argparse %-formats help
        )
    parser.add_argument(
        training_overrides.FLAG,
        dest=SET_DEST,
        action="append",
        default=[],
        type=_override_line,
        metavar="NAME=VALUE",
        help="override any keyword of the training arguments the notebook builds (TrainingArguments, SFTConfig, "
             "GRPOConfig, ...), typed as Transformers types that field; repeatable; e.g. --set learning_rate=1e-4 "
             "--set lr_scheduler_type=cosine",
    )
    return parser


def _override_line(text: str) -> str:
    """A `--set` value: one NAME=VALUE line (the name and the value's type are checked by runtime.setup)."""
    try:
        training_overrides.environment_value([text], environ={})
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix(f"{training_overrides.FLAG} ")) from None
    return text


def assignment_comments(script, names) -> dict[str, str]:
    """{name: the comment on its assignment} for each of `names` in the parameters cell of `script` (the first
    assignment of a name twice); {} when there is no readable script (a kernel, stdin)."""
    comments = {}
    for parameter in _parameters_cell(script):
        if parameter.name in names and parameter.comment is not None:
            comments.setdefault(parameter.name, parameter.comment)
    return comments


def _typed(name: str, default):
    """The function argparse calls on the text of `--name`: the shared rule (`typed`), its message argparse's."""

    def parse(text: str):
        try:
            return typed(name, default, text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def _metavar(default, is_dtype=False) -> str:
    if is_dtype:
        return "{" + ",".join(("None", *DTYPES)) + "}"
    if isinstance(default, bool):
        return "{true,false}"
    if default is None:
        return "VALUE"
    return type(default).__name__.upper()
