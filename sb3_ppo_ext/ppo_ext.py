"""PPOExt: SB3's PPO with a squashed Gaussian head, both value-clip forms, a KL penalty and diagnostics."""

from __future__ import annotations

import io
import math
import os
import pathlib
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import (
    DictRolloutBufferSamples,
    GymEnv,
    MaybeCallback,
    PyTorchObs,
    RolloutBufferSamples,
    Schedule,
)
from stable_baselines3.common.utils import FloatSchedule, explained_variance

from sb3_ppo_ext import losses
from sb3_ppo_ext.distributions import (
    analytic_kl,
    concat_distributions,
    detach_distributions,
    indexed_analytic_kl,
    mean_std,
    torch_distributions,
)
from sb3_ppo_ext.policies import CnnPolicy, MlpPolicy, MultiInputPolicy, PPOExtActorCriticPolicy
from sb3_ppo_ext.reliability import ModelFileError, atomic_path, check_model_file, zip_path

SelfPPOExt = TypeVar("SelfPPOExt", bound="PPOExt")

# Threshold on |a| (in [-1, 1] units) above which a squashed action component counts as saturated.
SATURATION_THRESHOLD = 0.99
# Rows per forward pass when computing the whole rollout's distributions before and after an update.
DISTRIBUTION_CHUNK = 2048


class NonFiniteLossError(FloatingPointError):
    """Raised by :meth:`PPOExt.train` before a non-finite loss or gradient reaches the parameters."""


def _positive_or_schedule(name: str, value: Any, allow_none: bool, check_schedule: bool = True) -> None:
    """
    ValueError unless ``value`` is a positive finite number, a schedule (positive at progress 1
    when ``check_schedule``), or an allowed None.
    """
    if value is None:
        if not allow_none:
            raise ValueError(f"{name}=None is not allowed: expected a positive float or a schedule")
        return
    if callable(value):
        if not check_schedule:
            return
        start = value(1.0)
        if not (isinstance(start, (int, float)) and math.isfinite(start) and start > 0):
            raise ValueError(f"{name} is a schedule whose initial value {start!r} is not a positive float")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        allowed = "a positive float, a schedule" + (" or None" if allow_none else "")
        raise ValueError(f"{name}={value!r} is invalid: expected {allowed}")


def _index_observations(obs: PyTorchObs, index: th.Tensor | slice) -> PyTorchObs:
    if isinstance(obs, dict):
        return {key: value[index] for key, value in obs.items()}
    return obs[index]


class _UpdateStats:
    """
    Sample-weighted means (and extremes) of per-minibatch diagnostics over a whole update.

    Per minibatch, the scalars of one ``add_mean`` call are stacked into one tensor and kept; the
    weighted means are reduced once, when first read (one tensor op per minibatch instead of two
    per diagnostic, and no host sync). Extremes keep the tensors and reduce them when read.
    """

    def __init__(self) -> None:
        # keys of one add_mean call -> (stacked rows, weights)
        self._rows: dict[tuple[str, ...], tuple[list[th.Tensor], list[float]]] = {}
        self._means: dict[str, float] | None = None
        self._extremes: dict[str, list[th.Tensor]] = {}

    def add_mean(self, weight: float, **values: th.Tensor) -> None:
        with th.no_grad():  # the scalars of one minibatch share dtype and device
            row = th.stack(tuple(values.values()))
        rows, weights = self._rows.setdefault(tuple(values), ([], []))
        rows.append(row)
        weights.append(float(weight))
        self._means = None

    def add_extremes(self, key: str, values: th.Tensor) -> None:
        self._extremes.setdefault(key, []).append(values.detach().flatten())

    def _reduce(self) -> dict[str, float]:
        if self._means is None:
            totals: dict[str, tuple[float, float]] = {}
            for keys, (rows, weights) in self._rows.items():
                weight = th.tensor(weights, dtype=th.float64, device=rows[0].device)
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


