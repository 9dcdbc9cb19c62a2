"""Command-line overrides for the parameters of a generated script: `--rows 500 --backend hf`.

Each parameter becomes one `--name VALUE` flag whose type is the type of its default; `--help` shows the
comment that follows its assignment in the script's parameters cell (the notebook author's words) and the notebook
that defines it, the `# 01_data_prep.ipynb` line above it there (`defined_in`). Inside a Jupyter
kernel (papermill's smoke run) nothing is parsed: `sys.argv` is the kernel's own there, and papermill
injects the parameters itself. Either way, once the values are final, a parameter named `output_dir`
(Trainer's name, which smoke and run set too) and NBDDP_OUTPUT_DIR (which `ddp.output_dir` puts in the training
arguments) are checked before any work (`preflight`). A parameter named `dtype` (Unsloth's, for the model's
weights) takes None or a dtype name: what FastLanguageModel and the hf backend accept.

Every script, with a parameters cell or without, also takes `--set NAME=VALUE` (repeatable): a keyword of the
training arguments the notebook builds. Its lines go to the NBDDP_SET environment variable, where the
runtime reads them (`training_overrides`; `pipeline.py` passes its own `--set` to the script the same way); never
into the script's globals, where a `set` would hide the builtin.
"""
import argparse
import ast
import difflib
import io
import os
import re
import sys
import tokenize
from datetime import timedelta

from nbddp.errors import UsageError
from nbddp.runtime import preflight, training_overrides, working_directory
from nbddp.script_parameters import WORKDIR

# The one parameter nbddp adds to every generated script; its default lives in the script.
BACKEND_CHOICES = ("auto", "unsloth", "hf")
NBDDP_OWN = "nbddp"  # what `defined_in` says for nbddp's own parameters (backend)
PARAMETERS_MARKER = '# %% tags=["parameters"]'  # the parameters cell's first line, as jupytext writes it
# Export's line above each notebook's parameters in that cell (a stage is NN_name.ipynb), and above nbddp's own.
NOTEBOOK_LINE = re.compile(rf"# (\d\d_.*\.ipynb|{NBDDP_OWN})")
OUTPUT_DIR = "output_dir"
OUTPUT_DIR_VARIABLE = "NBDDP_OUTPUT_DIR"
DTYPE = "dtype"
DTYPES = ("float16", "bfloat16", "float32")  # the names Unsloth's FastLanguageModel takes (and the hf backend)
TIMEOUT_VARIABLE = "NBDDP_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800
# argparse's dest for --set: not a Python name, so it can never be mistaken for (or collide with) a parameter.
SET_DEST = "nbddp --set"

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def running_in_kernel() -> bool:
    """True inside a Jupyter kernel, where flags come from papermill rather than the command line."""
    # Only an IPython kernel imports ipykernel's application and creates its singleton; checking the
    # singleton (not just the import) keeps a script that merely imports ipykernel in script mode.
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    return kernelapp is not None and kernelapp.IPKernelApp.initialized()


def apply_flags(namespace: dict, defined_in: dict[str, str]) -> None:
    """Override the parameters in `namespace` from `sys.argv[1:]` (script mode only), then check `output_dir` and
    NBDDP_OUTPUT_DIR.

    `namespace`: the script's globals as its parameters cell left them (`runtime.setup` calls this first), so an
    `output_dir` there is the parameter. `defined_in` maps each parameter name to the notebook that defines it
    (shown in `--help`; see `defined_in`).
    An unknown flag, a value of the wrong type, a `--set` that is not NAME=VALUE or an unusable output_dir exits
    with status 2, naming the flag; in a kernel, an unusable output_dir raises UsageError instead. `--set` lines
    are appended to os.environ["NBDDP_SET"]; whether their names and values fit a training argument is checked
    by `runtime.setup` (that needs transformers, which may only be imported after Unsloth).
    """
    script_mode = not running_in_kernel()
    if script_mode:
        values = vars(_parse(_build_parser(namespace, defined_in), defined_in))
        override_lines = values.pop(SET_DEST)
        if override_lines:
            os.environ[training_overrides.ENV] = training_overrides.environment_value(override_lines)
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


