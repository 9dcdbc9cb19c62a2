"""The patch registry (nbddp/patches.py): each change made once, all undone, the table complete."""
import builtins
import os
import re
import sys
from pathlib import Path

import pytest

from nbddp import patches

NBDDP = Path(patches.__file__).parent


@pytest.fixture(autouse=True)
def undone_around():
    patches.undo()  # what earlier tests of this process applied
    yield
    patches.undo()


class Library:
    def method(self, x):
        return x

    @classmethod
    def load(cls, name):
        return f"{cls.__name__}:{name}"


class Child(Library):
    pass


def doubling(original):
    def method(self, x):
        return 2 * original(self, x)

    return method


def test_wrap_changes_once_and_undo_puts_back_the_original():
    original = Library.method
    for _ in range(3):
        patches.wrap("clone-model-loss", Library, "method", doubling)
    assert Library().method(3) == 6
    assert patches.is_patched(Library.method, "clone-model-loss") and patches.active() == ("clone-model-loss",)
    patches.undo()
    assert Library.method is original and patches.active() == ()


def test_two_patches_of_one_function_stack_and_each_is_recognised():
    patches.wrap("gradient-checkpointing-choice", Library, "method", doubling)
    patches.wrap("unused-tower-adapters", Library, "method", doubling)
    patches.wrap("gradient-checkpointing-choice", Library, "method", doubling)  # under the other: still known
    assert Library().method(1) == 4


def test_an_inherited_function_already_wrapped_is_not_wrapped_again():
    patches.wrap("clone-model-loss", Library, "method", doubling)
    patches.wrap("clone-model-loss", Child, "method", doubling)
    assert Child().method(1) == 2 and "method" not in vars(Child)


def test_a_classmethod_stays_a_classmethod_and_undo_removes_what_the_owner_did_not_have():
    def suffixed(original):
        def load(cls, name):
            return original(cls, name) + "!"

        return load

    patches.wrap("smoke-sandbox", Child, "load", suffixed)
    assert Child.load("x") == "Child:x!" and Library.load("x") == "Library:x"
    patches.undo()
    assert "load" not in vars(Child) and Child.load("x") == "Child:x"


def test_items_and_lists_are_put_back(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    callbacks = ["a"]
    patches.set_item("accelerate-use-cpu", os.environ, "ACCELERATE_USE_CPU", "true", default_only=True)
    patches.append("checkpoint-markers", callbacks, "b")
    patches.append("checkpoint-markers", callbacks, "b")
    patches.set_attribute("notebook-display", builtins, "nbddp_test_display", print)
    assert os.environ["ACCELERATE_USE_CPU"] == "true" and callbacks == ["a", "b"]
    patches.undo()
    assert "ACCELERATE_USE_CPU" not in os.environ and callbacks == ["a"]
    assert not hasattr(builtins, "nbddp_test_display")


def test_a_value_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "false")
    patches.set_item("accelerate-use-cpu", os.environ, "ACCELERATE_USE_CPU", "true", default_only=True)
    assert os.environ["ACCELERATE_USE_CPU"] == "false" and patches.active() == ()


def test_a_patch_missing_from_the_table_is_refused():
    with pytest.raises(KeyError, match="add it to the table"):
        patches.wrap("my-new-patch", Library, "method", doubling)


def test_every_patch_in_the_table_is_applied_by_the_runtime_and_every_one_applied_is_in_it():
    # The runtime's patches, and the fallback's (nbddp/fallback: what importing Unsloth does to TRL).
    paths = [*(NBDDP / "runtime").rglob("*.py"), *(NBDDP / "fallback").rglob("*.py")]
    source = "\n".join(path.read_text() for path in paths if path.name != "patches.py")
    # A name is applied through a helper call, or through a module constant that holds it (PATCH = "...").
    used = set(re.findall(r'patches\.(?:wrap|set_attribute|set_item|append|record)\(\s*"([\w-]+)"', source))
    used |= set(re.findall(r'^PATCH = "([\w-]+)"', source, re.M))
    assert used == set(patches.PATCHES)


def test_activating_the_fallback_and_undoing_leaves_the_libraries_as_they_were():
    import trl
    from transformers import Trainer
    from transformers import trainer as transformers_trainer

    from nbddp.runtime import backend as backends

    before = {name: vars(Trainer)[name] for name in ("__init__", "train", "evaluation_loop")}
    sft = (trl.SFTTrainer.__init__, trl.SFTConfig.__init__)
    callbacks = list(transformers_trainer.DEFAULT_CALLBACKS)
    had_unsloth = sys.modules.get("unsloth")
    backends.activate("hf")
    assert patches.is_patched(Trainer.train, "batch-layout-at-train")
    patches.undo()
    assert {name: vars(Trainer)[name] for name in before} == before
    assert (trl.SFTTrainer.__init__, trl.SFTConfig.__init__) == sft
    assert transformers_trainer.DEFAULT_CALLBACKS == callbacks and sys.modules.get("unsloth") is had_unsloth


def test_rank_0_names_the_active_patches_and_warns_outside_the_tested_versions(monkeypatch, capsys):
    patches.wrap("clone-model-loss", Library, "method", doubling)
    patches.set_attribute("notebook-display", builtins, "nbddp_test_display", print)
    monkeypatch.setattr(patches, "_version", {"transformers": "5.99.0", "torch": "2.13.0+cpu"}.get)
    patches.announce()
    out, err = capsys.readouterr()
    assert out == ("nbddp: 2 patches of transformers for DDP (why: nbddp/patches.py; the names: -v, or the "
                   "run's logs)\n")
    assert err.startswith("nbddp: details: patched: clone-model-loss, notebook-display\n")  # for the logs
    assert "transformers 5.99.0 is installed, and nbddp's patches of it (clone-model-loss) were tested on " \
           "transformers 4.56 to 5.17" in err
    # advice that works for an installed tool, not a clone's requirements file
    assert err.endswith("if training fails inside transformers, install a tested version: pip install "
                        "'transformers>=4.56,<5.18'\n")
    assert "torch" not in err


def test_the_installed_stack_is_within_the_tested_versions():
    # Upgrading a pinned library means testing it on the patches, then widening TESTED: this says which.
    for library, (low, high) in patches.TESTED.items():
        installed = patches._version(library)
        assert installed is None or patches._within(installed, low, high), (library, installed)


def test_the_registry_pickles_without_the_originals_it_keeps():
    # Seen on a GPU: a smoke run's dataset.map pickled this module by value, with the original Trainer.compute_loss
    # its undo record keeps, and failed ("cannot pickle 'ConfigModuleInstance' object").
    import dill
    from transformers import Trainer

    from nbddp.runtime.trainer.trainer_patches import patch_compute_loss

    patch_compute_loss(Trainer)
    records = dill.dumps(patches._undo, recurse=True)
    assert dill.loads(records) == [] and b"compute_loss" not in records
    assert patches.active() == ("clone-model-loss",)
