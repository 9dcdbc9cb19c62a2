"""The console shows nbddp's lines and what went wrong; other libraries' progress bars, warnings and blank lines, and
nbddp's lines for the logs only, stay in the logs unless -v."""
import io
import logging

import pytest

from nbddp import log
from nbddp.orchestration import console_noise


@pytest.fixture
def level():
    before = log.logger.level
    yield log.set_level
    log.set_level(before)


@pytest.mark.parametrize("line", [
    "[default0]:", "[default1]:   \n", "", "\n",
    "[default0]:Map:   0%|          | 0/3000 [00:00<?, ? examples/s]",
    "[default0]:Tokenizing train dataset: 100%|██████████| 2800/2800 [00:00<00:00, 6606.98 examples/s]",
    "[default0]:Loading weights: 21 it [00:00, 16503.73it/s]",
    "Executing:   3%|▎         | 1/30 [00:00<00:25,  1.14cell/s]\rExecuting:  13%|█▎        | 4/30",
    "[default1]:/site-packages/torch/utils/data/dataloader.py:759: UserWarning: 'pin_memory' argument is set",
    "[default0]:/x/trainer.py:12: FutureWarning: `tokenizer` is deprecated",
    "W1207 00:02:07.869000 12345 torch/distributed/run.py:766] *****",
    "[default0]:nbddp: details: patched: a, b",
])
def test_noise(line):
    assert console_noise.noise(line)


@pytest.mark.parametrize("line", [
    "[default0]:nbddp: step 30/300 (10%): loss 1.2009",
    "[default0]:nbddp: warning: SFTConfig: the notebook's global batch of 3 rows (3 x 1) does not split",
    "[default1]:Traceback (most recent call last):",
    "[default1]:ValueError: 100% sure",
    "E1207 00:02:07.869000 12345 torch/distributed/elastic/multiprocessing/api.py:900] failed (exitcode: 1)",
    "[default0]:held-out loss after 300 steps: 0.7573",
])
def test_not_noise(line):
    assert not console_noise.noise(line)


def test_a_warnings_source_line_goes_with_it_and_whole_lines_pass(level):
    level(logging.INFO)
    console = io.StringIO()
    shown = console_noise.Filtered(console)
    for chunk in ["[default0]:/x.py:9: UserWarning: a\n[default0]:  super().__init__(lo", "ader)\n[default0]:  ind",
                  "ented, not under a warning\n[default0]:nbddp: ok", ""]:
        shown.write(chunk)
    assert console.getvalue() == "[default0]:  indented, not under a warning\n"
    shown.close()
    assert console.getvalue().endswith("[default0]:nbddp: ok") and shown.mid_line


def test_each_ranks_warning_keeps_its_source_line_when_the_ranks_interleave(level):
    level(logging.INFO)
    console = io.StringIO()
    shown = console_noise.Filtered(console)
    shown.write("[default0]:/d.py:759: UserWarning: pin\n[default1]:/d.py:759: UserWarning: pin\n"
                "[default1]:  super().__init__(loader)\n[default0]:  super().__init__(loader)\n")
    assert console.getvalue() == ""


def test_verbose_passes_everything_as_it_comes(level):
    level(logging.DEBUG)
    console = io.StringIO()
    shown = console_noise.Filtered(console)
    shown.write("[default0]:Map:  50%|#####\r")
    assert console.getvalue() == "[default0]:Map:  50%|#####\r"


def test_a_detail_line_is_for_the_logs_unless_verbose(level, capsys):
    level(logging.INFO)
    log.detail("patched: a, b")
    assert capsys.readouterr() == ("", "nbddp: details: patched: a, b\n")
    level(logging.DEBUG)
    log.detail("patched: a, b")
    assert capsys.readouterr() == ("nbddp: details: patched: a, b\n", "")
