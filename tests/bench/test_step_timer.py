import sys
import textwrap

from bench.step_timer import _PatchAfterImport


def test_hook_patches_the_module_once_it_is_imported(tmp_path, monkeypatch):
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "trainer.py").write_text(textwrap.dedent("""
        class Trainer:
            def train(self):
                return "original"
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def patch(module):
        seen.append(module.__name__)
        module.Trainer.train = lambda self: "patched"

    hook = _PatchAfterImport("fakepkg.trainer", patch)
    monkeypatch.setattr(sys, "meta_path", [hook, *sys.meta_path])
    try:
        import fakepkg  # noqa: F401  the parent alone does not trigger the patch
        assert seen == []
        from fakepkg.trainer import Trainer

        assert Trainer().train() == "patched"
        assert seen == ["fakepkg.trainer"]
        assert hook not in sys.meta_path  # removed after its one use
    finally:
        for name in ("fakepkg", "fakepkg.trainer"):
            sys.modules.pop(name, None)


def test_other_modules_are_left_to_the_normal_finders():
    hook = _PatchAfterImport("fakepkg.trainer", lambda module: None)
    assert hook.find_spec("json", None) is None


def test_collections_are_timed_in_the_step_they_ran_in():
    import gc

    from bench.step_timer import Report

    report = Report("/unused", 0.0, {})
    report.cuda = False
    gc.disable()  # no automatic collection: only the explicit one below
    report.mark(None)  # train begins
    report.mark(None)  # step 1 ends: no collection in it
    gc.collect()
    report.mark(None)  # step 2 ends: one full collection in it
    gc.callbacks.remove(report.time_collection)
    gc.enable()
    assert report.gc_ms[:-1] == [0.0, report.gc_ms[1]] and report.gc_ms[1] > 0.0
