"""`--set NAME=VALUE`: any keyword of the training arguments a notebook builds, from the command line.

    torchrun --nproc_per_node 2 generated/train.py --set learning_rate=1e-4 --set lr_scheduler_type=cosine
    python pipeline.py run --set learning_rate=1e-4

The script's flag, and `pipeline.py`'s for the processes it starts, put the lines into one environment
variable, NBDDP_SET (`NAME=VALUE` per line; a later line for the same name wins), so a kernel, a torchrun worker
and a restarted one all read the same overrides from one place. `check` refuses, before any work, a name that no
TrainingArguments-family config has and a value its field cannot take; `apply` puts the typed values into the
keyword arguments of each config the notebook builds (`ddp.training_args`), each config taking the names it has.

Values are typed as Transformers' own `HfArgumentParser` types that field of that class (the typing the
`--learning_rate 1e-4` flags of Transformers' example scripts get): bool fields take true/false (yes/no, 1/0),
enum fields their choices, `Optional[X]` fields an X, list fields their items separated by spaces. transformers and
trl are imported only inside the functions: the script's flags are read before setup imports Unsloth, which must
come before them.
"""
import difflib
import functools
import importlib
import os
import warnings
from typing import NamedTuple

from nbddp.errors import UsageError

ENV = "NBDDP_SET"
FLAG = "--set"

# The TrainingArguments family, in the order a message names them; those not importable here are skipped
# (CPO and ORPO moved to trl.experimental in TRL 1.x).
CONFIG_CLASSES = (
    ("transformers", "TrainingArguments"),
    ("trl", "SFTConfig"),
    ("trl", "DPOConfig"),
    ("trl", "GRPOConfig"),
    ("trl", "KTOConfig"),
    ("trl", "RewardConfig"),
    ("trl", "RLOOConfig"),
    ("trl", "CPOConfig"),
    ("trl.experimental.cpo", "CPOConfig"),
    ("trl", "ORPOConfig"),
    ("trl.experimental.orpo", "ORPOConfig"),
)


class Override(NamedTuple):
    name: str
    text: str  # as typed after `=`; typed per config class by `apply`

    def __str__(self):
        return f"{self.name}={self.text}"


def parse_line(line: str, where: str = FLAG) -> Override:
    """`NAME=VALUE` as an Override; UsageError naming `--set <line>` without `=` or a name."""
    name, equals, text = line.partition("=")
    if not equals or not name.strip():
        raise UsageError(f"{where} {line}: expected NAME=VALUE, e.g. {FLAG} learning_rate=1e-4")
    return Override(name.strip(), text)


def from_environment(environ=os.environ) -> list[Override]:
    """The overrides in NBDDP_SET, one per name: a later line for the same name wins. Blank lines are skipped."""
    overrides = {}
    for line in environ.get(ENV, "").splitlines():
        if line.strip():
            override = parse_line(line)
            overrides.pop(override.name, None)  # the later line's place, too
            overrides[override.name] = override
    return list(overrides.values())


def environment_value(lines, environ=os.environ, where: str = FLAG) -> str:
    """NBDDP_SET for a child process (or this one): the lines `environ` already holds, then `lines` (so they
    win); each of `lines` must be one `NAME=VALUE` line."""
    for line in lines:
        if "\n" in line or "\r" in line:
            raise UsageError(f"{where} {line!r}: a value must fit on one line")
        parse_line(line, where)
    return "\n".join([*filter(str.strip, environ.get(ENV, "").splitlines()), *lines])


def check(overrides, where: str = FLAG) -> None:
    """UsageError unless every override names a field of some TrainingArguments-family config and its text
    parses as that field's type (for one config at least: DPOConfig's `loss_type` is a list, KTOConfig's a choice).
    `where` starts each message (`--set`, or a regression suite's case)."""
    if not overrides:
        return  # nothing to import
    classes = config_classes()
    for override in overrides:
        owners = [config_class for config_class in classes if override.name in _actions(config_class)]
        if not owners:
            raise UsageError(f"{where} {override}: no training argument named {override.name}"
                             f"{_closest_field(override.name, classes)}")
        problems = []
        for config_class in owners:
            try:
                _typed(config_class, override, where)
                break
            except UsageError as problem:
                problems.append(problem)
        else:
            raise problems[0]


