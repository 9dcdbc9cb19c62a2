"""`--set NAME=VALUE`: any keyword of the training arguments a notebook builds, from the command line.

    torchrun --nproc_per_node 2 generated/train.py --set learning_rate=1e-4 --set lr_scheduler_type=cosine
    python pipeline.py run --set learning_rate=1e-4

The script's flag, and `pipeline.py`'s for the processes it starts, put the lines into one environment
variable, the run setting `set` (`NAME=VALUE` per line; a later line for the same name wins), so a kernel, a torchrun
worker and a restarted one all read the same overrides from one place. `check` refuses, before any work, a name that no
TrainingArguments-family config has and a value its field cannot take; `apply` puts the typed values into the
keyword arguments of each config the notebook builds (`ddp.training_args`), each config taking the names it has.

Values are typed as Transformers' own `HfArgumentParser` types that field of that class (the typing the
`--learning_rate 1e-4` flags of Transformers' example scripts get): bool fields take true/false (yes/no, 1/0),
enum fields their choices, `Optional[X]` fields an X, list fields their items separated by spaces. Then the ranges
the training arguments accept (RANGES: their own checks, the optimizer's, `set_seed`'s) and finite numbers, so that
`seed=-1` or `learning_rate=1e400` stop here rather than after the model load, or never. transformers and trl are
imported only inside the functions: the script's flags are read before setup imports Unsloth, which must come
before them.

`pipeline.py` checks without importing transformers (on a GPU host that initialises CUDA, and it takes seconds): from
the fields' `Schema` (`cached_schema`): the one the package ships for the stacks requirements*.txt pin (schemas/,
written by tools/write_shipped_schema.py), else the one the first check (a child process) writes into the user's
cache, one file per interpreter and versions of SCHEMA_PACKAGES.
"""
import difflib
import functools
import hashlib
import importlib
import importlib.metadata
import json
import math
import os
import sys
import uuid
import warnings
from pathlib import Path
from typing import NamedTuple

from nbddp.errors import UsageError
from nbddp.formats import run_settings

ENV = run_settings.ENV.SET
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


SCHEMA_VERSION = 1  # of the cached file's content: a change here makes a new file
# What the schema is made of: transformers and trl declare the fields, transformers' HfArgumentParser types them, and
# importing trl imports accelerate (and peft, in TRL 1.x); Python's typing reads the annotations.
SCHEMA_PACKAGES = ("transformers", "trl", "peft", "accelerate")
SHIPPED = Path(__file__).with_name("schemas")  # pyproject.toml's package-data puts it in the wheel
BOOL_WORDS = {"yes": True, "true": True, "t": True, "y": True, "1": True,  # Transformers' string_to_bool, any case
              "no": False, "false": False, "f": False, "n": False, "0": False}
SEED_LIMIT = 2 ** 32  # set_seed (numpy) takes seeds below it


def _from(low, high=math.inf, *, above=False, below=False):
    """A range test: low <= value <= high (`above`: low < value; `below`: value < high)."""
    return lambda value: (low < value if above else low <= value) and (value < high if below else value <= high)


def _steps(value):
    """Trainer's logging/eval/save interval: steps (a whole number from 1) or, below 1, a fraction of the run."""
    return 0 < value < 1 or (value >= 1 and value == int(value))


