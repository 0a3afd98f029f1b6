"""Actor-critic policies with an exact tanh-squashed Gaussian head, a Beta head and per-network learning rates."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from sb3_contrib.common.recurrent.type_aliases import RNNStates
from stable_baselines3.common.distributions import (
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    StateDependentNoiseDistribution,
)
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.preprocessing import get_action_dim
from stable_baselines3.common.torch_layers import CombinedExtractor, MlpExtractor, NatureCNN
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from stable_baselines3.common.utils import FloatSchedule, LinearSchedule
from torch import nn

from sb3_ppo_ext import speed
from sb3_ppo_ext.distributions import (
    BetaDistribution,
    TanhSquashedDistribution,
    rescale_tanh64,
)
from sb3_ppo_ext.validation import (
    DEFAULT_LOG_STD_BOUNDS,
    InvalidSettingError,
    check_network_learning_rates,
    check_policy_kwargs,
    linear_schedule_start,
)

DEFAULT_ENTROPY_ESTIMATOR = "mc"


# Prefixes (in ``named_parameters``) of the critic's parameters; every other parameter is the actor's,
# except a features extractor shared by both (``share_features_extractor=True``).
_CRITIC_PREFIXES = ("mlp_extractor.value_net.", "value_net.", "vf_features_extractor.", "lstm_critic.", "critic.")
_SHARED_PREFIX = "features_extractor."
NETWORKS = ("pi", "vf")


def learning_rate_schedule(name: str, value: float | str | Callable[[float], float]) -> Schedule:
    """
    The schedule of a ``learning_rates`` entry: a number (constant), ``"lin_<x>"`` (linear to 0) or a callable.

    :param name: the setting's name, for messages
    :param value: the entry
    """
    if isinstance(value, str):
        start = linear_schedule_start(value)
        if start is None:
            raise InvalidSettingError(f"{name}={value!r} is invalid: expected 'lin_<x>' with x > 0")
        return LinearSchedule(start, 0.0, 1.0)
    if callable(value):
        return value
    return FloatSchedule(float(value))


def network_parameters(policy: nn.Module) -> dict[str, list[nn.Parameter]]:
    """
    The actor's (``"pi"``) and the critic's (``"vf"``: critic MLP, ``value_net``, own extractor and LSTM) parameters.

    :param policy: e.g. a :class:`PPOExtActorCriticPolicy`
    :return: ``{"pi": [...], "vf": [...]}`` in ``named_parameters`` order
    :raises InvalidSettingError: a features extractor with parameters shared by the actor and the critic
    """
    groups: dict[str, list[nn.Parameter]] = {"pi": [], "vf": []}
    shared = []
    for name, parameter in policy.named_parameters():
        if getattr(policy, "share_features_extractor", False) and name.startswith(_SHARED_PREFIX):
            shared.append(name)
        groups["vf" if name.startswith(_CRITIC_PREFIXES) else "pi"].append(parameter)
    if shared:
        extractor = type(getattr(policy, "features_extractor", None)).__name__
        raise InvalidSettingError(
            f"policy_kwargs.learning_rates needs separate actor and critic networks, but the features extractor "
            f"({extractor}, {len(shared)} parameter tensors) is shared by both (share_features_extractor=True): its "
            "gradient mixes the policy and the value losses, so it has no learning rate of its own; set "
            "policy_kwargs=dict(share_features_extractor=False) to give each network its own extractor"
        )
    return groups


class CheckedForward:
    """Mixin: upstream's ``forward`` (a :meth:`direct_head` stepped directly), a non-finite log-prob a ``ValueError``."""

    _acting_plan: speed.ActingPlan | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = speed.direct_step(self, *args, **kwargs) if self.direct_head() is not None else None
        if output is None:
            output = super().forward(*args, **kwargs)  # type: ignore[misc]
        log_prob = output[2]
        if log_prob is not self.__dict__.get("_finite_log_prob") and not math.isfinite(float(log_prob.detach().sum())):
            raise ValueError(
                f"{type(self).__name__}.forward: non-finite log-probability of the sampled actions (NaN or inf in the "
                "observations or the network's outputs); check the environment's observations (VecCheckNan) and "
                "their normalisation"
            )
        return output

    def direct_head(self) -> str | None:
        """The head that :func:`sb3_ppo_ext.speed.direct_step` steps; ``None``: upstream's ``forward``."""
        return None

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """Marks one rollout collection: its steps run on an :class:`~sb3_ppo_ext.speed.ActingPlan` of the networks."""
        previous = self._acting_plan
        self._acting_plan = speed.ActingPlan.of(cast(nn.Module, self)) if self.direct_head() is not None else None
        try:
            yield
        finally:
            self._acting_plan = previous

    def _scores(
        self, latent_pi: th.Tensor, latent_vf: th.Tensor, actions: th.Tensor, entropy_requires_grad: bool, masks: Any = None
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Distribution]:
        """Values, log-probabilities, entropy and distribution of the latents, as upstream's ``evaluate_actions``."""
        distribution = self._get_action_dist_from_latent(latent_pi)  # type: ignore[attr-defined]
        if masks is not None:
            distribution.apply_masking(masks)
        values, log_prob = speed.lean_call(self.value_net, latent_vf), distribution.log_prob(actions)  # type: ignore[attr-defined]
        with th.set_grad_enabled(entropy_requires_grad and th.is_grad_enabled()):
            entropy = distribution.entropy()
        return values, log_prob, entropy, distribution

    def _latents(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor]:
        """The actor's and the critic's latents, as upstream's ``forward`` computes them (SB3's MlpExtractor: lean layers)."""
        features = self.extract_features(obs)  # type: ignore[attr-defined]
        extractor = self.mlp_extractor  # type: ignore[attr-defined]
        shared = self.share_features_extractor  # type: ignore[attr-defined]
        if type(extractor) is MlpExtractor and not speed.runs_hooks(extractor):
            pi_features, vf_features = (features, features) if shared else features
            return speed.lean_call(extractor.policy_net, pi_features), speed.lean_call(extractor.value_net, vf_features)
        if shared:
            return extractor(features)
        pi_features, vf_features = features
        return extractor.forward_actor(pi_features), extractor.forward_critic(vf_features)


