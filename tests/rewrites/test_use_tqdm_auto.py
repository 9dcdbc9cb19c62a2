import pytest
from rewrite_case import assert_rewrites, assert_unchanged

from nbddp.export.rewrites.use_tqdm_auto import UseTqdmAuto


@pytest.mark.parametrize(
    "before, after",
    [
        ("from tqdm.notebook import tqdm", "from tqdm.auto import tqdm"),
        ("from tqdm.notebook import tqdm as progress, trange", "from tqdm.auto import tqdm as progress, trange"),
        ("import tqdm.notebook", "import tqdm.auto"),
        ("import tqdm.notebook as tq", "import tqdm.auto as tq"),
    ],
)
def test_notebook_progress_bars_become_auto_ones(before, after):
    changes = assert_rewrites(UseTqdmAuto, f"{before}\n", f"{after}\n")
    assert changes == [(1, "replaced tqdm.notebook with tqdm.auto (Jupyter widgets show as text in a script)")]


def test_uses_through_the_module_are_replaced_where_they_are():
    changes = assert_rewrites(
        UseTqdmAuto,
        """\
        import tqdm.notebook
        for row in tqdm.notebook.tqdm(rows, desc="rows"):
            total += row
        """,
        """\
        import tqdm.auto
        for row in tqdm.auto.tqdm(rows, desc="rows"):
            total += row
        """,
    )
    assert [line for line, _ in changes] == [1, 2]


def test_other_progress_bars_and_names_tqdm_auto_lacks_are_left_alone():
    assert_unchanged(
        UseTqdmAuto,
        """\
        from tqdm import tqdm
        from tqdm.auto import trange
        from tqdm.notebook import tnrange
        from tqdm.notebook import *
        import tqdm
        bar = tqdm.tqdm(rows)
        notebook = my.tqdm.notebook
        """,
    )