# name -> (test, what it takes): the ranges the training arguments accept (their __post_init__ refuses a zero or
# fractional interval and a negative warmup; the optimizer a negative learning rate, decay or epsilon, betas from 1;
# set_seed a negative seed), checked before any work. Any float besides must be finite (`1e400` is inf; nan).
WHOLE_FROM_1 = (_from(1), "a whole number from 1")
FROM_0 = (_from(0), "a number from 0")
INTERVAL = (_steps, "steps (a whole number from 1) or a fraction of the run's steps (above 0, below 1)")
SEED = (_from(0, SEED_LIMIT, below=True), f"a whole number from 0 to {SEED_LIMIT - 1}")
BETA = (_from(0, 1, below=True), "a number from 0 to below 1")
RANGES = {
    "max_steps": (lambda steps: steps >= 1 or steps == -1,
                  "a whole number of steps from 1, or -1 to train for num_train_epochs"),
    "num_train_epochs": (_from(0, above=True), "a number above 0"),
    "warmup_steps": (_from(0), "a number from 0 (steps, or below 1 a fraction of the run's steps)"),
    "warmup_ratio": (_from(0, 1), "a number from 0 to 1"),
    "logging_steps": INTERVAL,
    "eval_steps": INTERVAL,
    "save_steps": INTERVAL,
    "seed": SEED,
    "data_seed": SEED,
    "per_device_train_batch_size": WHOLE_FROM_1,
    "per_device_eval_batch_size": WHOLE_FROM_1,
    "gradient_accumulation_steps": WHOLE_FROM_1,
    "eval_accumulation_steps": WHOLE_FROM_1,
    "torch_empty_cache_steps": WHOLE_FROM_1,
    "learning_rate": FROM_0,
    "weight_decay": FROM_0,
    "adam_epsilon": FROM_0,
    "max_grad_norm": FROM_0,
    "adam_beta1": BETA,
    "adam_beta2": BETA,
    "dataloader_num_workers": (_from(0), "a whole number from 0"),
}


class Field(NamedTuple):
    """What a field's `--name` takes, as Transformers' HfArgumentParser reads it: `kind` int, float, str, bool,
    choice (one of `choices`), or other (a type only that parser applies: `type_name`); `nargs` "+" for a list."""

    kind: str
    type_name: str
    choices: tuple = ()
    nargs: str | None = None


Schema = dict  # {config class name: {field name: Field}}, TrainingArguments first


class NeedsTransformers(Exception):
    """A field the cached schema cannot type (`kind` other, a list item that looks like a flag): check it with the
    classes themselves (`pipeline.py`: in its child process)."""


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


def from_environment(environ=None) -> list[Override]:
    """The overrides in the run setting `set`, one per name: a later line for the same name wins. Blank lines are
    skipped."""
    environ = os.environ if environ is None else environ
    overrides = {}
    for line in environ.get(ENV, "").splitlines():
        if line.strip():
            override = parse_line(line)
            overrides.pop(override.name, None)  # the later line's place, too
            overrides[override.name] = override
    return list(overrides.values())


def environment_value(lines, environ=None, where: str = FLAG) -> str:
    """The run setting `set` for a child process (or this one): the lines `environ` already holds, then `lines` (so they
    win); each of `lines` must be one `NAME=VALUE` line."""
    environ = os.environ if environ is None else environ
    for line in lines:
        if "\n" in line or "\r" in line:
            raise UsageError(f"{where} {line!r}: a value must fit on one line")
        parse_line(line, where)
    return "\n".join([*filter(str.strip, environ.get(ENV, "").splitlines()), *lines])


def check(overrides, where: str = FLAG, schema: Schema | None = None) -> None:
    """UsageError unless every override names a field of some TrainingArguments-family config, its text parses as
    that field's type (for one config at least: DPOConfig's `loss_type` is a list, KTOConfig's a choice) and the value
    is in the field's range (RANGES; finite). `where` starts each message (`--set`, or a regression suite's case).
    With `schema` (`cached_schema()`), nothing is imported: NeedsTransformers for a field the schema cannot type."""
    if not overrides:
        return  # nothing to import
    classes = {config_class.__name__: config_class for config_class in config_classes()} if schema is None else None
    fields = schema if schema is not None else live_schema(classes.values())
    for override in overrides:
        owners = [name for name, owned in fields.items() if override.name in owned]
        if not owners:
            raise UsageError(f"{where} {override}: no training argument named {override.name}"
                             f"{_closest_field(override.name, fields)}")
        for owner in owners:
            field = fields[owner][override.name]
            try:
                value = _typed(classes[owner], override) if schema is None else _typed_from(field, override)
                break
            except _ParseError:
                continue
        else:
            raise _type_error(owners[0], fields[owners[0]][override.name], override, where)
        _check_range(owner, override, value, where)


