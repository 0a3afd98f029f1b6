"""MaskablePPOExt (sb3_ppo_ext.maskable): each fault of an action mask is a ValueError naming action_masks.

In rollouts and in ``predict``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from helpers import TINY_ONE_BATCH
from sb3_contrib.common.envs import InvalidActionEnvDiscrete

from sb3_ppo_ext import MaskablePPOExt


class FaultyMasks(gym.Wrapper):
    """The env's own masks for three steps, then ``fault(masks)``; records every action it receives."""

    def __init__(self, env: gym.Env, fault):
        super().__init__(env)
        self.fault, self.received = fault, []

    def step(self, action):
        self.received.append(action)
        return self.env.step(action)

    def action_masks(self):
        masks = np.asarray(self.env.unwrapped.action_masks())
        return masks if len(self.received) < 3 else self.fault(masks)


def _masked_env(space: str) -> gym.Env:
    from sb3_contrib.common.envs import InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete

    if space == "multidiscrete":
        return InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=1)
    if space == "multibinary":
        return InvalidActionEnvMultiBinary(dims=4, n_invalid_actions=1)
    return InvalidActionEnvDiscrete(dim=12, n_invalid_actions=2)


MASK_FAULTS = {  # name -> (action space, fault, message)
    "no action": ("discrete", np.zeros_like, r"action_masks row 0 allows no action of Discrete\(12\)"),
    "transposed": ("discrete", lambda m: m.reshape(-1, 1), r"action_masks of shape \(1, 12, 1\).*expected 1 mask\(s\) of 12"),
    "strings": ("discrete", lambda m: m.astype(str), r"action_masks of dtype <U5.*expected 1 mask\(s\) of 12 booleans"),
    "other numbers": ("discrete", lambda m: m * 2, r"action_masks of dtype int64 hold values other than 0 and 1 \(e\.g\. 2\)"),
    "resized": ("discrete", lambda m: m[:-1], r"action_masks of shape \(1, 11\).*expected 1 mask\(s\) of 12"),
    "None": ("discrete", lambda m: None, r"action_masks hold None.*expected 1 mask\(s\) of 12"),
    "no value of a MultiDiscrete block": (
        "multidiscrete",
        lambda m: np.concatenate([m[:3], np.zeros(4, dtype=bool)]),
        r"action_masks row 0 allows no value of sub-action 1 \(mask positions 3:7\) of MultiDiscrete\(\[3 4\]\)",
    ),
    "no value of a binary action": (
        "multibinary",
        lambda m: np.concatenate([m[:2], [False, False], m[4:]]),
        r"action_masks row 0 allows no value of sub-action 1 \(mask positions 2:4\) of MultiBinary\(4\)",
    ),
}


@pytest.mark.parametrize("fault", list(MASK_FAULTS))
def test_a_bad_mask_in_a_rollout_stops_it_before_the_env_gets_an_action(fault: str):
    space, change, message = MASK_FAULTS[fault]

    env = FaultyMasks(_masked_env(space), change)
    model = MaskablePPOExt("MlpPolicy", env, **TINY_ONE_BATCH)
    with pytest.raises(ValueError, match=r"env\.action_masks\(\) during the rollout: " + message):
        model.learn(64)
    assert len(env.received) == 3  # no action was chosen with the bad masks


@pytest.mark.parametrize("fault", [name for name in MASK_FAULTS if name != "None"])  # predict(action_masks=None): unmasked
def test_a_bad_mask_in_predict_is_the_same_error(fault: str):
    space, change, message = MASK_FAULTS[fault]

    env = _masked_env(space)
    model = MaskablePPOExt("MlpPolicy", env, **TINY_ONE_BATCH)
    obs, _ = env.reset(seed=0)
    bad = np.stack([change(np.asarray(env.action_masks()))])  # as the rollout stacks one env's masks
    with pytest.raises(ValueError, match=r"MaskablePPOExt\.predict: " + message):
        model.predict(obs, action_masks=bad)


def test_predict_names_the_row_of_a_batch_and_refuses_a_transposed_batch_mask():

    env = _masked_env("discrete")
    model = MaskablePPOExt("MlpPolicy", env, **TINY_ONE_BATCH)
    obs, _ = env.reset(seed=0)
    masks = np.stack([env.action_masks()] * 2)
    model.predict(np.stack([obs] * 2), action_masks=masks.astype(np.float32))  # 0/1 numbers are masks too
    with pytest.raises(ValueError, match=r"action_masks of shape \(12, 2\).*expected 2 mask\(s\) of 12 booleans each"):
        model.predict(np.stack([obs] * 2), action_masks=masks.T)  # the right size: upstream reshapes it
    masks[1] = False
    with pytest.raises(ValueError, match=r"action_masks row 1 allows no action"):
        model.predict(np.stack([obs] * 2), action_masks=masks)
