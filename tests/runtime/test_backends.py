import sys
import types

import pytest
import torch

from nbddp import patches
from nbddp.errors import UsageError
from nbddp.runtime import backend as backends
from nbddp.fallback import models as hf_backend


@pytest.fixture
def machine(monkeypatch):
    """Pretend to be a machine with or without CUDA and the unsloth package."""
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)

    def make(cuda, unsloth):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(backends.importlib.util, "find_spec", lambda name: object() if unsloth and name == "unsloth" else None)

    return make


@pytest.mark.parametrize(
    "cuda, unsloth, expected",
    [
        (True, True, ("unsloth", "Unsloth: CUDA and unsloth found")),
        (False, True, ("hf", "Transformers+PEFT fallback: no CUDA")),
        (False, False, ("hf", "Transformers+PEFT fallback: no CUDA")),
        (True, False, ("hf", "Transformers+PEFT fallback: unsloth not installed")),
    ],
)
def test_auto(machine, cuda, unsloth, expected):
    machine(cuda=cuda, unsloth=unsloth)
    assert backends.choose("auto") == expected


def test_hf_on_request_even_with_unsloth(machine):
    machine(cuda=True, unsloth=True)
    assert backends.choose("hf")[0] == "hf"


@pytest.mark.parametrize("cuda, unsloth, missing", [(False, True, "a CUDA GPU"), (True, False, "the unsloth package")])
def test_unsloth_where_it_cannot_run_says_what_is_missing(machine, cuda, unsloth, missing):
    machine(cuda=cuda, unsloth=unsloth)
    with pytest.raises(UsageError, match=f"--backend unsloth needs {missing}; use --backend hf"):
        backends.choose("unsloth")


def test_unknown_backend(machine):
    machine(cuda=False, unsloth=False)
    with pytest.raises(UsageError, match="one of auto, unsloth, hf"):
        backends.choose("vllm")


def test_hf_installs_the_fallback_as_unsloth(monkeypatch, backend_patches_undone_after):
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    monkeypatch.delitem(sys.modules, "unsloth.chat_templates", raising=False)
    backends.activate("hf")
    from unsloth import FastLanguageModel, is_bfloat16_supported
    from unsloth.chat_templates import train_on_responses_only

    assert FastLanguageModel is hf_backend.FastLanguageModel
    assert is_bfloat16_supported is hf_backend.is_bfloat16_supported
    assert train_on_responses_only is hf_backend.chat_templates.train_on_responses_only


def test_hf_gives_unsloth_zoos_utils_without_its_init(monkeypatch, tmp_path, backend_patches_undone_after):
    package = tmp_path / "unsloth_zoo"
    package.mkdir()
    (package / "__init__.py").write_text('raise ImportError("Please install Unsloth via `pip install unsloth`!")\n')
    (package / "utils.py").write_text("from packaging.version import Version\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("unsloth_zoo", "unsloth_zoo.utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    backends.activate("hf")
    from unsloth_zoo.utils import Version  # as Unsloth's vision GRPO notebooks check TRL's version

    assert Version("0.22.2") < Version("0.24.0")
    assert sys.modules["unsloth_zoo.utils"].__file__ == str(package / "utils.py")
    assert not hasattr(sys.modules["unsloth_zoo"], "__file__")  # the bare package: its __init__ never ran


def test_hf_gives_unsloth_zoos_modules_that_import_their_siblings(monkeypatch, tmp_path, backend_patches_undone_after):
    # Muse_Glimmer_(30B)-GRPO: `from unsloth_zoo.rl_replacements import _maybe_compile, torch_compile_options`,
    # whose file imports its siblings; through the package, whose __init__ refused: "Please install Unsloth".
    package = tmp_path / "unsloth_zoo"
    package.mkdir()
    (package / "__init__.py").write_text('raise ImportError("Please install Unsloth via `pip install unsloth`!")\n')
    (package / "common.py").write_text("def _maybe_compile(**options):\n    return lambda function: function\n")
    (package / "rl_replacements.py").write_text("from .common import _maybe_compile\nRL_REPLACEMENTS = {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("unsloth_zoo", "unsloth_zoo.utils", "unsloth_zoo.common", "unsloth_zoo.rl_replacements"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    backends.activate("hf")
    import unsloth_zoo.rl_replacements as rl

    assert rl.__file__ == str(package / "rl_replacements.py") and rl.RL_REPLACEMENTS == {}
    assert rl._maybe_compile(dynamic=True)(len) is len
    for name in ("unsloth_zoo.common", "unsloth_zoo.rl_replacements"):
        del sys.modules[name]  # not the patch's to undo


def test_installed_fallback_does_not_count_as_unsloth(machine, monkeypatch):
    machine(cuda=True, unsloth=True)  # find_spec would answer yes
    monkeypatch.setitem(sys.modules, "unsloth", hf_backend)  # a second setup in the same kernel
    assert backends.choose("auto")[0] == "hf"


def test_unsloth_is_imported_and_the_trainer_patched(monkeypatch, backend_patches_undone_after):
    import trl
    from transformers import Trainer

    monkeypatch.setattr(Trainer, "compute_loss", Trainer.compute_loss)  # restored after the test
    real_unsloth = types.ModuleType("unsloth")
    monkeypatch.setitem(sys.modules, "unsloth", real_unsloth)
    backends.activate("unsloth")
    assert sys.modules["unsloth"] is real_unsloth
    assert patches.is_patched(Trainer.compute_loss, "clone-model-loss")
    if "ORPOConfig" not in dir(trl):  # TRL 1.x, where Unsloth leaves it out of trl too (Llama3_(8B)-ORPO, on a GPU)
        with pytest.raises(ImportError, match=r"TRL 1\.x moved ORPOConfig to trl\.experimental\.orpo"):
            from trl import ORPOConfig  # noqa: F401
