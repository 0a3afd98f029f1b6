"""MaskablePPOExt through rl-zoo3 (``--algo ppo_mask_ext``): masked end to end.

The fast tests check the pieces in this process (the Taxi wrapper, observations that carry their
masks, ``predict`` and ``evaluate_policy`` with them, the seams). The integration tests run rl-zoo3's
commands in subprocesses on ``OneValidAction-v0`` (tests/masked_zoo_envs.py), where a masked policy
scores exactly 20 per episode and an unmasked greedy one far less: every evaluation rl-zoo3 prints
or stores must be 20.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import masked_zoo_envs
import numpy as np
import pytest
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize

from sb3_ppo_ext import MaskablePPOExt
from sb3_ppo_ext.envs import (
    ActionMaskFromInfo,
    DictObservationWithMasks,
    MaskedObservations,
    ObservationWithMasks,
    masks_of,
    with_masks,
    without_masks,
)

TESTS = Path(__file__).resolve().parent
ONE_VALID = "OneValidAction-v0"
TINY = ["-n", "256", "--num-threads", "1", "--seed", "0", "-params", "n_envs:1", "n_steps:64", "batch_size:32"]


def one_valid_model(**kwargs) -> MaskablePPOExt:
    return MaskablePPOExt("MlpPolicy", make_vec_env(ONE_VALID, n_envs=2, seed=0), n_steps=32, batch_size=32, seed=0, **kwargs)


def test_action_mask_from_info_exposes_taxis_legal_actions():
    env = ActionMaskFromInfo(gym.make("Taxi-v4"))
    _, info = env.reset(seed=0)
    np.testing.assert_array_equal(env.action_masks(), info["action_mask"].astype(bool))
    for action in (0, 1, 2, 3):
        *_, info = env.step(action)
        np.testing.assert_array_equal(env.action_masks(), info["action_mask"].astype(bool))
    assert env.action_masks().dtype == bool


def test_action_mask_from_info_without_the_key_is_a_clear_error():
    with pytest.raises(ValueError, match=r"CartPole-v1.*reported no info\['action_mask'\]"):
        ActionMaskFromInfo(gym.make("CartPole-v1")).reset(seed=0)
    with pytest.raises(RuntimeError, match="before reset"):
        ActionMaskFromInfo(gym.make("Taxi-v4")).action_masks()


def test_masked_observations_carry_the_masks_of_their_states_across_resets():
    venv = MaskedObservations(make_vec_env(ONE_VALID, n_envs=3, seed=0))
    obs = venv.reset()
    assert isinstance(obs, ObservationWithMasks)
    for _ in range(2 * masked_zoo_envs.EPISODE_LENGTH + 3):  # through the auto-resets
        np.testing.assert_array_equal(masks_of(obs), get_action_masks(venv.venv))
        assert masks_of(obs).sum(axis=1).tolist() == [1, 1, 1]
        obs, _, _, _ = venv.step(np.zeros(3, dtype=int))
    plain = without_masks(obs)
    assert type(plain) is np.ndarray and masks_of(plain) is None
    np.testing.assert_array_equal(plain, obs)


def test_dict_observations_carry_masks_and_plain_ones_pass_through():
    masks = np.ones((2, 3), dtype=bool)
    carried = with_masks({"a": np.zeros((2, 4))}, masks)
    assert isinstance(carried, DictObservationWithMasks) and masks_of(carried) is masks
    assert type(without_masks(carried)) is dict
    assert masks_of(np.zeros(3)) is None and masks_of({"a": 1}) is None
    with pytest.raises(TypeError, match="tuple"):
        with_masks((1, 2), masks)


def test_masked_observations_need_an_env_with_masks():
    with pytest.raises(ValueError, match=r"provide no action_masks\(\)"):
        MaskedObservations(make_vec_env("CartPole-v1", n_envs=1))


def test_predict_uses_the_masks_the_observation_carries():
    model = one_valid_model()
    venv = MaskedObservations(make_vec_env(ONE_VALID, n_envs=4, seed=1))
    obs = venv.reset()
    for _ in range(10):
        for deterministic in (True, False):
            actions, _ = model.predict(obs, deterministic=deterministic)
            assert masks_of(obs)[np.arange(4), actions].all()
            explicit, _ = model.predict(without_masks(obs), action_masks=masks_of(obs), deterministic=True)
            if deterministic:
                np.testing.assert_array_equal(actions, explicit)
        obs, *_ = venv.step(actions)
    # Masks given explicitly win over the carried ones.
    other = np.roll(masks_of(obs), 1, axis=1)
    actions, _ = model.predict(obs, action_masks=other, deterministic=True)
    assert other[np.arange(4), actions].all()


def test_evaluate_policy_scores_the_masked_policy_only_through_masked_observations():
    model = one_valid_model()
    masked, _ = evaluate_policy(model, MaskedObservations(make_vec_env(ONE_VALID, n_envs=1, seed=2)), n_eval_episodes=5)
    unmasked, _ = evaluate_policy(model, make_vec_env(ONE_VALID, n_envs=1, seed=2), n_eval_episodes=5)
    assert masked == masked_zoo_envs.EPISODE_LENGTH
    assert unmasked < masked_zoo_envs.EPISODE_LENGTH / 2


def test_masked_observations_sit_above_vec_normalize():
    venv = MaskedObservations(VecNormalize(make_vec_env(ONE_VALID, n_envs=2, seed=0), norm_obs=False))
    obs = venv.reset()
    np.testing.assert_array_equal(masks_of(obs), get_action_masks(venv))
    model = one_valid_model()
    score, _ = evaluate_policy(model, venv, n_eval_episodes=4)
    assert score == masked_zoo_envs.EPISODE_LENGTH


def test_zoo_seams_wrap_only_the_masked_algorithms_evaluation_envs():
    from sb3_ppo_ext import zoo

    venv = make_vec_env(ONE_VALID, n_envs=1)
    assert zoo.is_masked("ppo_mask_ext") and not zoo.is_masked("ppo_ext") and not zoo.is_masked("ppo")
    assert isinstance(zoo.masked_env(venv, "ppo_mask_ext", ONE_VALID, evaluation=True), MaskedObservations)
    assert zoo.masked_env(venv, "ppo_mask_ext", ONE_VALID, evaluation=False) is venv
    with pytest.raises(zoo.ZooConfigError, match=r"--algo ppo_mask_ext needs action masks.*CartPole-v1.*env_wrapper"):
        zoo.masked_env(make_vec_env("CartPole-v1", n_envs=1), "ppo_mask_ext", "CartPole-v1", evaluation=False)


def test_maskable_sampler_and_converter_agree_and_build_a_model():
    import optuna

    from sb3_ppo_ext.samplers import convert_maskable_zoo_params, sample_maskable_zoo_params
    from sb3_ppo_ext.settings import to_algorithm_kwargs

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(8):
        trial = study.ask()
        kwargs = sample_maskable_zoo_params(trial, n_actions=0, n_envs=1, additional_args={})
        assert "use_sde" not in kwargs and "squash_output" not in kwargs["policy_kwargs"]
        replayed = to_algorithm_kwargs(convert_maskable_zoo_params(trial.params))
        assert replayed.keys() == kwargs.keys()
        assert {k: v for k, v in replayed.items() if not callable(v)} == {k: v for k, v in kwargs.items() if not callable(v)}
        kwargs.update(n_steps=32, batch_size=32)
        MaskablePPOExt("MlpPolicy", make_vec_env(ONE_VALID, n_envs=1), **kwargs)
        study.tell(trial, 0.0)


def test_shipped_entries_pass_the_settings_check():
    from sb3_ppo_ext import settings

    entries = settings.read_entries(str(settings.ALGORITHMS["ppo_mask_ext"].hyperparams))
    assert {"default", "Taxi-v4", "InvalidActionEnvDiscrete-v0"} <= set(entries)
    for name, entry in entries.items():
        assert settings.entry_problems(entry, "ppo_mask_ext") == [], name


# --- rl-zoo3's commands, in subprocesses ----------------------------------------------------


def _zoo(command: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
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


@pytest.mark.integration
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
    unmasked, _ = evaluate_policy(model, make_vec_env(ONE_VALID, n_envs=1, seed=0), n_eval_episodes=5)
    assert unmasked < masked_zoo_envs.EPISODE_LENGTH / 2


@pytest.mark.integration
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


@pytest.mark.integration
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


def test_test_envs_get_masks_only_for_the_masked_algorithm(monkeypatch: pytest.MonkeyPatch):
    """rl-zoo3's create_test_env (enjoy, record_video): wrapped for --algo ppo_mask_ext, untouched for ppo and ppo_ext."""
    import rl_zoo3

    from sb3_ppo_ext import zoo

    zoo.register()
    for algo, wrapped in (("ppo", False), ("ppo_ext", False), ("ppo_mask_ext", True)):
        monkeypatch.setattr(sys, "argv", ["enjoy", "--algo", algo, "--env", ONE_VALID])
        env = rl_zoo3.create_test_env(ONE_VALID, n_envs=1, hyperparams={}, should_render=False)
        assert isinstance(env, MaskedObservations) is wrapped, algo
        env.close()


@pytest.mark.integration
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
