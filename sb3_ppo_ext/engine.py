"""The one PPO update that PPOExt, MaskablePPOExt and RecurrentPPOExt share.

:class:`ExtUpdateEngine` is a mixin placed before the upstream algorithm in each class's bases
(``PPOExt(ExtUpdateEngine, PPO)``, ``MaskablePPOExt(ExtUpdateEngine, MaskablePPO)``,
``RecurrentPPOExt(ExtUpdateEngine, RecurrentPPO)``). Its ``train`` iterates the algorithm's own
rollout buffer with ``get(batch_size)`` exactly as upstream does (same minibatches, same NumPy
draws), and holds every loss term, the KL penalty and its beta rule, both value-clip forms,
``target_kl``, the non-finite guard and every diagnostic once.

What differs per algorithm is three named seams, each a method the algorithm overrides:

- :meth:`ExtUpdateEngine._evaluate_samples`: how the policy scores a minibatch (action masks,
  LSTM states and episode starts);
- :meth:`ExtUpdateEngine._valid_samples`: which samples of a minibatch count (the unpadded steps
  of a recurrent minibatch; ``None``: all of them);
- :meth:`ExtUpdateEngine._samples_distribution`: a policy's action distribution on a minibatch
  (or on the whole rollout, before and after the update: ``pi_old`` and ``pi_new`` for the update's
  KL, beta and diagnostics).

``pi_old``, the distribution each action was sampled from, is the policy before the update: at the
start of ``train`` one pass without gradients scores the whole rollout (the update's KL is measured
against it) and, for the KL penalty, hands its parameters to the rollout buffer
(:mod:`sb3_ppo_ext.buffers`, chosen through ``rollout_buffer_class``), so that every minibatch
carries its rows' ``pi_old``.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Generator, Iterator
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.type_aliases import PyTorchObs
from stable_baselines3.common.utils import explained_variance

from sb3_ppo_ext import losses, parameters, speed, validation
from sb3_ppo_ext.buffers import PI_OLD_BUFFERS, PiOldBuffer
from sb3_ppo_ext.distributions import (
    analytic_kl,
    concat_distributions,
    distribution_parameters,
    distributions_from_parameters,
    index_distribution,
    mean_std,
    torch_distributions,
)
from sb3_ppo_ext.files import LOADING, Loading
from sb3_ppo_ext.reliability import ModelFileError

# Threshold on |a| (in [-1, 1] units) above which a squashed action component counts as saturated.
SATURATION_THRESHOLD = 0.99
# Rows per forward pass when computing the whole rollout's distributions, before an update (pi_old) and after it.
DISTRIBUTION_CHUNK = 2048


class NonFiniteLossError(FloatingPointError):
    """Raised by the update before a non-finite loss or gradient reaches the parameters."""


class UnknownPolicyKwargError(validation.InvalidSettingError, TypeError):
    """A ``policy_kwargs`` key the policy class does not take (a ``TypeError``, as the policy's constructor raises)."""


class NoTrustRegionWarning(UserWarning):
    """``clip_range=None`` with ``kl_coef=0``: the objective has neither a clipped surrogate nor a KL penalty."""


class Minibatch(NamedTuple):
    """One minibatch as the engine sees it."""

    samples: Any
    """the buffer's own samples (``RolloutBufferSamples``, ``MaskableRolloutBufferSamples``, ...)"""
    valid: th.Tensor | None
    """boolean mask of the valid samples among ``samples``' rows; ``None``: all are valid"""
    old_distributions: list[th.distributions.Distribution] | None = None
    """``pi_old`` on the valid samples (for the KL penalty; ``None`` without it)"""

    @property
    def n_valid(self) -> int | th.Tensor:
        """The number of valid samples (a tensor when counted from ``valid``: no host sync)."""
        return len(self.samples.advantages) if self.valid is None else self.valid.sum()


class _UpdateStats:
    """
    Sample-weighted means (and extremes) of per-minibatch diagnostics over a whole update.

    Per minibatch, the scalars of one ``add_mean`` call are stacked into one tensor and kept; the
    weighted means are reduced once, when first read (one tensor op per minibatch instead of two
    per diagnostic, and no host sync). Extremes keep the tensors and reduce them when read.
    """

    def __init__(self) -> None:
        # keys of one add_mean call -> (stacked rows, weights: numbers or 0-d tensors)
        self._rows: dict[tuple[str, ...], tuple[list[th.Tensor], list[float | th.Tensor]]] = {}
        self._means: dict[str, float] | None = None
        self._extremes: dict[str, list[th.Tensor]] = {}

    def add_mean(self, weight: float | th.Tensor, **values: th.Tensor) -> None:
        with th.no_grad():  # the scalars of one minibatch share dtype and device
            row = th.stack(tuple(values.values()))
        rows, weights = self._rows.setdefault(tuple(values), ([], []))
        rows.append(row)
        weights.append(weight)
        self._means = None

    def add_extremes(self, key: str, values: th.Tensor) -> None:
        self._extremes.setdefault(key, []).append(values.detach().flatten())

    def _reduce(self) -> dict[str, float]:
        if self._means is None:
            totals: dict[str, tuple[float, float]] = {}
            for keys, (rows, weights) in self._rows.items():
                device = rows[0].device
                weight = th.stack([th.as_tensor(w, dtype=th.float64, device=device) for w in weights])
                sums = (th.stack(rows).to(th.float64) * weight[:, None]).sum(dim=0).tolist()
                for key, value in zip(keys, sums, strict=True):
                    total, total_weight = totals.get(key, (0.0, 0.0))
                    totals[key] = (total + value, total_weight + float(weight.sum().item()))
            self._means = {key: total / total_weight for key, (total, total_weight) in totals.items()}
        return self._means

    def mean(self, key: str) -> float:
        return float(self._reduce()[key])

    def extremes(self, key: str) -> tuple[float, float]:
        low, high = th.aminmax(th.cat(self._extremes[key]))
        return float(low.item()), float(high.item())

    def __contains__(self, key: str) -> bool:
        return key in self._reduce()


def flat_rollout(buffer: BaseBuffer, array: np.ndarray) -> np.ndarray:
    """
    A rollout array in the row order of the buffer's minibatches: ``(n_steps, n_envs, ...)`` ->
    ``(n_envs * n_steps, ...)``, unless the buffer's first ``get`` has already flattened it
    (SB3's public ``generator_ready`` and ``swap_and_flatten``).
    """
    return array if buffer.generator_ready else buffer.swap_and_flatten(array)  # type: ignore[attr-defined]


def flat_observations(buffer: BaseBuffer) -> PyTorchObs:
    """The rollout's observations as tensors, flattened in the buffer's row order (dict observations per key)."""
    observations = buffer.observations  # type: ignore[attr-defined]
    if isinstance(observations, dict):
        return {key: buffer.to_torch(flat_rollout(buffer, value)) for key, value in observations.items()}
    return buffer.to_torch(flat_rollout(buffer, observations))


def _valid_rows(dists: list[th.distributions.Distribution], valid: th.Tensor | None) -> list[th.distributions.Distribution]:
    """The rows ``valid`` (a boolean mask) of batched torch distributions; all of them for ``None``."""
    return dists if valid is None else [index_distribution(dist, valid) for dist in dists]


def _joined(parts: list[list[th.distributions.Distribution]]) -> list[th.distributions.Distribution]:
    """Per-chunk distributions joined along the batch (one chunk needs no concatenation)."""
    return parts[0] if len(parts) == 1 else concat_distributions(parts)


def index_observations(obs: PyTorchObs, index: th.Tensor | slice) -> PyTorchObs:
    """Rows ``index`` of a tensor or of each tensor of a dict observation."""
    if isinstance(obs, dict):
        return {key: value[index] for key, value in obs.items()}
    return obs[index]


class ExtUpdateEngine:
    """
    The PPO update with every extension; mixed into PPOExt, MaskablePPOExt and RecurrentPPOExt.

    The host class provides SB3's on-policy attributes (``policy``, ``rollout_buffer``,
    ``clip_range``, ...) and the extension attributes set by :meth:`_init_extensions`.
    """

    # Attributes of the host algorithm, declared for type checkers.
    policy: Any
    policy_class: Any
    policy_kwargs: dict[str, Any]
    rollout_buffer: Any
    observation_space: spaces.Space
    action_space: spaces.Space
    n_envs: int
    n_steps: int
    device: th.device
    clip_range: Any
    clip_range_vf: Any
    batch_size: int
    n_epochs: int
    normalize_advantage: bool
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    target_kl: float | None
    verbose: int
    logger: Any
    _n_updates: int
    _current_progress_remaining: float

    def _init_extensions(
        self,
        vf_clip_mode: str,
        kl_coef: float,
        kl_target: float | None,
        kl_adapt_factor: float,
        kl_adapt_tolerance: float,
        kl_coef_bounds: tuple[float, float],
    ) -> None:
        """
        Store the (already checked) extension settings; called by each algorithm's ``__init__`` after
        upstream's. numpy integers are accepted for ``n_steps``, ``batch_size`` and ``n_epochs`` (as by
        upstream); they are kept as Python ints for the update's index arithmetic.
        """
        self.vf_clip_mode = vf_clip_mode
        self.kl_coef = kl_coef
        self.kl_target = kl_target
        self.kl_adapt_factor = kl_adapt_factor
        self.kl_adapt_tolerance = kl_adapt_tolerance
        self.kl_coef_bounds = kl_coef_bounds
        self._normalise_settings()
        # The live beta: adapted after each update, saved with the model, carried on by a
        # continued ``learn``. Set here and not in ``_setup_model``: ``load`` (which calls
        # ``_setup_model`` after restoring the saved attributes) applies the beta rule to the saved value.
        self.current_kl_coef = self._live_kl_coef(None)

    def _normalise_settings(self) -> None:
        """The checked settings as the update uses them: Python ints (index arithmetic) and floats."""
        self.n_steps, self.batch_size, self.n_epochs = int(self.n_steps), int(self.batch_size), int(self.n_epochs)
        self.kl_coef = float(self.kl_coef)
        self.kl_target = None if self.kl_target is None else float(self.kl_target)
        self.kl_adapt_factor = float(self.kl_adapt_factor)
        self.kl_adapt_tolerance = float(self.kl_adapt_tolerance)
        self.kl_coef_bounds = (float(self.kl_coef_bounds[0]), float(self.kl_coef_bounds[1]))

    def _kl_state(self) -> tuple[Any, Any, Any]:
        """``(kl_coef, kl_target, current_kl_coef)``: what :meth:`_live_kl_coef` carries a beta on from."""
        return self.kl_coef, self.kl_target, self.current_kl_coef

    def _live_kl_coef(self, previous: tuple[Any, Any, Any] | None) -> Any:
        """
        The beta rule, the one place that decides the live beta (``current_kl_coef``) from the settings:

        - penalty off (``kl_coef == 0``): 0;
        - fixed beta (``kl_target=None``): ``kl_coef``, always: a ``kl_coef`` given to ``load`` or set
          by :class:`~sb3_ppo_ext.callbacks.ParameterScheduler` is the beta every update uses;
        - adaptive beta (``kl_target`` set): carried on from ``previous`` when that was an adaptive
          beta configured with the same ``kl_coef``; otherwise it starts at ``kl_coef``. So a new
          model, a penalty switched on at load and a ``kl_coef`` given at load that differs from the
          saved one start at ``kl_coef``, while a continued ``learn`` and a ``load`` that gives the
          saved ``kl_coef`` again (rl-zoo3's ``-i`` passes the yml's) keep the adapted beta.

        :param previous: ``(kl_coef, kl_target, current_kl_coef)`` the live beta was adapted under
            (:meth:`_kl_state`; at load, the file's), or ``None`` for a new model
        :return: the live beta (the carried-on value as it is: :meth:`_settings_error` checks it)
        """
        if not self.kl_coef > 0:
            return 0.0
        if self.kl_target is None or previous is None:
            return float(self.kl_coef)
        kl_coef, kl_target, beta = previous
        carried_on = kl_target is not None and validation.is_real(kl_coef) and float(kl_coef) == float(self.kl_coef)
        return beta if carried_on else float(self.kl_coef)

    # Attributes that hold a checked argument under another name.
    _ARGUMENT_ATTRIBUTES: ClassVar[dict[str, str]] = {"stats_window_size": "_stats_window_size"}

    def _configured_arguments(self) -> dict[str, Any]:
        """The model's current value of each argument with a row in :data:`~sb3_ppo_ext.parameters.ALGORITHM_RULES`."""
        arguments = {}
        for name in parameters.ALGORITHM_RULES:
            attribute = self._ARGUMENT_ATTRIBUTES.get(name, name)
            if attribute in self.__dict__:
                arguments[name] = self.__dict__[attribute]
        return arguments

    def _settings_error(self, previous: tuple[Any, Any, Any]) -> validation.InvalidSettingError | None:
        """
        What is wrong with the model's settings, as the constructor judges them (schedules are not
        evaluated: ``load``'s ``custom_objects`` may replace them for a model that will not train, as
        rl-zoo3's enjoy does with ``clip_range=lambda _: 0.0``), and with its live beta: the stored
        ``current_kl_coef`` must be a finite number >= 0, and an adaptive beta carried on (see
        :meth:`_live_kl_coef`) must lie within ``kl_coef_bounds``.

        :param previous: what the live beta was adapted under (:meth:`_kl_state`)
        :return: the error, or ``None`` when the settings are valid
        """
        try:
            n_envs = self.n_envs if getattr(self, "env", None) is not None else None
            parameters.check_arguments(self._configured_arguments(), check_schedules=False, n_envs=n_envs)
            validation.check_real("current_kl_coef", self.current_kl_coef, low=0.0, strict=False)
            beta = self._live_kl_coef(previous)
            low, high = self.kl_coef_bounds
            if self.kl_target is not None and self.kl_coef > 0 and not low <= beta <= high:
                raise validation.InvalidSettingError(
                    f"current_kl_coef={beta!r} (the adaptive beta carried on) is invalid: expected a value "
                    f"within kl_coef_bounds={self.kl_coef_bounds!r}"
                )
        except validation.InvalidSettingError as error:
            return error
        return None

    def _check_policy_fits_observations(self) -> None:
        """
        A ``ValueError`` naming the policies to use when the policy's default features extractor cannot read
        the observation space: a ``Dict`` space needs a ``MultiInput...`` policy (SB3's ``CombinedExtractor``),
        any other space a policy without it. SB3 makes the same check for ``"MlpPolicy"`` / ``"CnnPolicy"``
        only; without it, ``"MlpLstmPolicy"`` fails at the first rollout and ``"MultiInputPolicy"`` with an
        ``AttributeError``. A ``features_extractor_class`` given in ``policy_kwargs`` is the user's choice.
        """
        from stable_baselines3.common.torch_layers import CombinedExtractor

        def reads_dicts(policy_class: type) -> bool:
            extractor = parameters.policy_parameters(policy_class).get("features_extractor_class")
            return isinstance(extractor, type) and issubclass(extractor, CombinedExtractor)

        aliases: dict[str, type] = getattr(self, "policy_aliases", {})
        if "features_extractor_class" in (self.policy_kwargs or {}) or self.policy_class not in aliases.values():
            return
        dict_space = isinstance(self.observation_space, spaces.Dict)
        if reads_dicts(self.policy_class) == dict_space:
            return
        name = next(alias for alias, policy in aliases.items() if policy is self.policy_class)
        fitting = " or ".join(f"`{alias}`" for alias, policy in aliases.items() if reads_dicts(policy) == dict_space)
        raise validation.InvalidSettingError(
            f"You must use {fitting} when working with a {type(self.observation_space).__name__} observation space, not {name}"
        )

    def _get_policy_from_name(self, policy_name: str) -> type:
        """
        The policy class of an alias, as SB3's; an unknown alias is a ``ValueError`` that lists this
        class's aliases and names the class of this package whose alias it is (``"MlpLstmPolicy"``:
        ``RecurrentPPOExt``).
        """
        aliases: dict[str, type] = getattr(self, "policy_aliases", {})
        if policy_name in aliases:
            return aliases[policy_name]
        owners = sorted(
            {cls.__name__ for cls in _engine_classes() if policy_name in getattr(cls, "policy_aliases", {})}
            - {type(self).__name__}
        )
        hint = f"; {policy_name!r} is a policy of {' and '.join(owners)}" if owners else ""
        raise validation.InvalidSettingError(
            f"Policy {policy_name!r} unknown for {type(self).__name__}: expected one of {sorted(aliases)} or a policy "
            f"class{hint}"
        )

    def _check_policy_kwargs_names(self) -> None:
        """
        An :class:`UnknownPolicyKwargError` for a ``policy_kwargs`` key that the policy class's
        constructor chain does not take, with the closest valid name (as the settings check says it
        for rl-zoo3's ``-params``), instead of the constructor's bare ``TypeError``.
        """
        if not isinstance(self.policy_class, type) or not isinstance(self.policy_kwargs, dict):
            return
        taken = parameters.policy_parameters(self.policy_class)
        unknown = [key for key in self.policy_kwargs if key not in taken]
        if unknown:
            problems = "; ".join(parameters.unknown_policy_kwarg(key, self.policy_class, taken) for key in unknown)
            raise UnknownPolicyKwargError(f"{type(self).__name__}: {problems}; valid keys: {', '.join(sorted(taken))}")

    def _setup_model(self) -> None:
        # Checked again here because ``load(path, **kwargs)`` sets the saved attributes and its
        # keyword arguments without __init__: the same checks as the constructor's (see
        # ``_settings_error``), and the beta rule (``_live_kl_coef``) on the saved live beta.
        loading: Loading | None = self.__dict__.pop(LOADING, None)
        previous = self._kl_state()
        if loading is None:
            error = self._settings_error(previous)
            if error is not None:
                raise error
        else:
            saved_error = self._settings_error(previous)
            self.__dict__.update(loading.overrides)
            # A current_kl_coef given at load replaces the saved live beta.
            previous = (*previous[:2], self.current_kl_coef)
            error = self._settings_error(previous)
            if error is not None:
                if saved_error is not None and str(saved_error) == str(error):  # not mended by the keyword arguments
                    raise ModelFileError(
                        f"{loading.algorithm}.load: model file {loading.label} holds an invalid setting: {error}"
                    ) from error
                raise error  # from load's keyword arguments: the constructor's error
        self.current_kl_coef = self._live_kl_coef(previous)
        self._normalise_settings()
        self._check_policy_fits_observations()
        self._check_policy_kwargs_names()
        if self.clip_range is None and not self.kl_coef > 0:
            warnings.warn(
                f"{type(self).__name__}: clip_range=None with kl_coef=0 leaves no trust region (neither the clipped "
                "surrogate nor the KL penalty): every epoch follows the plain policy gradient of the ratio; set "
                "clip_range (e.g. 0.2) or kl_coef > 0 (e.g. kl_coef=1.0, kl_target=0.01)",
                NoTrustRegionWarning,
                stacklevel=3,
            )
        # Upstream's ``_setup_model`` wraps ``clip_range`` in a FloatSchedule unconditionally, which
        # rejects ``None`` (clipping off): it gets a stand-in, and ``None`` is put back afterwards.
        clipping_off = self.clip_range is None
        if clipping_off:
            self.clip_range = 1.0
        self._choose_rollout_buffer_class()
        super()._setup_model()  # type: ignore[misc]
        if clipping_off:
            self.clip_range = None

    # The buffer classes carrying pi_old (plain and Dict observations) that replace upstream's default
    # choice; ``None``: the algorithm takes no ``rollout_buffer_class`` (RecurrentPPO builds its own).
    _pi_old_buffer_classes: ClassVar[tuple[type, type] | None] = None

    def _choose_rollout_buffer_class(self) -> None:
        """
        ``rollout_buffer_class`` as ``_setup_model`` uses it: where it is ``None`` (upstream's choice by
        the observation space) or one of upstream's own buffer classes, the subclass of that class that
        carries ``pi_old`` (:data:`sb3_ppo_ext.buffers.PI_OLD_BUFFERS`: the same rollout and minibatches,
        plus each sample's ``old_distribution``). A class of the user's own is kept; the KL penalty then
        needs it to be a :class:`~sb3_ppo_ext.buffers.PiOldBuffer` (:meth:`_check_pi_old_buffer`).
        """
        if self._pi_old_buffer_classes is None:
            return
        chosen = getattr(self, "rollout_buffer_class", None)
        if chosen is None:
            plain, dict_buffer = self._pi_old_buffer_classes
            chosen = dict_buffer if isinstance(self.observation_space, spaces.Dict) else plain
        self.rollout_buffer_class = PI_OLD_BUFFERS.get(chosen, chosen)
        self._check_pi_old_buffer(self.rollout_buffer_class)

    def _check_pi_old_buffer(self, buffer_class: type) -> None:
        """An ``InvalidSettingError`` for a buffer class that cannot carry ``pi_old`` to the KL penalty's minibatches."""
        if self.kl_coef > 0 and not issubclass(buffer_class, PiOldBuffer):
            raise validation.InvalidSettingError(
                f"rollout_buffer_class={buffer_class.__name__} cannot carry pi_old, which the KL penalty "
                f"(kl_coef={self.kl_coef!r}) needs: expected one of upstream's buffer classes (replaced by the package's "
                "subclass) or a subclass of one of sb3_ppo_ext.buffers' PiOld buffers, or kl_coef=0"
            )

    def collect_rollouts(self, *args: Any, **kwargs: Any) -> bool:
        """
        The algorithm's collection (:meth:`_collect_rollouts`); a policy of this package acts on its
        :class:`~sb3_ppo_ext.speed.ActingPlan` meanwhile (``policy.acting()``).
        """
        acting = getattr(self.policy, "acting", None)
        with acting() if acting is not None else contextlib.nullcontext():
            return self._collect_rollouts(*args, **kwargs)

    def _collect_rollouts(self, *args: Any, **kwargs: Any) -> bool:
        """Upstream's ``collect_rollouts``: a seam for an algorithm that collects otherwise (RecurrentPPOExt, squashed)."""
        return super().collect_rollouts(*args, **kwargs)  # type: ignore[misc]

    @property
    def uses_kl_penalty(self) -> bool:
        """Whether the KL penalty is part of the objective (``kl_coef > 0``)."""
        return self.kl_coef > 0

    # ---- seams: what differs per algorithm ------------------------------------------------------

    def _evaluate_samples(
        self, samples: Any, actions: th.Tensor, need_distribution: bool
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Any]:
        """
        Values, log-probabilities, entropy and (if needed) the action distribution on a minibatch.

        With ``ent_coef == 0`` the entropy is only logged: a policy of this package computes it
        outside the autograd graph (same value, same random draws).

        :param samples: the buffer's minibatch
        :param actions: its actions as the policy scores them (long for Discrete)
        :param need_distribution: whether the distribution is needed (KL penalty)
        """
        if hasattr(self.policy, "evaluate_actions_and_distribution"):
            return self.policy.evaluate_actions_and_distribution(
                samples.observations, actions, entropy_requires_grad=self.ent_coef != 0, need_distribution=need_distribution
            )
        # A plain SB3 ActorCriticPolicy (e.g. loaded from a stock PPO file): a second actor pass
        # yields the distribution.
        values, log_prob, entropy = self.policy.evaluate_actions(samples.observations, actions)
        return values, log_prob, entropy, self.policy.get_distribution(samples.observations) if need_distribution else None

    def _valid_samples(self, samples: Any) -> th.Tensor | None:
        """Boolean mask of the minibatch rows that count (``None``: all of them)."""
        return None

    def _samples_distribution(self, policy: Any, samples: Any) -> Any:
        """``policy``'s (SB3) action distribution on the samples (of a minibatch, or of the whole rollout)."""
        return policy.get_distribution(samples.observations)

    def _rollout_distributions(self) -> list[th.distributions.Distribution]:
        """
        The policy's (detached) action distributions on every valid rollout sample, in eval mode, in the
        buffer's flattened row order: ``pi_old`` before the update, ``pi_new`` after it.
        """
        buffer = self.rollout_buffer
        if not isinstance(buffer, PiOldBuffer):
            return self._flat_rollout_distributions()
        self.policy.set_training_mode(False)
        parts = []
        with th.no_grad():
            for samples in buffer.rollout_samples(DISTRIBUTION_CHUNK):
                valid = self._valid_samples(samples)
                parts.append(_valid_rows(torch_distributions(self._samples_distribution(self.policy, samples)), valid))
        return _joined(parts)

    def _flat_rollout_distributions(self) -> list[th.distributions.Distribution]:
        """
        :meth:`_rollout_distributions` for a buffer class of the user's own (a subclass of the
        algorithm's upstream buffer): on its flattened observations, in chunks of ``DISTRIBUTION_CHUNK`` rows.
        """
        obs = flat_observations(self.rollout_buffer)
        n_samples = self.rollout_buffer.buffer_size * self.rollout_buffer.n_envs
        return self._chunked_distributions(
            n_samples, lambda index: self.policy.get_distribution(index_observations(obs, index))
        )

    def _chunked_distributions(self, n_samples: int, distribution_of: Any) -> list[th.distributions.Distribution]:
        """Torch distributions of ``distribution_of(rows)`` over all rows, computed chunk by chunk without autograd."""
        self.policy.set_training_mode(False)
        with th.no_grad():
            chunks = [
                torch_distributions(distribution_of(slice(start, start + DISTRIBUTION_CHUNK)))
                for start in range(0, n_samples, DISTRIBUTION_CHUNK)
            ]
        # Computed without autograd, so there is nothing to detach; one chunk needs no concatenation.
        return chunks[0] if len(chunks) == 1 else concat_distributions(chunks)

    # ---- the update -----------------------------------------------------------------------------

    def _update_learning_rates(self) -> None:
        """
        Upstream's ``_update_learning_rate``: every parameter group at ``lr_schedule``, logged as
        ``train/learning_rate``. For a policy with per-network rates (``policy_kwargs["learning_rates"]``),
        the actor's and the critic's groups then follow their own schedules (``policy.set_learning_rates``),
        logged as ``train/learning_rate_pi`` and ``train/learning_rate_vf``, with ``train/learning_rate``
        the actor's rate; a group added by the user keeps ``lr_schedule``, as upstream.
        """
        self._update_learning_rate(self.policy.optimizer)  # type: ignore[attr-defined]
        if getattr(self.policy, "learning_rate_schedules", None) is None:
            return
        rates = self.policy.set_learning_rates(self._current_progress_remaining)
        self.logger.record("train/learning_rate", rates["pi"])
        self.logger.record("train/learning_rate_pi", rates["pi"])
        self.logger.record("train/learning_rate_vf", rates["vf"])

    def _raise_non_finite(self, what: str, epoch: int, terms: dict[str, th.Tensor]) -> None:
        details = ", ".join(f"{name}={value.item():.6g}" for name, value in terms.items() if value.dim() == 0)
        self.policy.optimizer.zero_grad()
        raise NonFiniteLossError(
            f"{type(self).__name__}.train(): non-finite {what} at update {self._n_updates} (epoch {epoch}): {details}. "
            "No parameter was updated with it, so the model and its saved checkpoints are intact. "
            "Check the environment's observations and rewards for NaN/inf (VecCheckNan), "
            "observation/reward normalisation and the learning rate."
        )

    def _scored_actions(self, actions: th.Tensor) -> th.Tensor:
        """
        Actions as the policy scores them: Discrete actions are stored as floats of shape (n, 1);
        integer actions of other spaces are cast to float, as SB3's buffers do (sb3-contrib's recurrent
        buffers hand MultiBinary actions back as the space's ``int8``, which the Bernoulli log-prob refuses).
        """
        if isinstance(self.action_space, spaces.Discrete):
            return actions.long().flatten()
        return actions if actions.is_floating_point() else actions.float()

    def minibatch_losses(
        self,
        batch: Minibatch,
        clip_range: float | None,
        clip_range_vf: float | None,
        kl_coef: float,
    ) -> dict[str, th.Tensor]:
        """
        Every loss term and per-minibatch diagnostic of one minibatch.

        :param batch: the minibatch, its valid samples and (for the analytic KL penalty, when
            ``kl_coef > 0``) ``pi_old`` on them
        :param clip_range: current surrogate clip range, or ``None``
        :param clip_range_vf: current value clip range, or ``None``
        :param kl_coef: current ``beta`` (0: no penalty)
        :return: ``loss`` (with gradient) and its terms, ``approx_kl``, clip fractions (detached)
            and the per-sample ``ratio`` of the valid samples
        """
        samples, valid = batch.samples, batch.valid
        values, log_prob, entropy, distribution = self._evaluate_samples(
            samples, self._scored_actions(samples.actions), need_distribution=kl_coef > 0
        )
        values = values.flatten()
        old_values = samples.old_values
        advantages = samples.advantages
        # Normalization does not make sense if mini batchsize == 1, see SB3 GH issue #325
        if self.normalize_advantage and len(advantages) > 1:
            counted = advantages if valid is None else advantages[valid]
            advantages = (advantages - counted.mean()) / (counted.std() + 1e-8)

        # ratio between old and new policy, should be one at the first minibatch
        log_ratio = log_prob - samples.old_log_prob
        ratio = th.exp(log_ratio)
        policy_loss = losses.clipped_surrogate_loss(advantages, ratio, clip_range, valid)
        terms = {}
        kl_penalty = None
        if kl_coef > 0:
            assert distribution is not None and batch.old_distributions is not None
            new = _valid_rows(torch_distributions(distribution), valid)
            kl_penalty = losses.kl_penalty_loss(analytic_kl(batch.old_distributions, new), kl_coef)
            terms["kl_penalty"] = kl_penalty
        value_loss = losses.value_loss(values, old_values, samples.returns, clip_range_vf, self.vf_clip_mode, valid)
        # Entropy loss favors exploration; approximate it from samples when there is no closed form
        entropy_mean = -losses.masked_mean(log_prob, valid) if entropy is None else losses.masked_mean(entropy, valid)
        entropy_loss = -entropy_mean

        # Without the penalty no zero tensor is added (one autograd node fewer, the same value).
        # Summed in upstream's order (policy, entropy, value), so that without the squashed head
        # and the penalty the loss and its gradient are upstream's bit for bit. With ent_coef == 0
        # the entropy term adds nothing but a backward pass through the entropy estimate (a Monte
        # Carlo sample for the squashed head): it is left out of the graph (x + 0 * y == x exactly).
        loss = policy_loss if kl_penalty is None else policy_loss + kl_penalty
        if self.ent_coef != 0:
            loss = loss + self.ent_coef * entropy_loss
        loss = loss + self.vf_coef * value_loss

        with th.no_grad():
            valid_ratio = ratio if valid is None else ratio[valid]
            terms.update(
                policy_gradient_loss=policy_loss.detach(),
                value_loss=value_loss.detach(),
                entropy_loss=entropy_loss.detach(),
                entropy=entropy_mean.detach(),
                approx_kl=losses.approx_kl_k3(log_ratio, valid),
                ratio=valid_ratio.detach(),
            )
            if clip_range is not None:
                terms["clip_fraction"] = losses.clip_fraction(valid_ratio, clip_range)
            if clip_range_vf is not None:
                valid_values, valid_old = (values, old_values) if valid is None else (values[valid], old_values[valid])
                terms["clip_fraction_vf"] = losses.value_clip_fraction(valid_values, valid_old, clip_range_vf)
        if "kl_penalty" in terms:
            terms["kl_penalty"] = terms["kl_penalty"].detach()
        terms["loss"] = loss
        return terms

    def _minibatches(self, with_old: bool = False) -> Generator[Minibatch, None, None]:
        """
        One epoch's minibatches: the buffer's own ``get(batch_size)``, with their valid samples and,
        with ``with_old``, ``pi_old`` on them (from the parameters the samples carry).
        """
        kinds = self.rollout_buffer.distribution_kinds if with_old else None
        for samples in self.rollout_buffer.get(self.batch_size):
            valid = self._valid_samples(samples)
            old = None if kinds is None else _valid_rows(distributions_from_parameters(kinds, samples.old_distribution), valid)
            yield Minibatch(samples, valid, old)

    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer.

        Written out rather than extending the upstream ``train``, which has no hook for extra loss
        terms or per-minibatch statistics; the steps and their order follow upstream's.
        """
        # pi_old: the policy as it collected the rollout (eval mode), on every sample, before any parameter changes
        old_distributions = self._rollout_distributions()
        self.policy.set_training_mode(True)
        self._update_learning_rates()
        progress = self._current_progress_remaining
        clip_range = None if self.clip_range is None else float(self.clip_range(progress))
        clip_range_vf = None if self.clip_range_vf is None else float(self.clip_range_vf(progress))
        # The beta rule: a fixed beta is kl_coef as it is now (ParameterScheduler may have set it).
        self.current_kl_coef = kl_coef = self._live_kl_coef(self._kl_state())
        if kl_coef > 0:  # the penalty's pi_old rides in the minibatches
            self._check_pi_old_buffer(type(self.rollout_buffer))
            self.rollout_buffer.set_old_distribution(*distribution_parameters(old_distributions))

        stats = _UpdateStats()
        grad_norms: list[th.Tensor] = []
        # upstream's zero_grad, clip_grad_norm_ and Adam step, bit for bit, with less work per call
        optimizer_step = speed.OptimizerStep(self.policy.optimizer, list(self.policy.parameters()), self.max_grad_norm)
        continue_training = True
        epochs_completed = 0
        for epoch in range(self.n_epochs):
            # Closed explicitly (also after an early stop or an error): the buffer's generator is finished.
            batches = self._minibatches(with_old=kl_coef > 0)
            try:
                for batch in batches:
                    terms = self.minibatch_losses(batch, clip_range, clip_range_vf, kl_coef)
                    loss, approx_kl = terms["loss"], terms["approx_kl"]
                    stats.add_mean(batch.n_valid, **{k: v for k, v in terms.items() if k != "ratio"})
                    stats.add_extremes("ratio", terms["ratio"])

                    # Early stopping on SB3's criterion, see SB3 issue #417 and PR #419; a non-finite
                    # loss is reported before it (the comparison reads the host anyway).
                    if self.target_kl is not None:
                        if not math.isfinite(loss.item()):
                            self._raise_non_finite("loss", epoch, terms)
                        if approx_kl > 1.5 * self.target_kl:
                            continue_training = False
                            if self.verbose >= 1:
                                self.logger.info(
                                    f"Early stopping at step {epoch} due to reaching max kl: {approx_kl.item():.2f}"
                                )
                            break

                    optimizer_step.zero_grad()
                    loss.backward()
                    grad_norm = optimizer_step.clip()
                    # One host read per minibatch for both guards: loss + norm is finite iff both are. Nothing
                    # has reached the parameters yet (the optimizer steps below); the raise clears the gradients.
                    if not math.isfinite((loss.detach() + grad_norm).item()):
                        if not math.isfinite(loss.item()):
                            self._raise_non_finite("loss", epoch, terms)
                        self._raise_non_finite("gradient", epoch, dict(grad_norm=grad_norm, loss=loss))
                    grad_norms.append(grad_norm.detach())
                    optimizer_step.step()
            finally:
                batches.close()
            self._n_updates += 1
            if not continue_training:
                break
            epochs_completed += 1

        # pi_new on every sample: the analytic KL(pi_old || pi_new) of this update.
        new_distributions = self._rollout_distributions()
        kl = analytic_kl(old_distributions, new_distributions)
        mean_kl = float(kl.mean().item())
        if self.uses_kl_penalty and self.kl_target is not None:
            self.current_kl_coef = losses.adapt_kl_coef(
                self.current_kl_coef,
                mean_kl,
                self.kl_target,
                factor=self.kl_adapt_factor,
                tolerance=self.kl_adapt_tolerance,
                bounds=self.kl_coef_bounds,
            )
        self._log_update(
            stats,
            grad_norms,
            epochs_completed=epochs_completed,
            kl=kl,
            kl_coef=kl_coef,
            new_distributions=new_distributions,
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
        )

    def _log_update(
        self,
        stats: _UpdateStats,
        grad_norms: list[th.Tensor],
        epochs_completed: int,
        kl: th.Tensor,
        kl_coef: float,
        new_distributions: list[th.distributions.Distribution],
        clip_range: float | None,
        clip_range_vf: float | None,
    ) -> None:
        """Record an update's diagnostics under ``train/`` (see the README's metrics glossary)."""
        record = self.logger.record
        for key in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "loss", "entropy"):
            record(f"train/{key}", stats.mean(key))
        for key in ("clip_fraction", "clip_fraction_vf", "kl_penalty"):
            if key in stats:
                record(f"train/{key}", stats.mean(key))
        ratio_min, ratio_max = stats.extremes("ratio")
        record("train/ratio_min", ratio_min)
        record("train/ratio_max", ratio_max)
        if grad_norms:
            record("train/grad_norm", float(th.stack(grad_norms).mean().item()))
        record("train/kl", float(kl.mean().item()))
        record("train/kl_max", float(kl.max().item()))
        if self.uses_kl_penalty:
            record("train/kl_coef", kl_coef)
        record("train/epochs_completed", epochs_completed)
        std = mean_std(new_distributions)
        if std is not None:
            record("train/std", std)
        if getattr(self.policy, "squash_output", False) and isinstance(self.action_space, spaces.Box):
            # A mean over every stored pre-squash action (or Beta logit): no need to flatten the buffer or copy it into torch.
            actions = self.rollout_buffer.actions
            unit = self.policy.unit_actions(actions) if hasattr(self.policy, "unit_actions") else np.tanh(actions)
            saturated = np.abs(unit) > SATURATION_THRESHOLD
            record("train/action_saturation", float(saturated.mean()))
        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        record("train/explained_variance", explained_var)
        record("train/n_updates", self._n_updates, exclude="tensorboard")
        if clip_range is not None:
            record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            record("train/clip_range_vf", clip_range_vf)


def extension_arguments(
    vf_clip_mode: Any, kl_coef: Any, kl_target: Any, kl_adapt_factor: Any, kl_adapt_tolerance: Any, kl_coef_bounds: Any
) -> dict[str, Any]:
    """The extensions' own constructor arguments by name: what :meth:`ExtUpdateEngine._init_extensions` takes."""
    return dict(
        vf_clip_mode=vf_clip_mode,
        kl_coef=kl_coef,
        kl_target=kl_target,
        kl_adapt_factor=kl_adapt_factor,
        kl_adapt_tolerance=kl_adapt_tolerance,
        kl_coef_bounds=kl_coef_bounds,
    )


def _engine_classes() -> Iterator[type]:
    """Every class built on the engine (PPOExt, MaskablePPOExt, RecurrentPPOExt and their subclasses)."""
    pending = list(ExtUpdateEngine.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        yield cls


__all__ = [
    "ExtUpdateEngine",
    "Minibatch",
    "NoTrustRegionWarning",
    "NonFiniteLossError",
    "UnknownPolicyKwargError",
    "extension_arguments",
]