class PPOExt(PPO):
    """
    Proximal Policy Optimization with the extensions SB3's PPO lacks; a drop-in for ``PPO``.

    - an exact tanh-squashed Gaussian head for ``Box`` actions, on by default
      (see :class:`sb3_ppo_ext.policies.PPOExtActorCriticPolicy`; ``policy_kwargs=dict(squash_output=False)``
      restores stock PPO's Gaussian-plus-clip);
    - the value loss clipped in SB3's form or the max-of-two form of PPO2 (``vf_clip_mode``);
    - the KL-penalty objective of PPO1, with a fixed or adaptive coefficient, alone or together
      with the clipped surrogate (Schulman et al. 2017, sections 3-4);
    - diagnostics averaged over every minibatch of every epoch run, in the ``train/`` namespace.

    PPO1 is ``clip_range=None, kl_coef=1.0, kl_target=0.01``; the defaults are PPO2.

    Paper: https://arxiv.org/abs/1707.06347

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy, ...)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function of the current progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size
    :param n_epochs: Number of epoch when optimizing the surrogate loss
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator
    :param clip_range: Clipping parameter of the surrogate objective; a positive float, a schedule
        of the progress remaining (from 1 to 0), or ``None`` to turn clipping off
    :param clip_range_vf: Clipping parameter for the value function (float or schedule), or
        ``None`` (default) for no value clipping. This depends on the reward scaling.
    :param vf_clip_mode: With ``clip_range_vf``: ``"clipped"`` (SB3's form, loss on the clipped
        prediction only) or ``"max"`` (baselines PPO2 / CleanRL: ``mean(max((V-R)^2, (V_clip-R)^2))``).
        Both use SB3's scale (MSE without 0.5), so ``vf_coef`` means the same in each.
    :param normalize_advantage: Whether to normalize or not the advantage
    :param ent_coef: Entropy coefficient for the loss calculation
    :param vf_coef: Value function coefficient for the loss calculation
    :param kl_coef: Initial coefficient ``beta`` of the KL penalty ``beta * KL(pi_old || pi)``;
        0 (default) turns the penalty off. The KL is analytic for every head.
    :param kl_target: ``d_targ`` of the adaptive coefficient, or ``None`` for a fixed ``beta``.
        After each update (never per minibatch), with ``d`` the mean ``KL(pi_old || pi)`` over the
        rollout: ``d < d_targ / kl_adapt_tolerance`` divides ``beta`` by ``kl_adapt_factor``,
        ``d > d_targ * kl_adapt_tolerance`` multiplies it. Needs ``kl_coef > 0``.
    :param kl_adapt_factor: Multiplicative step of the adaptive coefficient (paper: 2), > 1
    :param kl_adapt_tolerance: Tolerance band of the adaptive coefficient (paper: 1.5), > 1
    :param kl_coef_bounds: ``(min, max)`` within which the adaptive ``beta`` is kept
    :param max_grad_norm: The maximum value for the gradient clipping
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE)
        instead of action noise exploration (default: False)
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE
        Default: -1 (only sample at the beginning of the rollout)
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it will be automatically selected.
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation
    :param target_kl: Limit the KL divergence between updates (SB3's early stopping on the
        per-minibatch ``approx_kl``), ``None`` for no limit
    :param stats_window_size: Window size for the rollout logging, specifying the number of episodes to average
        the reported success rate, mean episode length, and mean reward over
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation, including
        ``squash_output``, ``state_dependent_std``, ``log_std_bounds`` and ``entropy_estimator``
    :param verbose: Verbosity level: 0 for no output, 1 for info messages (such as device or wrappers used), 2 for
        debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run.
        Setting it to auto, the code will be run on the GPU if possible.
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }
    policy: ActorCriticPolicy
    clip_range: Schedule | None  # type: ignore[assignment]

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int = 2048,
        batch_size: int = 64,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range: float | Schedule | None = 0.2,
        clip_range_vf: float | Schedule | None = None,
        vf_clip_mode: str = "clipped",
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        kl_coef: float = 0.0,
        kl_target: float | None = None,
        kl_adapt_factor: float = 2.0,
        kl_adapt_tolerance: float = 1.5,
        kl_coef_bounds: tuple[float, float] = (1e-4, 1e4),
        max_grad_norm: float = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ):
        self._check_arguments(
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
            vf_clip_mode=vf_clip_mode,
            kl_coef=kl_coef,
            kl_target=kl_target,
            kl_adapt_factor=kl_adapt_factor,
            kl_adapt_tolerance=kl_adapt_tolerance,
            kl_coef_bounds=kl_coef_bounds,
            max_grad_norm=max_grad_norm,
            target_kl=target_kl,
        )
        super().__init__(
            policy,
            env,
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gamma=gamma,
            gae_lambda=gae_lambda,
            clip_range=clip_range,  # type: ignore[arg-type]
            clip_range_vf=clip_range_vf,
            normalize_advantage=normalize_advantage,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            target_kl=target_kl,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=False,
        )
        self.vf_clip_mode = vf_clip_mode
        self.kl_coef = float(kl_coef)
        self.kl_target = None if kl_target is None else float(kl_target)
        self.kl_adapt_factor = float(kl_adapt_factor)
        self.kl_adapt_tolerance = float(kl_adapt_tolerance)
        self.kl_coef_bounds = (float(kl_coef_bounds[0]), float(kl_coef_bounds[1]))
        # The live beta: adapted after each update, saved with the model, carried on by a
        # continued ``learn``. Set here and not in ``_setup_model`` so that ``load`` (which calls
        # ``_setup_model`` after restoring the saved attributes) keeps the saved value.
        self.current_kl_coef = self.kl_coef

        if _init_setup_model:
            self._setup_model()

    @staticmethod
    def _check_arguments(
        clip_range: Any,
        clip_range_vf: Any,
        vf_clip_mode: Any,
        kl_coef: Any,
        kl_target: Any,
        kl_adapt_factor: Any,
        kl_adapt_tolerance: Any,
        kl_coef_bounds: Any,
        max_grad_norm: Any,
        target_kl: Any,
        check_schedules: bool = True,
    ) -> None:
        """Raise ValueError, naming the parameter, the value and what is allowed, for any invalid argument."""
        _positive_or_schedule("clip_range", clip_range, allow_none=True, check_schedule=check_schedules)
        _positive_or_schedule("clip_range_vf", clip_range_vf, allow_none=True, check_schedule=check_schedules)
        if vf_clip_mode not in losses.VF_CLIP_MODES:
            raise ValueError(f"vf_clip_mode={vf_clip_mode!r} is invalid: expected one of {losses.VF_CLIP_MODES}")
        if vf_clip_mode == "max" and clip_range_vf is None:
            raise ValueError("vf_clip_mode='max' needs clip_range_vf (a positive float or schedule); it is None")
        if isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float)) or not math.isfinite(kl_coef) or kl_coef < 0:
            raise ValueError(f"kl_coef={kl_coef!r} is invalid: expected a finite float >= 0 (0 turns the KL penalty off)")
        if kl_target is not None:
            if isinstance(kl_target, bool) or not isinstance(kl_target, (int, float)) or not kl_target > 0:
                raise ValueError(f"kl_target={kl_target!r} is invalid: expected a float > 0 or None")
            if kl_coef == 0:
                raise ValueError(
                    f"kl_target={kl_target!r} needs kl_coef > 0 (the initial beta); with kl_coef=0 the penalty is off"
                )
        for name, value in (("kl_adapt_factor", kl_adapt_factor), ("kl_adapt_tolerance", kl_adapt_tolerance)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 1):
                raise ValueError(f"{name}={value!r} is invalid: expected a finite float > 1")
        try:
            low, high = (float(b) for b in kl_coef_bounds)
        except (TypeError, ValueError):
            raise ValueError(f"kl_coef_bounds={kl_coef_bounds!r} is invalid: expected (min, max) floats") from None
        if not (0 < low <= high and math.isfinite(high)):
            raise ValueError(f"kl_coef_bounds={kl_coef_bounds!r} is invalid: expected finite 0 < min <= max")
        if kl_target is not None and not low <= kl_coef <= high:
            raise ValueError(f"kl_coef={kl_coef!r} must lie within kl_coef_bounds={kl_coef_bounds!r} when kl_target is set")
        if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float)) or not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm={max_grad_norm!r} is invalid: expected a float > 0")
        if target_kl is not None and (
            isinstance(target_kl, bool) or not isinstance(target_kl, (int, float)) or not target_kl > 0
        ):
            raise ValueError(f"target_kl={target_kl!r} is invalid: expected a float > 0 or None")

    def _setup_model(self) -> None:
        # PPO._setup_model wraps ``clip_range`` in a FloatSchedule unconditionally, which rejects
        # ``None`` (clipping off): run the on-policy setup it builds on and convert here instead.
        super(PPO, self)._setup_model()
        # Checked again here because ``load(path, **kwargs)`` overrides attributes without __init__.
        # Schedules are not evaluated: ``load``'s ``custom_objects`` may replace them for a model
        # that will not train (rl-zoo3's enjoy passes ``clip_range=lambda _: 0.0``).
        self._check_arguments(
            check_schedules=False,
            clip_range=self.clip_range,
            clip_range_vf=self.clip_range_vf,
            vf_clip_mode=self.vf_clip_mode,
            kl_coef=self.kl_coef,
            kl_target=self.kl_target,
            kl_adapt_factor=self.kl_adapt_factor,
            kl_adapt_tolerance=self.kl_adapt_tolerance,
            kl_coef_bounds=self.kl_coef_bounds,
            max_grad_norm=self.max_grad_norm,
            target_kl=self.target_kl,
        )
        if self.clip_range is not None:
            self.clip_range = FloatSchedule(self.clip_range)
        if self.clip_range_vf is not None:
            self.clip_range_vf = FloatSchedule(self.clip_range_vf)

    @property
    def uses_kl_penalty(self) -> bool:
        """Whether the KL penalty is part of the objective (``kl_coef > 0``)."""
        return self.kl_coef > 0

    def _evaluate(
        self, obs: PyTorchObs, actions: th.Tensor, need_distribution: bool
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Distribution | None]:
        """
        Values, log-probabilities, entropy and (if needed) the action distribution on a minibatch.

        With ``ent_coef == 0`` the entropy is only logged: a PPOExt policy computes it outside the
        autograd graph (same value, same random draws).
        """
        if isinstance(self.policy, PPOExtActorCriticPolicy):
            return self.policy.evaluate_actions_and_distribution(obs, actions, entropy_requires_grad=self.ent_coef != 0)
        # A plain SB3 ActorCriticPolicy: a second actor pass yields the distribution.
        values, log_prob, entropy = self.policy.evaluate_actions(obs, actions)
        return values, log_prob, entropy, self.policy.get_distribution(obs) if need_distribution else None

    def _rollout_distributions(self, obs: PyTorchObs, n_samples: int) -> list[th.distributions.Distribution]:
        """The policy's (detached) action distributions on the whole rollout, in eval mode, in chunks."""
        self.policy.set_training_mode(False)
        chunks = []
        with th.no_grad():
            for start in range(0, n_samples, DISTRIBUTION_CHUNK):
                index = slice(start, start + DISTRIBUTION_CHUNK)
                chunks.append(
                    detach_distributions(torch_distributions(self.policy.get_distribution(_index_observations(obs, index))))
                )
        return concat_distributions(chunks)

    def _minibatches(self, epoch: int, row_of_sample: np.ndarray) -> Iterator[th.Tensor]:
        """
        Rows of one epoch's minibatches, exactly stock PPO's: SB3's ``RolloutBuffer.get`` draws a
        fresh permutation of the samples per epoch from NumPy's global RNG and cuts it in
        ``batch_size`` pieces. The rollout tensors are already in the first epoch's permutation
        (drawn by ``get(None)``), so epoch 0 takes them in order and every later epoch maps its
        own permutation of samples to rows.

        :param epoch: epoch number within the update
        :param row_of_sample: the row of the rollout tensors that holds each sample
        """
        n_samples = len(row_of_sample)
        rows = np.arange(n_samples) if epoch == 0 else row_of_sample[np.random.permutation(n_samples)]
        yield from th.split(th.as_tensor(rows, device=self.device), self.batch_size)

    def _raise_non_finite(self, what: str, epoch: int, terms: dict[str, th.Tensor]) -> None:
        details = ", ".join(f"{name}={value.item():.6g}" for name, value in terms.items() if value.dim() == 0)
        self.policy.optimizer.zero_grad()
        raise NonFiniteLossError(
            f"PPOExt.train(): non-finite {what} at update {self._n_updates} (epoch {epoch}): {details}. "
            "No parameter was updated with it, so the model and its saved checkpoints are intact. "
            "Check the environment's observations and rewards for NaN/inf (VecCheckNan), "
            "observation/reward normalisation and the learning rate."
        )

    def minibatch_losses(
        self,
        rollout: RolloutBufferSamples | DictRolloutBufferSamples,
        index: th.Tensor,
        all_actions: th.Tensor,
        old_distributions: list[th.distributions.Distribution],
        clip_range: float | None,
        clip_range_vf: float | None,
        kl_coef: float,
    ) -> dict[str, th.Tensor]:
        """
        Every loss term and per-minibatch diagnostic on the rows ``index`` of the rollout.

        :param rollout: the whole rollout as one batch of tensors
        :param index: rows of this minibatch
        :param all_actions: the rollout's actions as the policy scores them (long for Discrete)
        :param old_distributions: ``pi_old`` on every row (for the analytic KL)
        :param clip_range: current surrogate clip range, or ``None``
        :param clip_range_vf: current value clip range, or ``None``
        :param kl_coef: current ``beta`` (0: no penalty)
        :return: ``loss`` (with gradient) and its terms, ``approx_kl``, clip fractions (detached)
            and the per-sample ``ratio``
        """
        values, log_prob, entropy, distribution = self._evaluate(
            _index_observations(rollout.observations, index), all_actions[index], need_distribution=kl_coef > 0
        )
        values = values.flatten()
        old_values = rollout.old_values[index]
        advantages = rollout.advantages[index]
        # Normalization does not make sense if mini batchsize == 1, see SB3 GH issue #325
        if self.normalize_advantage and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)

        # ratio between old and new policy, should be one at the first minibatch
        log_ratio = log_prob - rollout.old_log_prob[index]
        ratio = th.exp(log_ratio)
        policy_loss = losses.clipped_surrogate_loss(advantages, ratio, clip_range)
        terms = {}
        if kl_coef > 0:
            assert distribution is not None
            kl = indexed_analytic_kl(old_distributions, index, torch_distributions(distribution))
            kl_penalty = losses.kl_penalty_loss(kl, kl_coef)
            terms["kl_penalty"] = kl_penalty
        else:
            kl_penalty = None
        value_loss = losses.value_loss(values, old_values, rollout.returns[index], clip_range_vf, self.vf_clip_mode)
        # Entropy loss favors exploration; approximate it from samples when there is no closed form
        entropy_mean = -th.mean(log_prob) if entropy is None else th.mean(entropy)
        entropy_loss = -entropy_mean

        # Without the penalty no zero tensor is added (one autograd node fewer, the same value).
        # Summed in stock PPO's order (policy, entropy, value), so that without the squashed head
        # and the penalty the loss and its gradient are PPO's bit for bit. With ent_coef == 0 the
        # entropy term adds nothing but a backward pass through the entropy estimate (a Monte
        # Carlo sample for the squashed head): it is left out of the graph (x + 0 * y == x exactly).
        loss = policy_loss if kl_penalty is None else policy_loss + kl_penalty
        if self.ent_coef != 0:
            loss = loss + self.ent_coef * entropy_loss
        loss = loss + self.vf_coef * value_loss

        with th.no_grad():
            terms.update(
                policy_gradient_loss=policy_loss.detach(),
                value_loss=value_loss.detach(),
                entropy_loss=entropy_loss.detach(),
                entropy=entropy_mean.detach(),
                approx_kl=losses.approx_kl_k3(log_ratio),
                ratio=ratio.detach(),
            )
            if clip_range is not None:
                terms["clip_fraction"] = losses.clip_fraction(ratio, clip_range)
            if clip_range_vf is not None:
                terms["clip_fraction_vf"] = losses.value_clip_fraction(values, old_values, clip_range_vf)
        if "kl_penalty" in terms:
            terms["kl_penalty"] = terms["kl_penalty"].detach()
        terms["loss"] = loss
        return terms

    def train(self) -> None:
        """
        Update policy using the currently gathered rollout buffer.

        Written out rather than extending ``PPO.train``, which has no hook for extra loss terms
        or for per-minibatch statistics; the steps and their order follow SB3's.
        """
        self._update_learning_rate(self.policy.optimizer)
        progress = self._current_progress_remaining
        clip_range = None if self.clip_range is None else float(self.clip_range(progress))
        clip_range_vf = None if self.clip_range_vf is None else float(self.clip_range_vf(progress))  # type: ignore[operator]
        kl_coef = self.current_kl_coef if self.uses_kl_penalty else 0.0

        # The whole rollout once as tensors; minibatches are slices of it. get() shuffles the rows
        # with a permutation from NumPy's global RNG: read it from a copy of the RNG state first,
        # so that the minibatches below can be stock PPO's, draw for draw.
        peek = np.random.RandomState()
        peek.set_state(np.random.get_state())
        rollout_order = peek.permutation(self.rollout_buffer.buffer_size * self.rollout_buffer.n_envs)
        row_of_sample = np.argsort(rollout_order)  # the inverse permutation
        rollout = next(self.rollout_buffer.get(batch_size=None))
        n_samples = rollout.advantages.shape[0]
        all_actions = rollout.actions
        if isinstance(self.action_space, spaces.Discrete):
            all_actions = all_actions.long().flatten()
        # pi_old on every sample, in the mode it was sampled in (eval), for the analytic KL.
        old_distributions = self._rollout_distributions(rollout.observations, n_samples)
        self.policy.set_training_mode(True)

        stats = _UpdateStats()
        grad_norms: list[th.Tensor] = []
        continue_training = True
        epochs_completed = 0
        for epoch in range(self.n_epochs):
            for index in self._minibatches(epoch, row_of_sample):
                terms = self.minibatch_losses(
                    rollout, index, all_actions, old_distributions, clip_range, clip_range_vf, kl_coef
                )
                loss, approx_kl = terms["loss"], terms["approx_kl"]
                stats.add_mean(float(len(index)), **{k: v for k, v in terms.items() if k != "ratio"})
                stats.add_extremes("ratio", terms["ratio"])

                # One host read instead of th.isfinite's element-wise ops (the same test on a scalar).
                if not math.isfinite(loss.item()):
                    self._raise_non_finite("loss", epoch, terms)

                # Early stopping on SB3's criterion, see SB3 issue #417 and PR #419
                if self.target_kl is not None and approx_kl > 1.5 * self.target_kl:
                    continue_training = False
                    if self.verbose >= 1:
                        self.logger.info(f"Early stopping at step {epoch} due to reaching max kl: {approx_kl.item():.2f}")
                    break

                self.policy.optimizer.zero_grad()
                loss.backward()
                grad_norm = th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                if not math.isfinite(grad_norm.item()):
                    self._raise_non_finite("gradient", epoch, dict(grad_norm=grad_norm, loss=loss))
                grad_norms.append(grad_norm.detach())
                self.policy.optimizer.step()

            self._n_updates += 1
            if not continue_training:
                break
            epochs_completed += 1

        # pi_new on every sample: the analytic KL(pi_old || pi_new) of this update.
        new_distributions = self._rollout_distributions(rollout.observations, n_samples)
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
            mean_kl=mean_kl,
            max_kl=float(kl.max().item()),
            kl_coef=kl_coef,
            all_actions=all_actions,
            new_distributions=new_distributions,
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
        )

    def _log_update(
        self,
        stats: _UpdateStats,
        grad_norms: list[th.Tensor],
        epochs_completed: int,
        mean_kl: float,
        max_kl: float,
        kl_coef: float,
        all_actions: th.Tensor,
        new_distributions: list[th.distributions.Distribution],
        clip_range: float | None,
        clip_range_vf: float | None,
    ) -> None:
        """Record an update's diagnostics under ``train/`` (see the README's metrics glossary)."""
        record = self.logger.record
        for key in ("entropy_loss", "policy_gradient_loss", "value_loss", "approx_kl", "loss", "entropy"):
            record(f"train/{key}", stats.mean(key))
        if "clip_fraction" in stats:
            record("train/clip_fraction", stats.mean("clip_fraction"))
        if "clip_fraction_vf" in stats:
            record("train/clip_fraction_vf", stats.mean("clip_fraction_vf"))
        if "kl_penalty" in stats:
            record("train/kl_penalty", stats.mean("kl_penalty"))
        ratio_min, ratio_max = stats.extremes("ratio")
        record("train/ratio_min", ratio_min)
        record("train/ratio_max", ratio_max)
        if grad_norms:
            record("train/grad_norm", float(th.stack(grad_norms).mean().item()))
        record("train/kl", mean_kl)
        record("train/kl_max", max_kl)
        if self.uses_kl_penalty:
            record("train/kl_coef", kl_coef)
        record("train/epochs_completed", epochs_completed)
        std = mean_std(new_distributions)
        if std is not None:
            record("train/std", std)
        if self.policy.squash_output:
            saturated = th.abs(th.tanh(all_actions)) > SATURATION_THRESHOLD
            record("train/action_saturation", float(saturated.float().mean().item()))
        explained_var = explained_variance(self.rollout_buffer.values.flatten(), self.rollout_buffer.returns.flatten())
        record("train/explained_variance", explained_var)
        record("train/n_updates", self._n_updates, exclude="tensorboard")
        if clip_range is not None:
            record("train/clip_range", clip_range)
        if clip_range_vf is not None:
            record("train/clip_range_vf", clip_range_vf)

    def learn(
        self: SelfPPOExt,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "PPOExt",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfPPOExt:
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )

    def save(
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """
        SB3's ``save``, atomic for a path: the zip is written to a temporary file in the same folder
        and renamed over ``path`` once complete, so an interrupted save leaves the previous file intact.

        :param path: file (``.zip`` appended when the name has no suffix, as in SB3) or binary file object
        :param exclude: names of parameters to exclude in addition to the default ones
        :param include: names of parameters to include even if excluded by default
        """
        if not isinstance(path, (str, os.PathLike)):
            super().save(path, exclude=exclude, include=include)
            return
        with atomic_path(zip_path(path)) as file:
            super().save(file, exclude=exclude, include=include)  # type: ignore[arg-type]

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfPPOExt],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> SelfPPOExt:
        """
        SB3's ``load``, with a :class:`sb3_ppo_ext.reliability.ModelFileError` naming the file and the
        problem for a missing, truncated, corrupt or foreign file (checked before anything is unpickled)
        and for an ``env`` whose spaces differ from the saved ones. Files saved by stock ``PPO`` load
        (stock policy, PPOExt's extras at their defaults). The file's pickled objects are trusted:
        load only files you trust.
        """
        if isinstance(path, (str, os.PathLike)):
            path = check_model_file(path, cls.__name__)
        try:
            return super().load(  # type: ignore[return-value]
                path,
                env=env,
                device=device,
                custom_objects=custom_objects,
                print_system_info=print_system_info,
                force_reset=force_reset,
                **kwargs,
            )
        except ValueError as error:
            if not str(error).startswith(("Observation spaces do not match", "Action spaces do not match")):
                raise
            raise ModelFileError(f"{cls.__name__}.load: {path} does not fit the given env: {error}") from error


__all__ = ["NonFiniteLossError", "PPOExt"]
