"""The action-mask wrappers (sb3_ppo_ext.envs).

Masks from infos; observations that carry their masks through resets, predict, evaluation and VecNormalize.
"""

from __future__ import annotations

import gymnasium as gym
import masked_zoo_envs
import numpy as np
import pytest
from masked_zoo_envs import ONE_VALID
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
from sb3_ppo_ext.maskable import MissingActionMasksWarning


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
    with pytest.warns(MissingActionMasksWarning):
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
