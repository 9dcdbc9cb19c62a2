"""A parameters cell, and how the text of a flag becomes a parameter's value.

A parameters cell holds `name = literal` assignments (`name: type = literal` too), one a line, and comments. In a
generated script's cell export writes a `# <notebook file name>` line above each notebook's parameters, and
`# nbddp` above nbddp's own (nbddp.export.parameters):

    # 01_data_prep.ipynb
    rows = 2000  # training rows to use
    # nbddp
    backend = "auto"  # auto | unsloth | hf

`read_cell` reads one into `Parameter`s: export the notebooks' cells, orchestration the script's defaults, the
runtime the script's comments and notebooks for `--help`; `read_script` the cell of a generated script's file (the
runtime's flags, and `pipeline.py`'s hints and `--help` before anything is run). `typed` is the one rule that turns a
flag's text into a value of its default's type: the script's `--name VALUE` (nbddp.runtime.inputs.flags) and
orchestration's `-p NAME VALUE` both use it, so they take and refuse the same texts.

Standard library only, so every room reads the same cell.
"""
import ast
import io
import math
import re
import tokenize
from dataclasses import dataclass

OWN_NOTEBOOK = "nbddp"  # the notebook line above nbddp's own parameters (backend, resume, ...)
SCRIPT_CELL_MARKER = '# %% tags=["parameters"]'  # a generated script's parameters cell starts so (jupytext)
NOTEBOOK_LINE = re.compile(rf"# (\d\d_.*\.ipynb|{OWN_NOTEBOOK})")  # a stage is NN_name.ipynb
DTYPE = "dtype"  # Unsloth's parameter for the model's weights: None (auto detection) or a dtype name
DTYPES = ("float16", "bfloat16", "float32")  # the names Unsloth's FastLanguageModel takes (and the hf backend)
MAX_STEPS = "max_steps"  # the Trainer's: optimizer steps from 1, or -1 to train for num_train_epochs
TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


@dataclass(frozen=True)
class Parameter:
    """One assignment of a parameters cell."""

    name: str
    default: object
    comment: str | None  # the comment on its line(s), without the `#`
    notebook: str | None  # the last NOTEBOOK_LINE above it: a notebook's file name or "nbddp"
    line: int  # 1-based line of the assignment in the cell
    end_line: int  # its last line (a default may span lines)


class ParametersCellError(ValueError):
    """A line of a parameters cell that is not a `name = literal` assignment or a comment. `line`: 1-based, in the
    cell; `name`: the parameter whose default is not a literal, None where the line is no such assignment at all."""

    def __init__(self, message: str, line: int, name: str | None = None):
        super().__init__(message)
        self.line = line
        self.name = name


def read_cell(source: str) -> list[Parameter]:
    """The assignments of the parameters cell `source`, in order (a name assigned twice comes twice)."""
    try:
        statements = ast.parse(source).body
    except SyntaxError as error:
        raise ParametersCellError(f"syntax error: {error.msg}", error.lineno or 1) from None
    comments = _comments(source)
    notebooks = [(number, line[2:]) for number, line in enumerate(source.splitlines(), start=1)
                 if NOTEBOOK_LINE.fullmatch(line)]
    parameters = []
    for statement in statements:
        name, value = _assignment(statement)
        if name is None or (parameters and parameters[-1].end_line == statement.lineno):  # `a = 1; b = 2`
            raise ParametersCellError("not a `name = literal` assignment", statement.lineno)
        try:
            default = ast.literal_eval(value)
        except (ValueError, TypeError, RecursionError):  # TypeError: `{[1]: 2}`
            raise ParametersCellError(f"`{name}` is not a literal", statement.lineno, name) from None
        lines = range(statement.lineno, statement.end_lineno + 1)
        parameters.append(Parameter(
            name=name,
            default=default,
            comment=next((comments[number] for number in lines if number in comments), None),
            notebook=next((notebook for number, notebook in reversed(notebooks) if number < statement.lineno), None),
            line=statement.lineno,
            end_line=statement.end_lineno,
        ))
    return parameters


def read_script(path) -> list[Parameter]:
    """`read_cell` of the parameters cell of the generated script at `path`: from SCRIPT_CELL_MARKER to the next
    `# %%` line; [] without one. OSError when the file cannot be read; ParametersCellError with the script's line."""
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    start = next((number + 1 for number, line in enumerate(lines) if line == SCRIPT_CELL_MARKER), len(lines))
    end = next((number for number in range(start, len(lines)) if lines[number].startswith("# %%")), len(lines))
    try:
        return read_cell("\n".join(lines[start:end]))
    except ParametersCellError as error:
        raise ParametersCellError(str(error), start + error.line, error.name) from None


def typed(name: str, default, text: str):
    """The value of flag `name` given as `text`, typed like its `default` and `checked`:
    a bool default takes one of TRUE_WORDS or FALSE_WORDS (any case); int and float `int(text)` and `float(text)`;
    `dtype` with a None or DTYPES default takes None or one of DTYPES; any other str the text itself; None a Python
    literal, else the text itself; a list, tuple or dict a Python literal of that type. Nothing is evaluated.
    Raises ValueError saying what it expected and quoting `text`."""
    if name == DTYPE and (default is None or default in DTYPES):
        if text.strip() == "None":
            return None
        if text.strip() in DTYPES:
            return text.strip()
        raise ValueError(f"expected None (auto detection) or one of {', '.join(DTYPES)}, not {text!r}")
    if isinstance(default, bool):  # before int: bool is a subclass of int
        word = text.strip().lower()
        if word in TRUE_WORDS + FALSE_WORDS:
            return word in TRUE_WORDS
        raise ValueError(f"expected one of {', '.join(TRUE_WORDS + FALSE_WORDS)}, got {text!r}")
    if isinstance(default, (int, float)):
        try:
            value = type(default)(text)
        except ValueError:
            raise ValueError(f"invalid {type(default).__name__} value: {text!r}") from None  # argparse's words
        return checked(name, value, text)
    if isinstance(default, str):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        if default is None:
            return text
        raise ValueError(f"expected a Python {type(default).__name__} literal, got {text!r}") from None
    if default is not None and not isinstance(value, type(default)):
        raise ValueError(f"expected a {type(default).__name__}, got {type(value).__name__} {text!r}")
    return value


def checked(name: str, value, text: str | None = None):
    """`value` for parameter `name` unless the training arguments it feeds would refuse it or train on nonsense:
    a float that is not finite (`1e400` is inf; nan), a `max_steps` below 1 other than -1 (the Trainer's "train
    for num_train_epochs", which a smoke run caps). Raises ValueError saying what it expected, quoting `text` (what
    was typed) when given."""
    shown = repr(text) if text is not None and text.strip() != str(value) else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected a finite number, not {shown}" + (f" ({value})" if shown != str(value) else ""))
    if name == MAX_STEPS and isinstance(value, int) and not isinstance(value, bool) and value < 1 and value != -1:
        raise ValueError(f"expected 1 or more optimizer steps, or -1 to train for num_train_epochs, not {shown}")
    return value


def _assignment(statement):
    """(name, value node) of a `name = value` or `name: type = value` statement, else (None, None)."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target = statement.target
    else:
        return None, None
    return (target.id, statement.value) if isinstance(target, ast.Name) else (None, None)


def _comments(source: str) -> dict[int, str]:
    """{line: the text of the comment that ends it} for the lines of `source` (Python ast has parsed) with one."""
    return {token.start[0]: token.string.lstrip("#").strip()
            for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
