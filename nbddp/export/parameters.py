"""The `parameters` cells of all stages, checked and merged into the one parameters cell of the script."""
import json
from dataclasses import dataclass
from pathlib import Path

from nbddp.errors import NotebookError
from nbddp.export.notebooks import SourceCell
from nbddp.export.syntax import check_syntax
from nbddp.formats.parameters import ParametersCellError, read_cell
from nbddp.formats.run_settings import script_parameter_lines
from nbddp.formats.script_parameters import OWN_PARAMETERS

# Names the generated script binds itself; a parameter with one of them would be overwritten or break it.
RESERVED_NAMES = (*OWN_PARAMETERS, "ddp", "runtime", "set")  # set: the --set flag


@dataclass(frozen=True)
class Parameter:
    """One `name = literal` assignment of a parameters cell."""

    name: str
    value: object
    cell: SourceCell
    line: int  # 1-based line of the assignment in the cell
    first_line: int  # first line of the comments above it (the line after the previous assignment)
    last_line: int

    @property
    def place(self):
        return f"{self.cell.location.notebook}, cell {self.cell.location.cell}, line {self.line}"


@dataclass(frozen=True)
class MergedParameters:
    """The merged parameters cell: its source and where each of its lines came from. A `# <notebook file name>`
    line (`# nbddp` for nbddp's own) stands above each notebook's parameters: the runtime reads it for `--help`
    (`nbddp.runtime.inputs.flags.defined_in`)."""

    source: str
    origin: list  # per line: [notebook, cell, line] or None for lines nbddp wrote


def read_parameters(cell: SourceCell) -> list[Parameter]:
    """The assignments of a parameters cell; anything but a literal assignment or a comment is an error."""
    try:
        assignments = read_cell(check_syntax(cell.location, cell.source))
    except ParametersCellError as error:
        raise _not_an_assignment(cell, error) from None
    parameters = []
    for assignment in assignments:
        if assignment.name in RESERVED_NAMES:
            raise NotebookError(
                cell.location.notebook,
                f"parameter name {assignment.name!r} is taken by the generated script",
                cell=cell.location.cell,
                line=assignment.line,
                hint=f"rename it; nbddp itself defines {', '.join(RESERVED_NAMES)}",
            )
        # The comments above an assignment go with it: they follow the previous assignment's last line.
        first_line = parameters[-1].last_line + 1 if parameters else 1
        parameters.append(Parameter(assignment.name, assignment.default, cell, assignment.line, first_line,
                                    assignment.end_line))
    return parameters


def merge_parameters(cells: list[SourceCell], workdir: str = ".") -> MergedParameters:
    """Merge the parameters cells (in pipeline order): a name defined twice must have one default. `workdir`: the
    notebooks' folder from the script's, the default of nbddp's `workdir` parameter."""
    first_definition: dict[str, Parameter] = {}
    lines: list[str] = []
    origin: list = []
    named_notebooks: set[str] = set()
    for cell in cells:
        dropped_lines: set[int] = set()
        for parameter in read_parameters(cell):
            earlier = first_definition.setdefault(parameter.name, parameter)
            if earlier is parameter:
                continue
            if repr(earlier.value) != repr(parameter.value):
                raise NotebookError(
                    cell.location.notebook,
                    f"parameter {parameter.name!r} defaults to {parameter.value!r} here "
                    f"but to {earlier.value!r} in {earlier.place}",
                    cell=cell.location.cell,
                    line=parameter.line,
                    hint="the stages run as one script, so a parameter has one default: make them equal",
                )
            # Same default: the first definition stands for both.
            dropped_lines.update(range(parameter.first_line, parameter.last_line + 1))
        kept = [
            (number, text)
            for number, text in enumerate(cell.source.splitlines(), start=1)
            if text.strip() and number not in dropped_lines
        ]
        notebook_name = Path(cell.location.notebook).name
        if kept and notebook_name not in named_notebooks:
            named_notebooks.add(notebook_name)
            lines.append(f"# {notebook_name}")
            origin.append(None)
        for number, text in kept:
            lines.append(text)
            origin.append([cell.location.notebook, cell.location.cell, number])
    nbddp_lines = script_parameter_lines(json.dumps(workdir))
    lines.extend(nbddp_lines)
    origin.extend([None] * len(nbddp_lines))
    return MergedParameters("\n".join(lines), origin)


def _not_an_assignment(cell: SourceCell, error: ParametersCellError) -> NotebookError:
    if error.name is None:
        return NotebookError(
            cell.location.notebook,
            f"a parameters cell holds only `name = literal` assignments and comments, not `{_line(cell, error.line)}`",
            cell=cell.location.cell,
            line=error.line,
            hint="keep literal defaults here and compute derived values in the next cell",
        )
    return NotebookError(
        cell.location.notebook,
        f"parameter {error.name!r} is not a literal (a number, string, bool, None, list, tuple or dict)",
        cell=cell.location.cell,
        line=error.line,
        hint="the default becomes a command-line flag, so it must be a literal; compute derived values in the next cell",
    )


def _line(cell: SourceCell, line: int) -> str:
    return cell.source.splitlines()[line - 1].strip()
