"""
Callbacks for SB3 on-policy training: a KL-adaptive learning rate, schedules for any numeric
training attribute, a training-health guard, action monitoring, Optuna pruning and TensorBoard
hyperparameters.

Every callback works with :class:`sb3_ppo_ext.ppo_ext.PPOExt` and with stock ``stable_baselines3.PPO``
(and ``A2C`` where the quantity it needs exists), composes with ``CallbackList`` and
``EvalCallback``, and takes only plain keyword arguments, so it can be named in an rl-zoo3
hyperparameter file::

    callback:
      - sb3_ppo_ext.callbacks.KLAdaptiveLR: {target_kl: 0.01}

Importing this module does not import optuna; :class:`OptunaPruningCallback` imports it when used.

On-policy ``learn`` runs, per iteration, ``collect_rollouts`` (``on_rollout_start``, one
``on_step`` per env step, ``on_rollout_end``), then ``dump_logs``, then ``train()``. No callback
hook follows ``train()``: what it recorded stays in ``logger.name_to_value`` until the next dump,
which comes after the next rollout. Callbacks that act "after each update" therefore run at the
next ``on_rollout_start`` and at ``on_training_end`` (after the last update), once per update
(detected by a change of ``model._n_updates``).
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.logger import HParam, TensorBoardOutputFormat
from stable_baselines3.common.utils import FloatSchedule, update_learning_rate
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_ext.reliability import model_state_problems, non_finite_entries, save_checkpoint
from sb3_ppo_ext.schedules import ParameterSchedule  # re-exported: ``from sb3_ppo_ext.callbacks import ParameterSchedule``
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


# The shared validators (one copy, in sb3_ppo_ext.validation), under the names this module uses.
_is_number = is_real
_check_finite = check_real
_optional = optional_real
_check_positive_int = check_int
_check_choice = check_choice


def _measured_kl(logger_values: Mapping[str, Any], kl_key: str | None) -> tuple[str, float] | None:
    """The KL train() just recorded: ``kl_key``, else ``train/kl`` (PPOExt, analytic), else ``train/approx_kl`` (PPO)."""
    keys = (kl_key,) if kl_key is not None else ("train/kl", "train/approx_kl")
    for key in keys:
        if key in logger_values:
            return key, float(logger_values[key])
    return None


def _all_finite(value: Any) -> bool:
    """Whether every floating-point entry of an array, tensor, number or dict of them is finite."""
    return not non_finite_entries(value)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _tensorboard_writer(callback: BaseCallback) -> Any | None:
    """The SummaryWriter of the model's logger, or None when no TensorBoard output is configured."""
    for output_format in callback.logger.output_formats:
        if isinstance(output_format, TensorBoardOutputFormat):
            return output_format.writer
    return None


class _AfterUpdateCallback(BaseCallback):
    """
    Base for callbacks that act once after each ``train()``, on what it recorded.

    :meth:`_on_update_end` runs at the ``on_rollout_start`` following an update and at
    ``on_training_end`` (after the last update of a ``learn``), when ``model._n_updates`` changed;
    ``logger.name_to_value`` then still holds the update's ``train/`` records.
    Subclasses overriding ``_init_callback``, ``_on_rollout_start`` or ``_on_training_end`` call ``super()``.
    """

    def _init_callback(self) -> None:
        self._seen_n_updates = self.model._n_updates

    def _check_update(self) -> None:
        if self.model._n_updates != self._seen_n_updates:
            self._seen_n_updates = self.model._n_updates
            self._on_update_end()

    def _on_rollout_start(self) -> None:
        self._check_update()

    def _on_training_end(self) -> None:
        self._check_update()

    def _on_update_end(self) -> None:
        """Called once after each update, with its ``train/`` records in ``self.logger.name_to_value``."""

    def _on_step(self) -> bool:
        return True


