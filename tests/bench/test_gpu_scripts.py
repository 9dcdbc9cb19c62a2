import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEVICE_CALLS = ("bench/gpu_call.sh", "bench/gpu_e2e.sh", "bench/layout_1gpu.sh", "bench/graphs_1gpu.sh")


def test_device_call_scripts_parse_share_the_gpu_environment_and_name_files_that_exist():
    for script in DEVICE_CALLS + ("bench/gpu_site.sh",):
        done = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    for script in DEVICE_CALLS:
        assert "source bench/gpu_site.sh" in (REPO / script).read_text()
    suites = re.findall(r"--suite ([\w./-]+)", (REPO / "bench/gpu_e2e.sh").read_text())
    assert suites and all((REPO / suite).is_file() for suite in suites)
    assert "NCCL_NVLS_ENABLE=0" in (REPO / "bench/gpu_site.sh").read_text()
