import json
import sys

import pytest

from nbddp.orchestration.script_notebook import to_notebook
from nbddp.orchestration.smoke.kernel import KERNEL_NAME, write_kernelspec
from nbddp.orchestration.smoke.notebook_run import run_notebook


def test_the_kernelspec_runs_this_interpreter(tmp_path):
    data_dir = write_kernelspec(tmp_path / "jupyter")
    spec = json.loads((data_dir / "kernels" / KERNEL_NAME / "kernel.json").read_text())
    assert spec["argv"][:3] == [sys.executable, "-m", "ipykernel_launcher"]
    assert spec["language"] == "python"


@pytest.mark.e2e
def test_our_kernelspec_wins_over_another_python3_spec(tmp_path, monkeypatch):
    user_data = tmp_path / "user-jupyter"
    (user_data / "kernels" / KERNEL_NAME).mkdir(parents=True)
    broken = {"argv": ["/nonexistent/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
              "display_name": "Python 3", "language": "python"}
    (user_data / "kernels" / KERNEL_NAME / "kernel.json").write_text(json.dumps(broken))
    # A JUPYTER_PATH the user set (shared kernels) is searched before the virtualenv's own kernelspecs.
    monkeypatch.setenv("JUPYTER_PATH", str(user_data))
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "which.py"
    script.write_text('# %% tags=["parameters"]\nout = "which.txt"\n\n# %%\nimport sys\nopen(out, "w").write(sys.executable)\n')
    run_notebook(to_notebook(script), script, {}, tmp_path, "", timeout=60, progress=False)
    assert (tmp_path / "which.txt").read_text() == sys.executable
