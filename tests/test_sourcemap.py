import hashlib
import json

from nbddp.export.cells import GeneratedCell
from nbddp.export.notebooks import Stage
from nbddp.export.rewrites.base import CellLocation
from nbddp.export.script import render_script
from nbddp.export.sourcemap import align_origins, recorded_sha256, sourcemap_text
from nbddp.runtime import sourcemap as runtime_sourcemap

HERE = CellLocation("notebooks/02_train.ipynb", 4)


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
    loaded = runtime_sourcemap.load(str(tmp_path / "train.sourcemap.json"))  # the runtime's reader takes it as it is
    assert runtime_sourcemap.lookup(loaded, loaded["cells"][1]["first_line"]).origin.cell == 4
