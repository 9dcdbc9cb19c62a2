"""Turn IPython magics and shell escapes into plain Python, or stop with an error that says what to do.

IPython's own input transformer first rewrites every magic into a `get_ipython().…` call, so this
module never guesses at IPython's syntax; `ConvertMagics` then replaces those calls:

- `!pip install …`, `%pip …` (also `uv pip`, conda, mamba) -> dropped: the script runs in an
  environment that already has its packages;
- `%matplotlib`, `%autoreload`, `%load_ext autoreload`, `%env` without a value -> dropped (interactive only);
- `%env A=1` / `%env A 1` -> `os.environ["A"] = "1"`;
- `%cd path` -> `os.chdir("path")` (after a `!git clone`, notebooks `%cd` into the clone);
- `%run NN_x.ipynb` of a stage -> dropped (the stage is part of the script already);
- `%%capture`, `%%time`, `%time` -> their body, itself converted;
- `!command` (`git clone`, `wget`, ...) -> `ddp.shell("command")`: once per machine (nbddp.runtime.once_per_machine);
- `%%writefile [-a] path` (or `%%file`) -> `ddp.write_file("path", "<the cell's text>")`, likewise once;
- anything else -> `NotebookError` at the magic's line, with a hint.

IPython fills `{expression}` and `$name` in a shell command from the notebook's variables, and leaves the command
as written where that fails (bash's `{a,b}`, a JSON body): such a command gets the script's variables,
`ddp.shell("wget {url}", {**globals(), **locals()})`, and the runtime expands it with IPython's own formatter.
A `%%writefile` or `%cd` path with them is refused.

A dropped line leaves a `# nbddp: dropped …` comment, or `pass  # nbddp: dropped …` where Python
needs a statement (an `if` whose only body was `!pip install`). Lines keep their numbers: a joined
`\\` continuation is padded with blank lines and a cell magic's line becomes a comment above its body.
"""
import ast
import difflib
import shlex
from pathlib import PurePath

import libcst as cst
import libcst.matchers as m
from IPython.core.inputtransformer2 import TransformerManager
from libcst.metadata import MetadataWrapper

from nbddp.errors import NotebookError
from nbddp.export.rewrites.base import CellLocation, Change, ExportContext, Rewrite
from nbddp.export.rewrites.dropped_lines import DROPPED, comment_out, dropped_line

NOTEBOOK_ONLY_HINT = "tag the cell notebook-only to leave it out of the script"

GET_IPYTHON_CALL = m.Call(func=m.Attribute(value=m.Call(func=m.Name("get_ipython")), attr=m.Name()))


def _ipython_call(method: str, strings: int) -> m.Call:
    return m.Call(
        func=m.Attribute(value=m.Call(func=m.Name("get_ipython")), attr=m.Name(method)),
        args=[m.Arg(m.SimpleString())] * strings,
    )


# What IPython writes for a magic on a line of its own.
MAGIC_LINE = m.SimpleStatementLine(
    body=[m.Expr(_ipython_call("system", 1) | _ipython_call("run_line_magic", 2) | _ipython_call("run_cell_magic", 3))]
)
OS_IMPORT = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("os"), asname=None)])])

PACKAGE_MAGICS = {"pip", "uv", "conda", "mamba", "micromamba"}
INTERACTIVE_MAGICS = {"matplotlib", "autoreload"}
ENV_MAGICS = {"env", "set_env"}
BODY_CELL_MAGICS = {"capture", "time"}
WRITEFILE_MAGICS = {"writefile", "file"}
COLAB_FORM = "#@"  # Colab's form annotations: `#@title Install { display-mode: "form" }`, `x = 1  #@param`


def to_python(source: str) -> str:
    """IPython's translation of a raw cell into Python, on the cell's own line numbers.

    IPython drops leading blank lines and joins `\\`-continued magics into one line; both are put
    back (blank lines) so that line N of the result is line N of the cell. A cell magic turns the
    whole cell into one call; `ConvertMagics` puts its body back on its lines. Colab's form lines
    (`#@title ...`, `#@markdown ...`) may come before a cell magic, as Colab runs it: they stay as
    comments above it.
    """
    lines = source.splitlines(keepends=True)
    lead = 0
    while lead < len(lines) and (not lines[lead].strip() or lines[lead].lstrip().startswith(COLAB_FORM)):
        lead += 1
    head, rest = lines[:lead], lines[lead:]
    if not rest:
        return source
    code = TransformerManager().transform_cell("".join(rest)).splitlines(keepends=True)
    if not rest[0].startswith("%%"):
        code = _pad_joined_lines(rest, code)
    python = "".join(head + code)
    return python if source.endswith("\n") else python.removesuffix("\n")  # IPython adds one


