import json
import textwrap

import pytest

from nbddp.errors import UsageError
from nbddp.orchestration import parameters, script_notebook
from nbddp.orchestration.regress.suite import load_suite

from .conftest import REPO, needs_generated_script

SUITE = textwrap.dedent("""\
    script: train_fixture.py
    timeout: 60
    tolerances:
      final_train_loss: {relative: 0.05}
      loss_at_step: {absolute: 0.01}
    cases:
      - name: one
        mode: papermill
        params: {max_steps: 4}
        loss_at_steps: [1, 2]
        tolerances:
          final_train_loss: {absolute: 0.5}
      - name: two
        mode: torchrun
        nproc: 2
      - name: parity
        parity: {nproc: 2, max_abs_diff: 1.0e-3}
        params: {max_steps: 3}
""")


def write_suite(tmp_path, text):
    path = tmp_path / "suite.yaml"
    path.write_text(text)
    return path


def test_cases_with_their_tolerances(tmp_path):
    suite = load_suite(write_suite(tmp_path, SUITE))
    one, two, parity = suite.cases
    assert (one.mode, one.nproc, one.params, one.loss_at_steps) == ("papermill", 1, {"max_steps": 4}, (1, 2))
    assert one.tolerances == {"final_train_loss": {"absolute": 0.5}, "loss_at_step": {"absolute": 0.01}}
    assert (two.mode, two.nproc, two.tolerances["final_train_loss"]) == ("torchrun", 2, {"relative": 0.05})
    assert (parity.mode, parity.nproc, parity.max_abs_diff) == ("parity", 2, 1e-3)
    assert suite.baseline_path == tmp_path / "suite_baseline.json"
    assert str(suite.script) == "train_fixture.py" and suite.timeout == 60


def test_only_picks_one_case_by_name(tmp_path):
    suite = load_suite(write_suite(tmp_path, SUITE))
    assert [case.name for case in suite.select("two")] == ["two"]
    with pytest.raises(UsageError, match="--only three: no such case .*cases: one, two, parity"):
        suite.select("three")


@pytest.mark.parametrize("text, message", [
    ("cases: []\n", "non-empty `cases`"),
    ("cases:\n  - mode: papermill\n", "every case needs a `name`"),
    ("cases:\n  - {name: a, mode: docker}\n", "case a: `mode` must be one of papermill, torchrun"),
    ("cases:\n  - {name: a, mode: torchrun}\n", "case a: `nproc` must be a positive number"),
    ("cases:\n  - {name: a, parity: {nproc: 2}}\n", "case a: `parity` needs `max_abs_diff`"),
    ("cases:\n  - {name: a, mode: papermill}\n  - {name: a, mode: papermill}\n", "repeated: a"),
    ("tolerances: {final_loss: {relative: 1}}\ncases:\n  - {name: a, mode: papermill}\n", "unknown metric 'final_loss'"),
    ("tolerances: {eval_loss: {percent: 1}}\ncases:\n  - {name: a, mode: papermill}\n", "`relative` and/or `absolute`"),
    ("cases: [\n", "not valid YAML"),
])
def test_a_bad_suite_names_the_flag_and_the_problem(tmp_path, text, message):
    with pytest.raises(UsageError, match=rf"--suite .*suite.yaml.*{message}"):
        load_suite(write_suite(tmp_path, text))


@needs_generated_script
def test_the_gpu_suite_is_the_default_suite_on_unsloth():
    cpu, gpu = load_suite(REPO / "regress.yaml"), load_suite(REPO / "regress_gpu.yaml")
    assert [case.name for case in gpu.cases] == [case.name for case in cpu.cases]
    for cpu_case, gpu_case in zip(cpu.cases, gpu.cases):
        assert (gpu_case.mode, gpu_case.nproc) == (cpu_case.mode, cpu_case.nproc)
        assert gpu_case.params == cpu_case.params | {"backend": "unsloth"}
    assert gpu.baseline_path.name == "regress_gpu_baseline.json"
    # The committed GPU baseline (recorded on the GPU host) covers every case that compares against one.
    recorded = json.loads(gpu.baseline_path.read_text())
    assert recorded["suite"] == "regress_gpu.yaml"
    assert set(recorded["cases"]) == {case.name for case in gpu.cases if case.mode != "parity"}
    # What `regress` checks before any run: every case's parameters exist in the script, with the right types.
    script = REPO / gpu.script
    defaults = parameters.read_defaults(script_notebook.to_notebook(script), script)
    for case in gpu.cases:
        parameters.resolve(defaults, case.params, file_label=f"case {case.name}")
