"""Callbacks for on-policy training (the callbacks guide); importing this module does not import optuna."""

from __future__ import annotations

import math
import os
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.logger import HParam, TensorBoardOutputFormat
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.utils import FloatSchedule, update_learning_rate
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_ext.reliability import model_state_problems, non_finite_entries, save_checkpoint
from sb3_ppo_ext.schedules import ParameterSchedule
from sb3_ppo_ext.validation import (
    SCHEDULE_KEYS,
    InvalidSettingError,
    check_choice,
    check_int,
    check_real,
    is_integer_parameter,
    is_real,
    optional_real,
    scheduled_value_problem,
)

if TYPE_CHECKING:
    import gymnasium as gym
    import optuna
    from torch.utils.tensorboard import SummaryWriter

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _tensorboard_writer(callback: BaseCallback) -> SummaryWriter | None:
    """The SummaryWriter of the model's logger, or None when no TensorBoard output is configured."""
    formats = callback.logger.output_formats
    return next((output.writer for output in formats if isinstance(output, TensorBoardOutputFormat)), None)


class _AfterUpdateCallback(BaseCallback):
    """Runs ``_on_update_end`` after each update (at the next rollout start or training end), with its ``train/`` records."""

    def __init__(self, kl_key: str | None, verbose: int):
        super().__init__(verbose=verbose)
        if kl_key is not None and not isinstance(kl_key, str):
            raise InvalidSettingError(f"kl_key={kl_key!r} is invalid: expected a logger key such as 'train/kl', or None")
        self.kl_key = kl_key

    def _measured_kl(self) -> tuple[str, float] | None:
        """The update's KL: ``kl_key``, else ``train/kl`` (PPOExt), else ``train/approx_kl`` (PPO); or None."""
        for key in (self.kl_key,) if self.kl_key is not None else ("train/kl", "train/approx_kl"):
            if key in self.logger.name_to_value:
                return key, float(self.logger.name_to_value[key])
        return None

    def _init_callback(self) -> None:
        self._seen_n_updates = self.model._n_updates

    def _check_update(self) -> None:
        if self.model._n_updates != self._seen_n_updates:
            self._seen_n_updates = self.model._n_updates
            self._on_update_end()

    def _on_rollout_start(self) -> None:
        self._check_update()

    _on_training_end = _on_rollout_start

    def _on_update_end(self) -> None:
        pass

    def _on_step(self) -> bool:
        return True