def _pad_joined_lines(original: list[str], transformed: list[str]) -> list[str]:
    """Follow each magic IPython assembled from `\\`-continued lines with blank lines for the lines it ate."""
    padded = []
    matcher = difflib.SequenceMatcher(None, original, transformed, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        block = transformed[j1:j2]
        if tag != "replace" or i2 - i1 == j2 - j1:
            padded += block
            continue
        groups = _continued_line_groups(original[i1:i2])
        if len(groups) == len(block):
            for line, group_size in zip(block, groups):
                padded += [line] + ["\n"] * (group_size - 1)
        else:
            padded += block + ["\n"] * max(0, (i2 - i1) - (j2 - j1))
    return padded


def _continued_line_groups(lines: list[str]) -> list[int]:
    """Sizes of the logical lines that `\\` continuations make of `lines`."""
    sizes = []
    continues = False
    for line in lines:
        if continues:
            sizes[-1] += 1
        else:
            sizes.append(1)
        continues = line.endswith("\\\n")
    return sizes


def parse_cell(code: str, location: CellLocation, line_offset: int = 0) -> cst.Module:
    """Parse a cell (after `to_python`), or raise a `NotebookError` at the offending line."""
    try:
        return cst.parse_module(code)
    except cst.ParserSyntaxError as error:
        line, message = error.raw_line, error.message
    try:  # Python's own parser places syntax errors better than libcst's
        ast.parse(code)
    except SyntaxError as error:
        line, message = error.lineno, error.msg
    raise NotebookError(
        location.notebook,
        f"not valid Python: {message}",
        cell=location.cell,
        line=line + line_offset,
        hint="fix the syntax, or " + NOTEBOOK_ONLY_HINT,
    )


def magic_text(call: cst.Call) -> str:
    """The magic as the author wrote it, rebuilt from IPython's `get_ipython()` call."""
    method = call.func.attr.value
    args = [arg.value.evaluated_value for arg in call.args if isinstance(arg.value, cst.SimpleString)]
    if method in {"system", "getoutput"} and args:
        return "!" + args[0]
    if method == "run_line_magic" and len(args) == 2:
        return f"%{args[0]} {args[1]}".rstrip()
    if method == "run_cell_magic" and len(args) == 3:
        return f"%%{args[0]} {args[1]}".rstrip()
    return cst.Module([]).code_for_node(call)


def is_package_command(command: str) -> bool:
    """`pip install …`, `python -m pip …` (also `{sys.executable} -m pip …`), `uv pip …`, `conda install …` and
    the like."""
    words = _words(command)
    if words[:1] in (["pip"], ["pip3"]) or words[:2] == ["uv", "pip"]:
        return True
    if len(words) >= 3 and words[0].startswith(("python", "{sys.executable}")) and words[1:3] == ["-m", "pip"]:
        return True
    return words[:1] in (["conda"], ["mamba"], ["micromamba"]) and words[1:2] == ["install"]


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # unbalanced quotes: IPython would hand them to the shell as they are
        return command.split()


def _uses_ipython_expansion(text: str) -> bool:
    """Whether IPython would try to fill `{expression}` or `$name` in `text` from the notebook's variables."""
    return "{" in text or "$" in text


def _quoted(text: str) -> str:
    """A double-quoted Python string literal for `text`."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class ConvertMagics(Rewrite):
    NAME = "convert-magics"
    DESCRIPTION = (
        "Drop package installs and display-only magics, turn %env into os.environ, keep the body of "
        "%%capture/%%time, run shell commands and %%writefile once per machine; any other magic is an error."
    )

    def __init__(self, location: CellLocation, context: ExportContext = ExportContext(), line_offset: int = 0):
        super().__init__(location, context)
        self.line_offset = line_offset  # lines above this code in the cell (the body of a cell magic)
        self._dropped: list[cst.SimpleStatementLine] = []
        self._cell_magic: cst.Call | None = None
        self._needs_os = False

    def line_of(self, node) -> int:
        return super().line_of(node) + self.line_offset

    # A cell magic is the whole cell (IPython only recognises `%%` on the first line).

    def visit_Module(self, node: cst.Module) -> bool:
        if len(node.body) == 1 and m.matches(node.body[0], MAGIC_LINE):
            call = node.body[0].body[0].value
            if call.func.attr.value == "run_cell_magic":
                self._cell_magic = call
                return False
        return True

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self._cell_magic is not None:
            return self._convert_cell_magic(updated_node, self._cell_magic)
        body, footer = comment_out(updated_node.body, updated_node.footer, self._dropped, keep_statement=False)
        if self._needs_os and not any(m.matches(statement, OS_IMPORT) for statement in body):
            body = [cst.parse_statement("import os\n"), *body]
        return updated_node.with_changes(body=body, footer=footer)

    def _convert_cell_magic(self, module: cst.Module, call: cst.Call) -> cst.Module:
        name, line, body = (arg.value.evaluated_value for arg in call.args)
        text = magic_text(call)
        if name in WRITEFILE_MAGICS:
            return self._convert_writefile(module, call, line, body, text)
        if name not in BODY_CELL_MAGICS:
            self.fail(call, f"cell magic `{text}` has no equivalent in a script", hint=NOTEBOOK_ONLY_HINT)
        if name == "capture" and any(not word.startswith("-") for word in line.split()):
            self.fail(
                call,
                f"`{text}` stores the output in a variable that the script would not have",
                hint="drop the variable name, or " + NOTEBOOK_ONLY_HINT,
            )
        self.record(call, f"dropped `{text}`; its body is kept")
        converted, changes = convert_cell(body, self.location, self.context, line_offset=self.line_of(call))
        self.changes.extend(changes)
        magic_comment = cst.EmptyLine(comment=cst.Comment(DROPPED + text))
        return converted.with_changes(
            header=[*module.header, magic_comment, *converted.header],
            footer=[*converted.footer, *module.footer],
            has_trailing_newline=module.has_trailing_newline,  # IPython ends the body with a newline
        )

    def _convert_writefile(self, module: cst.Module, call: cst.Call, line: str, body: str, text: str) -> cst.Module:
        words = _words(line)
        append = words[:1] == ["-a"]
        if append:
            words = words[1:]
        if len(words) != 1 or words[0].startswith("-"):
            self.fail(call, f"`{text}` is not `%%writefile [-a] path`", hint=NOTEBOOK_ONLY_HINT)
        if _uses_ipython_expansion(line):
            self.fail(call, f"`{text}` names its file with IPython's `{{...}}`/`$name` expansion, which the script "
                            "cannot repeat", hint="write the file from Python, or " + NOTEBOOK_ONLY_HINT)
        # One line of the script per line of the cell: the call opens on the magic's line and each line of
        # the text is a string literal on its own line, so a traceback's line numbers still point into the cell.
        body_lines = body.splitlines(keepends=True)
        mode = ", append=True" if append else ""
        if body_lines:
            literals = "".join(f"\n    {line_text!r}" for line_text in body_lines)
            code = f"ddp.write_file({_quoted(words[0])}, (  # {text}{literals}){mode})\n"
        else:
            code = f"ddp.write_file({_quoted(words[0])}, \"\"{mode})  # {text}\n"
        self.record(call, f"`{text}` -> ddp.write_file({_quoted(words[0])}, ...{mode}): written once per machine")
        converted = cst.parse_module(code)
        return converted.with_changes(header=[*module.header, *converted.header], footer=module.footer,
                                      has_trailing_newline=module.has_trailing_newline)

    # Line magics and shell escapes, one statement each.

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return not m.matches(node, MAGIC_LINE)  # the magics that stand alone are handled on leaving

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node, GET_IPYTHON_CALL):  # a magic used as a value: `x = !ls`, `y = %timeit …`
            self.fail(node, f"`{magic_text(node)}` has no equivalent in a script", hint=NOTEBOOK_ONLY_HINT)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not m.matches(original_node, MAGIC_LINE):
            return updated_node
        call = original_node.body[0].value
        method, text = call.func.attr.value, magic_text(call)
        if method == "system" and is_package_command(text[1:]):
            return self._drop(original_node, call, f"dropped `{text}` (install packages before running the script)")
        if method == "system":
            return self._convert_shell(original_node, call, text[1:], text)
        if method == "run_cell_magic":  # not the whole cell: written by hand
            self.fail(call, f"`{text}` has no equivalent in a script", hint=NOTEBOOK_ONLY_HINT)
        name, args = (arg.value.evaluated_value for arg in call.args)
        return self._convert_line_magic(original_node, call, name, args.strip(), text)

    def _convert_line_magic(self, line, call, name, args, text):
        if name in PACKAGE_MAGICS:
            return self._drop(line, call, f"dropped `{text}` (install packages before running the script)")
        if name in INTERACTIVE_MAGICS or (name == "load_ext" and args == "autoreload"):
            return self._drop(line, call, f"dropped `{text}` (interactive only)")
        if name in ENV_MAGICS:
            return self._convert_env(line, call, args, text)
        if name == "cd":
            return self._convert_cd(line, call, args, text)
        if name == "run" and self._runs_stage(args):
            return self._drop(line, call, f"dropped `{text}` (that stage is part of the script)")
        if name == "run":
            self.fail(
                call,
                f"`{text}` runs something that is not a stage notebook",
                hint="make it a stage (notebooks/NN_name.ipynb) and drop the %run, or " + NOTEBOOK_ONLY_HINT,
            )
        if name == "time":
            self.record(call, f"dropped `%time` (timing only); kept `{args}`")
            statement = self._parse_statement(call, args)
            return statement.with_changes(leading_lines=line.leading_lines)
        self.fail(call, f"magic `{text}` has no equivalent in a script", hint=NOTEBOOK_ONLY_HINT)

    def _convert_shell(self, line, call, command, text):
        message = f"`{text}` -> ddp.shell(...): runs once per machine, the other ranks wait"
        if _uses_ipython_expansion(command):  # filled in at run time, from the script's variables
            statement = cst.parse_statement(f"ddp.shell({_quoted(command)}, {{**globals(), **locals()}})\n")
            message += "; {...}/$name filled in from the script's variables, as IPython does"
        else:
            statement = cst.parse_statement(f"ddp.shell({_quoted(command)})\n")
        self.record(call, message)
        return statement.with_changes(leading_lines=line.leading_lines)

    def _convert_cd(self, line, call, args, text):
        words = _words(args)
        if len(words) != 1 or words[0].startswith("-") or _uses_ipython_expansion(args):
            self.fail(call, f"`{text}` is not a plain `%cd path`", hint='change directory in Python: os.chdir("path")')
        path = _quoted(words[0])
        self._needs_os = True
        statement = cst.parse_statement(
            f"os.chdir(os.path.expanduser({path}))\n" if words[0].startswith("~") else f"os.chdir({path})\n")
        self.record(call, f"`{text}` -> {cst.Module([]).code_for_node(statement).strip()}")
        return statement.with_changes(leading_lines=line.leading_lines)

    def _convert_env(self, line, call, args, text):
        separator = "=" if "=" in args else " "
        name, _, value = (part.strip() for part in args.partition(separator))
        if not value:  # `%env` or `%env A` only shows values
            return self._drop(line, call, f"dropped `{text}` (interactive only)")
        if any(character.isspace() for character in name) or "$" in value or "{" in value:
            self.fail(
                call,
                f"`{text}` is not a plain `%env NAME=value`",
                hint='set it in Python instead: os.environ["NAME"] = value',
            )
        self._needs_os = True
        statement = cst.parse_statement(f"os.environ[{_quoted(name)}] = {_quoted(value)}\n")
        self.record(call, f"`{text}` -> {cst.Module([]).code_for_node(statement).strip()}")
        return statement.with_changes(leading_lines=line.leading_lines)

    def _runs_stage(self, args: str) -> bool:
        words = _words(args)
        return bool(words) and PurePath(words[-1]).name in self.context.stage_notebooks

    def _parse_statement(self, call, code):
        try:
            return cst.parse_statement(code + "\n")
        except cst.ParserSyntaxError as error:
            self.fail(call, f"`{code}` is not a Python statement: {error.message}")

    def _drop(self, line: cst.SimpleStatementLine, call, message) -> cst.SimpleStatementLine:
        self.record(call, message)
        dropped = dropped_line(line, magic_text(call))
        self._dropped.append(dropped)
        return dropped

    # Dropped lines become comments where the block has other statements to stand for it.

    def leave_IndentedBlock(self, original_node, updated_node):
        body, footer = comment_out(updated_node.body, updated_node.footer, self._dropped, keep_statement=True)
        return updated_node.with_changes(body=body, footer=footer)


def convert_cell(
    source: str, location: CellLocation, context: ExportContext, line_offset: int = 0
) -> tuple[cst.Module, list[Change]]:
    """Raw cell source (magics and all) -> plain Python tree and the changes made; errors and changes
    count lines from `line_offset + 1`."""
    module = parse_cell(to_python(source), location, line_offset)
    rewrite = ConvertMagics(location, context, line_offset)
    return MetadataWrapper(module).visit(rewrite), rewrite.changes
