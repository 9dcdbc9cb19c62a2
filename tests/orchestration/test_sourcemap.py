import json

import pytest

from nbddp.orchestration.sourcemap import Location, SourceMap, sourcemap_path


@pytest.fixture
def source_map(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("# stand-in: only the map beside it is read\n")
    sourcemap_path(script).write_text(json.dumps({"script": "train.py", "cells": [
        {"title": "header", "first_line": 6, "origin": [None, None]},
        {"title": "01_data.ipynb cell 3", "first_line": 12,
         "origin": [["notebooks/01_data.ipynb", 3, 1], None, ["notebooks/01_data.ipynb", 3, 4]]},
    ]}))
    return SourceMap.for_script(script)


def test_the_map_sits_beside_the_script():
    assert str(sourcemap_path("generated/train.py")) == "generated/train.sourcemap.json"


def test_a_mapped_line_points_into_its_source_notebook(source_map):
    assert source_map.locate(1, 3) == Location("notebooks/01_data.ipynb", 3, 4)


def test_a_line_nbddp_wrote_points_into_the_script(source_map):
    assert source_map.locate(1, 2) == Location(source_map.script, None, 13)


def test_without_a_line_the_cell_of_its_first_mapped_line(source_map):
    assert source_map.locate(1) == Location("notebooks/01_data.ipynb", 3, None)
    assert source_map.locate(0) == Location(source_map.script, None, 6)


def test_without_a_map_locations_stay_in_the_script_notebook(tmp_path):
    source_map = SourceMap.for_script(tmp_path / "other.py")
    assert source_map.locate(4, 2) == Location(str(tmp_path / "other.py"), 5, 2)