class KLAdaptiveLR(_AfterUpdateCallback):
    """
    Learning rate driven by the KL measured after each update (rl_games); it replaces ``model.lr_schedule``.

    :param target_kl: target KL per update, > 0
    :param kl_factor: tolerance band around the target (rl_games: 2), > 1
    :param lr_factor: multiplicative step of the learning rate (rl_games: 1.5), > 1
    :param min_lr: lower bound of the learning rate, > 0
    :param max_lr: upper bound of the learning rate, >= ``min_lr``
    :param kl_key: logger key of the measured KL; ``None`` takes ``train/kl``, else ``train/approx_kl``
    :param verbose: 1 prints each change of the learning rate
    """

    def __init__(
        self,
        target_kl: float,
        kl_factor: float = 2.0,
        lr_factor: float = 1.5,
        min_lr: float = 1e-6,
        max_lr: float = 1e-2,
        kl_key: str | None = None,
        verbose: int = 0,
    ):
        super().__init__(kl_key, verbose)
        self.target_kl = check_real("target_kl", target_kl, low=0.0)
        self.kl_factor = check_real("kl_factor", kl_factor, low=1.0)
        self.lr_factor = check_real("lr_factor", lr_factor, low=1.0)
        self.min_lr = check_real("min_lr", min_lr, low=0.0)
        self.max_lr = check_real("max_lr", max_lr, low=0.0)
        if self.max_lr < self.min_lr:
            raise InvalidSettingError(f"max_lr={max_lr!r} is invalid: expected max_lr >= min_lr={min_lr!r}")
        self.learning_rate = float("nan")

    def _init_callback(self) -> None:
        super()._init_callback()
        progress = self.model._current_progress_remaining
        schedules = getattr(self.model.policy, "learning_rate_schedules", None)
        if schedules is None:
            current = float(self.model.lr_schedule(progress))
            self._vf_ratio: float | None = None
        else:
            current = float(schedules["pi"](progress))
            self._vf_ratio = float(schedules["vf"](1.0)) / float(schedules["pi"](1.0))
        self._set_learning_rate(min(max(current, self.min_lr), self.max_lr))

    def _set_learning_rate(self, learning_rate: float) -> None:
        self.learning_rate = learning_rate
        self.model.learning_rate = learning_rate
        self.model.lr_schedule = FloatSchedule(learning_rate)
        if self._vf_ratio is None:
            update_learning_rate(self.model.policy.optimizer, learning_rate)
            return
        rates = {"pi": learning_rate, "vf": learning_rate * self._vf_ratio}
        self.model.policy.replace_learning_rates(rates)  # type: ignore[operator]  # a policy of this package
        self.model.policy_kwargs = {**self.model.policy_kwargs, "learning_rates": rates}  # what load rebuilds from

    def _on_update_end(self) -> None:
        measured = self._measured_kl()
        if measured is None:
            wanted = self.kl_key or "'train/kl' or 'train/approx_kl'"
            model = type(self.model).__name__
            raise ValueError(f"KLAdaptiveLR(kl_key={self.kl_key!r}): the update recorded no {wanted}; {model} logs no such KL")
        key, kl = measured
        if not math.isfinite(kl):
            return
        learning_rate = self.learning_rate
        if kl > self.target_kl * self.kl_factor:
            learning_rate /= self.lr_factor
        elif kl < self.target_kl / self.kl_factor:
            learning_rate *= self.lr_factor
        learning_rate = min(max(learning_rate, self.min_lr), self.max_lr)
        if learning_rate != self.learning_rate and self.verbose >= 1:
            print(f"KLAdaptiveLR: {key}={kl:.3g}, learning rate {self.learning_rate:.3g} -> {learning_rate:.3g}")
        self._set_learning_rate(learning_rate)


Schedule = ParameterSchedule | Callable[[float], float]