class KLAdaptiveLR(_AfterUpdateCallback):
    """
    Learning rate driven by the KL measured after each update (as in rl_games and skrl).

    After each update, with ``d`` the measured ``KL(pi_old || pi_new)``: ``d > kl_factor * target_kl``
    divides the learning rate by ``lr_factor``, ``d < target_kl / kl_factor`` multiplies it by
    ``lr_factor``; the rate is kept within ``[min_lr, max_lr]``. The rate starts from the model's
    current one (clamped into the bounds), so a callback attached after ``load`` resumes.

    The adapted rate replaces the model's schedule: the callback sets ``model.learning_rate`` and
    ``model.lr_schedule`` to the adapted constant and updates the optimizer. ``train()`` therefore
    applies it (and records it as ``train/learning_rate``) instead of resetting the rate from the
    original schedule, and ``save`` / ``load`` keep it (``load`` rebuilds ``lr_schedule`` from
    ``learning_rate``).

    With per-network rates (``policy_kwargs["learning_rates"]``) the callback adapts both
    proportionally: it adapts the actor's rate (``pi``, within ``[min_lr, max_lr]``) and sets the
    critic's (``vf``) to it times the ratio of their schedules' initial values (at progress 1, where
    every rate is positive), replacing both schedules by constants (``policy.replace_learning_rates``,
    and ``model.policy_kwargs`` so that ``save`` / ``load`` keep them); ``train()`` applies and records
    them as ``train/learning_rate_pi`` and ``train/learning_rate_vf``.

    :param target_kl: Target KL per update, > 0
    :param kl_factor: Tolerance band: the rate changes only when the KL leaves
        ``[target_kl / kl_factor, target_kl * kl_factor]`` (rl_games: 2), > 1
    :param lr_factor: Multiplicative step of the learning rate (rl_games: 1.5), > 1
    :param min_lr: Lower bound of the learning rate, > 0
    :param max_lr: Upper bound of the learning rate, >= ``min_lr``
    :param kl_key: Logger key of the measured KL; ``None`` (default) takes ``train/kl`` (PPOExt's
        analytic mean KL) when present, else ``train/approx_kl`` (stock PPO's estimate)
    :param verbose: Verbosity level: 0 no output, 1 a line per change of the learning rate
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
        super().__init__(verbose=verbose)
        self.target_kl = _check_finite("target_kl", target_kl, low=0.0)
        self.kl_factor = _check_finite("kl_factor", kl_factor, low=1.0)
        self.lr_factor = _check_finite("lr_factor", lr_factor, low=1.0)
        self.min_lr = _check_finite("min_lr", min_lr, low=0.0)
        self.max_lr = _check_finite("max_lr", max_lr, low=0.0)
        if self.max_lr < self.min_lr:
            raise ValueError(f"max_lr={max_lr!r} is invalid: expected max_lr >= min_lr={min_lr!r}")
        if kl_key is not None and not isinstance(kl_key, str):
            raise ValueError(f"kl_key={kl_key!r} is invalid: expected a logger key such as 'train/kl', or None")
        self.kl_key = kl_key
        self.learning_rate = float("nan")
        self._vf_ratio: float | None = None

    def _init_callback(self) -> None:
        super()._init_callback()
        progress = self.model._current_progress_remaining
        schedules = getattr(self.model.policy, "learning_rate_schedules", None)
        if schedules is None:
            current = float(self.model.lr_schedule(progress))
            self._vf_ratio = None
        else:  # per-network rates: the callback adapts the actor's, the critic's keeps its initial ratio to it
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
        policy: Any = self.model.policy  # a policy of this package (it has learning_rate_schedules)
        policy.replace_learning_rates(rates)
        # What save/load rebuilds the policy from (a new dict: the caller's policy_kwargs stay as given).
        self.model.policy_kwargs = {**self.model.policy_kwargs, "learning_rates": rates}

    def next_learning_rate(self, kl: float) -> float:
        """
        The learning rate after an update that measured ``kl``.

        :param kl: Measured KL of the update
        :return: The new learning rate
        """
        learning_rate = self.learning_rate
        if kl > self.target_kl * self.kl_factor:
            learning_rate /= self.lr_factor
        elif kl < self.target_kl / self.kl_factor:
            learning_rate *= self.lr_factor
        return min(max(learning_rate, self.min_lr), self.max_lr)

    def _on_update_end(self) -> None:
        measured = _measured_kl(self.logger.name_to_value, self.kl_key)
        if measured is None:
            wanted = self.kl_key or "'train/kl' or 'train/approx_kl'"
            raise ValueError(
                f"KLAdaptiveLR(kl_key={self.kl_key!r}): the update recorded no {wanted}; "
                f"{type(self.model).__name__} does not log that KL (A2C logs none)"
            )
        key, kl = measured
        if not math.isfinite(kl):
            return
        learning_rate = self.next_learning_rate(kl)
        if learning_rate != self.learning_rate and self.verbose >= 1:
            print(f"KLAdaptiveLR: {key}={kl:.3g}, learning rate {self.learning_rate:.3g} -> {learning_rate:.3g}")
        self._set_learning_rate(learning_rate)


class ParameterScheduler(BaseCallback):
    """
    Schedules for any numeric training attribute of the model (``ent_coef``, ``clip_range``,
    ``clip_range_vf``, ``vf_coef``, ``target_kl``, ``max_grad_norm``, PPOExt's ``kl_target``,
    ``n_epochs``, ``learning_rate``, ...), each value logged as ``schedule/<name>``.

    Values are set at the start of training and at the end of each rollout, i.e. just before the
    ``train()`` that uses them, from the progress that ``train()`` sees
    (``num_timesteps / total_timesteps``) or from ``num_timesteps``. Attributes that SB3 calls as
    schedules (``clip_range``, ``clip_range_vf``, or any currently callable one) receive constant
    schedules; ``n_epochs`` and ``batch_size`` are rounded, and so is any value that is a whole
    number for an attribute that holds an int (otherwise it becomes a float); ``learning_rate`` sets ``model.learning_rate``,
    ``model.lr_schedule`` and the optimizer (do not combine it with :class:`KLAdaptiveLR`); with
    per-network rates (``policy_kwargs["learning_rates"]``) it is an error at the start of training, as
    the optimizer then follows those rates (give each its own schedule there).
    ``kl_coef`` schedules a fixed beta (each update uses the scheduled value, see
    ``ExtUpdateEngine._live_kl_coef``); with ``kl_target`` set it is an error at the start of
    training, as ``kl_coef`` is then only the adaptive beta's initial value.

    Example (yml): ``schedules: {ent_coef: {kind: linear, start: 0.01, end: 0.0}}``.

    :param schedules: Attribute name to a :class:`ParameterSchedule`, a dict of its keywords, or
        an SB3-style callable of the progress remaining (from 1 to 0)
    :param verbose: Verbosity level: 0 no output, 1 the values at each update
    """

    def __init__(
        self,
        schedules: Mapping[str, ParameterSchedule | Mapping[str, Any] | Callable[[float], float]],
        verbose: int = 0,
    ):
        super().__init__(verbose=verbose)
        if not isinstance(schedules, Mapping) or not schedules:
            raise ValueError(f"schedules={schedules!r} is invalid: expected a non-empty dict of attribute name -> schedule")
        for name in schedules:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"schedules={dict(schedules)!r} is invalid: {name!r} is not an attribute name")
        self.schedules = {name: ParameterSchedule.from_spec(name, spec) for name, spec in schedules.items()}
        for name, schedule in self.schedules.items():
            if isinstance(schedule, ParameterSchedule):
                for extreme in schedule.extremes():
                    problem = scheduled_value_problem(name, extreme)
                    if problem is not None:
                        raise InvalidSettingError(
                            f"schedules[{name!r}]={schedule!r} is invalid: it would set {name}={extreme!r}; {name}: {problem}"
                        )
        self.current_values: dict[str, float] = {}

    def _init_callback(self) -> None:
        for name in self.schedules:
            if name == "learning_rate":
                rates = getattr(self.model.policy, "learning_rates", None)
                if rates is not None:
                    raise InvalidSettingError(
                        f"schedules['learning_rate'] is invalid with policy_kwargs.learning_rates={rates!r}: the optimizer "
                        "follows the actor's and the critic's own rates, not learning_rate; give each its schedule there "
                        "(e.g. {'pi': 'lin_3e-4', 'vf': 'lin_1e-3'})"
                    )
                continue
            if not hasattr(self.model, name):
                raise ValueError(
                    f"schedules[{name!r}] is invalid: {type(self.model).__name__} has no attribute {name!r} to schedule"
                )
            current = getattr(self.model, name)
            if not (current is None or callable(current) or _is_number(current)):
                raise ValueError(
                    f"schedules[{name!r}] is invalid: {type(self.model).__name__}.{name}={current!r} is not numeric"
                )
            kl_target = getattr(self.model, "kl_target", None)
            if name == "kl_coef" and kl_target is not None:
                # A fixed beta is kl_coef (each update uses the scheduled value); an adaptive one only starts there.
                raise InvalidSettingError(
                    f"schedules['kl_coef'] is invalid with kl_target={kl_target!r}: kl_coef is only the "
                    "initial beta of the adaptive penalty, which then adapts; schedule kl_target instead, or use a "
                    "fixed beta (kl_target=None), whose beta is kl_coef"
                )

    def value(self, name: str) -> float:
        """
        The scheduled value of ``name`` at the model's current timesteps.

        :param name: A scheduled attribute
        :return: Its value now
        """
        schedule = self.schedules[name]
        total = max(float(self.model._total_timesteps), 1.0)
        progress_remaining = 1.0 - float(self.model.num_timesteps) / total
        if not isinstance(schedule, ParameterSchedule):
            return float(schedule(progress_remaining))
        if schedule.by == "timesteps":
            return schedule(float(self.model.num_timesteps))
        return schedule(1.0 - progress_remaining)

    def _apply(self) -> None:
        for name in self.schedules:
            value = self.value(name)
            problem = scheduled_value_problem(name, value)
            if problem is not None:  # a callable schedule, which cannot be checked in advance
                raise InvalidSettingError(
                    f"ParameterScheduler: schedules[{name!r}] gives {name}={value!r} at {self.model.num_timesteps} steps; "
                    f"{name}: {problem}"
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

    def _on_training_start(self) -> None:
        self._apply()

    def _on_rollout_end(self) -> None:
        self._apply()

    def _on_step(self) -> bool:
        return True


HEALTH_CONDITIONS = ("non_finite", "kl", "entropy", "clip_fraction", "value_loss")
HEALTH_RESPONSES = ("log", "warn", "stop")
DEFAULT_RESPONSES = {"non_finite": "stop", "kl": "warn", "entropy": "warn", "clip_fraction": "warn", "value_loss": "warn"}


class TrainingHealthWarning(RuntimeWarning):
    """Warned by :class:`TrainingHealthGuard` when a condition whose response is ``warn`` or ``stop`` is met."""


class TrainingHealthGuard(_AfterUpdateCallback):
    """
    Watches a run for signs it has gone bad and logs, warns, or saves the model and stops.

    Conditions (keys of ``responses``):

    - ``non_finite``: a NaN/inf in the env's observations (terminal ones included) or rewards or
      in the value predictions, or rewards / value predictions so large that the update's float32
      losses would overflow to inf (squared returns over a minibatch above float32's maximum, e.g.
      a reward of 1e30), checked at every step so that training stops before ``train()`` sees it;
      a non-finite parameter or ``train/loss`` / ``train/value_loss`` after an update;
    - ``kl``: the update's KL (``train/kl``, else ``train/approx_kl``) ``>= kl_limit * target``,
      the target being ``kl_target`` or else the model's ``target_kl`` or PPOExt's ``kl_target``
      (the check is off when there is none);
    - ``entropy``: ``train/entropy`` (else ``-train/entropy_loss``) below ``min_entropy``;
    - ``clip_fraction``: ``train/clip_fraction`` above ``max_clip_fraction``;
    - ``value_loss``: ``train/value_loss`` above ``value_loss_factor`` times the mean of the
      previous ``value_loss_window`` updates' value losses.

    Responses: ``log`` records ``health/<condition>`` (the offending value) and a logger info line;
    ``warn`` also warns a :class:`TrainingHealthWarning`; ``stop`` also saves the model and stops ``learn``.
    The step checks stop before ``train()`` sees the bad step, so the model saved then is the last good update's,
    with the ``VecNormalize`` statistics as that update left them (the bad step had already reached them: the guard
    keeps a copy of the statistics at each rollout start, never of the policy or the optimizer). The checks after an
    update stop at the first step of the next rollout and save the model as that update left it; to keep the state
    before each update, run :class:`sb3_ppo_ext.reliability.AtomicCheckpointCallback` with ``save_freq=n_steps``
    beside the guard. The save (:func:`sb3_ppo_ext.reliability.save_checkpoint`) writes
    ``<save_path>/<name_prefix>_<timesteps>_steps.zip`` (:attr:`checkpoint_path`) after the ``VecNormalize``
    statistics (:attr:`vec_normalize_path`), atomically. An update that left NaN / inf weights (stock PPO or A2C on
    NaN losses; PPOExt raises :class:`sb3_ppo_ext.engine.NonFiniteLossError` from ``train()`` before a non-finite
    loss reaches the weights) leaves nothing to save or to act with: a stop then raises ``FloatingPointError``.

    :param responses: Condition to ``log``, ``warn`` or ``stop``, merged over the defaults
        (``non_finite``: ``stop``, all others: ``warn``)
    :param kl_target: KL target of the ``kl`` check; ``None`` takes the model's
    :param kl_limit: ``k`` of the ``kl`` check (KL >= k x target), > 0; ``None`` turns it off
    :param kl_key: Logger key of the KL; ``None`` takes ``train/kl``, else ``train/approx_kl``
    :param min_entropy: Entropy below which the policy has collapsed; ``None`` (default) off
    :param max_clip_fraction: Clip fraction above which an update is flagged, in (0, 1]; ``None`` (default) off
    :param value_loss_factor: Explosion factor of the value loss, > 1; ``None`` (default) off
    :param value_loss_window: Number of previous updates the value-loss reference averages, >= 1
    :param save_path: Folder of the checkpoint; ``None`` takes the logger's folder, and without one
        a stop saves nothing (and warns)
    :param name_prefix: File name prefix of the checkpoint
    :param verbose: Verbosity level: 0 no output, 1 a line per triggered condition
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
        save_path: str | None = None,
        name_prefix: str = "last_good_model",
        verbose: int = 0,
    ):
        super().__init__(verbose=verbose)
        self.responses = dict(DEFAULT_RESPONSES)
        if responses is not None:
            if not isinstance(responses, Mapping):
                raise ValueError(f"responses={responses!r} is invalid: expected a dict of condition -> response")
            for condition, response in responses.items():
                _check_choice("responses key", condition, HEALTH_CONDITIONS)
                self.responses[condition] = _check_choice(f"responses[{condition!r}]", response, HEALTH_RESPONSES)
        self.kl_target = _optional("kl_target", kl_target, low=0.0)
        self.kl_limit = _optional("kl_limit", kl_limit, low=0.0)
        if kl_key is not None and not isinstance(kl_key, str):
            raise ValueError(f"kl_key={kl_key!r} is invalid: expected a logger key such as 'train/kl', or None")
        self.kl_key = kl_key
        self.min_entropy = _optional("min_entropy", min_entropy)
        self.max_clip_fraction = _optional("max_clip_fraction", max_clip_fraction, low=0.0, high=1.0)
        self.value_loss_factor = _optional("value_loss_factor", value_loss_factor, low=1.0)
        self.value_loss_window = _check_positive_int("value_loss_window", value_loss_window)
        if save_path is not None and not isinstance(save_path, (str, os.PathLike)):
            raise ValueError(f"save_path={save_path!r} is invalid: expected a folder path or None")
        self.save_path = None if save_path is None else os.fspath(save_path)
        if not isinstance(name_prefix, str) or not name_prefix:
            raise ValueError(f"name_prefix={name_prefix!r} is invalid: expected a non-empty string")
        self.name_prefix = name_prefix
        #: ``(timesteps, condition, message)`` of every condition met.
        self.events: list[tuple[int, str, str]] = []
        #: The condition that stopped training, if any.
        self.stopped_by: str | None = None
        #: The checkpoint saved by a stop, if any.
        self.checkpoint_path: str | None = None
        self._stop_pending = False
        self._value_losses: deque[float] = deque(maxlen=value_loss_window)
        #: The VecNormalize statistics saved by a stop, if the training env is normalised.
        self.vec_normalize_path: str | None = None
        self._statistics: dict[str, Any] = {}

    def _init_callback(self) -> None:
        super()._init_callback()
        self._kl_target = self.kl_target
        if self._kl_target is None:
            for name in ("target_kl", "kl_target"):
                value: Any = getattr(self.model, name, None)
                if _is_number(value) and value > 0:
                    self._kl_target = float(value)
                    break
        self._stop_pending = False

    def _check_update(self) -> None:
        # Between rollouts: keep the VecNormalize statistics, which a bad step reaches before the guard sees it.
        vec_normalize = self.model.get_vec_normalize_env()
        names = ("obs_rms", "ret_rms") if vec_normalize is not None else ()  # without norm_obs there is no obs_rms
        self._statistics = {
            name: copy.deepcopy(getattr(vec_normalize, name)) for name in names if hasattr(vec_normalize, name)
        }
        super()._check_update()

    def _trigger(self, condition: str, value: float, message: str) -> None:
        response = self.responses[condition]
        message = f"TrainingHealthGuard at {self.model.num_timesteps} steps: {message}"
        self.events.append((self.model.num_timesteps, condition, message))
        self.logger.record(f"health/{condition}", value)
        self.logger.info(message)
        if self.verbose >= 1:
            print(message)
        if response in ("warn", "stop"):
            warnings.warn(message, TrainingHealthWarning, stacklevel=2)
        if response == "stop" and not self._stop_pending:
            self._stop(condition)

    def _stop(self, condition: str) -> None:
        self._stop_pending = True
        self.stopped_by = condition
        vec_normalize = self.model.get_vec_normalize_env()
        for name, statistics in self._statistics.items():
            setattr(vec_normalize, name, statistics)
        problems = model_state_problems(self.model)
        if problems:  # an update on NaN losses (stock PPO, A2C): the next action needs those weights
            raise FloatingPointError(
                f"TrainingHealthGuard at {self.model.num_timesteps} steps: {'; '.join(problems)} after the update, "
                "nothing to save or to train on; resume from the newest checkpoint of AtomicCheckpointCallback "
                "(sb3_ppo_ext.reliability.resume)"
            )
        folder = self.save_path or self.logger.get_dir()
        if folder is None:
            warnings.warn(
                "TrainingHealthGuard: no save_path and no logger folder, the stopped model was not saved",
                TrainingHealthWarning,
                stacklevel=3,
            )
            return
        checkpoint = save_checkpoint(self.model, folder, self.name_prefix)
        assert checkpoint is not None  # its state is finite
        self.checkpoint_path = str(checkpoint.model_path)
        self.vec_normalize_path = None if checkpoint.vec_normalize_path is None else str(checkpoint.vec_normalize_path)
        if self.verbose >= 1:
            print(f"TrainingHealthGuard: saved the model to {self.checkpoint_path}")

    def _on_step(self) -> bool:
        if not self._stop_pending:
            problem = self._step_problem()
            if problem is not None:
                self._trigger("non_finite", *problem)
        return not self._stop_pending

    def _step_problem(self) -> tuple[float, str] | None:
        """
        NaN / inf in the step's observations (terminal ones included), rewards or value predictions, or finite rewards
        and value predictions large enough to overflow the update's float32 losses.

        A return is at most ``max|reward| * horizon + max|value|`` (``horizon``: ``n_steps``, or
        ``1 / (1 - gamma)`` when shorter); the value loss and the advantage normalisation sum
        squares of such numbers over a minibatch, which overflow once that bound squared, times
        the minibatch size, exceeds float32's maximum.
        """
        if not _all_finite(self.locals.get("new_obs")):
            return float("nan"), "non-finite new_obs from the environment or policy"
        rewards = np.abs(np.asarray(self.locals.get("rewards", 0.0), dtype=np.float64))
        values = self.locals.get("values")
        reward = float(rewards.max()) if rewards.size else 0.0  # NaN if any is NaN
        value = float(th.abs(values).max()) if isinstance(values, th.Tensor) and values.numel() else 0.0
        for what, largest in (("rewards", reward), ("values", value)):
            if not math.isfinite(largest):
                return float("nan"), f"non-finite {what} from the environment or policy"
        if not all(_all_finite(info.get("terminal_observation")) for info in self.locals.get("infos") or []):
            return float("nan"), "non-finite terminal observation"
        gamma = float(getattr(self.model, "gamma", 0.99))
        n_steps = int(getattr(self.model, "n_steps", 1))
        horizon = n_steps if gamma >= 1.0 else min(n_steps, 1.0 / (1.0 - gamma))
        bound = reward * horizon + value
        samples = int(getattr(self.model, "batch_size", None) or n_steps * self.model.n_envs)
        if bound * bound * samples <= FLOAT32_MAX:
            return None
        return bound, (
            f"rewards up to {reward:.3g} and value predictions up to {value:.3g} overflow the update: returns of up to "
            f"{bound:.3g}, squared over a {samples}-sample minibatch, exceed float32's maximum {FLOAT32_MAX:.3g}"
        )

    def _on_update_end(self) -> None:
        values = self.logger.name_to_value
        finite_params = all(bool(th.isfinite(param).all()) for param in self.model.policy.parameters())
        bad_losses = [key for key in ("train/loss", "train/value_loss") if key in values and not math.isfinite(values[key])]
        if not finite_params:
            self._trigger("non_finite", float("nan"), "non-finite policy parameters after the update")
        elif bad_losses:
            self._trigger("non_finite", float("nan"), f"non-finite {', '.join(bad_losses)} in the update")
        measured = _measured_kl(values, self.kl_key)
        if measured is not None and self._kl_target is not None and self.kl_limit is not None:
            key, kl = measured
            if kl >= self.kl_limit * self._kl_target:
                self._trigger("kl", kl, f"{key}={kl:.4g} >= {self.kl_limit:g} x target {self._kl_target:g}")
        entropy = values.get("train/entropy")
        if entropy is None and "train/entropy_loss" in values:
            entropy = -float(values["train/entropy_loss"])
        if self.min_entropy is not None and entropy is not None and entropy < self.min_entropy:
            self._trigger("entropy", float(entropy), f"entropy {entropy:.4g} < min_entropy {self.min_entropy:g}")
        clip_fraction = values.get("train/clip_fraction")
        if self.max_clip_fraction is not None and clip_fraction is not None and clip_fraction > self.max_clip_fraction:
            self._trigger(
                "clip_fraction",
                float(clip_fraction),
                f"train/clip_fraction {clip_fraction:.4g} > max_clip_fraction {self.max_clip_fraction:g}",
            )
        value_loss = values.get("train/value_loss")
        if value_loss is not None and math.isfinite(value_loss):
            if self.value_loss_factor is not None and self._value_losses:
                reference = float(np.mean(self._value_losses))
                if reference > 0 and value_loss > self.value_loss_factor * reference:
                    self._trigger(
                        "value_loss",
                        float(value_loss),
                        f"train/value_loss {value_loss:.4g} > {self.value_loss_factor:g} x recent mean {reference:.4g}",
                    )
            self._value_losses.append(float(value_loss))