def _type_error(owner, field, override, where):
    whose = "" if owner == "TrainingArguments" else f"{owner}'s "
    return UsageError(f"{where} {override}: {whose}{override.name} takes {_describe(field)}, not {override.text!r}")


def _check_range(owner, override, value, where):
    """UsageError for a value (each item of a list) out of its field's range or not finite."""
    test, takes = RANGES.get(override.name, (lambda _: True, ""))
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        infinite = isinstance(item, float) and not math.isfinite(item)
        if infinite:
            test, takes = (lambda _: False), "a finite number"
        if not test(item):
            whose = "" if owner == "TrainingArguments" else f"{owner}'s "
            shown = f" ({item})" if infinite and override.text.strip().lower() != str(item) else ""  # 1e400 is inf
            raise UsageError(f"{where} {override}: {whose}{override.name} takes {takes}, not {override.text!r}{shown}")


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
        try:
            value = _typed(config_class, override)
        except _ParseError:  # a value another config takes (DPOConfig's loss_type, where this is KTOConfig)
            raise _type_error(config_class.__name__, _field(fields[override.name]), override, FLAG) from None
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


def _closest_field(name, fields: Schema) -> str:
    names = sorted({field for owned in fields.values() for field in owned})
    close = difflib.get_close_matches(name, names, n=1)
    if close:
        return f" (did you mean {close[0]}?)"
    return f" (none of {', '.join(fields)} has such a field)"


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


def _typed(config_class, override):
    """The override's text parsed as `config_class`'s HfArgumentParser parses `--name text`; _ParseError if not."""
    action = _actions(config_class)[override.name]
    if action.nargs == "+":  # a list field: its items, as a shell would split them
        argv = [f"--{override.name}", *override.text.split()]
    else:
        argv = [f"--{override.name}={override.text}"]  # `=`: a value may start with `-`
    values, _ = _parser(config_class).parse_known_args(argv)
    return getattr(values, action.dest)


def _typed_from(field: Field, override):
    """The override's text typed as `_typed` types it, from the field's schema alone; _ParseError if it does not
    parse, NeedsTransformers where only Transformers' parser can tell (tests/runtime/test_training_overrides.py
    compares the two on every field)."""
    if field.nargs == "+":
        items = override.text.split()
        if any(item.startswith("-") and not _is_number(item) for item in items):
            raise NeedsTransformers(override.name)  # argparse would take it for a flag
        if not items:
            raise _ParseError(override.name)
        return [_typed_text(field, item, override.name) for item in items]
    return _typed_text(field, override.text, override.name)


def _typed_text(field: Field, text, name):
    if field.kind == "choice":
        if text not in field.choices:
            raise _ParseError(name)
        return text
    if field.kind == "bool":
        if text.lower() not in BOOL_WORDS:
            raise _ParseError(name)
        return BOOL_WORDS[text.lower()]
    if field.kind not in ("int", "float", "str"):
        raise NeedsTransformers(name)
    try:
        return {"int": int, "float": float, "str": str}[field.kind](text)
    except ValueError:
        raise _ParseError(name) from None


def _is_number(text) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _field(action) -> Field:
    """The Field of an argparse action of HfArgumentParser."""
    type_name = getattr(action.type, "__name__", str(action.type))
    if action.choices:
        kind = "choice"
    elif type_name == "string_to_bool":
        kind = "bool"
    else:
        kind = type_name if type_name in ("int", "float", "str") else "other"
    nargs = "+" if action.nargs == "+" else None
    return Field(kind, type_name, tuple(str(choice) for choice in action.choices or ()), nargs)


def live_schema(classes=None) -> Schema:
    """The Schema of `classes` (default: every config class importable here); imports transformers and trl."""
    return {config_class.__name__: {name: _field(action) for name, action in _actions(config_class).items()}
            for config_class in (config_classes() if classes is None else classes)}