class ParameterScheduler(BaseCallback):
    """
    Schedules for numeric training attributes, set before each ``train()`` and logged as ``schedule/<name>``.

    :param schedules: attribute name to a :class:`ParameterSchedule`, its keywords, or a callable of progress remaining
    :param verbose: 1 prints the values at each update
    """

    def __init__(self, schedules: Mapping[str, Schedule | Mapping[str, Any]], verbose: int = 0):
        super().__init__(verbose=verbose)
        if not isinstance(schedules, Mapping) or not schedules:
            raise InvalidSettingError(f"schedules={schedules!r} is invalid: expected a non-empty dict of name -> schedule")
        for name in schedules:
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidSettingError(f"schedules={dict(schedules)!r} is invalid: {name!r} is not an attribute name")
        self.schedules: dict[str, Schedule] = {name: ParameterSchedule.from_spec(name, s) for name, s in schedules.items()}
        for name, schedule in self.schedules.items():
            for extreme in schedule.extremes() if isinstance(schedule, ParameterSchedule) else ():
                problem = scheduled_value_problem(name, extreme)
                if problem is not None:
                    raise InvalidSettingError(
                        f"schedules[{name!r}]={schedule!r} is invalid: it would set {name}={extreme!r}; {name}: {problem}"
                    )
        self.current_values: dict[str, float] = {}

    def _init_callback(self) -> None:
        model = type(self.model).__name__
        for name in self.schedules:
            if name == "learning_rate":
                rates = getattr(self.model.policy, "learning_rates", None)
                if rates is not None:
                    raise InvalidSettingError(
                        f"schedules['learning_rate'] is invalid with policy_kwargs.learning_rates={rates!r}: the optimizer "
                        "follows those rates; give each its schedule there (e.g. {'pi': 'lin_3e-4', 'vf': 'lin_1e-3'})"
                    )
                continue
            if not hasattr(self.model, name):
                raise InvalidSettingError(f"schedules[{name!r}] is invalid: {model} has no attribute {name!r} to schedule")
            current = getattr(self.model, name)
            if not (current is None or callable(current) or is_real(current)):
                raise InvalidSettingError(f"schedules[{name!r}] is invalid: {model}.{name}={current!r} is not numeric")
            kl_target = getattr(self.model, "kl_target", None)
            if name == "kl_coef" and kl_target is not None:
                raise InvalidSettingError(
                    f"schedules['kl_coef'] is invalid with kl_target={kl_target!r}: kl_coef is only the adaptive beta's "
                    "initial value; schedule kl_target instead, or use a fixed beta (kl_target=None), whose beta is kl_coef"
                )

    def value(self, name: str) -> float:
        """The scheduled value of ``name`` at the model's current timesteps."""
        schedule = self.schedules[name]
        progress_remaining = 1.0 - float(self.model.num_timesteps) / max(float(self.model._total_timesteps), 1.0)
        if not isinstance(schedule, ParameterSchedule):
            return float(schedule(progress_remaining))
        return schedule(float(self.model.num_timesteps) if schedule.by == "timesteps" else 1.0 - progress_remaining)

    def _on_rollout_end(self) -> None:  # just before the update
        for name in self.schedules:
            value = self.value(name)
            problem = scheduled_value_problem(name, value)
            if problem is not None:  # a callable schedule, which cannot be checked in advance
                steps = self.model.num_timesteps
                raise InvalidSettingError(
                    f"ParameterScheduler: schedules[{name!r}] gives {name}={value!r} at {steps} steps; {name}: {problem}"
                )
            if name == "learning_rate":
                self.model.learning_rate = value
                self.model.lr_schedule = FloatSchedule(value)
                update_learning_rate(self.model.policy.optimizer, value)
            else:
                current = getattr(self.model, name)
                if callable(current) or name in SCHEDULE_KEYS:  # attributes SB3 calls as schedules
                    setattr(self.model, name, FloatSchedule(value))
                elif is_integer_parameter(name) or (isinstance(current, (int, np.integer)) and float(value).is_integer()):
                    setattr(self.model, name, round(value))
                else:
                    setattr(self.model, name, value)
            self.current_values[name] = value
            self.logger.record(f"schedule/{name}", value)
        if self.verbose >= 1:
            print(f"ParameterScheduler at {self.model.num_timesteps} steps: {self.current_values}")

    _on_training_start = _on_rollout_end

    def _on_step(self) -> bool:
        return True


HEALTH_RESPONSES = ("log", "warn", "stop")
DEFAULT_RESPONSES = {"non_finite": "stop", "kl": "warn", "entropy": "warn", "clip_fraction": "warn", "value_loss": "warn"}


class TrainingHealthWarning(RuntimeWarning):
    """Warned by :class:`TrainingHealthGuard` when a condition whose response is ``warn`` or ``stop`` is met."""


class HealthEvent(NamedTuple):
    """A condition :class:`TrainingHealthGuard` found met."""

    timesteps: int
    condition: str
    message: str