def apply(config_class, kwargs: dict, overrides) -> tuple[dict, list[str]]:
    """A copy of `kwargs` with each override that names a field of `config_class` set to its typed value, and one
    note per such override: `learning_rate=0.0001 (the notebook wrote 0.0002)`. Overrides of fields that
    `config_class` lacks are left out (another config of the notebook may take them)."""
    kwargs = dict(kwargs)
    notes = []
    fields = _actions(config_class) if overrides else {}
    for override in overrides:
        if override.name not in fields:
            continue
        value = _typed(config_class, override)
        if override.name in kwargs:
            before = f"the notebook wrote {kwargs[override.name]!r}"
        else:
            before = f"the notebook left it at its default {_default(config_class, override.name)!r}"
        kwargs[override.name] = value
        notes.append(f"{override.name}={value!r} ({before})")
    return kwargs, notes


def config_classes() -> list:
    """The TrainingArguments-family config classes importable here, TrainingArguments first."""
    classes = []
    for module_name, class_name in CONFIG_CLASSES:
        config_class = _import(module_name, class_name)
        if config_class is not None and config_class not in classes:
            classes.append(config_class)
    return classes


def _import(module_name, class_name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental warns on import that its APIs may change
        try:
            return getattr(importlib.import_module(module_name), class_name, None)
        except ImportError:
            return None


def _closest_field(name, classes) -> str:
    names = sorted({field for config_class in classes for field in _actions(config_class)})
    close = difflib.get_close_matches(name, names, n=1)
    if close:
        return f" (did you mean {close[0]}?)"
    return f" (none of {', '.join(config_class.__name__ for config_class in classes)} has such a field)"


@functools.cache
def _parser(config_class):
    """Transformers' HfArgumentParser for `config_class` (or its nearest base it can read), raising instead of
    exiting, with nothing required: it only types one field at a time."""
    import dataclasses

    from transformers import HfArgumentParser

    class RaisingParser(HfArgumentParser):
        def error(self, message):
            raise _ParseError(message)

    for base in config_class.__mro__:
        if not dataclasses.is_dataclass(base):
            continue
        try:
            parser = RaisingParser(base, allow_abbrev=False, add_help=False)
        except (ValueError, RuntimeError, TypeError):  # a field type HfArgumentParser refuses; try the base class
            continue
        for action in parser._actions:
            action.required = False
        return parser
    return None


class _ParseError(Exception):
    pass


@functools.cache
def _actions(config_class) -> dict:
    """{field name: the argparse action that parses `--field`} for `config_class` ({} when it has none)."""
    parser = _parser(config_class)
    if parser is None:
        return {}
    actions = {}
    for action in parser._actions:
        # Bool fields that default to True also get a `--no_<name>` action with the same dest: skip it.
        if f"--{action.dest}" in action.option_strings:
            actions[action.dest] = action
    return actions


def _typed(config_class, override, where=FLAG):
    """The override's text parsed as `config_class`'s HfArgumentParser parses `--name text`."""
    action = _actions(config_class)[override.name]
    if action.nargs == "+":  # a list field: its items, as a shell would split them
        argv = [f"--{override.name}", *override.text.split()]
    else:
        argv = [f"--{override.name}={override.text}"]  # `=`: a value may start with `-`
    try:
        values, _ = _parser(config_class).parse_known_args(argv)
    except _ParseError:
        owner = "" if config_class.__name__ == "TrainingArguments" else f"{config_class.__name__}'s "
        raise UsageError(f"{where} {override}: {owner}{override.name} takes {_describe(action)}, "
                         f"not {override.text!r}") from None
    return getattr(values, action.dest)


def _describe(action) -> str:
    """What `action` takes, in words: `a bool (true or false)`, `one of linear, cosine, ...`, `an int`."""
    if action.choices:
        kind = f"one of {', '.join(str(choice) for choice in action.choices)}"
    elif getattr(action.type, "__name__", "") == "string_to_bool":
        kind = "a bool (true or false)"
    else:
        name = getattr(action.type, "__name__", str(action.type))
        kind = f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"
    return f"a list of values separated by spaces, each {kind}" if action.nargs == "+" else kind


def _default(config_class, name):
    """The field's default in `config_class`, as its parser holds it (TRL's configs change some of
    TrainingArguments': SFTConfig's learning rate is 2e-05)."""
    return _actions(config_class)[name].default


def main(argv) -> int:
    """`python -c '... training_overrides.main(sys.argv[1:])' GROUPS`: check GROUPS, a JSON list of `[where, [lines]]`,
    in a process of its own (`pipeline.py`'s check, which must not import transformers: on a GPU host that
    initialises CUDA). Prints the error's one line on stdout and returns its exit status (2), or returns 0."""
    import json

    try:
        for where, lines in json.loads(argv[0]):
            check([parse_line(line, where) for line in lines], where)
    except UsageError as error:
        print(error, flush=True)
        return error.exit_status
    return 0
