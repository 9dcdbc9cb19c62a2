import io
import sys

import pytest

from nbddp.orchestration.smoke import papermill_stderr
from nbddp.orchestration.smoke.papermill_stderr import TRACEBACK_START, _UntilTraceback

TRACEBACK = f"{TRACEBACK_START}\n  File \"x.py\", line 1\nValueError: boom\n"


@pytest.mark.parametrize("chunk_size", [1, 3, 17, 1000])
def test_the_console_gets_everything_before_the_traceback_whatever_the_chunks(chunk_size):
    text = "Executing:  10%|#\rExecuting: 100%|##########\n" + "a warning\n" + TRACEBACK + "after\n"
    console = io.StringIO()
    stream = _UntilTraceback(console)
    for start in range(0, len(text), chunk_size):
        stream.write(text[start:start + chunk_size])
    stream.close()
    assert console.getvalue() == "Executing:  10%|#\rExecuting: 100%|##########\na warning\n"


def test_text_that_only_looks_like_a_traceback_start_is_passed_on():
    console = io.StringIO()
    stream = _UntilTraceback(console)
    stream.write("Trace")
    assert console.getvalue() == ""  # held back: it may be the start of a traceback
    stream.write("s of progress\nTraceback (most")
    stream.close()
    assert console.getvalue() == "Traces of progress\nTraceback (most"  # never completed: shown at the end


def test_run_echoes_up_to_the_traceback_and_logs_all_of_it(tmp_path, capfd):
    code = ("import sys; sys.stderr.write('Executing:  50%|#   | 1/2 [00:01<00:01]\\rExecuting: 100%|\\n'); "
            "sys.stderr.write('Input Notebook: x.ipynb\\n'); raise ValueError('boom')")
    status = papermill_stderr.run([sys.executable, "-c", code], None, tmp_path / "log")
    assert status == 1
    assert capfd.readouterr().err == "Input Notebook: x.ipynb\n"  # its cell bar: in the log (and with -v)
    logged = (tmp_path / "log").read_bytes().decode()
    assert logged.startswith("Executing:  50%|#   | 1/2 [00:01<00:01]\rExecuting: 100%|\nInput Notebook: x.ipynb\n"
                             "Traceback (most recent call last):") and "ValueError: boom" in logged