class TrainingHealthGuard(_AfterUpdateCallback):
    """
    Watches a run for signs it has gone bad and logs, warns, or saves the model (:func:`save_checkpoint`) and stops.

    :param responses: condition to ``log``, ``warn`` or ``stop``, over the defaults (``non_finite``: ``stop``, else ``warn``)
    :param kl_target: KL target of the ``kl`` check; ``None`` takes the model's ``target_kl``, else ``kl_target``
    :param kl_limit: ``k`` of the ``kl`` check (KL >= k x target), > 0; ``None`` turns it off
    :param kl_key: logger key of the KL; ``None`` takes ``train/kl``, else ``train/approx_kl``
    :param min_entropy: entropy (``train/entropy``, else ``-train/entropy_loss``) below which the policy collapsed
    :param max_clip_fraction: clip fraction above which an update is flagged, in (0, 1]
    :param value_loss_factor: value loss explosion factor over the mean of the last ``value_loss_window`` updates, > 1
    :param value_loss_window: number of previous updates the value-loss reference averages, >= 1
    :param save_path: folder of the checkpoint; ``None`` takes the logger's (without one a stop saves nothing, and warns)
    :param name_prefix: file name prefix of the checkpoint
    :param verbose: 1 prints each condition met
    """

    def __init__(
        self,
        responses: Mapping[str, str] | None = None,
        kl_target: float | None = None,
        kl_limit: float | None = 10.0,
        kl_key: str | None = None,
        min_entropy: float | None = None,
        max_clip_fraction: float | None = None,
        value_loss_factor: float | None = None,
        value_loss_window: int = 10,
        save_path: str | os.PathLike[str] | None = None,
        name_prefix: str = "last_good_model",
        verbose: int = 0,
    ):
        super().__init__(kl_key, verbose)
        if responses is not None and not isinstance(responses, Mapping):
            raise InvalidSettingError(f"responses={responses!r} is invalid: expected a dict of condition -> response")
        self.responses = dict(DEFAULT_RESPONSES)
        for condition, response in (responses or {}).items():
            check_choice("responses key", condition, tuple(DEFAULT_RESPONSES))
            self.responses[condition] = check_choice(f"responses[{condition!r}]", response, HEALTH_RESPONSES)
        self.kl_target = optional_real("kl_target", kl_target, low=0.0)
        self.kl_limit = optional_real("kl_limit", kl_limit, low=0.0)
        self.min_entropy = optional_real("min_entropy", min_entropy)
        self.max_clip_fraction = optional_real("max_clip_fraction", max_clip_fraction, low=0.0, high=1.0)
        self.value_loss_factor = optional_real("value_loss_factor", value_loss_factor, low=1.0)
        self.value_loss_window = check_int("value_loss_window", value_loss_window)
        if save_path is not None and not isinstance(save_path, (str, os.PathLike)):
            raise InvalidSettingError(f"save_path={save_path!r} is invalid: expected a folder path or None")
        if not isinstance(name_prefix, str) or not name_prefix:
            raise InvalidSettingError(f"name_prefix={name_prefix!r} is invalid: expected a non-empty string")
        self.save_path = None if save_path is None else os.fspath(save_path)
        self.name_prefix = name_prefix
        self.events: list[HealthEvent] = []
        self.stopped_by: str | None = None
        self.checkpoint_path: str | None = None
        self.vec_normalize_path: str | None = None
        self._value_losses: deque[float] = deque(maxlen=value_loss_window)
        self._statistics: dict[str, RunningMeanStd | dict[str, RunningMeanStd]] = {}

    def _init_callback(self) -> None:
        super()._init_callback()
        targets = (getattr(self.model, "target_kl", 0.0), getattr(self.model, "kl_target", 0.0))
        self._kl_target = self.kl_target or next((float(value) for value in targets if is_real(value) and value > 0), None)
        self._stop_pending = False

    def _check_update(self) -> None:
        # A copy of the VecNormalize statistics, which a bad step reaches before the guard sees it.
        stats = self.model.get_vec_normalize_env()
        self._statistics = {}
        for name in ("obs_rms", "ret_rms") if stats is not None else ():
            rms = getattr(stats, name, None)  # without norm_obs there is no obs_rms
            if rms is not None:
                self._statistics[name] = {k: v.copy() for k, v in rms.items()} if isinstance(rms, dict) else rms.copy()
        super()._check_update()

    def _trigger(self, condition: str, value: float, message: str) -> None:
        message = f"TrainingHealthGuard at {self.model.num_timesteps} steps: {message}"
        self.events.append(HealthEvent(self.model.num_timesteps, condition, message))
        self.logger.record(f"health/{condition}", value)
        self.logger.info(message)
        if self.verbose >= 1:
            print(message)
        if self.responses[condition] in ("warn", "stop"):
            warnings.warn(message, TrainingHealthWarning, stacklevel=2)
        if self.responses[condition] == "stop" and not self._stop_pending:
            self._stop(condition)

    def _stop(self, condition: str) -> None:
        self._stop_pending = True
        self.stopped_by = condition
        for name, statistics in self._statistics.items():
            setattr(self.model.get_vec_normalize_env(), name, statistics)
        problems = model_state_problems(self.model)
        if problems:  # an update on NaN losses (stock PPO, A2C): the next action needs those weights
            advice = "nothing to save or to train on; resume from the newest checkpoint of AtomicCheckpointCallback"
            raise FloatingPointError(
                f"TrainingHealthGuard at {self.model.num_timesteps} steps: {'; '.join(problems)}; {advice}"
            )
        folder = self.save_path or self.logger.get_dir()
        if folder is None:
            message = "TrainingHealthGuard: no save_path and no logger folder, the stopped model was not saved"
            warnings.warn(message, TrainingHealthWarning, stacklevel=3)
            return
        checkpoint = save_checkpoint(self.model, folder, self.name_prefix)
        assert checkpoint is not None  # its state is finite
        self.checkpoint_path = str(checkpoint.model_path)
        self.vec_normalize_path = None if checkpoint.vec_normalize_path is None else str(checkpoint.vec_normalize_path)
        if self.verbose >= 1:
            print(f"TrainingHealthGuard: saved the model to {self.checkpoint_path}")

    def _on_step(self) -> bool:
        problem = None if self._stop_pending else self._step_problem()
        if problem is not None:
            self._trigger("non_finite", *problem)
        return not self._stop_pending

    def _step_problem(self) -> tuple[float, str] | None:
        """``(value, message)`` for non-finite step data, or returns whose squares over a minibatch overflow float32."""
        if non_finite_entries(self.locals.get("new_obs")):
            return float("nan"), "non-finite new_obs from the environment or policy"
        rewards = np.abs(np.asarray(self.locals.get("rewards", 0.0), dtype=np.float64))
        values = self.locals.get("values")
        reward = float(rewards.max()) if rewards.size else 0.0  # NaN if any is NaN
        value = float(values.abs().max()) if isinstance(values, th.Tensor) and values.numel() else 0.0
        for what, largest in (("rewards", reward), ("values", value)):
            if not math.isfinite(largest):
                return float("nan"), f"non-finite {what} from the environment or policy"
        infos = self.locals.get("infos") or []
        if any(non_finite_entries(info["terminal_observation"]) for info in infos if "terminal_observation" in info):
            return float("nan"), "non-finite terminal observation"
        gamma = float(getattr(self.model, "gamma", 0.99))
        n_steps = int(getattr(self.model, "n_steps", 1))
        bound = reward * (n_steps if gamma >= 1.0 else min(n_steps, 1.0 / (1.0 - gamma))) + value
        samples = int(getattr(self.model, "batch_size", None) or n_steps * self.model.n_envs)
        if bound * bound * samples <= FLOAT32_MAX:
            return None
        return bound, (
            f"rewards up to {reward:.3g} and value predictions up to {value:.3g} overflow the update: returns of up to "
            f"{bound:.3g}, squared over a {samples}-sample minibatch, exceed float32's maximum {FLOAT32_MAX:.3g}"
        )

    def _on_update_end(self) -> None:
        values = self.logger.name_to_value
        bad_losses = [key for key in ("train/loss", "train/value_loss") if key in values and not math.isfinite(values[key])]
        if not all(bool(th.isfinite(param).all()) for param in self.model.policy.parameters()):
            self._trigger("non_finite", float("nan"), "non-finite policy parameters after the update")
        elif bad_losses:
            self._trigger("non_finite", float("nan"), f"non-finite {', '.join(bad_losses)} in the update")
        measured = self._measured_kl()
        if measured is not None and self._kl_target is not None and self.kl_limit is not None:
            key, kl = measured
            if kl >= self.kl_limit * self._kl_target:
                self._trigger("kl", kl, f"{key}={kl:.4g} >= {self.kl_limit:g} x target {self._kl_target:g}")
        entropy = values.get("train/entropy", -values["train/entropy_loss"] if "train/entropy_loss" in values else None)
        if self.min_entropy is not None and entropy is not None and entropy < self.min_entropy:
            self._trigger("entropy", float(entropy), f"entropy {entropy:.4g} < min_entropy {self.min_entropy:g}")
        clip_fraction = values.get("train/clip_fraction")
        if self.max_clip_fraction is not None and clip_fraction is not None and clip_fraction > self.max_clip_fraction:
            message = f"train/clip_fraction {clip_fraction:.4g} > max_clip_fraction {self.max_clip_fraction:g}"
            self._trigger("clip_fraction", float(clip_fraction), message)
        value_loss = values.get("train/value_loss")
        if value_loss is not None and math.isfinite(value_loss):
            reference = float(np.mean(self._value_losses)) if self._value_losses else 0.0
            if self.value_loss_factor is not None and reference > 0 and value_loss > self.value_loss_factor * reference:
                message = f"train/value_loss {value_loss:.4g} > {self.value_loss_factor:g} x recent mean {reference:.4g}"
                self._trigger("value_loss", float(value_loss), message)
            self._value_losses.append(float(value_loss))