def defined_in(script: str | None) -> dict[str, str]:
    """{name: the notebook that defines it} for each parameter of the generated `script`, in order: the top-level
    assignments of its parameters cell (from PARAMETERS_MARKER to the next `# %%` line), each under the last
    NOTEBOOK_LINE above it. {} when there is no readable script (a kernel, stdin) or no parameters cell."""
    try:
        with open(script, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, TypeError):  # TypeError: no __file__ (None)
        return {}
    start = next((number + 1 for number, line in enumerate(lines) if line == PARAMETERS_MARKER), len(lines))
    end = next((number for number in range(start, len(lines)) if lines[number].startswith("# %%")), len(lines))
    cell = lines[start:end]
    try:
        statements = ast.parse("\n".join(cell)).body
    except SyntaxError:
        return {}
    notebooks = [(number, line[2:]) for number, line in enumerate(cell, start=1) if NOTEBOOK_LINE.fullmatch(line)]
    found = {}
    for statement in statements:
        target = statement.targets[0] if isinstance(statement, ast.Assign) else getattr(statement, "target", None)
        if isinstance(target, ast.Name):
            above = [notebook for number, notebook in notebooks if number < statement.lineno]
            found[target.id] = above[-1] if above else "?"
    return found


def process_group_timeout() -> timedelta:
    """NBDDP_TIMEOUT_S: how long the process group's collectives wait for a slow rank (1800 s unless set).
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
    notebook_parameters = [name for name, notebook in defined_in.items() if notebook != NBDDP_OWN]
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
            type=_parse_dtype if is_dtype else _parser_for(default),
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
    """{name: the comment that ends its line}, for the first top-level statement of each of `names` in `script`
    (the parameters cell's assignment: it comes first); {} when there is no readable script (a kernel, stdin)."""
    try:
        with open(script, encoding="utf-8") as file:
            source = file.read()
    except (OSError, TypeError):  # TypeError: no __file__ (None)
        return {}
    comments, seen, current = {}, set(), None
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NAME and token.start[1] == 0:  # a statement at the top level begins
                current = token.string if token.string in names and token.string not in seen else None
                seen.add(token.string)
            elif token.type == tokenize.COMMENT and current is not None:
                comments[current] = token.string.lstrip("#").strip()
                current = None
            elif token.type == tokenize.NEWLINE:
                current = None
    except (tokenize.TokenError, SyntaxError):  # not readable as Python: the comments found so far
        pass
    return comments


def _parser_for(default):
    """The function argparse calls on the text of a flag, chosen by the type of the default."""
    if isinstance(default, bool):  # before int: bool is a subclass of int
        return _parse_bool
    if isinstance(default, (int, float, str)):
        return type(default)
    if default is None:
        return _parse_literal_or_text
    return _literal_parser(type(default))


def _metavar(default, is_dtype=False) -> str:
    if is_dtype:
        return "{" + ",".join(("None", *DTYPES)) + "}"
    if isinstance(default, bool):
        return "{true,false}"
    if default is None:
        return "VALUE"
    return type(default).__name__.upper()


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(_TRUE + _FALSE)}, got {text!r}")


def _parse_dtype(text: str):
    """For `--dtype`: None (auto detection) or one of DTYPES, as text (what from_pretrained takes)."""
    if text.strip() == "None":
        return None
    if text.strip() in DTYPES:
        return text.strip()
    raise argparse.ArgumentTypeError(f"expected None (auto detection) or one of {', '.join(DTYPES)}, not {text!r}")


def _parse_literal_or_text(text: str):
    """For a parameter whose default is None: a Python literal (`3`, `[1, 2]`, `None`), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _literal_parser(kind: type):
    """A parser for list/dict/tuple defaults: a Python literal of the same type, never `eval`."""

    def parse(text: str):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise argparse.ArgumentTypeError(f"expected a Python {kind.__name__} literal, got {text!r}") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {type(value).__name__} {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid <type> value" messages
    return parse
