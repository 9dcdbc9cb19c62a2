"""Move `import unsloth` above the first import of transformers, trl or peft in the same cell.

Unsloth patches those libraries when it is imported, and warns (and optimises less) when they were
imported first. Across cells nothing is needed: the runtime's setup imports unsloth before any cell.
Only whole lines at the cell's top level are moved; the moved line keeps its comments.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite

PATCHED_BY_UNSLOTH = {"transformers", "trl", "peft"}


def imported_packages(statement: cst.BaseStatement) -> set[str]:
    """Top-level packages that a line of imports imports: {"transformers"} for `from transformers.x import y`."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    packages = set()
    for small in statement.body:
        if isinstance(small, cst.Import):
            packages |= {_top_package(alias.name) for alias in small.names}
        elif isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None:
            packages.add(_top_package(small.module))
    return packages


def _top_package(name: cst.BaseExpression) -> str:
    while isinstance(name, cst.Attribute):
        name = name.value
    return name.value


def is_unsloth_import_line(statement: cst.BaseStatement) -> bool:
    return imported_packages(statement) == {"unsloth"} and all(
        m.matches(small, m.Import() | m.ImportFrom()) for small in statement.body
    )


class HoistUnslothImport(Rewrite):
    NAME = "hoist-unsloth-import"
    DESCRIPTION = "Import unsloth before transformers, trl and peft within a cell, as Unsloth requires."

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        first_patched = next(
            (index for index, statement in enumerate(body) if imported_packages(statement) & PATCHED_BY_UNSLOTH),
            None,
        )
        if first_patched is None:
            return updated_node
        late = [index for index in range(first_patched + 1, len(body)) if is_unsloth_import_line(body[index])]
        if not late:
            return updated_node
        for index in late:
            self.record(original_node.body[index], "moved the unsloth import above the first transformers/trl/peft one")
        target = body[first_patched]
        moved = [body[index] for index in late]
        # The comments above the first patched import now sit above the unsloth import.
        moved[0] = moved[0].with_changes(leading_lines=[*target.leading_lines, *moved[0].leading_lines])
        target = target.with_changes(leading_lines=[])
        rest = [body[index] for index in range(first_patched + 1, len(body)) if index not in late]
        return updated_node.with_changes(body=[*body[:first_patched], *moved, target, *rest])
