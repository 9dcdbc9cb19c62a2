import sys
import textwrap

import pytest
import yaml

from nbddp.orchestration.script_notebook import to_notebook
from nbddp.orchestration.smoke import notebook_run
from nbddp.orchestration.smoke.notebook_run import NotebookRunFailed, papermill_command, run_notebook


def test_a_script_without_kernelspec_gets_python3(tmp_path):
    script = tmp_path / "train.py"
    script.write_text('# %% tags=["parameters"]\nrows = 1\n')
    assert to_notebook(script).metadata.kernelspec["name"] == "python3"


def test_parameters_reach_papermill_as_yaml_that_keeps_their_types(tmp_path):
    command = papermill_command(tmp_path / "in.ipynb", tmp_path / "out.ipynb", {"lr": 1e-5, "name": "2024-01-01"},
                                tmp_path, timeout=30, progress=False)
    assert command[:3] == [sys.executable, "-m", "papermill"]
    injected = yaml.safe_load(command[command.index("-y") + 1])
    assert injected == {"lr": 1e-5, "name": "2024-01-01"} and isinstance(injected["lr"], float)
    assert command[command.index("--execution-timeout") + 1] == "30"


@pytest.mark.e2e
def test_a_cell_past_the_timeout_is_reported_as_such(workdir):
    script = workdir / "slow.py"
    script.write_text(textwrap.dedent('''\
        # %% tags=["parameters"]
        seconds = 60

        # %%
        import time
        time.sleep(seconds)
    '''))
    with pytest.raises(NotebookRunFailed, match="per-cell timeout of 2 s") as error:
        run_notebook(to_notebook(script), script, {}, workdir, "", timeout=2, progress=False)
    assert (error.value.cell, error.value.line, error.value.exit_status) == (2, 2, 1)
    assert (workdir / "slow.html").exists()


def test_dead_kernel_wording():
    failure = notebook_run.cell_failure.CellFailure(3, None, "DeadKernelError", "the kernel died", 1.0)
    assert "kernel died" in notebook_run._describe(failure, notebook_run.DEAD_KERNEL_STATUS, None)


@pytest.mark.e2e
def test_bad_input_raised_in_a_cell_exits_2(workdir):
    # As require_fields raises it in the data prep cell of a smoke run.
    script = workdir / "bad_rows.py"
    script.write_text(textwrap.dedent('''\
        # %% tags=["parameters"]
        rows = 1

        # %%
        from nbddp.errors import DataError
        raise DataError('data/x.jsonl row 17: missing "output"')
    '''))
    with pytest.raises(NotebookRunFailed, match='DataError: data/x.jsonl row 17: missing "output"') as error:
        run_notebook(to_notebook(script), script, {}, workdir, "", timeout=60, progress=False)
    assert (error.value.cell, error.value.line, error.value.exit_status) == (2, 2, 2)


@pytest.mark.e2e
def test_a_failing_cell_keeps_papermills_traceback_off_the_console_and_in_its_log(workdir, capfd):
    script = workdir / "fails.py"
    script.write_text('# %% tags=["parameters"]\nrows = 1\n\n# %%\nraise ValueError("boom")\n')
    with pytest.raises(NotebookRunFailed, match="ValueError: boom") as error:
        run_notebook(to_notebook(script), script, {}, workdir, "", timeout=60, progress=False)
    assert "Traceback" not in capfd.readouterr().err
    log = workdir / notebook_run.PAPERMILL_LOG
    assert str(log) in error.value.hint
    assert "PapermillExecutionError" in log.read_text() and "ValueError: boom" in log.read_text()


@pytest.mark.e2e
def test_papermill_failing_outside_any_cell_says_why(workdir):
    notebook = to_notebook(workdir / "train_fixture.py")
    notebook.metadata.kernelspec = {"name": "nosuchkernel", "display_name": "x", "language": "python"}
    with pytest.raises(NotebookRunFailed, match="papermill exited with status 1: .*No such kernel named nosuchkernel"):
        run_notebook(notebook, workdir / "train_fixture.py", {}, workdir, "", timeout=60, progress=False)


def test_a_notebook_nbconvert_cannot_render_is_still_a_run(tmp_path, monkeypatch, capsys):
    # nbconvert unpacked without its data files (templates) raises ValueError: the run must not fail for it.
    import nbconvert
    import nbformat

    class TemplatesMissing:
        def from_notebook_node(self, *args, **kwargs):
            raise ValueError("No template sub-directory with name 'lab' found in the following paths:\n\t/x")

    monkeypatch.setattr(nbconvert, "HTMLExporter", TemplatesMissing)
    executed = tmp_path / "train.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), executed)
    assert notebook_run.render_html(executed, tmp_path / "train.html") is None
    assert not (tmp_path / "train.html").exists()
    assert "no HTML rendering of" in capsys.readouterr().err


def test_render_html_writes_the_page(tmp_path):
    import nbformat

    executed = tmp_path / "train.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("marker_name = 1")]), executed)
    html = notebook_run.render_html(executed, tmp_path / "train.html")
    assert html == tmp_path / "train.html" and "marker_name" in html.read_text()
