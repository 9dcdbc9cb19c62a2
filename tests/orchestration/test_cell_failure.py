from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from nbddp.orchestration.smoke.cell_failure import find_failure, last_started_cell

# IPython 9's colored traceback text: the call in cell In[4] line 2, raised in cell In[3] line 3.
TRACEBACK = [
    "\x1b[31m---------------------------------------------------------------------------\x1b[39m",
    "\x1b[31mIndexError\x1b[39m                                Traceback (most recent call last)",
    "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[4]\x1b[39m\x1b[32m, line 2\x1b[39m\n      1 x = 1\n----> 2 f()\n",
    "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[3]\x1b[39m\x1b[32m, line 3\x1b[39m, in \x1b[36mf\x1b[39m\x1b[34m()\x1b[39m\n",
    "\x1b[31mIndexError\x1b[39m: list index out of range",
]


def tagged(cell, *tags):
    cell.metadata["tags"] = list(tags)
    return cell


def executed(with_markers=True):
    """A notebook as papermill leaves it: injected parameters after `parameters`, error markers around."""
    error = new_output("error", ename="IndexError", evalue="list index out of range", traceback=TRACEBACK)
    cells = [
        tagged(new_markdown_cell("An Exception was encountered"), "papermill-error-cell-tag"),
        new_markdown_cell("# title"),
        tagged(new_code_cell("rows = 4", execution_count=1), "parameters"),
        tagged(new_code_cell("rows = 2", execution_count=2), "injected-parameters"),
        new_code_cell("def f():\n    t = []\n    return t[0]", execution_count=3),
        tagged(new_markdown_cell("Execution stopped here"), "papermill-error-cell-tag"),
        new_code_cell("x = 1\nf()", execution_count=4, outputs=[error]),
        new_code_cell("print('never')"),
    ]
    if not with_markers:
        cells = [cell for cell in cells if "papermill-error-cell-tag" not in cell.metadata.get("tags", [])]
    return new_notebook(cells=cells)


def test_the_innermost_notebook_frame_in_original_cell_indices():
    failure = find_failure(executed())
    # Original notebook: title (0), parameters (1), def f (2), the call (3), print (4).
    assert (failure.cell_index, failure.line, failure.ename) == (2, 3, "IndexError")
    assert failure.evalue == "list index out of range"


def test_indices_are_the_same_without_error_markers():
    assert find_failure(executed(with_markers=False)).cell_index == 2


def test_without_cell_frames_the_failing_cell_and_no_line():
    notebook = executed()
    notebook.cells[6].outputs[0].traceback = ["KeyboardInterrupt: "]
    failure = find_failure(notebook)
    assert (failure.cell_index, failure.line) == (3, None)


def test_a_clean_exit_is_not_a_failure():
    notebook = new_notebook(cells=[new_code_cell("import sys; sys.exit(0)", execution_count=1, outputs=[
        new_output("error", ename="SystemExit", evalue="0", traceback=[])])])
    assert find_failure(notebook) is None


def test_a_dead_kernel_is_reported_at_the_last_cell_that_started():
    notebook = executed(with_markers=False)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    for index in (0, 1, 2, 3):
        notebook.cells[index].metadata["papermill"] = {"start_time": "2026-01-01T00:00:00", "duration": 1.5}
    failure = last_started_cell(notebook)
    assert (failure.cell_index, failure.ename, failure.duration_s) == (2, "DeadKernelError", 1.5)
