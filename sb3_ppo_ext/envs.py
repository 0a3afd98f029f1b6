"""Action masks for envs that report them in ``info`` (:class:`ActionMaskFromInfo`) and for loops that call
``predict(obs)`` without masks (:class:`MaskedObservations`, whose observations carry them to
:meth:`sb3_ppo_ext.MaskablePPOExt.predict`); :func:`register_envs`: sb3-contrib's masked test envs as gymnasium ids.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from sb3_contrib.common.maskable.utils import get_action_masks, is_masking_supported
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn


class ActionMaskFromInfo(gym.Wrapper):
    """
    The action mask an environment reports in ``info[key]`` at ``reset`` and every ``step`` as ``action_masks()``.

    :param env: the environment
    :param key: the ``info`` key of the mask
    """

    def __init__(self, env: gym.Env, key: str = "action_mask"):
        super().__init__(env)
        self.key = key
        self._masks: np.ndarray | None = None

    def _keep(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.key not in info:
            raise ValueError(
                f"ActionMaskFromInfo: the environment {self.env.spec.id if self.env.spec else self.env!r} reported no "
                f"info[{self.key!r}] (info keys: {sorted(info)}); expected the action mask of the state it returned"
            )
        self._masks = np.asarray(info[self.key], dtype=bool)
        return info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs, self._keep(info)

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._keep(info)

    def action_masks(self) -> np.ndarray:
        """The mask of the current state (``True``: the action is allowed)."""
        if self._masks is None:
            raise RuntimeError("ActionMaskFromInfo.action_masks() called before reset()")
        return self._masks


class ObservationWithMasks(np.ndarray):
    """A VecEnv's observations (an ``ndarray``) with ``action_masks``: the masks of the states they describe."""

    action_masks: np.ndarray


class DictObservationWithMasks(dict):
    """A VecEnv's Dict observations with ``action_masks``: the masks of the states they describe."""

    action_masks: np.ndarray


def with_masks(observations: VecEnvObs, masks: np.ndarray) -> VecEnvObs:
    """``observations`` carrying ``masks`` (see :func:`masks_of`); the arrays are not copied."""
    if isinstance(observations, dict):
        carrier: Any = DictObservationWithMasks(observations)
    elif isinstance(observations, np.ndarray):
        carrier = observations.view(ObservationWithMasks)
    else:
        raise TypeError(f"cannot attach action masks to observations of type {type(observations).__name__}")
    carrier.action_masks = masks
    return carrier


def masks_of(observations: Any) -> np.ndarray | None:
    """The masks that ``observations`` carry (from :class:`MaskedObservations`), or ``None``."""
    return getattr(observations, "action_masks", None)


def without_masks(observations: Any) -> Any:
    """``observations`` as plain ``ndarray`` / ``dict`` (undoes :func:`with_masks`; anything else is returned as is)."""
    if isinstance(observations, ObservationWithMasks):
        return observations.view(np.ndarray)
    if isinstance(observations, DictObservationWithMasks):
        return dict(observations)
    return observations


class MaskedObservations(VecEnvWrapper):
    """
    A VecEnv whose observations carry the action masks of the states they describe, for loops that call
    ``predict(obs)`` alone. Put it outermost and hand its observations to ``predict`` unchanged: a copy drops them.

    :param venv: a VecEnv whose environments provide ``action_masks()``
    :raises ValueError: when they do not
    """

    def __init__(self, venv: VecEnv):
        if not is_masking_supported(venv):
            raise ValueError(f"MaskedObservations: the environments of {type(venv).__name__} provide no action_masks()")
        super().__init__(venv)

    def reset(self) -> VecEnvObs:
        return with_masks(self.venv.reset(), get_action_masks(self.venv))

    def step_wait(self) -> VecEnvStepReturn:
        observations, rewards, dones, infos = self.venv.step_wait()
        return with_masks(observations, get_action_masks(self.venv)), rewards, dones, infos


# sb3-contrib's masked test environments as gymnasium ids (for rl-zoo3's --env): id -> gymnasium.register's arguments.
MASKED_TEST_ENVS: dict[str, dict[str, Any]] = {
    f"{name}-v0": dict(entry_point=f"sb3_contrib.common.envs:{name}", kwargs=kwargs, max_episode_steps=100)
    for name, kwargs in (
        ("InvalidActionEnvDiscrete", dict(dim=20, n_invalid_actions=10)),
        ("InvalidActionEnvMultiDiscrete", dict(dims=[5, 5], n_invalid_actions=4)),
        ("InvalidActionEnvMultiBinary", dict(dims=10, n_invalid_actions=4)),
    )
}


def register_envs() -> None:
    """Register :data:`MASKED_TEST_ENVS` with gymnasium (ids already registered are kept)."""
    for env_id, arguments in MASKED_TEST_ENVS.items():
        if env_id not in gym.registry:
            gym.register(env_id, **arguments)
