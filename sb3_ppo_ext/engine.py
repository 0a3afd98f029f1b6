"""The one PPO update that PPOExt, MaskablePPOExt and RecurrentPPOExt share.

:class:`ExtUpdateEngine` is a mixin placed before the upstream algorithm in each class's bases; its ``train`` iterates
the algorithm's own buffer with ``get(batch_size)`` as upstream does. Each algorithm overrides three seams:
``_evaluate_samples``, ``_valid_samples`` and ``_samples_distribution``.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Generator, Iterator
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.type_aliases import PyTorchObs
from stable_baselines3.common.utils import explained_variance

from sb3_ppo_ext import losses, speed, validation
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
from sb3_ppo_ext.reliability import LOADING, Loading, ModelFileError

# |a| (in [-1, 1] units) above which a squashed action component counts as saturated.
SATURATION_THRESHOLD = 0.99
# Rows per forward pass of the no-grad passes over the rollout (pi_old before an update, pi_new after it).
DISTRIBUTION_CHUNK = 2048
# Without the KL penalty the passes serve only train/kl, train/kl_max and train/std: on a larger rollout they read
# every k-th sample, k the smallest stride that leaves at most this many.
DIAGNOSTIC_ROWS = 2048

Distributions = list[th.distributions.Distribution]


class NonFiniteLossError(FloatingPointError):
    """Raised by the update before a non-finite loss or gradient reaches the parameters."""


class UnknownPolicyKwargError(validation.InvalidSettingError, TypeError):
    """A ``policy_kwargs`` key the policy class does not take (a ``TypeError``, as the policy's constructor raises)."""


class NoTrustRegionWarning(UserWarning):
    """``clip_range=None`` with ``kl_coef=0``: the objective has neither a clipped surrogate nor a KL penalty."""


class KLState(NamedTuple):
    """What a live beta was adapted under (see :meth:`ExtUpdateEngine._live_kl_coef`)."""

    kl_coef: Any
    kl_target: Any
    current_kl_coef: Any


class Minibatch(NamedTuple):
    """One minibatch as the engine sees it."""

    samples: Any
    """the buffer's own samples (``RolloutBufferSamples``, ``MaskableRolloutBufferSamples``, ...)"""
    valid: th.Tensor | None
    """boolean mask of the valid samples among ``samples``' rows; ``None``: all are valid"""
    old_distributions: Distributions | None = None
    """``pi_old`` on the valid samples (for the KL penalty; ``None`` without it)"""

    @property
    def n_valid(self) -> int | th.Tensor:
        """The number of valid samples (a tensor when counted from ``valid``: no host sync)."""
        return len(self.samples.advantages) if self.valid is None else self.valid.sum()


class _UpdateStats:
    """Sample-weighted means (in float64) and extremes of per-minibatch diagnostics over an update, reduced when read."""

    def __init__(self) -> None:
        self.terms: list[dict[str, th.Tensor]] = []
        self.weights: list[int | th.Tensor] = []
        self.ratios: list[th.Tensor] = []

    def add(self, weight: int | th.Tensor, terms: dict[str, th.Tensor]) -> None:
        self.weights.append(weight)
        self.terms.append({key: value.detach() for key, value in terms.items() if key != "ratio"})
        self.ratios.append(terms["ratio"].detach().flatten())

    def means(self) -> dict[str, float]:
        device = self.terms[0]["loss"].device
        weights = th.stack([th.as_tensor(w, dtype=th.float64, device=device) for w in self.weights])
        total = weights.sum()
        return {
            key: float(((th.stack([terms[key] for terms in self.terms]).to(th.float64) * weights).sum() / total).item())
            for key in self.terms[0]
        }

    def ratio_extremes(self) -> tuple[float, float]:
        low, high = th.aminmax(th.cat(self.ratios))
        return float(low.item()), float(high.item())


def flat_rollout(buffer: BaseBuffer, array: np.ndarray) -> np.ndarray:
    """A rollout array in the row order of the buffer's minibatches (flattened unless the first ``get`` did it)."""
    return array if buffer.generator_ready else buffer.swap_and_flatten(array)  # type: ignore[attr-defined]


def flat_observations(buffer: BaseBuffer) -> PyTorchObs:
    """The rollout's observations as tensors, flattened in the buffer's row order (dict observations per key)."""
    observations = buffer.observations  # type: ignore[attr-defined]
    if isinstance(observations, dict):
        return {key: buffer.to_torch(flat_rollout(buffer, value)) for key, value in observations.items()}
    return buffer.to_torch(flat_rollout(buffer, observations))


def index_observations(obs: PyTorchObs, index: th.Tensor | slice) -> PyTorchObs:
    """Rows ``index`` of a tensor or of each tensor of a dict observation."""
    if isinstance(obs, dict):
        return {key: value[index] for key, value in obs.items()}
    return obs[index]


def _valid_rows(dists: Distributions, valid: th.Tensor | None) -> Distributions:
    """The rows ``valid`` (a boolean mask) of batched torch distributions; all of them for ``None``."""
    return dists if valid is None else [index_distribution(dist, valid) for dist in dists]


def _joined(parts: list[Distributions]) -> Distributions:
    """Per-chunk distributions joined along the batch."""
    return parts[0] if len(parts) == 1 else concat_distributions(parts)


class ExtUpdateEngine:
    """The PPO update with every extension; the host class provides SB3's on-policy attributes."""

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
    clip_range: Any  # a schedule, or None; a float while upstream's _setup_model runs
    clip_range_vf: Any
    batch_size: int
    n_epochs: int
    normalize_advantage: bool
    ent_coef: float
    vf_coef: float
    max_grad_norm: float
    target_kl: float | None
    verbose: int
    logger: Logger
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
        """Store the (already checked) extension settings; called by each algorithm's ``__init__`` after upstream's."""
        self.vf_clip_mode = vf_clip_mode
        self.kl_coef = kl_coef
        self.kl_target = kl_target
        self.kl_adapt_factor = kl_adapt_factor
        self.kl_adapt_tolerance = kl_adapt_tolerance
        self.kl_coef_bounds = kl_coef_bounds
        self._normalise_settings()
        # The live beta, saved with the model (``_setup_model`` applies the beta rule to a loaded one).
        self.current_kl_coef = self._live_kl_coef(None)

    def _normalise_settings(self) -> None:
        """The checked settings as the update uses them: Python ints (index arithmetic; numpy ints are accepted) and floats."""
        self.n_steps, self.batch_size, self.n_epochs = int(self.n_steps), int(self.batch_size), int(self.n_epochs)
        self.kl_coef = float(self.kl_coef)
        self.kl_target = None if self.kl_target is None else float(self.kl_target)
        self.kl_adapt_factor = float(self.kl_adapt_factor)
        self.kl_adapt_tolerance = float(self.kl_adapt_tolerance)
        self.kl_coef_bounds = (float(self.kl_coef_bounds[0]), float(self.kl_coef_bounds[1]))

    def _kl_state(self) -> tuple[Any, Any, Any]:
        """What :meth:`_live_kl_coef` carries a beta on from."""
        return KLState(self.kl_coef, self.kl_target, self.current_kl_coef)

    def _live_kl_coef(self, previous: tuple[Any, Any, Any] | None) -> Any:
        """
        The beta rule: 0 with the penalty off; ``kl_coef`` for a fixed beta; an adaptive beta is carried on from
        ``previous`` when that was adaptive under the same ``kl_coef``, otherwise it restarts at ``kl_coef``.

        :param previous: the :class:`KLState` the live beta was adapted under (at load, the file's), or ``None``
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
        """The model's current value of each argument with a row in :data:`~sb3_ppo_ext.validation.ALGORITHM_RULES`."""
        arguments = {}
        for name in validation.ALGORITHM_RULES:
            attribute = self._ARGUMENT_ATTRIBUTES.get(name, name)
            if attribute in self.__dict__:
                arguments[name] = self.__dict__[attribute]
        return arguments

    def _settings_error(self, previous: tuple[Any, Any, Any]) -> validation.InvalidSettingError | None:
        """The constructor's error for the settings (schedules not evaluated) or the live beta, or ``None``."""
        try:
            n_envs = self.n_envs if getattr(self, "env", None) is not None else None
            validation.check_arguments(self._configured_arguments(), check_schedules=False, n_envs=n_envs)
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
        """A ``ValueError`` naming the fitting policy aliases when the alias's default extractor cannot read the space."""
        from stable_baselines3.common.torch_layers import CombinedExtractor

        def reads_dicts(policy_class: type) -> bool:
            extractor = validation.policy_parameters(policy_class).get("features_extractor_class")
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
        """The policy class of an alias; an unknown alias is a ``ValueError`` naming the class that has it."""
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
        """An :class:`UnknownPolicyKwargError` with the closest valid name for a key the policy class does not take."""
        if not isinstance(self.policy_class, type) or not isinstance(self.policy_kwargs, dict):
            return
        taken = validation.policy_parameters(self.policy_class)
        unknown = [key for key in self.policy_kwargs if key not in taken]
        if unknown:
            problems = "; ".join(validation.unknown_policy_kwarg(key, self.policy_class, taken) for key in unknown)
            raise UnknownPolicyKwargError(f"{type(self).__name__}: {problems}; valid keys: {', '.join(sorted(taken))}")

    def _setup_model(self) -> None:
        # ``load`` sets the saved attributes and its keyword arguments without __init__: the constructor's checks again.
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
        # Upstream's ``_setup_model`` rejects ``clip_range=None``: a stand-in, put back afterwards.
        clipping_off = self.clip_range is None
        if clipping_off:
            self.clip_range = 1.0
        self._choose_rollout_buffer_class()
        super()._setup_model()  # type: ignore[misc]
        if clipping_off:
            self.clip_range = None

    # The (plain, Dict) buffer classes carrying pi_old; ``None``: no ``rollout_buffer_class`` (RecurrentPPO).
    _pi_old_buffer_classes: ClassVar[tuple[type, type] | None] = None

    def _choose_rollout_buffer_class(self) -> None:
        """Replace ``None`` or an upstream ``rollout_buffer_class`` by its ``pi_old`` subclass; keep the user's own."""
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
        """The algorithm's collection, a policy of this package acting on its ``ActingPlan`` meanwhile."""
        acting = getattr(self.policy, "acting", None)
        with acting() if acting is not None else contextlib.nullcontext():
            return self._collect_rollouts(*args, **kwargs)

    def _collect_rollouts(self, *args: Any, **kwargs: Any) -> bool:
        """Upstream's ``collect_rollouts``: a seam for an algorithm that collects otherwise."""
        return super().collect_rollouts(*args, **kwargs)  # type: ignore[misc]

    @property
    def uses_kl_penalty(self) -> bool:
        """Whether the KL penalty is part of the objective (``kl_coef > 0``)."""
        return self.kl_coef > 0

    # ---- seams: what differs per algorithm ------------------------------------------------------

    def _evaluate_samples(
        self, samples: Any, actions: th.Tensor, need_distribution: bool
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Any]:
        """Values, log-probabilities, entropy and (if ``need_distribution``) the action distribution on a minibatch."""
        if hasattr(self.policy, "evaluate_actions_and_distribution"):
            return self.policy.evaluate_actions_and_distribution(
                samples.observations, actions, entropy_requires_grad=self.ent_coef != 0, need_distribution=need_distribution
            )
        # A plain SB3 ActorCriticPolicy (e.g. loaded from a stock PPO file): a second actor pass yields the distribution.
        values, log_prob, entropy = self.policy.evaluate_actions(samples.observations, actions)
        return values, log_prob, entropy, self.policy.get_distribution(samples.observations) if need_distribution else None

    def _valid_samples(self, samples: Any) -> th.Tensor | None:
        """Boolean mask of the minibatch rows that count (``None``: all of them)."""
        return None

    def _samples_distribution(self, policy: Any, samples: Any) -> Any:
        """``policy``'s (SB3) action distribution on the samples (of a minibatch, or of the whole rollout)."""
        return policy.get_distribution(samples.observations)

    def _rollout_distributions(self, stride: int = 1) -> Distributions:
        """The policy's distributions on every ``stride``-th valid rollout sample (no grad, eval mode, buffer row order)."""
        buffer = self.rollout_buffer
        if not isinstance(buffer, PiOldBuffer):
            return self._flat_rollout_distributions(stride)
        self.policy.set_training_mode(False)
        parts = []
        with th.no_grad():
            for samples in buffer.rollout_samples(DISTRIBUTION_CHUNK, stride):
                valid = self._valid_samples(samples)
                parts.append(_valid_rows(torch_distributions(self._samples_distribution(self.policy, samples)), valid))
        return _joined(parts)

    def _flat_rollout_distributions(self, stride: int = 1) -> Distributions:
        """:meth:`_rollout_distributions` for a buffer class of the user's own, on its flattened observations."""
        obs = flat_observations(self.rollout_buffer)
        n_samples = self.rollout_buffer.buffer_size * self.rollout_buffer.n_envs
        return self._chunked_distributions(
            n_samples, lambda index: self.policy.get_distribution(index_observations(obs, index)), stride
        )

    def _chunked_distributions(
        self, n_samples: int, distribution_of: Callable[[slice], Any], stride: int = 1
    ) -> Distributions:
        """Torch distributions of ``distribution_of(rows)`` over every ``stride``-th row, chunk by chunk, without autograd."""
        self.policy.set_training_mode(False)
        span = DISTRIBUTION_CHUNK * stride
        with th.no_grad():
            return _joined(
                [
                    torch_distributions(distribution_of(slice(start, min(start + span, n_samples), stride)))
                    for start in range(0, n_samples, span)
                ]
            )

    # ---- the update -----------------------------------------------------------------------------

    def _update_learning_rates(self) -> None:
        """Upstream's ``_update_learning_rate``, then the per-network rates of ``policy_kwargs["learning_rates"]``."""
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
        """Actions as the policy scores them: Discrete as longs of shape (n,), integer actions of other spaces as floats."""
        if isinstance(self.action_space, spaces.Discrete):
            return actions.long().flatten()
        return actions if actions.is_floating_point() else actions.float()

    def minibatch_losses(
        self, batch: Minibatch, clip_range: float | None, clip_range_vf: float | None, kl_coef: float
    ) -> dict[str, th.Tensor]:
        """
        Every loss term and per-minibatch diagnostic of one minibatch.

        :param batch: the minibatch, its valid samples and (with ``kl_coef > 0``) ``pi_old`` on them
        :param clip_range: current surrogate clip range, or ``None``
        :param clip_range_vf: current value clip range, or ``None``
        :param kl_coef: current ``beta`` (0: no penalty)
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

        log_ratio = log_prob - samples.old_log_prob
        ratio = th.exp(log_ratio)
        policy_loss = losses.clipped_surrogate_loss(advantages, ratio, clip_range, valid)
        terms = {}
        kl_penalty = None
        if kl_coef > 0:
            assert distribution is not None and batch.old_distributions is not None
            new = _valid_rows(torch_distributions(distribution), valid)
            kl_penalty = losses.kl_penalty_loss(analytic_kl(batch.old_distributions, new), kl_coef)
            terms["kl_penalty"] = kl_penalty.detach()
        value_loss = losses.value_loss(values, old_values, samples.returns, clip_range_vf, self.vf_clip_mode, valid)
        # Entropy loss favors exploration; approximate it from samples when there is no closed form
        entropy_mean = -losses.masked_mean(log_prob, valid) if entropy is None else losses.masked_mean(entropy, valid)
        entropy_loss = -entropy_mean

        # Upstream's order (policy, entropy, value), bit for bit; a zero entropy term stays out of the graph.
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
        terms["loss"] = loss
        return terms

    def _minibatches(self, with_old: bool = False) -> Generator[Minibatch, None, None]:
        """One epoch's minibatches (the buffer's ``get(batch_size)``), with ``with_old`` ``pi_old`` on them."""
        kinds = self.rollout_buffer.distribution_kinds if with_old else None
        for samples in self.rollout_buffer.get(self.batch_size):
            valid = self._valid_samples(samples)
            old = None if kinds is None else _valid_rows(distributions_from_parameters(kinds, samples.old_distribution), valid)
            yield Minibatch(samples, valid, old)

    def train(self) -> None:
        """Update policy using the currently gathered rollout buffer (upstream's steps, in upstream's order)."""
        # The beta rule: a fixed beta is kl_coef as it is now (ParameterScheduler may have set it).
        self.current_kl_coef = kl_coef = self._live_kl_coef(self._kl_state())
        # pi_old: the policy as it collected the rollout (eval mode), before any parameter changes; on every sample
        # for the penalty, else on the diagnostics' samples
        stride = 1 if kl_coef > 0 else -(-self.rollout_buffer.buffer_size * self.rollout_buffer.n_envs // DIAGNOSTIC_ROWS)
        old_distributions = self._rollout_distributions(stride)
        self.policy.set_training_mode(True)
        self._update_learning_rates()
        progress = self._current_progress_remaining
        clip_range = None if self.clip_range is None else float(self.clip_range(progress))
        clip_range_vf = None if self.clip_range_vf is None else float(self.clip_range_vf(progress))
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
            batches = self._minibatches(with_old=kl_coef > 0)
            try:
                for batch in batches:
                    terms = self.minibatch_losses(batch, clip_range, clip_range_vf, kl_coef)
                    loss, approx_kl = terms["loss"], terms["approx_kl"]
                    stats.add(batch.n_valid, terms)

                    # Early stopping on SB3's criterion (SB3 issue #417, PR #419), a non-finite loss reported before it.
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
                    # One host read for both guards (loss + norm is finite iff both are), before the optimizer steps.
                    if not math.isfinite((loss.detach() + grad_norm).item()):
                        if not math.isfinite(loss.item()):
                            self._raise_non_finite("loss", epoch, terms)
                        self._raise_non_finite("gradient", epoch, dict(grad_norm=grad_norm, loss=loss))
                    grad_norms.append(grad_norm.detach())
                    optimizer_step.step()
            finally:
                batches.close()  # the buffer's generator is finished, also after an early stop or an error
            self._n_updates += 1
            if not continue_training:
                break
            epochs_completed += 1

        # pi_new on the same samples: the analytic KL(pi_old || pi_new) of this update.
        new_distributions = self._rollout_distributions(stride)
        kl = analytic_kl(old_distributions, new_distributions)
        if self.uses_kl_penalty and self.kl_target is not None:
            self.current_kl_coef = losses.adapt_kl_coef(
                self.current_kl_coef,
                float(kl.mean().item()),
                self.kl_target,
                factor=self.kl_adapt_factor,
                tolerance=self.kl_adapt_tolerance,
                bounds=self.kl_coef_bounds,
            )
        self._log_update(stats, grad_norms, epochs_completed, kl, kl_coef, new_distributions, clip_range, clip_range_vf)

    def _log_update(
        self,
        stats: _UpdateStats,
        grad_norms: list[th.Tensor],
        epochs_completed: int,
        kl: th.Tensor,
        kl_coef: float,
        new_distributions: Distributions,
        clip_range: float | None,
        clip_range_vf: float | None,
    ) -> None:
        """Record an update's diagnostics under ``train/`` (docs/guide/diagnostics.md)."""
        record = self.logger.record
        means = stats.means()
        for key in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "loss", "entropy"):
            record(f"train/{key}", means[key])
        for key in ("clip_fraction", "clip_fraction_vf", "kl_penalty"):
            if key in means:
                record(f"train/{key}", means[key])
        ratio_min, ratio_max = stats.ratio_extremes()
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
            # Over every stored pre-squash action (or Beta logit), in the buffer's own arrays.
            actions = self.rollout_buffer.actions
            unit = self.policy.unit_actions(actions) if hasattr(self.policy, "unit_actions") else np.tanh(actions)
            record("train/action_saturation", float((np.abs(unit) > SATURATION_THRESHOLD).mean()))
        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        record("train/explained_variance", explained_var)
        record("train/n_updates", self._n_updates, exclude="tensorboard")
        if clip_range is not None:
            record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            record("train/clip_range_vf", clip_range_vf)


EXTENSION_ARGUMENTS = ("vf_clip_mode", "kl_coef", "kl_target", "kl_adapt_factor", "kl_adapt_tolerance", "kl_coef_bounds")


def extension_arguments(*values: object) -> dict[str, Any]:
    """The extensions' constructor arguments (in :data:`EXTENSION_ARGUMENTS`' order) by name, for ``_init_extensions``."""
    return dict(zip(EXTENSION_ARGUMENTS, values, strict=True))


def _engine_classes() -> Iterator[type]:
    """Every class built on the engine (PPOExt, MaskablePPOExt, RecurrentPPOExt and their subclasses)."""
    pending = list(ExtUpdateEngine.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        yield cls


__all__ = [
    "ExtUpdateEngine",
    "KLState",
    "Minibatch",
    "NoTrustRegionWarning",
    "NonFiniteLossError",
    "UnknownPolicyKwargError",
    "extension_arguments",
]
