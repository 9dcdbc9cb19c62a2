"""Run the generated script once as a notebook (script_notebook converts it): papermill executes it in a child.

Papermill runs as `python -m papermill` so that CUDA_VISIBLE_DEVICES and the kernelspec search
path change for the child only. Its executed notebook is the record: a failure is read back from
it (cell_failure) and reported at the source notebook cell and line (sourcemap). The console shows papermill's
cell counter and the kernel's training progress (`progress.log`, the run setting `progress_file`), neither with `-q`.
"""

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import yaml

from nbddp import errors, log
from nbddp.errors import NotebookError
from nbddp.formats.sourcemap import SourceMap
from nbddp.orchestration import environment, stopping
from nbddp.orchestration import parameters as orchestration_parameters
from nbddp.orchestration.project import files
from nbddp.orchestration.smoke import cell_failure, kernel, papermill_stderr

DEAD_KERNEL_STATUS = 138  # papermill's exit status when the kernel died
PAPERMILL_LOG = "papermill.stderr.log"
# The kernel's training progress lines (nbddp.runtime.reporting.progress), echoed as they come.
PROGRESS_LOG = "progress.log"
# What the runtime raises for bad input (require_fields, require_model, output_dir): in a cell, still bad input.
BAD_INPUT_ERRORS = frozenset(name for name, value in vars(errors).items()
                             if isinstance(value, type) and issubclass(value, errors.NbddpError))


class NotebookRunFailed(NotebookError):
    """A cell raised (or the kernel died); located in the source notebook. Exit 1, or 2 when the cell raised
    nbddp's own bad-input error (its message says what to fix)."""

    exit_status = 1


@dataclass(frozen=True)
class NotebookRun:
    executed: Path
    html: Path | None  # None when nbconvert could not render it
    wall_time_s: float


def run_notebook(notebook, script, parameters, out_dir, cuda_visible_devices, timeout=None, progress=True,
                 extra_env=None):
    """Execute `notebook` (converted from `script`) with `parameters` injected (its `workdir` absolute, see
    `parameters.with_absolute_paths`); results in `out_dir`. `extra_env`: variables for the kernel on top of ours.

    Writes `<stem>.ipynb` (executed), `<stem>.html`, the cells' stdout/stderr logs, papermill's own stderr
    (`papermill.stderr.log`) and the training progress (`progress.log`). Raises NotebookRunFailed naming the source
    notebook, cell and line when a cell fails, stopping.Interrupted when a signal stopped papermill and its kernel.
    """
    out_dir = Path(out_dir)
    stem = Path(script).stem
    parameters = orchestration_parameters.with_absolute_paths(
        script, orchestration_parameters.read_defaults(notebook, script), parameters)
    executed, html = out_dir / f"{stem}.ipynb", out_dir / f"{stem}.html"
    with tempfile.TemporaryDirectory(prefix="nbddp-kernel-") as scratch:
        given = Path(scratch) / f"{stem}.ipynb"
        nbformat.write(notebook, given)
        env = environment.child_environment(cuda_visible_devices, kernel.write_kernelspec(Path(scratch) / "jupyter"))
        progress_log = out_dir / PROGRESS_LOG
        files.write_text(progress_log, "")
        env |= log.environment() | {log.PROGRESS_FILE_ENV: str(progress_log.resolve())} | (extra_env or {})
        command = papermill_command(given, executed, parameters, out_dir, timeout, progress and not log.quiet())
        started = time.monotonic()
        try:
            status = papermill_stderr.run(command, env, out_dir / PAPERMILL_LOG, progress_log)
        except stopping.Interrupted as stopped:
            raise stopping.Interrupted(stopped.signum, f"papermill and its kernel have exited; the notebook run "
                                                       f"wrote into {files.shown(out_dir)}") from None
        wall_time_s = time.monotonic() - started
    if not executed.exists():
        papermill_log = out_dir / PAPERMILL_LOG
        raise NotebookRunFailed(script, f"papermill exited with status {status} before running any cell"
                                        f"{_last_line(papermill_log)}", hint=f"papermill's output: {papermill_log}")
    html = render_html(executed, html)
    if status != 0:
        raise _located_failure(script, executed, status, timeout)
    return NotebookRun(executed, html, wall_time_s)


def papermill_command(given, executed, parameters, out_dir, timeout, progress):
    """The papermill command line; the kernel's working directory is ours, like torchrun's."""
    command = [sys.executable, "-m", "papermill", str(given), str(executed), "--cwd", str(Path.cwd())]
    # YAML, not JSON: PyYAML reads JSON's `1e-05` as a string, and papermill reads -y with PyYAML.
    command += ["-y", yaml.safe_dump(parameters, default_flow_style=True), "--log-level", "ERROR"]
    command += ["--stdout-file", str(out_dir / "cells.stdout.log"), "--stderr-file", str(out_dir / "cells.stderr.log")]
    command += ["--progress-bar" if progress else "--no-progress-bar"]
    if timeout:
        command += ["--execution-timeout", str(int(timeout))]
    return command


def render_html(executed, html):
    """An HTML rendering of the executed notebook, for reading the run in a browser: `html`, or None with a
    warning when nbconvert cannot render it. The executed notebook is the record, so the run goes on."""
    from nbconvert import HTMLExporter  # slow to import; only needed once a notebook ran

    resources = {"metadata": {"name": Path(executed).stem}}  # the page title
    try:
        body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4), resources=resources)
    except (ValueError, OSError) as error:  # its templates missing: an nbconvert installed without data files
        log.logger.warning(f"nbddp: warning: no HTML rendering of {executed} ({error.__class__.__name__}: "
                           f"{str(error).splitlines()[0]}); reinstall nbconvert with pip to get its templates")
        return None
    files.write_text(html, body)
    return html


def _located_failure(script, executed, status, timeout):
    notebook = nbformat.read(executed, as_version=4)
    failure = cell_failure.find_failure(notebook) or cell_failure.last_started_cell(notebook)
    log = executed.parent / PAPERMILL_LOG
    hint = f"executed notebook: {executed}; papermill's output: {log}"
    if failure is None:
        return NotebookRunFailed(script, f"papermill exited with status {status}{_last_line(log)}", hint=hint)
    where = SourceMap.for_script(script).locate(failure.cell_index, failure.line)
    failed = NotebookRunFailed(where.notebook, _describe(failure, status, timeout), where.cell, where.line, hint)
    if failure.ename in BAD_INPUT_ERRORS:
        failed.exit_status = errors.NbddpError.exit_status
    return failed


def _last_line(log) -> str:
    """': <the log's last non-blank line>' (for papermill, the exception it ended with), or ''."""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return f": {lines[-1]}" if lines else ""


def _describe(failure, status, timeout):
    timed_out = timeout and failure.duration_s is not None and failure.duration_s >= timeout
    if failure.ename == "KeyboardInterrupt" and timed_out:
        return f"the cell ran past the per-cell timeout of {timeout} s (--timeout) and was interrupted"
    if status == DEAD_KERNEL_STATUS and failure.ename == "DeadKernelError":
        return "the kernel died while running this cell (out of memory? a crash in native code?)"
    return f"{failure.ename}: {failure.evalue}" if failure.evalue else failure.ename
