"""The parent's side of the console: -q/-v reach the logger and the children, torchrun keeps a quiet run's stdout in
its logs, and a smoke run's training progress is echoed beside papermill's cell counter."""
import logging
import sys

import pytest

from nbddp import cli, log
from nbddp.orchestration.launch import launch
from nbddp.orchestration.smoke import papermill_stderr


@pytest.fixture
def quiet():
    before = log.logger.level
    log.set_level(logging.WARNING)
    yield
    log.set_level(before)


def test_the_flags_set_the_level_while_the_command_runs(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "run", lambda *args, **kwargs: seen.append(log.environment()[log.LEVEL_ENV]))
    for flag in ("-q", "--verbose", None):
        assert cli.main(["run", *([flag] if flag else [])]) == 0
    assert seen == ["WARNING", "DEBUG", "INFO"]
    assert not log.quiet()


def test_quiet_and_verbose_are_one_or_the_other(capsys):
    assert cli.main(["smoke", "-q", "-v"]) == 2  # one paragraph, not argparse's usage block
    assert "error: argument -v/--verbose: not allowed with argument -q/--quiet" in capsys.readouterr().err


def test_info_lines_go_to_stdout_warnings_to_stderr_and_quiet_keeps_only_warnings(capsys, quiet):
    log.logger.info("launch: hidden")
    log.logger.warning("nbddp: warning: shown")
    assert capsys.readouterr() == ("", "nbddp: warning: shown\n")


def test_a_quiet_run_keeps_the_workers_stdout_in_its_logs_and_tells_them(monkeypatch, quiet):
    plan = launch.plan_launch("train.py", log_dir="runs/x/logs", environ={})
    assert plan.command[-6:-1] == ["runs/x/logs", "--redirects", "1", "--tee", "2"]
    started = []
    monkeypatch.setattr(launch.stderr_tail, "run", lambda command, env, log_path=None: started.append(env) or (0, ""))
    launch.execute(plan)
    assert started[0][log.LEVEL_ENV] == "WARNING" and started[0]["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


@pytest.mark.parametrize("level, shown", [
    (logging.INFO, "nbddp: step 1/3 (33%)\nnbddp: step 2/3 (66%)\n"),  # papermill's cell bar: in its log only
    (logging.DEBUG, "Executing:  50%|#    | 1/2\nnbddp: step 1/3 (33%)\nnbddp: step 2/3 (66%)\n"
                    "\rExecuting: 100%|#####| 2/2\n"),  # -v: everything
])
def test_the_kernels_progress_lines_are_echoed_on_lines_of_their_own(tmp_path, capfd, level, shown):
    progress = tmp_path / "progress.log"
    progress.write_text("")
    code = ("import sys, time\n"
            "sys.stderr.write('Executing:  50%|#    | 1/2'); sys.stderr.flush()\n"
            f"open({str(progress)!r}, 'a').write('nbddp: step 1/3 (33%)\\nnbddp: step 2/3')\n"
            "time.sleep(1)\n"
            f"open({str(progress)!r}, 'a').write(' (66%)\\n')\n"
            "time.sleep(1)\n"
            "sys.stderr.write('\\rExecuting: 100%|#####| 2/2\\n')\n")
    before = log.logger.level
    log.set_level(level)
    try:
        assert papermill_stderr.run([sys.executable, "-c", code], None, tmp_path / "log", progress) == 0
    finally:
        log.set_level(before)
    assert capfd.readouterr().err == shown
    assert (tmp_path / "log").read_bytes().decode() == ("Executing:  50%|#    | 1/2\rExecuting: 100%|#####| 2/2\n")
