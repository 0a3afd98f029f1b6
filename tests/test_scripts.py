"""The scripts in scripts/ run (their full runs are benchmarks, not tests)."""

import runpy
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_gpu_check_self_check_on_cpu(capsys):
    """The CPU-vs-device comparison machinery works (run with --device cuda on a CUDA machine)."""
    gpu_check = runpy.run_path(str(SCRIPTS / "gpu_check.py"))
    env_id, kwargs = gpu_check["CONFIGS"]["squashed + clip + KL + value clip max"]
    assert gpu_check["check"]("t", env_id, kwargs, "cpu", 1e-6)
    out = capsys.readouterr().out
    assert "kl_penalty" in out and "MISMATCH" not in out
