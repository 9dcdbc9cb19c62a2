"""Progress bars from `tqdm.auto`, not `tqdm.notebook`: text in a script, widgets in a kernel (the smoke run).

`tqdm.notebook` draws Jupyter widgets, which a script under torchrun shows as `HBox(children=...)` lines or an
"IProgress not found" error. `from tqdm.notebook import tqdm, trange`, `import tqdm.notebook [as t]` and
`tqdm.notebook.tqdm(...)` get `tqdm.auto` instead; an import of names `tqdm.auto` lacks (`tnrange`,
`tqdm_notebook`) is left alone.
"""
import libcst as cst
import libcst.matchers as m

from nbddp.export.rewrites.base import Rewrite

TQDM_NOTEBOOK = m.Attribute(value=m.Name("tqdm"), attr=m.Name("notebook"))
IN_TQDM_AUTO = {"tqdm", "trange"}


class UseTqdmAuto(Rewrite):
    NAME = "use-tqdm-auto"
    DESCRIPTION = "Use tqdm.auto instead of tqdm.notebook: a text progress bar in the script, widgets in a notebook."

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        """`from tqdm.notebook import tnrange` (or `*`): tqdm.auto lacks the name, so its `tqdm.notebook` stays."""
        if not m.matches(node.module, TQDM_NOTEBOOK):
            return True
        names = node.names
        return not isinstance(names, cst.ImportStar) and all(alias.name.value in IN_TQDM_AUTO for alias in names)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if not m.matches(original_node, TQDM_NOTEBOOK):
            return updated_node
        self.record(original_node, "replaced tqdm.notebook with tqdm.auto (Jupyter widgets show as text in a script)")
        return updated_node.with_changes(attr=cst.Name("auto"))
