"""`pipeline.py export` refuses a notebook that calls input(): one paragraph at its cell and line, exit 2."""
import importlib.util
from pathlib import Path

from fixtures.export.stages import code, markdown, two_stage_pipeline, write_stage

_spec = importlib.util.spec_from_file_location("pipeline", Path(__file__).parents[1] / "pipeline.py")
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


def test_input_in_a_cell_exits_2_naming_notebook_cell_and_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    notebooks = two_stage_pipeline(tmp_path)
    write_stage(notebooks, "02_train.ipynb", [markdown("# Train"), code("import os\nrepo = input('Hub repo: ')")])
    assert pipeline.main(["export"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: notebooks/02_train.ipynb, cell 2, line 2: input() waits for an answer typed at the "
                          "terminal; under torchrun no process reads one, so every rank would wait forever\n  hint: ")
    assert "--answer VALUE" in err
    assert not (tmp_path / "generated").exists()
