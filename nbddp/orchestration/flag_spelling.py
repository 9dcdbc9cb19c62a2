"""What an option a command does not take probably meant, and the notebook parameters its `--help` lists.

`pipeline.py run --max_steps 10` spells a notebook parameter as the generated script does; `run` and `smoke` take
it as `-p max_steps 10`, `launch` after `--`. `unknown_options` turns what argparse left over into one paragraph
that ends with the command corrected; `parameters_help` is the table that `run`, `smoke` and `launch --help` end
with. Both read the script's parameters cell (nbddp.formats.parameters), never run anything.
"""
import difflib
import shlex
from dataclasses import dataclass

from nbddp.formats.parameters import Parameter, ParametersCellError, read_script

TAKES_P = ("smoke", "run")  # the commands with -p NAME VALUE; launch passes script flags after `--`
EXPORT_ONLY = ("--notebooks", "--out")  # run, smoke and launch find the notebooks through the script's source map
MAX_DEFAULT_TEXT = 40  # characters of a default shown in --help


@dataclass(frozen=True)
class Command:
    """The command a user typed: `prog` (`python pipeline.py` or `nbddp`), its `verb` and every word after it."""

    prog: str
    verb: str
    words: list

    def text(self, words=None) -> str:
        return " ".join([self.prog, shlex.join([self.verb, *(self.words if words is None else words)])])


def script_parameters(script) -> list[Parameter]:
    """The parameters of the generated `script`; [] when it cannot be read (the command itself reports that)."""
    try:
        return read_script(script)
    except (OSError, ParametersCellError):
        return []


def unknown_options(command: Command, unknown: list, options: dict, script) -> str:
    """One paragraph for the words argparse left over (`unknown`) from `command`: for each option, what it probably
    meant (a notebook parameter of `script`, an option of another verb in `options` ({verb: its option strings}),
    the nearest option of this verb), for each other word that the verb takes none; then the command corrected."""
    parameters = {parameter.name: parameter for parameter in script_parameters(script)}
    words = list(command.words)
    notes, before, values = [], [], []
    for option in (word for word in unknown if _is_option(word)):
        values.append(_value(words, option))
        if option in ("-p", "--param") and command.verb == "launch":
            note, replacement, first = _launch_parameter(words, option, values[-1])
        else:
            note, replacement, first = _meaning(command, option, values[-1], options, parameters)
        notes.append(note)
        _replace(words, option, replacement)
        before += [first] if first and first not in before else []
    for word in (word for word in unknown if not _is_option(word) and word in words):
        if word in values:
            values.remove(word)  # an unknown option's value, replaced with it
            continue
        notes.append(f"`{word}`: {command.verb} takes no such word (every option: {command.prog} {command.verb} "
                     "--help)")
        words.remove(word)
    corrected = " && ".join([*before, command.text(words)])
    return f"{'; '.join(notes)}. Corrected: {corrected}"


def _meaning(command, option, value, options, parameters):
    """(what `option` probably meant, the words that replace it and its value, a command to run before)."""
    name, equals, attached = option.partition("=")
    given = [option] if equals or value is None else [option, value]
    rest = [attached] if equals else given[1:]  # its value, as separate words
    typed = f"`{' '.join(given)}`"
    own = options[command.verb]
    dashed = name.replace("_", "-")
    if dashed != name and dashed in own:
        return f"{typed}: {command.verb} spells it {dashed}", [dashed, *rest], None
    parameter = parameters.get(name.lstrip("-").replace("-", "_"))
    if parameter is not None:
        return _as_parameter(command, parameter, _value_text(option, value, parameter))
    elsewhere = [verb for verb, strings in options.items() if name in strings and verb != command.verb]
    if name in EXPORT_ONLY and command.verb != "export":
        export = " ".join([command.prog, shlex.join(["export", *given])])
        return (f"{typed} is export's: {command.verb} finds the notebooks through the script's source map, so export "
                "them first", [], export)
    if elsewhere:
        return f"{typed} is not an option of {command.verb} but of {', '.join(elsewhere)}", [], None
    return _nearest(command, name, rest, own, parameters)