class ActionMonitor(BaseCallback):
    """
    Per-rollout, per-dimension statistics of the ``Box`` actions the env received: ``actions/...``, :attr:`last_stats`.

    :param bound_tolerance: distance to a bound that counts as at the bound, as a fraction of the range, in [0, 0.5)
    :param histograms: whether to write TensorBoard histograms when a TensorBoard logger is configured
    :param verbose: verbosity level
    """

    def __init__(self, bound_tolerance: float = 0.005, histograms: bool = True, verbose: int = 0):
        super().__init__(verbose=verbose)
        self.bound_tolerance = check_real("bound_tolerance", bound_tolerance, low=0.0, strict=False)
        if self.bound_tolerance >= 0.5:
            raise InvalidSettingError(f"bound_tolerance={bound_tolerance!r} is invalid: expected a fraction in [0, 0.5)")
        if not isinstance(histograms, bool):
            raise InvalidSettingError(f"histograms={histograms!r} is invalid: expected True or False")
        self.histograms = histograms
        self.last_stats: dict[str, np.ndarray] = {}
        self._env_actions: list[np.ndarray] = []
        self._pre_squash: list[np.ndarray] = []

    def _init_callback(self) -> None:
        space = self.model.action_space
        if not isinstance(space, spaces.Box):
            raise ValueError(f"ActionMonitor needs a Box action space; {type(self.model).__name__} has {space!r}")
        self._low = np.asarray(space.low, dtype=np.float64).reshape(-1)
        self._high = np.asarray(space.high, dtype=np.float64).reshape(-1)

    def _on_rollout_start(self) -> None:
        self._env_actions, self._pre_squash = [], []

    def _on_step(self) -> bool:
        self._env_actions.append(np.array(self.locals["clipped_actions"], dtype=np.float64).reshape(-1, self._low.size))
        if self.model.policy.squash_output:
            self._pre_squash.append(np.array(self.locals["actions"], dtype=np.float64).reshape(-1, self._low.size))
        return True

    @staticmethod
    def _moments(actions: np.ndarray) -> dict[str, np.ndarray]:
        return {name: getattr(actions, name)(axis=0) for name in ("mean", "std", "min", "max")}

    def action_stats(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        """Moments and ``at_low`` / ``at_high`` / ``at_bounds`` fractions per dimension of ``actions``, ``at_bounds_all``."""
        margin = self.bound_tolerance * (self._high - self._low)  # SB3 requires finite bounds for Box actions
        at_low, at_high = actions <= self._low + margin, actions >= self._high - margin
        at_bounds = at_low | at_high
        bounds = {"at_low": at_low.mean(axis=0), "at_high": at_high.mean(axis=0), "at_bounds": at_bounds.mean(axis=0)}
        return {**self._moments(actions), **bounds, "at_bounds_all": np.asarray(at_bounds.mean())}

    def _on_rollout_end(self) -> None:
        if not self._env_actions:
            return
        env_actions = np.concatenate(self._env_actions)
        stats = self.action_stats(env_actions)
        pre_squash = np.concatenate(self._pre_squash) if self._pre_squash else None
        if pre_squash is not None:
            stats.update({f"pre_squash_{key}": value for key, value in self._moments(pre_squash).items()})
        self.last_stats = stats
        self.logger.record("actions/at_bounds", float(stats["at_bounds_all"]))
        for key, value in stats.items():
            for dim, item in enumerate(value if key != "at_bounds_all" else []):
                self.logger.record(f"actions/{key}_{dim}", float(item))
        writer = _tensorboard_writer(self) if self.histograms else None
        if writer is not None:
            for dim in range(env_actions.shape[1]):
                writer.add_histogram(f"actions/dim_{dim}", env_actions[:, dim], self.num_timesteps)
                if pre_squash is not None:
                    writer.add_histogram(f"actions/pre_squash_dim_{dim}", pre_squash[:, dim], self.num_timesteps)
            writer.flush()


class OptunaPruningCallback(EvalCallback):
    """
    ``EvalCallback`` reporting its ``i``-th mean reward to an Optuna trial as step ``i``, stopping when pruned.

    :param trial: the ``optuna.Trial`` to report to
    :param eval_env: the environment used for evaluation
    :param n_eval_episodes: episodes per evaluation, >= 1
    :param eval_freq: evaluate every ``eval_freq`` calls of the callback (steps of the vectorised env), >= 1
    :param deterministic: whether to evaluate the deterministic policy
    :param raise_pruned: raise ``optuna.TrialPruned`` when pruned instead of only stopping training
    :param verbose: verbosity level
    :param eval_kwargs: further keyword arguments of ``EvalCallback`` (``log_path``, ``best_model_save_path``, ...)
    """

    def __init__(
        self,
        trial: optuna.Trial,
        eval_env: gym.Env | VecEnv,
        n_eval_episodes: int = 5,
        eval_freq: int = 10000,
        deterministic: bool = True,
        raise_pruned: bool = False,
        verbose: int = 0,
        **eval_kwargs: Any,
    ):
        if not (callable(getattr(trial, "report", None)) and callable(getattr(trial, "should_prune", None))):
            raise InvalidSettingError(f"trial={trial!r} is invalid: expected an optuna.Trial (with report and should_prune)")
        n_eval_episodes, eval_freq = check_int("n_eval_episodes", n_eval_episodes), check_int("eval_freq", eval_freq)
        eval_kwargs.update(n_eval_episodes=n_eval_episodes, eval_freq=eval_freq, deterministic=deterministic, verbose=verbose)
        super().__init__(eval_env, **eval_kwargs)
        self.trial = trial
        self.raise_pruned = raise_pruned
        self.eval_idx = 0
        self.is_pruned = False

    def _on_step(self) -> bool:
        if self.n_calls % self.eval_freq != 0:
            return True
        continue_training = super()._on_step()
        self.eval_idx += 1
        self.trial.report(self.last_mean_reward, self.eval_idx)
        if not self.trial.should_prune():
            return continue_training
        self.is_pruned = True
        if self.raise_pruned:
            import optuna

            raise optuna.TrialPruned(f"pruned at evaluation {self.eval_idx} ({self.num_timesteps} steps)")
        return False


DEFAULT_HPARAMS = tuple(
    "learning_rate n_steps batch_size n_epochs gamma gae_lambda clip_range clip_range_vf normalize_advantage ent_coef "
    "vf_coef max_grad_norm target_kl use_sde n_envs seed vf_clip_mode kl_coef kl_target".split()
)
DEFAULT_METRICS = ("rollout/ep_rew_mean", "rollout/ep_len_mean", "train/value_loss")


def _hparam_value(value: object) -> bool | int | float | str:
    """A value TensorBoard's HParams accepts; schedules are shown by their start value."""
    value = value(1.0) if callable(value) else value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if is_real(value):
        return value.item() if isinstance(value, np.generic) else value  # type: ignore[return-value]
    return str(value)


class HParamsWarning(UserWarning):
    """Issued by :class:`HParamsCallback` when the model has no TensorBoard logger to write to."""


class HParamsCallback(BaseCallback):
    """
    Writes the run's hyperparameters and the final value of each metric to TensorBoard's HParams tab.

    :param hparams: model attribute names to record; ``None`` for a default PPO/PPOExt/A2C list
    :param extra_hparams: further ``name: value`` pairs (env id, seed, ...)
    :param metrics: logger keys shown as metrics in the HParams tab
    :param verbose: verbosity level
    """

    def __init__(
        self,
        hparams: Sequence[str] | None = None,
        extra_hparams: Mapping[str, Any] | None = None,
        metrics: Sequence[str] = DEFAULT_METRICS,
        verbose: int = 0,
    ):
        super().__init__(verbose=verbose)
        for name, names in (("hparams", hparams), ("metrics", metrics)):
            if names is not None and (isinstance(names, str) or not all(isinstance(item, str) for item in names)):
                raise InvalidSettingError(f"{name}={names!r} is invalid: expected a list of names")
        if not metrics:
            raise InvalidSettingError(f"metrics={metrics!r} is invalid: expected at least one logger key")
        if extra_hparams is not None and not isinstance(extra_hparams, Mapping):
            raise InvalidSettingError(f"extra_hparams={extra_hparams!r} is invalid: expected a dict")
        self.hparams = tuple(DEFAULT_HPARAMS if hparams is None else hparams)
        self.extra_hparams = dict(extra_hparams or {})
        self.metrics = tuple(metrics)
        self.final_metrics: dict[str, float] = {}

    def hparam_dict(self) -> dict[str, bool | int | float | str]:
        """The hyperparameters recorded for the model."""
        values = {name: getattr(self.model, name) for name in self.hparams if hasattr(self.model, name)}
        return {"algo": type(self.model).__name__, **{k: _hparam_value(v) for k, v in (values | self.extra_hparams).items()}}

    def _on_training_start(self) -> None:
        if _tensorboard_writer(self) is None:
            message = f"HParamsCallback: {type(self.model).__name__} has no TensorBoard logger, so nothing is written"
            warnings.warn(f"{message}; pass tensorboard_log=... (pip install '.[tensorboard]')", HParamsWarning, stacklevel=2)
        metric_dict = {metric: 0.0 for metric in self.metrics}
        self.logger.record("hparams", HParam(self.hparam_dict(), metric_dict), exclude=("stdout", "log", "json", "csv"))

    def _on_rollout_end(self) -> None:
        # The logger's last value (before the coming dump clears it), else the episodes' mean.
        episodes = self.model.ep_info_buffer
        for metric in self.metrics:
            key = {"rollout/ep_rew_mean": "r", "rollout/ep_len_mean": "l"}.get(metric)
            if metric in self.logger.name_to_value:
                self.final_metrics[metric] = float(self.logger.name_to_value[metric])
            elif key is not None and episodes:
                self.final_metrics[metric] = float(np.mean([info[key] for info in episodes]))

    def _on_training_end(self) -> None:
        self._on_rollout_end()
        writer = _tensorboard_writer(self)
        if writer is not None:
            for metric, value in self.final_metrics.items():
                writer.add_scalar(metric, value, self.num_timesteps)
            writer.flush()

    def _on_step(self) -> bool:
        return True


__all__ = [
    "ActionMonitor",
    "HParamsCallback",
    "HParamsWarning",
    "KLAdaptiveLR",
    "OptunaPruningCallback",
    "ParameterScheduler",
    "TrainingHealthGuard",
    "TrainingHealthWarning",
]
