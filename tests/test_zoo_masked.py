"""MaskablePPOExt through rl-zoo3 (``--algo ppo_mask_ext``): masked end to end.

The fast tests check the pieces in this process (the Taxi wrapper, observations that carry their
masks, ``predict`` and ``evaluate_policy`` with them, the seams). The integration tests run rl-zoo3's
commands in subprocesses on ``OneValidAction-v0`` (tests/masked_zoo_envs.py), where a masked policy
scores exactly 20 per episode and an unmasked greedy one far less: every evaluation rl-zoo3 prints
or stores must be 20.
"""

from __future__ import annotations

import sys

import pytest
from masked_zoo_envs import ONE_VALID
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext import MaskablePPOExt
from sb3_ppo_ext.envs import (
    MaskedObservations,
)


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
