"""`unsloth.dataprep` under the fallback (nbddp/fallback/dataprep.py)."""
import sys

import pytest

from nbddp.errors import UsageError
from nbddp.runtime import backend as backends


def test_importing_synthetic_data_kit_says_what_to_do(monkeypatch, backend_patches_undone_after):
    for name in ("unsloth", "unsloth.dataprep"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    backends.activate("hf")
    with pytest.raises(UsageError, match=r"unsloth\.dataprep\.SyntheticDataKit serves the model with vLLM .* "
                                         r"\(--backend unsloth\), or prepare the data beforehand"):
        from unsloth.dataprep import SyntheticDataKit  # noqa: F401
    with pytest.raises(UsageError, match=r"unsloth\.dataprep\.RawTextDataLoader is Unsloth's data preparation"):
        from unsloth.dataprep import RawTextDataLoader  # noqa: F401
