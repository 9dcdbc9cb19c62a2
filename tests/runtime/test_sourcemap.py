import json

import pytest

from nbddp.runtime import sourcemap
from nbddp.runtime.sourcemap import Origin, ScriptLine, SourceMapError

MAP = {
    "script": "train.py",
    "cells": [
        {"title": "nbddp setup", "first_line": 10, "origin": [None, None, None]},
        {"title": "03_train.ipynb cell 4", "first_line": 15, "origin": [["notebooks/03_train.ipynb", 4, 1], None, ["notebooks/03_train.ipynb", 4, 3]]},
    ],
}


def test_path_sits_beside_the_script():
    assert sourcemap.sourcemap_path("generated/train.py") == "generated/train.sourcemap.json"


def test_lookup_maps_each_line_of_a_cell():
    assert sourcemap.lookup(MAP, 15) == ScriptLine("03_train.ipynb cell 4", Origin("notebooks/03_train.ipynb", 4, 1))
    assert sourcemap.lookup(MAP, 17).origin == Origin("notebooks/03_train.ipynb", 4, 3)


def test_lines_nbddp_wrote_have_no_origin():
    assert sourcemap.lookup(MAP, 16) == ScriptLine("03_train.ipynb cell 4", None)
    assert sourcemap.lookup(MAP, 12) == ScriptLine("nbddp setup", None)


def test_lines_outside_every_cell():
    for line in (1, 9, 13, 14, 18):
        assert sourcemap.lookup(MAP, line) is None


def test_origin_reads_like_a_notebook_error():
    assert str(Origin("notebooks/03_train.ipynb", 4, 2)) == "notebooks/03_train.ipynb, cell 4, line 2"


def test_load(tmp_path):
    path = tmp_path / "train.sourcemap.json"
    assert sourcemap.load(str(path)) is None
    path.write_text(json.dumps(MAP))
    assert sourcemap.load(str(path)) == MAP


def test_bad_json_is_a_source_map_error(tmp_path):
    path = tmp_path / "train.sourcemap.json"
    path.write_text('{"cells": [')
    with pytest.raises(SourceMapError, match="not JSON"):
        sourcemap.load(str(path))


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
    path = tmp_path / "train.sourcemap.json"
    path.write_text(json.dumps(mapping))
    with pytest.raises(SourceMapError, match=reason):
        sourcemap.load(str(path))