class NetworkLearningRates:
    """Mixin of the policies: ``learning_rates``, the actor's and the critic's own optimizer groups (``"network"``)."""

    learning_rates: dict[str, Any] | None = None
    learning_rate_schedules: dict[str, Schedule] | None = None
    optimizer: th.optim.Optimizer
    optimizer_class: type[th.optim.Optimizer]
    optimizer_kwargs: dict[str, Any]

    def _init_network_learning_rates(self, learning_rates: Mapping[str, Any] | None) -> None:
        """With ``learning_rates`` (judged by its row), one optimizer group per network (called last in ``__init__``)."""
        self.learning_rates = None if learning_rates is None else dict(learning_rates)
        self.learning_rate_schedules = None
        if self.learning_rates is None:
            return
        # After every parent's __init__ (sb3-contrib's LSTM policy builds its optimizer last).
        schedules = self._set_schedules("policy_kwargs.learning_rates", self.learning_rates)
        parameters = network_parameters(self)  # type: ignore[arg-type]
        groups = [{"params": parameters[network], "lr": schedules[network](1), "network": network} for network in NETWORKS]
        self.optimizer = self.optimizer_class(groups, **self.optimizer_kwargs)

    fast: bool = False

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()  # type: ignore[misc]
        data["learning_rates"] = self.learning_rates
        data["fast"] = self.fast
        return data

    def set_learning_rates(self, progress_remaining: float) -> dict[str, float]:
        """
        Set the actor's and the critic's groups from their schedules.

        :param progress_remaining: training progress remaining (1 to 0)
        :return: ``{"pi": rate, "vf": rate}`` as set
        """
        if self.learning_rate_schedules is None:
            raise InvalidSettingError(f"{type(self).__name__} has no learning_rates: its optimizer has one group")
        rates = {network: float(schedule(progress_remaining)) for network, schedule in self.learning_rate_schedules.items()}
        for group in self.optimizer.param_groups:
            if group.get("network") in rates:
                group["lr"] = rates[group["network"]]
        return rates

    def replace_learning_rates(self, learning_rates: Mapping[str, Any]) -> None:
        """
        Replace the ``learning_rates`` and set the groups at progress 1, keeping the optimizer's state.

        :param learning_rates: ``{"pi": rate, "vf": rate}``, as the setting takes them
        """
        if self.learning_rate_schedules is None:
            raise InvalidSettingError(f"{type(self).__name__} has no learning_rates: its optimizer has one group")
        check_network_learning_rates("learning_rates", learning_rates)
        self.learning_rates = dict(learning_rates)
        self._set_schedules("learning_rates", self.learning_rates)
        self.set_learning_rates(1.0)

    def _set_schedules(self, setting: str, learning_rates: Mapping[str, Any]) -> dict[str, Schedule]:
        schedules = {network: learning_rate_schedule(f"{setting}.{network}", learning_rates[network]) for network in NETWORKS}
        self.learning_rate_schedules = schedules
        return schedules