def _launch_parameter(words, option, name):
    """`launch -p NAME VALUE`: the script's `--NAME VALUE` after `--` (argparse took NAME and VALUE as its words)."""
    index = words.index(option)
    value = words[index + 2] if index + 2 < len(words) and words[index + 2] != "--" else "VALUE"
    del words[index + 2:index + 3]
    note = f"launch takes a notebook parameter as the script's flag, after --: --{name} {value}"
    return note, ["--", f"--{name}", value], None


def _as_parameter(command, parameter, value):
    """A notebook parameter spelled as the script's flag: `-p NAME VALUE` for smoke and run, after `--` for launch."""
    if command.verb in TAKES_P:
        return (f"`--{parameter.name} {value}` is the script's spelling of the notebook parameter {parameter.name}; "
                f"{command.verb} takes it as -p {parameter.name} {value}"), ["-p", parameter.name, value], None
    if command.verb == "launch":
        return (f"`--{parameter.name} {value}` is a flag of the script, which launch passes on after --",
                ["--", f"--{parameter.name}", value], None)
    return f"`--{parameter.name}` is a notebook parameter, which {command.verb} does not take", [], None


def _nearest(command, name, rest, own, parameters):
    """The option of this verb (or, for smoke and run, the `-p NAME` of a parameter) closest to `name`, with the
    words of its value `rest`."""
    candidates = {option: [option] for option in own if option.startswith("--")}
    if command.verb in TAKES_P:
        candidates |= {f"--{parameter}": ["-p", parameter] for parameter in parameters}
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not close:
        return (f"`{name}` is not an option of {command.verb} (every option: {command.prog} {command.verb} --help)",
                [], None)
    words = candidates[close[0]]
    return f"`{name}` is not an option of {command.verb}; the nearest is {' '.join(words)}", [*words, *rest], None


def _is_option(word) -> bool:
    return word.startswith("-") and not _is_number(word)


def _is_number(word) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _value(words, option):
    """The word after `option` in `words` when it is its value (not another option), else None."""
    if "=" in option or option not in words:
        return None
    index = words.index(option)
    after = words[index + 1] if index + 1 < len(words) else None
    return after if after is not None and not _is_option(after) and after != "--" else None


def _value_text(option, value, parameter):
    if "=" in option:
        return option.partition("=")[2]
    if value is not None:
        return value
    return "true" if isinstance(parameter.default, bool) else "VALUE"


def _replace(words, option, replacement):
    """Put `replacement` where `option` (and its value, if it has one) stood in `words`; an option of the script
    (`--` first) goes after the words' own `--`, or at the end."""
    index = words.index(option)
    length = 2 if _value(words, option) is not None else 1
    del words[index:index + length]
    if replacement[:1] == ["--"]:
        if "--" in words:
            words[words.index("--") + 1:words.index("--") + 1] = replacement[1:]
        else:
            words += replacement
        return
    limit = words.index("--") if "--" in words else len(words)
    words[min(index, limit):min(index, limit)] = replacement


def parameters_help(script, verb) -> str:
    """The notebook parameters of `script` as `verb --help` shows them (name, type, default, notebook), and where
    each one's comment is; how to list them when there is no script yet."""
    parameters = script_parameters(script)
    spelling = "-p NAME VALUE" if verb in TAKES_P else "after --: -- --NAME VALUE"
    if not parameters:
        return (f"notebook parameters ({spelling}): `python {script} --help` lists them, with their notebooks' "
                f"comments, once `export` has written {script}")
    width = max(len(parameter.name) for parameter in parameters)
    rows = [f"  {parameter.name:<{width}}  {_type(parameter.default):<5}  {_shown(parameter.default)}"
            for parameter in parameters]
    return "\n".join([f"notebook parameters of {script} ({spelling}; a VALUE is typed like the default; a relative "
                      "path is read from the notebooks' folder, where the cells run):", *rows,
                      f"each with its notebook and comment: python {script} --help"])


def _type(default) -> str:
    return "any" if default is None else type(default).__name__


def _shown(default) -> str:
    text = repr(default)
    return text if len(text) <= MAX_DEFAULT_TEXT else text[:MAX_DEFAULT_TEXT - 3] + "..."