class ActionMonitor(BaseCallback):
    """
    Per-rollout statistics of the actions the environment received, per action dimension
    (``Box`` action spaces only), recorded at the end of each rollout:

    - ``actions/mean_<i>``, ``actions/std_<i>``, ``actions/min_<i>``, ``actions/max_<i>``;
    - ``actions/at_low_<i>``, ``actions/at_high_<i>``, ``actions/at_bounds_<i>``: fraction of steps
      within ``bound_tolerance * (high - low)`` of the lower / upper / either bound, and
      ``actions/at_bounds`` over all dimensions;
    - for squashed policies (``policy.squash_output``: PPOExt's default head, SAC-style heads) the
      pre-squash sample the rollout buffer stores: ``actions/pre_squash_{mean,std,min,max}_<i>``.

    With a TensorBoard logger, also histograms ``actions/dim_<i>`` (and ``actions/pre_squash_dim_<i>``).
    The last rollout's statistics are in :attr:`last_stats`.

    :param bound_tolerance: Distance to a bound, as a fraction of the range, that counts as at the
        bound, in [0, 0.5) (default 0.005: ``abs(a) >= 0.99`` in [-1, 1] units, PPOExt's
        ``train/action_saturation`` threshold)
    :param histograms: Whether to write TensorBoard histograms when a TensorBoard logger is configured
    :param verbose: Verbosity level
    """

    def __init__(self, bound_tolerance: float = 0.005, histograms: bool = True, verbose: int = 0):
        super().__init__(verbose=verbose)
        self.bound_tolerance = _check_finite("bound_tolerance", bound_tolerance, low=0.0, strict=False)
        if self.bound_tolerance >= 0.5:
            raise ValueError(f"bound_tolerance={bound_tolerance!r} is invalid: expected a fraction of the range in [0, 0.5)")
        if not isinstance(histograms, bool):
            raise ValueError(f"histograms={histograms!r} is invalid: expected True or False")
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
        self._env_actions = []
        self._pre_squash = []

    def _on_step(self) -> bool:
        n_dims = self._low.shape[0]
        self._env_actions.append(np.array(self.locals["clipped_actions"], dtype=np.float64).reshape(-1, n_dims))
        if self.model.policy.squash_output:
            self._pre_squash.append(np.array(self.locals["actions"], dtype=np.float64).reshape(-1, n_dims))
        return True

    @staticmethod
    def _moments(actions: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "mean": actions.mean(axis=0),
            "std": actions.std(axis=0),
            "min": actions.min(axis=0),
            "max": actions.max(axis=0),
        }

    def action_stats(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        """
        Statistics of env actions, one entry per dimension (``at_bounds_all`` is a scalar).

        :param actions: Env actions, shape ``(n, action_dim)``
        :return: ``mean``, ``std``, ``min``, ``max``, ``at_low``, ``at_high``, ``at_bounds`` per dimension
        """
        stats = self._moments(actions)
        # SB3 requires finite bounds for Box actions.
        margin = self.bound_tolerance * (self._high - self._low)
        at_low = actions <= self._low + margin
        at_high = actions >= self._high - margin
        stats["at_low"] = at_low.mean(axis=0)
        stats["at_high"] = at_high.mean(axis=0)
        stats["at_bounds"] = (at_low | at_high).mean(axis=0)
        stats["at_bounds_all"] = np.asarray((at_low | at_high).mean())
        return stats

    def _on_rollout_end(self) -> None:
        if not self._env_actions:
            return
        env_actions = np.concatenate(self._env_actions)
        stats = self.action_stats(env_actions)
        if self._pre_squash:
            pre_squash = np.concatenate(self._pre_squash)
            stats.update({f"pre_squash_{key}": value for key, value in self._moments(pre_squash).items()})
        self.last_stats = stats
        for key, value in stats.items():
            if key == "at_bounds_all":
                self.logger.record("actions/at_bounds", float(value))
                continue
            for dim, item in enumerate(value):
                self.logger.record(f"actions/{key}_{dim}", float(item))
        writer = _tensorboard_writer(self) if self.histograms else None
        if writer is not None:
            for dim in range(env_actions.shape[1]):
                writer.add_histogram(f"actions/dim_{dim}", env_actions[:, dim], self.num_timesteps)
                if self._pre_squash:
                    writer.add_histogram(f"actions/pre_squash_dim_{dim}", pre_squash[:, dim], self.num_timesteps)
            writer.flush()


class OptunaPruningCallback(EvalCallback):
    """
    Evaluates the agent every ``eval_freq`` calls, reports the mean reward to an Optuna trial and
    stops training when the trial's pruner says so; for pipelines that do not use rl-zoo3.

    The ``i``-th evaluation is reported as step ``i`` (1, 2, ...), so trials with different
    ``n_envs`` are compared evaluation by evaluation. After ``learn`` returns, check
    :attr:`is_pruned` and ``raise optuna.TrialPruned()`` in the objective, or pass
    ``raise_pruned=True`` to have the callback raise it from inside ``learn``.

    :param trial: The ``optuna.Trial`` to report to
    :param eval_env: The environment used for evaluation
    :param n_eval_episodes: Episodes per evaluation, >= 1
    :param eval_freq: Evaluate every ``eval_freq`` calls of the callback (env steps of the vectorised env), >= 1
    :param deterministic: Whether to evaluate the deterministic policy
    :param raise_pruned: Raise ``optuna.TrialPruned`` when pruned instead of only stopping training
    :param verbose: Verbosity level
    :param eval_kwargs: Further keyword arguments of ``EvalCallback`` (``log_path``,
        ``best_model_save_path``, ``callback_after_eval``, ...)
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
            raise ValueError(f"trial={trial!r} is invalid: expected an optuna.Trial (with report and should_prune)")
        _check_positive_int("n_eval_episodes", n_eval_episodes)
        _check_positive_int("eval_freq", eval_freq)
        super().__init__(
            eval_env,
            n_eval_episodes=n_eval_episodes,
            eval_freq=eval_freq,
            deterministic=deterministic,
            verbose=verbose,
            **eval_kwargs,
        )
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
        if self.trial.should_prune():
            self.is_pruned = True
            if self.raise_pruned:
                import optuna  # optional dependency, imported only when used

                raise optuna.TrialPruned(f"pruned at evaluation {self.eval_idx} ({self.num_timesteps} steps)")
            return False
        return continue_training


DEFAULT_HPARAMS = (
    "learning_rate",
    "n_steps",
    "batch_size",
    "n_epochs",
    "gamma",
    "gae_lambda",
    "clip_range",
    "clip_range_vf",
    "normalize_advantage",
    "ent_coef",
    "vf_coef",
    "max_grad_norm",
    "target_kl",
    "use_sde",
    "n_envs",
    "seed",
    "vf_clip_mode",
    "kl_coef",
    "kl_target",
)
DEFAULT_METRICS = ("rollout/ep_rew_mean", "rollout/ep_len_mean", "train/value_loss")


def _hparam_value(value: Any) -> bool | int | float | str:
    """A value TensorBoard's HParams accepts; schedules are shown by their start value."""
    if callable(value):
        value = value(1.0)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if _is_number(value):
        return value.item() if isinstance(value, np.generic) else value
    return str(value)


class HParamsWarning(UserWarning):
    """Issued by :class:`HParamsCallback` when the model has no TensorBoard logger to write to."""


class HParamsCallback(BaseCallback):
    """
    Writes the run's hyperparameters and final metrics to TensorBoard's HParams tab.

    At the start of training, the model's attributes named in ``hparams`` (those it has;
    schedules by their initial value), ``algo`` (the class name) and ``extra_hparams`` are recorded
    as an SB3 ``HParam`` declaring ``metrics``. At the end of training the last value of each metric
    (the last update's ``train/`` records, which SB3 never dumps, episode statistics from the info
    buffer, or the last value seen at a rollout end) is written to TensorBoard at the final
    timestep, so the tab shows the final metrics. It writes straight to TensorBoard rather than
    dumping the logger, so the other callbacks' ``on_training_end`` still see the last update's
    records. It needs a TensorBoard logger (``tensorboard_log=...``, with the ``tensorboard``
    package: ``pip install ".[tensorboard]"``); without one it warns at the start of training
    (:class:`HParamsWarning`) and writes nothing.

    :param hparams: Model attribute names to record; ``None`` for a default PPO/PPOExt/A2C list
    :param extra_hparams: Further ``name: value`` pairs (env id, seed, ...)
    :param metrics: Logger keys shown as metrics in the HParams tab
    :param verbose: Verbosity level
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
                raise ValueError(f"{name}={names!r} is invalid: expected a list of names")
        if not metrics:
            raise ValueError(f"metrics={metrics!r} is invalid: expected at least one logger key")
        if extra_hparams is not None and not isinstance(extra_hparams, Mapping):
            raise ValueError(f"extra_hparams={extra_hparams!r} is invalid: expected a dict")
        self.hparams = tuple(DEFAULT_HPARAMS if hparams is None else hparams)
        self.extra_hparams = dict(extra_hparams or {})
        self.metrics = tuple(metrics)
        self.final_metrics: dict[str, float] = {}

    def hparam_dict(self) -> dict[str, bool | int | float | str]:
        """The hyperparameters recorded for the model."""
        values: dict[str, bool | int | float | str] = {"algo": type(self.model).__name__}
        for name in self.hparams:
            if hasattr(self.model, name):
                values[name] = _hparam_value(getattr(self.model, name))
        values.update({name: _hparam_value(value) for name, value in self.extra_hparams.items()})
        return values

    def _on_training_start(self) -> None:
        if _tensorboard_writer(self) is None:
            warnings.warn(
                f"HParamsCallback: {type(self.model).__name__} has no TensorBoard logger, so no hyperparameters or "
                "final metrics are written; pass tensorboard_log=... (with the tensorboard package installed: "
                'pip install ".[tensorboard]") or rl-zoo3\'s --tensorboard-log',
                HParamsWarning,
                stacklevel=2,
            )
        metric_dict = {metric: 0.0 for metric in self.metrics}
        self.logger.record("hparams", HParam(self.hparam_dict(), metric_dict), exclude=("stdout", "log", "json", "csv"))

    def _final_value(self, metric: str) -> float | None:
        if metric in self.logger.name_to_value:
            return float(self.logger.name_to_value[metric])
        episodes = self.model.ep_info_buffer
        key = {"rollout/ep_rew_mean": "r", "rollout/ep_len_mean": "l"}.get(metric)
        if key is not None and episodes:
            return float(np.mean([info[key] for info in episodes]))
        return self.final_metrics.get(metric)

    def _on_rollout_end(self) -> None:
        # Remember the metrics recorded by the previous update before the coming dump clears them.
        self._remember(self.metrics)

    def _remember(self, metrics: Iterable[str]) -> None:
        for metric in metrics:
            value = self._final_value(metric)
            if value is not None:
                self.final_metrics[metric] = value

    def _on_training_end(self) -> None:
        self._remember(self.metrics)
        writer = _tensorboard_writer(self)
        if writer is None:
            return
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
    "ParameterSchedule",
    "ParameterScheduler",
    "TrainingHealthGuard",
    "TrainingHealthWarning",
]
