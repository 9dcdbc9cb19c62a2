import hashlib
import json

import pytest

from nbddp.export.cells import GeneratedCell
from nbddp.export.notebooks import Stage
from nbddp.export.rewrites.base import CellLocation
from nbddp.export.script import render_script
from nbddp.formats.sourcemap import (
    Location,
    ScriptLine,
    SourceMap,
    SourceMapError,
    align_origins,
    recorded_sha256,
    sourcemap_path,
    sourcemap_text,
)

HERE = CellLocation("notebooks/02_train.ipynb", 4)

MAP = {
    "script": "train.py",
    "cells": [
        {"title": "nbddp setup", "first_line": 10, "origin": [None, None, None]},
        {"title": "03_train.ipynb cell 4", "first_line": 15, "origin": [["notebooks/03_train.ipynb", 4, 1], None, ["notebooks/03_train.ipynb", 4, 3]]},
    ],
}


def map_beside(tmp_path, mapping) -> SourceMap:
    """The map `mapping` (a JSON value) beside `train.py` in `tmp_path`, read back."""
    script = tmp_path / "train.py"
    script.write_text("# stand-in: only the map beside it is read\n")
    sourcemap_path(script).write_text(json.dumps(mapping))
    return SourceMap.for_script(script)


# The writer: each script line's origin, and the file's text.

def test_unchanged_lines_map_to_themselves():
    source = "a = 1\n\nb = a + 1"
    assert align_origins(source, source, HERE) == [[HERE.notebook, 4, 1], [HERE.notebook, 4, 2], [HERE.notebook, 4, 3]]


def test_shifted_lines_follow_their_original_line():
    original = "import os\nmodel = load(name)\nprint(model)"
    rewritten = "if ddp.is_main_process:\n    import os\n    model = load(name, device_map=ddp.device_map())\n    # nbddp: note\n    print(model)\nddp.barrier()"
    lines = [origin[2] if origin else None for origin in align_origins(original, rewritten, HERE)]
    # added at the top: no line above; changed: the line it replaces; added below: the nearest line above
    assert lines == [None, 1, 2, 2, 3, 3]


def test_a_block_that_grew_maps_its_extra_lines_to_its_last_original_line():
    lines = [origin[2] for origin in align_origins("x = f()\ny = 2", "x = g(\n    1,\n)\ny = 2", HERE)]
    assert lines == [1, 1, 1, 2]


def test_a_moved_line_maps_to_where_it_was():
    # hoist-unsloth-import moves the unsloth import above the first transformers import, even to the top
    original = "from transformers import TrainingArguments\nfrom unsloth import FastVisionModel\nx = 1"
    rewritten = "from unsloth import FastVisionModel\nfrom transformers import TrainingArguments\nx = 1"
    assert [origin[2] for origin in align_origins(original, rewritten, HERE)] == [2, 1, 3]
    original = "import torch\nfrom transformers import X\nfrom unsloth import Y\nprint(1)"
    rewritten = "import torch\nfrom unsloth import Y\nfrom transformers import X\nif ddp.is_main_process:\n    print(1)"
    assert [origin[2] for origin in align_origins(original, rewritten, HERE)][:3] == [1, 3, 2]


def test_first_line_of_each_cell_points_at_its_first_source_line():
    cells = [
        GeneratedCell("markdown", "header", [None]),
        GeneratedCell("code", "a = 1", [[HERE.notebook, 4, 1]], "02_train.ipynb cell 4"),
        GeneratedCell("code", "def f():\n    return 1", [[HERE.notebook, 5, 1], [HERE.notebook, 5, 2]], "02_train.ipynb cell 5"),
        GeneratedCell("markdown", "Some *text*", [[HERE.notebook, 6, 1]], "02_train.ipynb cell 6"),
        GeneratedCell("code", "f()", [None], "nbddp teardown"),
    ]
    script = render_script(cells)
    sourcemap = json.loads(sourcemap_text("train.py", script, cells, [Stage(HERE.notebook, (), "b" * 64)]))
    script_lines = script.splitlines()

    assert sourcemap["script"] == "train.py"
    assert [entry["title"] for entry in sourcemap["cells"]] == ["nbddp header", *(cell.title for cell in cells[1:])]
    for entry, cell in zip(sourcemap["cells"], cells):
        first = entry["first_line"]
        written = script_lines[first - 1 : first - 1 + len(cell.source.splitlines())]
        expected = cell.source.splitlines() if cell.cell_type == "code" else [f"# {line}" for line in cell.source.splitlines()]
        assert written == expected
        assert entry["origin"] == cell.origin


