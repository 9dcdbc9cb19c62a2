"""tools/extract_chat_templates.py: the committed nbddp/fallback/unsloth_chat_templates.json is what Unsloth
gives."""
import json
import subprocess

import pytest

from tools.extract_chat_templates import OUT, download_wheel, dump_json, extract, main, pinned_version


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The pinned unsloth wheel, from the package index (as CI installs everything else)."""
    try:
        return download_wheel(pinned_version(), tmp_path_factory.mktemp("wheel"))
    except subprocess.CalledProcessError:
        pytest.skip(f"pip could not download unsloth=={pinned_version()}: no package index reachable")


def test_the_committed_json_is_what_the_pinned_wheel_gives(wheel):
    assert dump_json(extract(wheel)) == OUT.read_text(encoding="utf-8")


def test_check_fails_on_a_json_that_differs(wheel, tmp_path, capsys):
    stale = tmp_path / "templates.json"
    stale.write_text(dump_json({**json.loads(OUT.read_text(encoding="utf-8")), "unsloth_version": "0"}), encoding="utf-8")
    assert main(["--wheel", str(wheel), "--out", str(stale), "--check"]) == 1
    assert "differs from what extract_chat_templates.py writes now" in capsys.readouterr().err
    assert main(["--wheel", str(wheel), "--out", str(stale)]) == 0
    assert main(["--wheel", str(wheel), "--out", str(stale), "--check"]) == 0


def test_the_table_is_the_one_of_the_unsloth_extra():
    table = json.loads(OUT.read_text(encoding="utf-8"))
    assert table["unsloth_version"] == pinned_version()
    assert {"llama-3.1", "chatml", "qwen-2.5", "gemma-3", "gemma-4", "phi-4"} <= set(table["chat_templates"])
    assert all(entry["template"] in table["templates"] for entry in table["chat_templates"].values())
