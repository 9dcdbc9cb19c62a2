"""Before/after harness for one rewrite, in the manner of LibCST's `CodemodTest.assertCodemod`."""
from textwrap import dedent

import libcst as cst
from libcst.metadata import MetadataWrapper

from nbddp.export.rewrites.base import CellLocation, ExportContext

LOCATION = CellLocation("notebooks/02_train.ipynb", 4)


def run(rewrite_class, before: str, tags=(), stages=()):
    """Apply one rewrite to dedented `before`; returns the new code and [(line, message), ...]."""
    context = ExportContext(stage_notebooks=frozenset(stages), cell_tags=frozenset(tags))
    rewrite = rewrite_class(LOCATION, context)
    module = MetadataWrapper(cst.parse_module(dedent(before))).visit(rewrite)
    assert all(change.rewrite == rewrite_class.NAME for change in rewrite.changes)
    return module.code, [(change.line, change.message) for change in rewrite.changes]


def assert_rewrites(rewrite_class, before: str, after: str, tags=(), stages=()):
    """`before` becomes `after`, and rewriting `after` again leaves it as it is; returns the changes."""
    code, changes = run(rewrite_class, before, tags, stages)
    assert code == dedent(after)
    assert run(rewrite_class, code, tags, stages)[0] == code
    return changes


def assert_unchanged(rewrite_class, before: str, tags=(), stages=()):
    code, changes = run(rewrite_class, before, tags, stages)
    assert code == dedent(before)
    assert changes == []