def _describe(field: Field) -> str:
    """What `field` takes, in words: `a bool (true or false)`, `one of linear, cosine, ...`, `an int`."""
    if field.kind == "choice":
        kind = f"one of {', '.join(field.choices)}"
    elif field.kind == "bool":
        kind = "a bool (true or false)"
    else:
        kind = f"{'an' if field.type_name[:1] in 'aeiou' else 'a'} {field.type_name}"
    return f"a list of values separated by spaces, each {kind}" if field.nargs == "+" else kind


def stack_key() -> str:
    """`python-3.11_transformers-5.17.0_trl-1.14.2_..._schema-1`: the versions of Python and SCHEMA_PACKAGES installed
    here (`none` for one that is not) and SCHEMA_VERSION. Reads package metadata only, imports nothing."""
    versions = [f"python-{sys.version_info.major}.{sys.version_info.minor}"]
    for package in SCHEMA_PACKAGES:
        try:
            versions.append(f"{package}-{importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package}-none")
    return "_".join([*versions, f"schema-{SCHEMA_VERSION}"])


def schema_path(environ=None) -> Path:
    """The cached Schema for this interpreter and its `stack_key`: under XDG_CACHE_HOME (else
    ~/.cache)/nbddp/training-arguments/. Reads package metadata only, imports nothing."""
    environ = os.environ if environ is None else environ
    key = f"{os.path.realpath(sys.executable)}|{stack_key()}"
    root = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "nbddp" / "training-arguments" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def shipped_schema_path() -> Path:
    """The Schema the package ships for this `stack_key` (SHIPPED/<key>.json); it exists for the stacks
    requirements.txt and requirements-notebooks.txt pin."""
    return SHIPPED / f"{stack_key()}.json"


def cached_schema(environ=None) -> Schema | None:
    """The Schema `write_schema` left for this interpreter and versions, else the one shipped for these versions;
    None when there is neither (or it cannot be read: the next check in a child process writes it again)."""
    environ = os.environ if environ is None else environ
    for path in (schema_path(environ), shipped_schema_path()):
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            return {owner: {name: Field(kind, type_name, tuple(choices), nargs)
                             for name, (kind, type_name, choices, nargs) in owned.items()}
                    for owner, owned in stored.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return None


def schema_text(schema: Schema) -> str:
    """`schema` as the JSON `cached_schema` reads, one line per field (a shipped file's diff shows the fields that
    changed), the classes and fields in their order: a message names the first class that has a field."""
    classes = [f"{json.dumps(owner)}: {{\n" + ",\n".join(f"  {json.dumps(name)}: {json.dumps(list(field))}"
                                                      for name, field in owned.items()) + "\n}"
               for owner, owned in schema.items()]
    return "{\n" + ",\n".join(classes) + "\n}\n"


def write_schema(schema: Schema, path: Path) -> None:
    """Store `schema` at `path` (`schema_path()`) for `cached_schema`, whole or not at all; a cache that cannot be
    written is left alone."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(schema_text(schema), encoding="utf-8")
        os.replace(temp, path)
    except OSError:
        if temp.is_file():
            temp.unlink()


def _default(config_class, name):
    """The field's default in `config_class`, as its parser holds it (TRL's configs change some of
    TrainingArguments': SFTConfig's learning rate is 2e-05)."""
    return _actions(config_class)[name].default


def main(argv) -> int:
    """`python -c '... training_overrides.main(sys.argv[1:])' GROUPS PATH`: check GROUPS, a JSON list of
    `[where, [lines]]`, in a process of its own (`pipeline.py`'s check, which must not import transformers: on a GPU
    host that initialises CUDA), and write the Schema to PATH (the parent's `schema_path()`) for the checks after
    it. Prints the error's one line on stdout and returns its exit status (2), or returns 0."""
    write_schema(live_schema(), Path(argv[1]) if len(argv) > 1 else schema_path())
    try:
        for where, lines in json.loads(argv[0]):
            check([parse_line(line, where) for line in lines], where)
    except UsageError as error:
        print(error, flush=True)
        return error.exit_status
    return 0
