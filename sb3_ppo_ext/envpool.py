"""EnvPool's batched C++ environments (``pip install "sb3-ppo-ext[envpool]"``) as an SB3 VecEnv: :class:`EnvPoolVecEnv`.

An episode that ends is reset at once (``terminal_observation``, ``TimeLimit.truncated`` and ``episode`` in its
info, as SB3's ``Monitor`` writes it), so EnvPool's own reset step never happens; float64 ``Box`` actions are
float32, as gymnasium's MuJoCo envs declare them, so a model trained here loads onto gymnasium's env of the task.
What EnvPool cannot do (``env_method``, ``set_attr``, rendering) is an error naming it. See the EnvPool guide.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv
from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices, VecEnvObs, VecEnvStepReturn

from sb3_ppo_ext.validation import InvalidSettingError, check_int

_BOOKKEEPING_KEYS = ("env_id", "players")  # EnvPool's own info keys, not per-env values of the task
_NO_PYTHON = "EnvPool's environments have no Python attributes or methods"
_NO_RENDER = "rendering is not supported; render on gymnasium's env of the same task"
POOL_OPTIONS = ("num_threads", "thread_affinity_offset")  # EnvPool's pool's, not the task's: gymnasium takes neither


def require_envpool() -> ModuleType:
    """The ``envpool`` module; an ``ImportError`` naming the extra to install when it is missing."""
    try:
        import envpool
    except ImportError:
        raise ImportError('EnvPool is not installed: pip install "sb3-ppo-ext[envpool]"') from None
    return envpool


def task_kwargs(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``env_kwargs`` without :data:`POOL_OPTIONS`: the task's own settings, which gymnasium's env takes too."""
    return {key: value for key, value in env_kwargs.items() if key not in POOL_OPTIONS}


class EnvPoolVecEnv(VecEnv):
    """
    ``num_envs`` copies of an EnvPool task (``envpool.make_gymnasium``) behind SB3's ``VecEnv`` interface.

    :param task: EnvPool task id, e.g. ``"Hopper-v5"`` (``envpool.list_all_envs()`` lists them)
    :param num_envs: number of environments stepped together
    :param seed: seed of env 0; env ``i`` gets ``seed + i`` (modulo ``2**31 - 1``)
    :param num_threads: EnvPool's worker threads; 0 lets EnvPool choose
    :param make_kwargs: the task's settings for ``envpool.make_gymnasium`` (``reset_noise_scale=0.0``, ...)
    """

    def __init__(self, task: str, num_envs: int, seed: int = 0, num_threads: int = 0, **make_kwargs: Any):
        envpool = require_envpool()
        if task not in envpool.list_all_envs():
            raise InvalidSettingError(f"task={task!r} is not an EnvPool task; envpool.list_all_envs() lists them")
        num_envs = check_int("num_envs", num_envs)
        if "batch_size" in make_kwargs:  # EnvPool's asynchronous mode returns a subset of the envs at each step
            raise InvalidSettingError(f"batch_size={make_kwargs['batch_size']!r}: EnvPoolVecEnv steps all envs together")
        self.task, self.num_threads, self.make_kwargs = task, num_threads, make_kwargs
        self.pool = self._make_pool(num_envs, seed)
        action_space = self.pool.action_space
        if isinstance(action_space, spaces.Box) and action_space.dtype == np.float64:
            low, high = action_space.low.astype(np.float32), action_space.high.astype(np.float32)
            action_space = spaces.Box(low, high, dtype=np.float32)
        super().__init__(num_envs, self.pool.observation_space, action_space)
        self._env_ids = np.arange(self.num_envs, dtype=np.int32)
        self._actions: np.ndarray | None = None
        self._returns = np.zeros(self.num_envs)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._start = time.time()

    def _make_pool(self, num_envs: int, seed: int) -> Any:
        seed = int(seed) % (2**31 - 1)  # EnvPool takes int32 seeds; SB3 and rl-zoo3 draw seeds up to 2**32 - 1
        return require_envpool().make_gymnasium(
            self.task, num_envs=num_envs, num_threads=self.num_threads, seed=seed, **self.make_kwargs
        )

    def reset(self) -> VecEnvObs:
        """Reset every env; seeds given by :meth:`seed` take effect here (the pool is rebuilt with them)."""
        if self._seeds[0] is not None:
            self.pool.close()
            self.pool = self._make_pool(self.num_envs, self._seeds[0])
            self._reset_seeds()
        if any(self._options):
            raise NotImplementedError(f"EnvPoolVecEnv.reset: EnvPool takes no reset options, got {self._options!r}")
        obs, _ = self.pool.reset(self._env_ids)
        self._returns[:], self._lengths[:] = 0.0, 0
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=self.pool.action_space.dtype)

    def step_wait(self) -> VecEnvStepReturn:
        obs, rewards, terminated, truncated, info = self.pool.step(self._actions, self._env_ids)
        dones = terminated | truncated
        self._returns += rewards
        self._lengths += 1
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for key, values in info.items():
            if key not in _BOOKKEEPING_KEYS:
                for env_info, value in zip(infos, values.tolist(), strict=True):
                    env_info[key] = value
        ended = np.flatnonzero(dones)
        if ended.size:
            elapsed = round(time.time() - self._start, 6)
            for i in ended:
                infos[i]["terminal_observation"] = obs[i].copy()
                infos[i]["TimeLimit.truncated"] = bool(truncated[i] and not terminated[i])
                infos[i]["episode"] = {"r": float(self._returns[i]), "l": int(self._lengths[i]), "t": elapsed}
            # Reset now: EnvPool would otherwise spend the next step of these envs on its own reset.
            obs[ended], _ = self.pool.reset(ended.astype(np.int32))
            self._returns[ended], self._lengths[ended] = 0.0, 0
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.pool.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """``render_mode`` (``None``) of each env; any other name is an ``AttributeError`` naming it."""
        if attr_name != "render_mode":
            raise AttributeError(f"EnvPoolVecEnv.get_attr({attr_name!r}): {_NO_PYTHON} (only render_mode is known: None)")
        return [None for _ in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        raise NotImplementedError(f"EnvPoolVecEnv.set_attr({attr_name!r}): {_NO_PYTHON}")

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any) -> list:
        raise NotImplementedError(f"EnvPoolVecEnv.env_method({method_name!r}): {_NO_PYTHON}")

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        """``False`` for every env: EnvPool's environments carry no gymnasium wrappers."""
        return [False for _ in self._get_indices(indices)]

    def render(self, mode: str | None = None) -> np.ndarray | None:
        raise NotImplementedError(f"EnvPoolVecEnv.render: {_NO_RENDER}")

    def get_images(self) -> Sequence[np.ndarray | None]:
        raise NotImplementedError(f"EnvPoolVecEnv.get_images: {_NO_RENDER}")
