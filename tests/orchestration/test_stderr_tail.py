import os
import sys

from nbddp.orchestration import stderr_tail


def python(code):
    return [sys.executable, "-c", code]


def test_stderr_passes_through_and_its_end_comes_back(capfd):
    status, tail = stderr_tail.run(python("import sys; sys.stderr.write('progress 50%\\rprogress 100%'); sys.exit(3)"),
                                   dict(os.environ))
    assert status == 3
    assert tail == "progress 50%\rprogress 100%"
    assert capfd.readouterr().err == tail  # echoed as it came, unterminated line included


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