class PPOExtActorCriticPolicy(CheckedForward, NetworkLearningRates, ActorCriticPolicy):
    """
    SB3's ``ActorCriticPolicy`` with an exact tanh-squashed Gaussian head for ``Box`` actions, on by default: the
    pre-squash sample ``u`` is stored and scored, and the env receives ``low + (tanh(u) + 1) / 2 * (high - low)``
    through :meth:`unscale_action`.

    :param observation_space: Observation space
    :param action_space: Action space
    :param lr_schedule: Learning rate schedule (could be constant)
    :param squash_output: tanh-squash the Gaussian head; ``None`` (default): for ``Box`` action spaces;
        ``False``: stock PPO's Gaussian plus clipping
    :param state_dependent_std: the log-std from a linear head on the actor's latent (``Box`` only, not with gSDE)
    :param log_std_bounds: ``(min, max)`` of the state-dependent log-std (``tanh``-mapped), default ``(-5, 2)``
    :param entropy_estimator: the squashed head's entropy: ``"mc"`` (default), ``"gaussian"`` or ``"sample"``
    :param action_dist: ``"gaussian"`` (default) or ``"beta"`` (:class:`~sb3_ppo_ext.distributions.BetaDistribution`)
    :param learning_rates: ``{"pi": rate, "vf": rate}``: the actor's and the critic's own learning rates; ``None``: one
    :param fast: fused Adam, NumPy steps of a state-independent Gaussian head: equal to float rounding, not bit for bit
    :param args: positional arguments of ``ActorCriticPolicy`` after ``lr_schedule``
    :param kwargs: keyword arguments of ``ActorCriticPolicy``
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        *args: Any,
        squash_output: bool | None = None,
        state_dependent_std: bool = False,
        log_std_bounds: tuple[float, float] | None = None,
        entropy_estimator: str | None = None,
        action_dist: str = "gaussian",
        learning_rates: Mapping[str, float | str | Callable[[float], float]] | None = None,
        fast: bool = False,
        **kwargs: Any,
    ):
        own: dict[str, object] = dict(squash_output=squash_output, state_dependent_std=state_dependent_std)
        own.update(log_std_bounds=log_std_bounds, entropy_estimator=entropy_estimator, action_dist=action_dist)
        check_policy_kwargs({**own, "learning_rates": learning_rates, "fast": fast, **kwargs}, action_space)
        is_beta, fast, state_dependent_std = action_dist == "beta", bool(fast), bool(state_dependent_std)
        squash_output = isinstance(action_space, spaces.Box) if squash_output is None else bool(squash_output)
        if state_dependent_std:
            low, high = log_std_bounds or DEFAULT_LOG_STD_BOUNDS
            log_std_bounds = (float(low), float(high))
        if entropy_estimator is None and squash_output and not is_beta:
            entropy_estimator = DEFAULT_ENTROPY_ESTIMATOR

        # Plain attributes read by ``_build``, which ``ActorCriticPolicy.__init__`` calls.
        self.state_dependent_std = bool(state_dependent_std)
        self.log_std_bounds = log_std_bounds
        self.entropy_estimator = entropy_estimator
        self.action_dist_name = action_dist
        # SB3 asserts that squash_output needs gSDE: build unsquashed, then switch squashing on.
        kwargs = speed.with_foreach_adam(kwargs, fused=fast)
        self.fast = fast
        super().__init__(observation_space, action_space, lr_schedule, *args, squash_output=False, **kwargs)  # type: ignore[misc]
        self._squash_output = bool(squash_output)
        if self.squash_output != self._squash_output:
            import stable_baselines3

            raise RuntimeError(
                f"{type(self).__name__}: stable_baselines3 {stable_baselines3.__version__}'s policy.squash_output does "
                f"not read the _squash_output attribute this package sets (squash_output={self._squash_output} was "
                "set, the property says otherwise): the squashed head cannot work with this SB3 version; install the "
                "version this package supports (see pyproject.toml) or pass policy_kwargs=dict(squash_output=False)"
            )
        if self._squash_output:
            assert isinstance(action_space, spaces.Box)
            half_range = (action_space.high.astype(np.float64) - action_space.low.astype(np.float64)) / 2.0
            # A zero-width dimension's constant log(0) cancels in ratios and KLs: left out.
            self._log_half_range_sum = float(np.log(half_range[half_range > 0]).sum())
            if is_beta:
                assert isinstance(self.action_dist, BetaDistribution)
                self.action_dist.log_range_sum = float(np.log(2.0 * half_range[half_range > 0]).sum())
        self._init_network_learning_rates(learning_rates)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            squash_output=self.squash_output,
            state_dependent_std=self.state_dependent_std,
            log_std_bounds=self.log_std_bounds if self.state_dependent_std else None,
            entropy_estimator=self.entropy_estimator,
            action_dist=self.action_dist_name,
        )
        return data

    def _build(self, lr_schedule: Schedule) -> None:
        super()._build(lr_schedule)
        if self.action_dist_name == "beta":
            self._build_beta_head(lr_schedule)
            return
        if not self.state_dependent_std:
            return
        del self.log_std
        self.log_std_net = nn.Linear(self.mlp_extractor.latent_dim_pi, get_action_dim(self.action_space))
        if self.ortho_init:
            self.init_weights(self.log_std_net, gain=0.01)
        assert self.log_std_bounds is not None
        low, high = self.log_std_bounds
        with th.no_grad():
            self.log_std_net.bias.fill_(math.atanh(2.0 * (self.log_std_init - low) / (high - low) - 1.0))
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)  # type: ignore[call-arg]

    def _build_beta_head(self, lr_schedule: Schedule) -> None:
        """Replace the Gaussian head (``action_net`` and ``log_std``) by the Beta head's ``action_net`` of 2 x dim outputs."""
        action_dim = get_action_dim(self.action_space)
        del self.log_std
        self.action_dist = BetaDistribution(action_dim)  # log_range_sum: set by __init__ once the bounds are read
        self.action_net = self.action_dist.proba_distribution_net(self.mlp_extractor.latent_dim_pi)
        if self.ortho_init:
            self.init_weights(self.action_net, gain=0.01)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)  # type: ignore[call-arg]

    def _bounded_log_std(self, latent_pi: th.Tensor) -> th.Tensor:
        assert self.log_std_bounds is not None
        low, high = self.log_std_bounds
        return low + 0.5 * (high - low) * (th.tanh(speed.lean_call(self.log_std_net, latent_pi)) + 1.0)

    def _get_action_dist_from_latent(self, latent_pi: th.Tensor) -> Distribution:
        if isinstance(self.action_dist, BetaDistribution):
            return self.action_dist.proba_distribution(speed.lean_call(self.action_net, latent_pi))
        if self.state_dependent_std:
            distribution = self.action_dist.proba_distribution(
                speed.lean_call(self.action_net, latent_pi), self._bounded_log_std(latent_pi)
            )
        else:
            distribution = super()._get_action_dist_from_latent(latent_pi)
        if self.squash_output:
            assert self.entropy_estimator is not None
            return TanhSquashedDistribution(
                distribution,  # type: ignore[arg-type]
                self._log_half_range_sum,
                self.entropy_estimator,
            )
        return distribution

    def direct_head(self) -> str | None:
        """``"gaussian"``, ``"sde"`` or ``"categorical"``: the head stepped without distribution objects; else ``None``."""
        if type(self)._get_action_dist_from_latent is not _OWN_HEADS[0]:  # a subclass's or a patch's own distribution
            return None
        dist = self.action_dist
        if type(dist) is DiagGaussianDistribution:
            return "gaussian"
        if type(dist) is StateDependentNoiseDistribution and dist.bijector is None and not self.state_dependent_std:
            return "sde"
        return "categorical" if type(dist) is CategoricalDistribution else None

    def evaluate_actions_and_distribution(
        self, obs: PyTorchObs, actions: th.Tensor, entropy_requires_grad: bool = True, need_distribution: bool = True
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Distribution | None]:
        """
        ``evaluate_actions`` that also returns the action distribution (for the KL penalty, without a second pass).

        :param obs: Observation
        :param actions: Actions as stored in the rollout buffer (pre-squash for the squashed head)
        :param entropy_requires_grad: ``False`` computes the entropy outside the autograd graph
        :param need_distribution: ``False``: the Gaussian heads may return ``None`` for the distribution
        :return: values, log-likelihood of the actions, entropy (``None``: estimated from samples), distribution
        """
        if not need_distribution:
            scores = speed.direct_scores(self, obs, actions, entropy_requires_grad)  # type: ignore[arg-type]
            if scores is not None:
                return (*scores, None)
        return self._scores(*self._latents(obs), actions, entropy_requires_grad)

    def evaluate_actions(self, obs: PyTorchObs, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        values, log_prob, entropy, _ = self.evaluate_actions_and_distribution(obs, actions, need_distribution=False)
        return values, log_prob, entropy

    def unit_actions(self, stored: np.ndarray) -> np.ndarray:
        """Stored actions as the env's actions in ``[-1, 1]`` units."""
        scale = 0.5 if self.action_dist_name == "beta" else 1.0  # sigmoid(u) = (tanh(u / 2) + 1) / 2
        return np.tanh(scale * stored) if self.squash_output else stored

    def unscale_action(self, scaled_action: np.ndarray) -> np.ndarray:
        """The env's action of a stored one (pre-squash ``u`` or the Beta head's logit); unsquashed: SB3's map."""
        if not self.squash_output:
            return super().unscale_action(scaled_action)
        if self.action_dist_name == "beta":
            scaled_action = 0.5 * np.asarray(scaled_action, dtype=np.float64)
        space = self.action_space
        assert isinstance(space, spaces.Box)
        cache = getattr(self, "_rescale_cache", None)
        if cache is None or cache[0] is not space:
            low64, high64 = space.low.astype(np.float64), space.high.astype(np.float64)
            cache = self._rescale_cache = (space, low64, high64, high64 - low64, space.low.dtype)
        return rescale_tanh64(scaled_action, *cache[1:])

    def scale_action(self, action: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`unscale_action`, clamped to ``|u| <= 9`` (float32 ``tanh`` saturates there)."""
        scaled = super().scale_action(action)
        if not self.squash_output:
            return scaled
        bound = np.tanh(9.0)
        return np.arctanh(np.clip(scaled, -bound, bound)) * (2.0 if self.action_dist_name == "beta" else 1.0)


# The heads' distributions as defined here and upstream: a head is stepped and scored directly only while its own.
_OWN_HEADS = (PPOExtActorCriticPolicy._get_action_dist_from_latent, MaskableActorCriticPolicy._get_action_dist_from_latent)


class PPOExtActorCriticCnnPolicy(PPOExtActorCriticPolicy):
    """:class:`PPOExtActorCriticPolicy` with SB3's ``NatureCNN`` features extractor by default."""

    def __init__(self, *args: Any, features_extractor_class: type = NatureCNN, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


class PPOExtMultiInputActorCriticPolicy(PPOExtActorCriticPolicy):
    """:class:`PPOExtActorCriticPolicy` for ``Dict`` observation spaces (SB3's ``CombinedExtractor``)."""

    def __init__(self, *args: Any, features_extractor_class: type = CombinedExtractor, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


MlpPolicy = PPOExtActorCriticPolicy
CnnPolicy = PPOExtActorCriticCnnPolicy
MultiInputPolicy = PPOExtMultiInputActorCriticPolicy


# ---- MaskablePPOExt's policies ------------------------------------------------------------------


class MaskablePPOExtPolicy(CheckedForward, NetworkLearningRates, MaskableActorCriticPolicy):
    """
    sb3-contrib's ``MaskableActorCriticPolicy`` whose ``evaluate_actions`` can also return the masked distribution.

    :param args: arguments of ``MaskableActorCriticPolicy``
    :param squash_output: ``None`` or ``False`` (masked action spaces are discrete)
    :param learning_rates: as in :class:`PPOExtActorCriticPolicy`
    :param fast: the fast mode (fused Adam), as in :class:`PPOExtActorCriticPolicy`
    :param kwargs: keyword arguments of ``MaskableActorCriticPolicy``
    """

    def __init__(
        self,
        *args: Any,
        squash_output: bool | None = None,
        learning_rates: Mapping[str, float | str | Callable[[float], float]] | None = None,
        fast: bool = False,
        **kwargs: Any,
    ):
        check_policy_kwargs({"fast": fast, "squash_output": squash_output, "learning_rates": learning_rates, **kwargs})
        self.fast = bool(fast)
        if squash_output:
            raise InvalidSettingError(
                f"squash_output={squash_output!r} is invalid for MaskablePPOExt: its action spaces (Discrete, "
                "MultiDiscrete, MultiBinary) are discrete and have no squashed head; expected None or False"
            )
        super().__init__(*args, **speed.with_foreach_adam(kwargs, fused=self.fast))
        self._init_network_learning_rates(learning_rates)

    def direct_head(self) -> str | None:
        """``"masked"``: the masked categorical head (``Discrete`` actions), stepped directly; else ``None``."""
        if (
            type(self.action_dist) is not MaskableCategoricalDistribution
            or type(self)._get_action_dist_from_latent is not _OWN_HEADS[1]
        ):
            return None
        return "masked"

    def evaluate_actions_and_distribution(
        self,
        obs: PyTorchObs,
        actions: th.Tensor,
        action_masks: th.Tensor | None = None,
        entropy_requires_grad: bool = True,
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Any]:
        """Upstream's ``evaluate_actions`` (``action_masks``: ``None`` for none) that also returns the distribution."""
        return self._scores(*self._latents(obs), actions, entropy_requires_grad, action_masks)

    def evaluate_actions(
        self, obs: th.Tensor, actions: th.Tensor, action_masks: th.Tensor | None = None
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        values, log_prob, entropy, _ = self.evaluate_actions_and_distribution(obs, actions, action_masks)
        return values, log_prob, entropy


class MaskablePPOExtCnnPolicy(MaskablePPOExtPolicy):
    """:class:`MaskablePPOExtPolicy` with SB3's ``NatureCNN`` features extractor by default."""

    def __init__(self, *args: Any, features_extractor_class: type = NatureCNN, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


class MaskablePPOExtMultiInputPolicy(MaskablePPOExtPolicy):
    """:class:`MaskablePPOExtPolicy` for ``Dict`` observation spaces (SB3's ``CombinedExtractor``)."""

    def __init__(self, *args: Any, features_extractor_class: type = CombinedExtractor, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


# ---- RecurrentPPOExt's policies -----------------------------------------------------------------


class SquashedActionsWarning(UserWarning):
    """A squashed :class:`RecurrentPPOExtPolicy` stepped outside RecurrentPPOExt's collection: its actions are pre-squash."""


class RecurrentPPOExtPolicy(PPOExtActorCriticPolicy, RecurrentActorCriticPolicy):
    """
    sb3-contrib's ``RecurrentActorCriticPolicy`` with PPOExt's squashed head for ``Box`` actions, on by default; the
    first ``forward`` outside RecurrentPPOExt's collection (:meth:`ext_collection`) warns (:class:`SquashedActionsWarning`).

    :param args: arguments of :class:`PPOExtActorCriticPolicy`
    :param kwargs: keyword arguments of both parents (PPOExt's head, sb3-contrib's LSTM)
    """

    _in_ext_collection: bool = False
    _warned_outside_ext_collection: bool = False

    @contextlib.contextmanager
    def ext_collection(self) -> Iterator[None]:
        """Marks the ``forward`` calls of RecurrentPPOExt's rollout collection, which squashes the actions it sends."""
        self._in_ext_collection = True
        try:
            yield
        finally:
            self._in_ext_collection = False

    def forward(  # type: ignore[override]
        self, obs: th.Tensor, lstm_states: RNNStates, episode_starts: th.Tensor, deterministic: bool = False
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor, RNNStates]:
        """Upstream's ``forward``; the first call outside RecurrentPPOExt's collection with the squashed head warns."""
        if self.squash_output and not self._in_ext_collection and not self._warned_outside_ext_collection:
            self._warned_outside_ext_collection = True
            warnings.warn(
                f"{type(self).__name__} has the squashed head (squash_output=True): forward returns pre-squash "
                "actions, which a file loaded with sb3_contrib.RecurrentPPO.load sends clipped to the env, not squashed: "
                "load it with sb3_ppo_ext.RecurrentPPOExt.load (predict is right under either class)",
                SquashedActionsWarning,
                stacklevel=2,
            )
        return super().forward(obs, lstm_states, episode_starts, deterministic)

    def direct_head(self) -> None:
        return None  # the LSTM's forward (states in, states out) is upstream's

    @staticmethod
    def _process_sequence(
        features: th.Tensor,
        lstm_states: tuple[th.Tensor, th.Tensor],
        episode_starts: th.Tensor,
        lstm: nn.LSTM,
    ) -> tuple[th.Tensor, th.Tensor]:
        """
        Upstream's ``_process_sequence`` with two changes (tested bit for bit, and against the installed copy): the
        states are multiplied by ``1 - episode_start`` only at steps where some sequence starts (elsewhere by exactly
        1), and the LSTM runs through :func:`~sb3_ppo_ext.speed.lean_lstm`.
        """
        n_seq = lstm_states[0].shape[1]
        features_sequence = features.reshape((n_seq, -1, lstm.input_size)).swapaxes(0, 1)
        episode_starts = episode_starts.reshape((n_seq, -1)).swapaxes(0, 1)
        resets = (episode_starts != 0.0).any(dim=1).tolist()
        if not any(resets):
            lstm_output, lstm_states = speed.lean_lstm(lstm, features_sequence, lstm_states)
            lstm_output = th.flatten(lstm_output.transpose(0, 1), start_dim=0, end_dim=1)
            return lstm_output, lstm_states  # type: ignore[return-value]
        lstm_output = []  # type: ignore[assignment]  # upstream's names: a list, then the flattened tensor
        weights = speed.lstm_weights(lstm)
        for features, episode_start, reset in zip(features_sequence, episode_starts, resets, strict=True):
            if reset:
                lstm_states = (
                    (1.0 - episode_start).view(1, n_seq, 1) * lstm_states[0],
                    (1.0 - episode_start).view(1, n_seq, 1) * lstm_states[1],
                )
            hidden, lstm_states = speed.lean_lstm(lstm, features.unsqueeze(dim=0), lstm_states, weights)
            lstm_output += [hidden]  # type: ignore[arg-type]
        lstm_output = th.flatten(th.cat(lstm_output).transpose(0, 1), start_dim=0, end_dim=1)  # type: ignore[arg-type]
        return lstm_output, lstm_states  # type: ignore[return-value]

    def _sequence_pass(
        self, features: th.Tensor, lstm_states: tuple[th.Tensor, th.Tensor], episode_starts: th.Tensor, lstm: nn.LSTM
    ) -> tuple[th.Tensor, tuple[th.Tensor, th.Tensor]]:
        """The LSTM over padded sequences: :meth:`_process_sequence`, or in the fast mode one call per sequence."""
        if not self.fast:  # sb3-contrib annotates the returned states as one tensor: they are (h, c)
            return self._process_sequence(features, lstm_states, episode_starts, lstm)  # type: ignore[return-value]
        n_seq = lstm_states[0].shape[1]
        sequences = features.reshape((n_seq, -1, lstm.input_size)).swapaxes(0, 1)  # (max length, n_seq, features)
        starts = episode_starts.reshape((n_seq, -1)).swapaxes(0, 1)
        if len(starts) > 1 and bool(starts[1:].any()):
            return self._process_sequence(features, lstm_states, episode_starts, lstm)  # type: ignore[return-value]
        keep = (1.0 - starts[0]).view(1, n_seq, 1)
        output, states = speed.lean_lstm(lstm, sequences, (keep * lstm_states[0], keep * lstm_states[1]))
        return th.flatten(output.transpose(0, 1), start_dim=0, end_dim=1), states

    def sequence_distribution(
        self, obs: PyTorchObs, lstm_states: tuple[th.Tensor, th.Tensor], episode_starts: th.Tensor
    ) -> Any:
        """Upstream's ``get_distribution`` on padded sequences, through :meth:`_sequence_pass`: no random draw."""
        features = BasePolicy.extract_features(self, obs, self.pi_features_extractor)
        latent_pi, _ = self._sequence_pass(features, lstm_states, episode_starts, self.lstm_actor)
        return self._get_action_dist_from_latent(self.mlp_extractor.forward_actor(latent_pi))

    def evaluate_actions_and_distribution(  # type: ignore[override]
        self,
        obs: PyTorchObs,
        actions: th.Tensor,
        lstm_states: RNNStates,
        episode_starts: th.Tensor,
        entropy_requires_grad: bool = True,
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Any]:
        """Upstream's ``evaluate_actions`` on padded sequences, through :meth:`_sequence_pass`, and the distribution."""
        features = self.extract_features(obs)
        if self.share_features_extractor:
            pi_features = vf_features = cast(th.Tensor, features)
        else:
            pi_features, vf_features = features
        # RNNStates annotates each LSTM's states as a tuple of any length: they are (h, c).
        pi_states, vf_states = cast(tuple[tuple[th.Tensor, th.Tensor], tuple[th.Tensor, th.Tensor]], lstm_states)
        latent_pi, _ = self._sequence_pass(pi_features, pi_states, episode_starts, self.lstm_actor)
        if self.lstm_critic is not None:
            latent_vf, _ = self._sequence_pass(vf_features, vf_states, episode_starts, self.lstm_critic)
        elif self.shared_lstm:
            latent_vf = latent_pi.detach()
        else:
            latent_vf = self.critic(vf_features)  # type: ignore[misc]  # sb3-contrib types critic as None when an LSTM serves it
        latent_pi, latent_vf = self.mlp_extractor.forward_actor(latent_pi), self.mlp_extractor.forward_critic(latent_vf)
        return self._scores(latent_pi, latent_vf, actions, entropy_requires_grad)

    def evaluate_actions(  # type: ignore[override]
        self, obs: th.Tensor, actions: th.Tensor, lstm_states: RNNStates, episode_starts: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        values, log_prob, entropy, _ = self.evaluate_actions_and_distribution(obs, actions, lstm_states, episode_starts)
        return values, log_prob, entropy


class RecurrentPPOExtCnnPolicy(RecurrentPPOExtPolicy):
    """:class:`RecurrentPPOExtPolicy` with SB3's ``NatureCNN`` features extractor by default."""

    def __init__(self, *args: Any, features_extractor_class: type = NatureCNN, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)


class RecurrentPPOExtMultiInputPolicy(RecurrentPPOExtPolicy):
    """:class:`RecurrentPPOExtPolicy` for ``Dict`` observation spaces (SB3's ``CombinedExtractor``)."""

    def __init__(self, *args: Any, features_extractor_class: type = CombinedExtractor, **kwargs: Any):
        super().__init__(*args, features_extractor_class=features_extractor_class, **kwargs)