def test_the_map_records_the_scripts_and_each_notebooks_sha256_where_every_room_reads_it(tmp_path):
    cells = [GeneratedCell("markdown", "header", [None]), GeneratedCell("code", "a = 1", [[HERE.notebook, 4, 1]], "x")]
    script = render_script(cells)
    stages = [Stage("notebooks/01_data.ipynb", (), "a" * 64), Stage(HERE.notebook, (), "b" * 64)]
    text = sourcemap_text("train.py", script, cells, stages)
    assert text.splitlines()[:6] == [
        '{"script": "train.py",',
        f' "script_sha256": "{hashlib.sha256(script.encode()).hexdigest()}",',
        ' "notebooks": {',
        f'   "notebooks/01_data.ipynb": "{"a" * 64}",',
        f'   "notebooks/02_train.ipynb": "{"b" * 64}"',
        " },",
    ]
    assert recorded_sha256(text) == hashlib.sha256(script.encode()).hexdigest()
    (tmp_path / "train.sourcemap.json").write_text(text)
    loaded = SourceMap.for_script(tmp_path / "train.py")  # the one reader takes it as it is
    assert loaded.lookup(loaded.cells[1]["first_line"]).origin.cell == 4
    assert loaded.locate(1, 1) == Location(HERE.notebook, 4, 1)


# The reader: a script line (the runtime's tracebacks), a cell and its line (the orchestration's failure reports).

def test_path_sits_beside_the_script():
    assert str(sourcemap_path("generated/train.py")) == "generated/train.sourcemap.json"


def test_lookup_maps_each_line_of_a_cell(tmp_path):
    source_map = map_beside(tmp_path, MAP)
    assert source_map.lookup(15) == ScriptLine("03_train.ipynb cell 4", Location("notebooks/03_train.ipynb", 4, 1))
    assert source_map.lookup(17).origin == Location("notebooks/03_train.ipynb", 4, 3)


def test_lines_nbddp_wrote_have_no_origin(tmp_path):
    source_map = map_beside(tmp_path, MAP)
    assert source_map.lookup(16) == ScriptLine("03_train.ipynb cell 4", None)
    assert source_map.lookup(12) == ScriptLine("nbddp setup", None)


def test_lines_outside_every_cell(tmp_path):
    source_map = map_beside(tmp_path, MAP)
    for line in (1, 9, 13, 14, 18):
        assert source_map.lookup(line) is None


def test_a_location_reads_like_a_notebook_error():
    assert str(Location("notebooks/03_train.ipynb", 4, 2)) == "notebooks/03_train.ipynb, cell 4, line 2"
    assert str(Location("notebooks/03_train.ipynb", 4, None)) == "notebooks/03_train.ipynb, cell 4"
    assert str(Location("generated/train.py", None, 13)) == "generated/train.py, line 13"


def test_load(tmp_path):
    missing = SourceMap.for_script(tmp_path / "train.py")
    assert missing.cells == [] and missing.lookup(15) is None
    assert map_beside(tmp_path, MAP) == SourceMap(str(tmp_path / "train.py"), MAP["cells"])


def test_bad_json_is_a_source_map_error(tmp_path):
    (tmp_path / "train.sourcemap.json").write_text('{"cells": [')
    with pytest.raises(SourceMapError, match="not JSON"):
        SourceMap.for_script(tmp_path / "train.py")


@pytest.mark.parametrize(
    "mapping, reason",
    [
        ([], 'no "cells" list'),
        ({"script": "train.py"}, 'no "cells" list'),
        ({"cells": {"title": "x"}}, 'no "cells" list'),
        ({"cells": [MAP["cells"][0], "cell"]}, "cell 1 is not"),
        ({"cells": [{"title": "x", "first_line": "10", "origin": []}]}, "cell 0 is not"),
        ({"cells": [{"title": "x", "first_line": 10}]}, "cell 0 is not"),
        ({"cells": [{"title": "x", "first_line": 10, "origin": [["nb.ipynb", 3]]}]}, "cell 0 is not"),
        ({"cells": [{"title": "x", "first_line": 10, "origin": [[3, 1, 1]]}]}, "cell 0 is not"),
    ],
)
def test_a_map_of_the_wrong_shape_is_a_source_map_error(tmp_path, mapping, reason):
    with pytest.raises(SourceMapError, match=reason):
        map_beside(tmp_path, mapping)


@pytest.fixture
def source_map(tmp_path):
    return map_beside(tmp_path, {"script": "train.py", "cells": [
        {"title": "header", "first_line": 6, "origin": [None, None]},
        {"title": "01_data.ipynb cell 3", "first_line": 12,
         "origin": [["notebooks/01_data.ipynb", 3, 1], None, ["notebooks/01_data.ipynb", 3, 4]]},
    ]})


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


def test_the_notebooks_folder_is_the_one_the_map_names_from_above_the_scripts_folder(tmp_path):
    (tmp_path / "generated").mkdir()
    source_map = map_beside(tmp_path / "generated", MAP)
    assert source_map.notebook_dir() == str(tmp_path / "notebooks")
    assert SourceMap.for_script(tmp_path / "other.py").notebook_dir() is None
