"""The EnvPool entries through rl-zoo3's command lines: train on EnvPool, evaluate and enjoy on gymnasium."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import build_venv

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="EnvPool 1.2.5 has wheels for Python >= 3.11 only")

CONF = ["--conf-file", "sb3_ppo_ext.hyperparams.envpool"]


def _run(cwd: Path, module: str, *args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", module, "--algo", "ppo_ext", "--env", "Hopper-v5", "-f", "logs", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_train_on_envpool_with_evaluations_then_continue_and_enjoy_on_gymnasium(tmp_path: Path):
    result = _run(tmp_path, "rl_zoo3.train", *CONF, "-n", "4096", "--eval-freq", "2048", "--eval-episodes", "2", "--seed", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "logs" / "ppo_ext" / "Hopper-v5_1"
    assert np.load(run / "evaluations.npz")["timesteps"].tolist() == [2048, 4096]  # every 2048 steps of 32 envs
    assert yaml.unsafe_load((run / "Hopper-v5" / "config.yml").read_text())["env_backend"] == "envpool"
    # The training env was EnvPool's: rl-zoo3 writes a Monitor file for every gymnasium training env, none here.
    assert (run / "Hopper-v5" / "vecnormalize.pkl").is_file() and not list(run.glob("*.monitor.csv"))

    result = _run(tmp_path, "rl_zoo3.train", *CONF, "-n", "2048", "-i", str(run / "Hopper-v5.zip"), "-params", "n_envs:16")
    assert result.returncode == 0, result.stderr[-3000:]
    # The run's statistics and step count carried on: 4096 + two rollouts of 16 envs x 64 steps.
    assert "Loading saved VecNormalize stats" in result.stdout and re.search(r"total_timesteps +\| 6144 ", result.stdout)

    result = _run(tmp_path, "rl_zoo3.enjoy", "--exp-id", "1", "-n", "300", "--no-render", "--deterministic")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Mean reward" in result.stdout


def test_optimize_runs_its_trial_on_envpool(tmp_path: Path):
    options = ["-n", "1024", "-optimize", "--n-trials", "1", "--n-evaluations", "1", "--eval-episodes", "1"]
    result = _run(tmp_path, "rl_zoo3.train", *CONF, *options, "--no-optim-plots", "-params", "n_envs:8")
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = (tmp_path / "logs" / "ppo_ext").glob("report_Hopper-v5_1-trials-1024-tpe-median_*.csv")
    assert report.read_text().count("\n") == 2  # the header and the one trial


def test_missing_envpool_is_one_line_naming_the_extra_and_leaves_no_folder(tmp_path: Path):
    shadow = tmp_path / "shadow" / "envpool"  # an envpool that cannot be imported, first on the path
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'envpool'\", name='envpool')\n")
    result = _run(tmp_path, "rl_zoo3.train", *CONF, "-n", "1024", pythonpath=str(shadow.parent))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        'error: EnvPool is not installed: pip install "sb3-ppo-ext[envpool]" (the Hopper-v5 entry has env_backend: envpool; '
        "-params env_backend:gymnasium trains on gymnasium's envs instead)"
    ]
    assert not (tmp_path / "logs").exists()


def test_fresh_venv_with_the_extra_trains_on_envpool_and_enjoys(tmp_path_factory: pytest.TempPathFactory):
    """``pip install "<repo copy>[zoo,envpool]"`` in a fresh venv: the shipped EnvPool entry trains, evaluates, enjoys."""
    venv = build_venv(tmp_path_factory.mktemp("envpool") / "venv", "[zoo,envpool]")
    workdir = tmp_path_factory.mktemp("envpool-run")
    zoo = [str(venv.python), "-m", "rl_zoo3.train", "--algo", "ppo_ext", "--env", "Hopper-v5", "-f", "logs", *CONF]
    train = [*zoo, "-n", "2048", "--eval-freq", "2048", "--eval-episodes", "1", "--seed", "0"]
    result = subprocess.run(train, cwd=workdir, env=venv.env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Eval num_timesteps=2048" in result.stdout
    enjoy = [str(venv.python), "-m", "rl_zoo3.enjoy", "--algo", "ppo_ext", "--env", "Hopper-v5", "-f", "logs", "-n", "200"]
    result = subprocess.run(
        [*enjoy, "--no-render"], cwd=workdir, env=venv.env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0 and "Mean reward" in result.stdout, result.stderr[-3000:]
