"""MaskablePPOExt through rl-zoo3's command lines (subprocesses on OneValidAction-v0).

Train, evaluate, checkpoints, continue, enjoy, optimize, all masked, with VecNormalize (``normalize:True``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import masked_zoo_envs
import numpy as np
import pytest
from helpers import REPO_ROOT
from masked_zoo_envs import ONE_VALID
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_ppo_ext import MaskablePPOExt
from sb3_ppo_ext.maskable import MissingActionMasksWarning


def test_train_eval_checkpoints_continue_and_enjoy_are_masked(tmp_path: Path):
    base = ["--env", ONE_VALID, "--gym-packages", "masked_zoo_envs", "-f", "logs"]
    result = _zoo("train", [*base, "--eval-freq", "64", "--eval-episodes", "3", "--save-freq", "128", *TINY], tmp_path)
    assert "ppo_mask_ext.yml" in result.stdout
    evaluations = _evaluations(result.stdout)
    assert len(evaluations) == 4 and set(evaluations) == {20.0}, result.stdout
    run = tmp_path / "logs" / "ppo_mask_ext" / f"{ONE_VALID}_1"
    stored = np.load(run / "evaluations.npz")
    assert (stored["results"] == masked_zoo_envs.EPISODE_LENGTH).all()
    assert (run / "best_model.zip").is_file() and (run / "rl_model_256_steps.zip").is_file()
    assert (run / ONE_VALID / "vecnormalize.pkl").is_file()
    assert "not of the same type" not in result.stderr  # SB3's EvalCallback warning: both envs are VecNormalize

    # -i continues the checkpoint; its evaluations are masked too.
    resumed = _zoo(
        "train",
        [*base, "--eval-freq", "64", "--eval-episodes", "2", "-i", str(run / "rl_model_256_steps.zip"), *TINY],
        tmp_path,
    )
    assert set(_evaluations(resumed.stdout)) == {20.0}

    for mode in ([], ["--stochastic"]):
        replay = _zoo(
            "enjoy",
            [
                "--env",
                ONE_VALID,
                "--gym-packages",
                "masked_zoo_envs",
                "-f",
                "logs",
                "--exp-id",
                "1",
                "-n",
                "60",
                "--no-render",
                *mode,
            ],
            tmp_path,
        )
        assert re.search(r"Mean reward: 20\.00 \+/- 0\.00", replay.stdout), replay.stdout

    # The same model, evaluated without masks, scores less: the 20s above are the masks' doing.
    model = MaskablePPOExt.load(run / f"{ONE_VALID}.zip")
    with pytest.warns(MissingActionMasksWarning):
        unmasked, _ = evaluate_policy(model, make_vec_env(ONE_VALID, n_envs=1, seed=0), n_eval_episodes=5)
    assert unmasked < masked_zoo_envs.EPISODE_LENGTH / 2


def test_optimize_trials_are_scored_with_masks(tmp_path: Path):
    storage = tmp_path / "study.log"
    args = ["--env", ONE_VALID, "--gym-packages", "masked_zoo_envs", "-optimize", "--n-trials", "2", "--n-evaluations", "2"]
    args += ["--eval-episodes", "2", "--storage", str(storage), "--study-name", "masked", "--sampler", "random"]
    _zoo("train", [*args, *TINY], tmp_path)
    import optuna

    from sb3_ppo_ext.storage import make_storage

    study = optuna.load_study(study_name="masked", storage=make_storage(str(storage)))
    values = [trial.value for trial in study.trials if trial.state == optuna.trial.TrialState.COMPLETE]
    assert values and set(values) == {20.0}


def test_an_env_without_masks_is_a_one_line_error_before_anything_runs(tmp_path: Path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo_mask_ext", "--env", "CartPole-v1", "-n", "64", "-f", "logs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "error: --algo ppo_mask_ext needs action masks, but the env CartPole-v1 provides no action_masks()" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs" / "ppo_mask_ext").exists()  # no run folder left


def test_the_suites_callbacks_for_masked_models_work_through_the_zoo(tmp_path: Path):
    """KLAdaptiveLR, ParameterScheduler and TrainingHealthGuard from a --conf-file entry of ppo_mask_ext."""
    import yaml

    conf = tmp_path / "masked.yml"
    entry = {
        "n_envs": 1,
        "n_timesteps": 256,
        "policy": "MlpPolicy",
        "n_steps": 64,
        "batch_size": 32,
        "kl_coef": 0.5,
        "kl_target": 0.01,
        "callback": [
            {"sb3_ppo_ext.callbacks.KLAdaptiveLR": {"target_kl": 0.01}},
            {
                "sb3_ppo_ext.callbacks.ParameterScheduler": {
                    "schedules": {"ent_coef": {"kind": "linear", "start": 0.01, "end": 0.0}}
                }
            },
            {"sb3_ppo_ext.callbacks.TrainingHealthGuard": {"responses": {"kl": "warn"}}},
        ],
    }
    conf.write_text(yaml.safe_dump({ONE_VALID: entry}))
    args = ["--env", ONE_VALID, "--gym-packages", "masked_zoo_envs", "--conf-file", str(conf), "-f", "logs"]
    result = _zoo(
        "train", [*args, "--eval-freq", "128", "--eval-episodes", "2", "--num-threads", "1", "--seed", "0"], tmp_path
    )
    assert set(_evaluations(result.stdout)) == {20.0}
    model = MaskablePPOExt.load(tmp_path / "logs" / "ppo_mask_ext" / f"{ONE_VALID}_1" / f"{ONE_VALID}.zip")
    assert model.ent_coef == 0.0  # the schedule ran to its end
    assert model.num_timesteps == 256


TINY = ["-n", "256", "--num-threads", "1", "--seed", "0"]
TINY += ["-params", "n_envs:1", "n_steps:64", "batch_size:32", "normalize:True"]


def _zoo(command: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    env.pop("SB3_PPO_EXT_NO_ZOO_HOOK", None)
    result = subprocess.run(
        [sys.executable, "-m", f"rl_zoo3.{command}", "--algo", "ppo_mask_ext", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _evaluations(output: str) -> list[float]:
    return [float(value) for value in re.findall(r"Eval num_timesteps=\d+, episode_reward=(-?[\d.]+)", output)]
