import logging
import os
import sys

import pytest

from nbddp import log
from nbddp.orchestration.launch import stderr_tail


def python(code):
    return [sys.executable, "-c", code]


@pytest.fixture
def verbose():
    """-v: the console gets everything, as it comes."""
    level = log.logger.level
    log.set_level(logging.DEBUG)
    yield
    log.set_level(level)


def test_stderr_passes_through_and_its_end_comes_back(capfd, verbose):
    status, tail = stderr_tail.run(python("import sys; sys.stderr.write('progress 50%\\rprogress 100%'); sys.exit(3)"),
                                   dict(os.environ))
    assert status == 3
    assert tail == "progress 50%\rprogress 100%"
    assert capfd.readouterr().err == tail  # echoed as it came, unterminated line included


def test_the_console_leaves_out_other_libraries_noise_which_the_log_keeps(capfd, tmp_path):
    lines = ["[default0]:Map:  50%|#####     | 1500/3000 [00:01<00:01, 1500.00 examples/s]\r[default0]:Map: 100%|",
             "[default1]:", "[default0]:/x/dataloader.py:759: UserWarning: 'pin_memory' argument is set as true",
             "[default0]:  super().__init__(loader)", "[default1]:nbddp: details: patched: a, b",
             "W1207 00:02:07.869000 12 torch/distributed/run.py:766] Setting OMP_NUM_THREADS",
             "[default0]:nbddp: warning: the notebook's global batch does not split", "[default1]:Traceback (most "
             "recent call last):", "[default1]:  File \"train.py\", line 3", "[default1]:ValueError: bad",
             "[default0]:Loading weights: 3 it [00:00, 16503.73it/s]", "no newline at the end"]
    text = "\n".join(lines)
    status, tail = stderr_tail.run(python(f"import sys; sys.stderr.write({text!r})"), dict(os.environ),
                                   log_path=str(tmp_path / "logs" / "torchrun.stderr.log"))
    assert status == 0 and tail == text and (tmp_path / "logs" / "torchrun.stderr.log").read_bytes().decode() == text
    assert capfd.readouterr().err.splitlines() == [lines[6], *lines[7:10], lines[-1]]


def test_only_the_end_is_kept(monkeypatch, capfd):
    monkeypatch.setattr(stderr_tail, "KEEP_CHARS", 1000)
    code = "import sys\nfor i in range(2000): sys.stderr.write(f'line {i}\\n'); sys.stderr.flush()"
    status, tail = stderr_tail.run(python(code), dict(os.environ))
    assert status == 0
    assert tail.endswith("line 1999\n") and "line 0\n" not in tail
    assert 1000 <= len(tail) < 1000 + 65536
    assert capfd.readouterr().err.startswith("line 0\nline 1\n")


def test_utf8_split_across_reads_is_decoded_whole(capfd):
    code = "import os, time\nos.write(2, '🏖'.encode()[:2]); time.sleep(0.2); os.write(2, '🏖'.encode()[2:])"
    assert stderr_tail.run(python(code), dict(os.environ)) == (0, "🏖")
