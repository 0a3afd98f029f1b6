"""What several test modules share: the tiny training settings and the env with a broken reward.

Imported as ``from helpers import ...`` (pytest's ``pythonpath`` setting puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv

# The tiny settings of the unit tests: one short rollout, a few minibatches. Tests that give their own
# policy_kwargs use TINY; TINY_NET adds a small network.
TINY = dict(n_steps=32, batch_size=16, n_epochs=2, seed=0)
TINY_NET = dict(TINY, policy_kwargs=dict(net_arch=[16]))
# One minibatch, one epoch, an 8-unit network on the CPU: the reliability tests (checkpoints, files).
TINY_ONE_BATCH = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]), device="cpu", seed=0)


class BrokenRewardEnv(gym.Env):
    """A Box env (3-d observations, 1-d actions) whose reward is ``reward`` from step ``at`` on (a broken simulator)."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, at: int, reward: float = float("nan")):
        self.at, self.t, self.broken_reward = at, 0, reward

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = self.broken_reward if self.t >= self.at else float(-np.square(action).sum())
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), reward, False, self.t % 50 == 0, {}


def pendulum_vec_env() -> DummyVecEnv:
    """One Pendulum-v1 in a DummyVecEnv."""
    return DummyVecEnv([lambda: gym.make("Pendulum-v1")])
