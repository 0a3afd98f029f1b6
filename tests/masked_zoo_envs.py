"""A masked env for the rl-zoo3 tests (``--gym-packages masked_zoo_envs``): one valid action per step.

``OneValidAction-v0``: one allowed action (of 8), drawn at random every step and shown only by the
mask (the observation, a ``Box`` so that ``VecNormalize`` applies, is always 0); the allowed action
earns 1, any other 0; 20 steps an episode.
A masked policy scores exactly 20 in every episode, whatever its weights; an unmasked greedy
policy takes the same action at every step, which is allowed one step in eight.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

N_ACTIONS = 8
EPISODE_LENGTH = 20


class OneValidActionEnv(gym.Env):
    """One allowed action per step, shown only by the mask; reward 1 for it, 0 for any other."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(0.0, 1.0, (1,), dtype=np.float32)
        self.action_space = spaces.Discrete(N_ACTIONS)
        self._state = 0
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._steps = 0
        self._state = int(self.np_random.integers(N_ACTIONS))
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(int(action) == self._state)
        self._steps += 1
        self._state = int(self.np_random.integers(N_ACTIONS))
        return np.zeros(1, dtype=np.float32), reward, False, self._steps >= EPISODE_LENGTH, {}

    def action_masks(self) -> np.ndarray:
        return np.arange(N_ACTIONS) == self._state


# The env id of OneValidActionEnv.
ONE_VALID = "OneValidAction-v0"
if ONE_VALID not in gym.registry:
    gym.register(ONE_VALID, entry_point=OneValidActionEnv)
