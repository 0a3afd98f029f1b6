"""What several test modules share: tiny training settings, small envs, reference computations, model helpers.

Imported as ``from helpers import ...`` (pytest's ``pythonpath`` setting puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = REPO_ROOT / "scripts"

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


MASK_ENVS = {
    "discrete": lambda: InvalidActionEnvDiscrete(dim=12, n_invalid_actions=6),
    "multidiscrete": lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2),
    "multibinary": lambda: InvalidActionEnvMultiBinary(dims=4, n_invalid_actions=2),
}


MASK_TINY = dict(n_steps=64, batch_size=16, n_epochs=3, seed=0, policy_kwargs=dict(net_arch=[16]))


LSTM_TINY = dict(n_steps=32, batch_size=16, n_epochs=3, seed=0)


LSTM_POLICY = dict(net_arch=[16], lstm_hidden_size=8)


def weights(model):
    return th.nn.utils.parameters_to_vector(model.policy.parameters()).detach().clone()


def quiet(model):
    model.set_logger(configure(None, []))
    return model


class AsymmetricBoxEnv(gym.Env):
    """Asymmetric bounds ([-1, 3] x [0, 0.5]); records every action it receives; rewards the upper corner."""

    episode_length = 20

    def __init__(self):
        self.action_space = spaces.Box(np.array([-1.0, 0.0], dtype=np.float32), np.array([3.0, 0.5], dtype=np.float32))
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.received, self._t = [], 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.observation_space.sample(), {}

    def reward(self, action) -> float:
        return -float(np.sum((action - self.action_space.high) ** 2))

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        self._t += 1
        return self.observation_space.sample(), self.reward(action), False, self._t >= self.episode_length, {}


class RecordingBoxEnv(AsymmetricBoxEnv):
    """The asymmetric box with short episodes, so that recurrent sequences are padded; the reward is the first action."""

    episode_length = 7

    def reward(self, action) -> float:
        return float(action[0])


class ImageEnv(gym.Env):
    """Channel-last images (SB3 transposes them), one-step episodes, action 1 masked."""

    observation_space = spaces.Box(0, 255, (36, 36, 1), dtype=np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, True, {}

    def action_masks(self):
        return np.array([True, False, True])


def masked_kl_by_hand(p_logits, q_logits, mask):
    """KL over the valid categories, each policy renormalised over them, in float64."""
    p_logits, q_logits = p_logits.double(), q_logits.double()
    neg = th.tensor(-np.inf, dtype=th.float64)
    log_p = th.log_softmax(th.where(mask, p_logits, neg), dim=-1)
    log_q = th.log_softmax(th.where(mask, q_logits, neg), dim=-1)
    terms = th.where(mask, log_p.exp() * (log_p - log_q), th.zeros_like(log_p))
    return terms.sum(-1)


@dataclasses.dataclass(frozen=True)
class Member:
    """One algorithm of the family, with what the behaviours every algorithm must share need to build it small."""

    name: str
    algorithm: type
    upstream: type
    policy: str
    make_env: Callable[[], gym.Env]
    tiny: dict[str, Any]

    def model(self, n_envs: int = 1, **kwargs: Any) -> Any:
        """A small model of this algorithm on ``n_envs`` copies of its env (``kwargs`` over :attr:`tiny`)."""
        from stable_baselines3.common.env_util import make_vec_env

        return self.algorithm(self.policy, make_vec_env(self.make_env, n_envs=n_envs, seed=0), **{**self.tiny, **kwargs})


def _family() -> dict[str, Member]:
    pendulum = lambda: gym.make("Pendulum-v1")  # noqa: E731
    return {
        "ppo": Member("ppo", PPOExt, PPO, "MlpPolicy", pendulum, dict(TINY)),
        "maskable": Member("maskable", MaskablePPOExt, MaskablePPO, "MlpPolicy", MASK_ENVS["multidiscrete"], dict(MASK_TINY)),
        "recurrent": Member(
            "recurrent", RecurrentPPOExt, RecurrentPPO, "MlpLstmPolicy", pendulum, dict(LSTM_TINY, policy_kwargs=LSTM_POLICY)
        ),
    }


# The family: PPOExt, MaskablePPOExt and RecurrentPPOExt (the ``family`` fixture of conftest.py runs a test on each).
FAMILY = _family()


def run_and_sigkill(command: list[str], ready: Callable[[], bool], timeout: float = 180, **popen_kwargs) -> None:
    """Start ``command``, poll ``ready()`` until it holds, SIGKILL the child and check that it died of it."""
    popen_kwargs.setdefault("env", {**os.environ, "OMP_NUM_THREADS": "1"})
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen_kwargs)
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            if process.poll() is not None:
                _, stderr = process.communicate()
                pytest.fail(f"child exited with {process.returncode} before it was ready:\n{stderr.decode()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"child not ready after {timeout} s")
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL


HOOK_SWITCH = "SB3_PPO_EXT_NO_ZOO_HOOK"


def hook_env(hook: bool) -> dict[str, str]:
    """This environment for a subprocess with the rl-zoo3 startup hook on or off (one torch thread, no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in {HOOK_SWITCH, "PYTHONPATH"}}
    env["OMP_NUM_THREADS"] = "1"
    if not hook:
        env[HOOK_SWITCH] = "1"
    return env


def run_with_hook(command: list[str], cwd: Path, hook: bool) -> subprocess.CompletedProcess:
    """Run ``command`` in ``cwd`` with the startup hook on or off (:func:`hook_env`); its output captured."""
    return subprocess.run(command, cwd=cwd, env=hook_env(hook), capture_output=True, text=True, timeout=600)


# The package's modules in the order one fresh interpreter imports them (modules_after_imports).
IMPORT_STEPS = (
    "sb3_ppo_ext.schedules",
    "sb3_ppo_ext.reliability",
    "sb3_ppo_ext.storage",
    "sb3_ppo_ext.settings",
    "sb3_ppo_ext.callbacks",
    "sb3_ppo_ext.zoo",
    "sb3_ppo_ext.samplers",
)


@functools.cache
def modules_after_imports() -> dict[str, frozenset[str]]:
    """
    The modules a fresh interpreter has loaded after importing each of :data:`IMPORT_STEPS`, in that
    order: one subprocess (per test process) for every test of what an import pulls in. Each step adds
    to the ones before, so "``X`` does not load ``Y``" read from a step holds for ``X`` alone too.
    """
    code = (
        "import importlib, json, sys\n"
        "loaded = {}\n"
        f"for name in {IMPORT_STEPS!r}:\n"
        "    importlib.import_module(name)\n"
        "    loaded[name] = sorted(sys.modules)\n"
        "print(json.dumps(loaded))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return {name: frozenset(modules) for name, modules in json.loads(result.stdout).items()}


def statements(function: Callable) -> list[str]:
    """
    The statements of a function as lines formatted by ``ast.unparse`` (no comments, no docstring): what a
    drift test compares between an upstream method and this package's copy of it.
    """
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    assert isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef)
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.unparse(statement) for statement in body).splitlines()


def copy_changes(upstream: Callable, copy: Callable) -> tuple[list[str], list[str]]:
    """The statement lines (:func:`statements`) that ``copy`` removed from ``upstream`` and those it added, in order."""
    diff = [line for line in difflib.ndiff(statements(upstream), statements(copy)) if line[:1] in "+-"]
    return [line[2:].strip() for line in diff if line.startswith("-")], [
        line[2:].strip() for line in diff if line.startswith("+")
    ]
