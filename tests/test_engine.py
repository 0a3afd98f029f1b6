"""The update engine (sb3_ppo_ext.engine): what every algorithm built on it checks at construction and does in an update."""

from __future__ import annotations

import gymnasium as gym
import pytest

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt


@pytest.mark.parametrize(
    "algorithm, policy, observations, message",
    [
        (RecurrentPPOExt, "MlpLstmPolicy", "dict", r"`MultiInputLstmPolicy` when working with a Dict .*not MlpLstmPolicy"),
        (RecurrentPPOExt, "CnnLstmPolicy", "dict", r"You must use `MultiInputLstmPolicy` .*not CnnLstmPolicy"),
        (
            RecurrentPPOExt,
            "MultiInputLstmPolicy",
            "box",
            r"You must use `MlpLstmPolicy` or `CnnLstmPolicy` when working with a Box .*not MultiInputLstmPolicy",
        ),
        (PPOExt, "MlpPolicy", "dict", r"You must use `MultiInputPolicy` when working with dict observation space"),  # SB3's
        (PPOExt, "MultiInputPolicy", "box", r"You must use `MlpPolicy` or `CnnPolicy` when working with a Box"),
        (MaskablePPOExt, "MlpPolicy", "dict", r"You must use `MultiInputPolicy` when working with dict observation space"),
    ],
)
def test_a_policy_that_cannot_read_the_observations_is_an_error_at_construction(algorithm, policy, observations, message):
    from stable_baselines3.common.envs import SimpleMultiObsEnv

    env = SimpleMultiObsEnv() if observations == "dict" else gym.make("CartPole-v1")
    with pytest.raises(ValueError, match=message):
        algorithm(policy, env, n_steps=16, batch_size=16, device="cpu")
