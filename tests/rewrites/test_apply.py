from nbddp.export.rewrites import apply
from nbddp.export.rewrites.base import CellLocation, ExportContext

LOCATION = CellLocation("notebooks/01_data_prep.ipynb", 2)


def test_apply_converts_magics_before_anything_else():
    code, changes = apply("%%capture\n!pip install unsloth\nimport os\n", LOCATION, ExportContext())
    assert code == "# nbddp: dropped %%capture\n# nbddp: dropped !pip install unsloth\nimport os\n"
    assert [str(change) for change in changes] == [
        "notebooks/01_data_prep.ipynb, cell 2, line 1: [convert-magics] dropped `%%capture`; its body is kept",
        "notebooks/01_data_prep.ipynb, cell 2, line 2: [convert-magics] dropped `!pip install unsloth`"
        " (install packages before running the script)",
    ]
