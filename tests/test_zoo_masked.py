"""MaskablePPOExt through rl-zoo3 (``--algo ppo_mask_ext``): masked end to end.

The fast tests check the seams and run rl-zoo3's ``ExperimentManager`` in this process (training with
``--eval-freq``, ``-optimize``, with and without ``normalize``). The integration tests run rl-zoo3's
commands in subprocesses. Both use ``OneValidAction-v0`` (tests/masked_zoo_envs.py), where a masked
policy scores exactly 20 per episode and an unmasked greedy one far less: every evaluation rl-zoo3
prints or stores must be 20.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import masked_zoo_envs
import numpy as np
import pytest
from masked_zoo_envs import ONE_VALID
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext import MaskablePPOExt
from sb3_ppo_ext.envs import MaskedObservations


def test_zoo_seams_wrap_only_the_test_envs_of_enjoy():
    from sb3_ppo_ext import zoo_support as zoo

    venv = make_vec_env(ONE_VALID, n_envs=1)
    assert zoo.is_masked("ppo_mask_ext") and not zoo.is_masked("ppo_ext") and not zoo.is_masked("ppo")
    assert isinstance(zoo.masked_env(venv, "ppo_mask_ext", ONE_VALID, carry_masks=True), MaskedObservations)
    assert zoo.masked_env(venv, "ppo_mask_ext", ONE_VALID, carry_masks=False) is venv
    with pytest.raises(zoo.ZooConfigError, match=r"--algo ppo_mask_ext needs action masks.*CartPole-v1.*env_wrapper"):
        zoo.masked_env(make_vec_env("CartPole-v1", n_envs=1), "ppo_mask_ext", "CartPole-v1", carry_masks=False)


# --- rl-zoo3's ExperimentManager in this process ---------------------------------------------


TINY_ENTRY = {"n_envs": 1, "n_steps": 64, "batch_size": 32}


def _run(folder: Path, **options) -> list[warnings.WarningMessage]:
    """rl-zoo3's train on OneValidAction-v0 with ``--algo ppo_mask_ext``, in this process; the warnings it issued."""
    import rl_zoo3.exp_manager

    from sb3_ppo_ext import zoo

    zoo.register()
    manager = rl_zoo3.exp_manager.ExperimentManager(
        argparse.Namespace(),
        "ppo_mask_ext",
        ONE_VALID,
        str(folder),
        n_timesteps=256,
        seed=0,
        verbose=0,
        log_interval=-1,
        **options,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if manager.optimize_hyperparameters:
            manager.setup_experiment()
            manager.hyperparameters_optimization()
        else:
            model, _ = manager.setup_experiment()
            manager.learn(model)
            manager.save_trained_model(model)
    return caught


def _same_type_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "Training and eval env are not of the same type" in str(w.message)]


@pytest.mark.parametrize("normalize", [False, True])
def test_eval_freq_evaluates_with_masks_syncs_vec_normalize_and_warns_nothing(tmp_path: Path, normalize: bool):
    """--eval-freq: every evaluation is the masked policy's 20, with or without VecNormalize, and no env-type warning."""
    caught = _run(tmp_path, eval_freq=64, n_eval_episodes=2, hyperparams={**TINY_ENTRY, "normalize": normalize})
    assert _same_type_warnings(caught) == []
    run = tmp_path / "ppo_mask_ext" / f"{ONE_VALID}_1"
    stored = np.load(run / "evaluations.npz")
    assert stored["results"].shape == (4, 2) and (stored["results"] == masked_zoo_envs.EPISODE_LENGTH).all()
    assert (run / ONE_VALID / "vecnormalize.pkl").is_file() is normalize


def test_optimize_trials_with_vec_normalize_are_scored_with_masks(tmp_path: Path):
    """-optimize with normalize: True: each trial's evaluations sync VecNormalize and act with masks."""
    import optuna

    storage = tmp_path / "study.log"
    caught = _run(
        tmp_path / "logs",
        optimize_hyperparameters=True,
        n_trials=2,
        n_evaluations=2,
        n_eval_episodes=2,
        sampler="random",
        storage=str(storage),
        study_name="masked",
        no_optim_plots=True,
        hyperparams={**TINY_ENTRY, "normalize": True},
    )
    assert _same_type_warnings(caught) == []
    journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(storage)))
    study = optuna.load_study(study_name="masked", storage=journal)
    assert [trial.state for trial in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert [trial.value for trial in study.trials] == [20.0, 20.0]


def test_evaluation_callbacks_are_rl_zoo3s_again_after_a_masked_run(tmp_path: Path):
    """The masked evaluation classes are rl-zoo3's names only while a masked algorithm's manager builds its callbacks."""
    import rl_zoo3.exp_manager
    from rl_zoo3.callbacks import TrialEvalCallback
    from stable_baselines3.common.callbacks import EvalCallback

    _run(tmp_path, eval_freq=128, n_eval_episodes=1, hyperparams=TINY_ENTRY)
    assert rl_zoo3.exp_manager.EvalCallback is EvalCallback
    assert rl_zoo3.exp_manager.TrialEvalCallback is TrialEvalCallback


def test_maskable_sampler_and_converter_agree_and_build_a_model():
    import optuna

    from sb3_ppo_ext.samplers import convert_zoo_params, sample_zoo_params
    from sb3_ppo_ext.validation import to_algorithm_kwargs

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(8):
        trial = study.ask()
        kwargs = sample_zoo_params(trial, n_actions=0, n_envs=1, additional_args={})
        assert "use_sde" not in kwargs and "squash_output" not in kwargs["policy_kwargs"]
        replayed = to_algorithm_kwargs(convert_zoo_params(trial.params))
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
