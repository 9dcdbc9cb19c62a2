"""An option a command does not take: one paragraph (exit 2) saying what it probably meant, the command corrected;
and the notebook parameters that `run`, `smoke` and `launch --help` list."""
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from nbddp import cli as pipeline
from nbddp.formats.parameters import SCRIPT_CELL_MARKER

REPO = Path(__file__).resolve().parents[2]
CELL = """# 01_data.ipynb
data_path = "../data/rows.jsonl"  # the rows
max_steps = 300
learning_rate = 2e-3
# nbddp
resume = False
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder with a generated/train.py whose parameters cell holds CELL; nothing can run in it."""
    (tmp_path / "generated").mkdir()
    (tmp_path / "generated" / "train.py").write_text(f"# %% [markdown]\n# header\n\n{SCRIPT_CELL_MARKER}\n{CELL}\n"
                                                     "# %% nbddp setup\nraise SystemExit('ran')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(capsys, argv):
    """The one-paragraph error of `pipeline.py ARGV`, which must exit 2 and write nothing."""
    before = sorted(Path.cwd().rglob("*"))
    assert pipeline.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert sorted(Path.cwd().rglob("*")) == before
    return err.removeprefix("error: ").strip()


@pytest.mark.parametrize("argv, corrected", [
    (["run", "--max_steps", "10"], "python pipeline.py run -p max_steps 10"),
    (["smoke", "--max_steps=10", "--device", "cpu"], "python pipeline.py smoke -p max_steps 10 --device cpu"),
    (["run", "--max-steps", "-1"], "python pipeline.py run -p max_steps -1"),
    (["run", "--resume"], "python pipeline.py run -p resume true"),
    (["launch", "--max_steps", "10", "--dry-run"], "python pipeline.py launch --dry-run -- --max_steps 10"),
    (["launch", "--learning_rate", "3", "--", "--max_steps", "1"],
     "python pipeline.py launch -- --learning_rate 3 --max_steps 1"),
    (["launch", "-p", "max_steps", "10"], "python pipeline.py launch -- --max_steps 10"),
])
def test_the_scripts_spelling_of_a_parameter_is_refused_with_the_commands_own(project, capsys, monkeypatch, argv,
                                                                               corrected):
    monkeypatch.setattr(sys, "argv", ["pipeline.py"])  # the prog a user of the clone types
    message = refused(capsys, argv)
    assert message.endswith(f". Corrected: {corrected}"), message
    assert message.count("script") == 1  # one note: the script's spelling, or its flag


@pytest.mark.parametrize("argv, meaning, corrected", [
    (["run", "--notebooks", "notebooks"], "`--notebooks notebooks` is export's: run finds the notebooks through the "
                                          "script's source map, so export them first",
     "nbddp export --notebooks notebooks && nbddp run"),
    (["run", "--nproc_per_node", "2"], "`--nproc_per_node 2`: run spells it --nproc-per-node",
     "nbddp run --nproc-per-node 2"),
    (["smoke", "--devise", "cpu"], "`--devise` is not an option of smoke; the nearest is --device", "nbddp smoke --device cpu"),
    (["run", "--lerning_rate", "1e-3"], "`--lerning_rate` is not an option of run; the nearest is -p learning_rate",
     "nbddp run -p learning_rate 1e-3"),
    (["export", "--nootebooks", "nb"], "`--nootebooks` is not an option of export; the nearest is --notebooks",
     "nbddp export --notebooks nb"),
    (["launch", "--check"], "`--check` is not an option of launch but of export", "nbddp launch"),
    (["run", "--frobnicate", "x"], "`--frobnicate` is not an option of run (every option: nbddp run --help)",
     "nbddp run"),
    (["run", "stray"], "`stray`: run takes no such word", "nbddp run"),
])
def test_every_unknown_option_gets_what_it_probably_meant(project, capsys, monkeypatch, argv, meaning, corrected):
    monkeypatch.setattr(sys, "argv", ["nbddp"])
    message = refused(capsys, argv)
    assert message.startswith(meaning) and message.endswith(f". Corrected: {corrected}"), message


def test_a_bad_value_is_one_paragraph_naming_the_commands_help(project, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["nbddp"])
    assert refused(capsys, ["run", "--nnodes", "x"]) == ("argument --nnodes/--nodes: invalid int value: 'x' "
                                                         "(see `nbddp run --help`)")


def test_help_lists_the_notebook_parameters_with_type_and_default(project, capsys):
    for verb, spelling in (("run", "-p NAME VALUE"), ("smoke", "-p NAME VALUE"), ("launch", "after --: -- --NAME")):
        with pytest.raises(SystemExit):
            pipeline.main([verb, "--help"])
        lines = capsys.readouterr().out.splitlines()
        heading = next(index for index, line in enumerate(lines) if line.startswith("notebook parameters of"))
        assert spelling in " ".join(lines[heading:heading + 2])
        rows = [line.split(None, 2) for line in lines if line.startswith("  ") and line.split()[0] in
                {"data_path", "max_steps", "learning_rate", "resume"}]
        assert rows == [["data_path", "str", "'../data/rows.jsonl'"], ["max_steps", "int", "300"],
                        ["learning_rate", "float", "0.002"], ["resume", "bool", "False"]]
        assert lines[-1] == "each with its notebook and comment: python generated/train.py --help"


def test_help_without_a_script_says_how_to_see_the_parameters(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        pipeline.main(["run", "--help"])
    assert ("`python generated/train.py --help` lists them, with their notebooks' comments, once `export` has "
            "written generated/train.py") in " ".join(capsys.readouterr().out.split())


def test_the_repositorys_run_refuses_the_scripts_spelling_within_3_s():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "pipeline.py", "run", "--max_steps", "10"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds, not wall time, which the suite's parallel workers on a small machine stretch (alone: 0.8-1.6 s)
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 3
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("error: `--max_steps 10` is the script's spelling of the notebook parameter max_steps; "
                             "run takes it as -p max_steps 10. Corrected: python pipeline.py run -p max_steps 10\n")
