"""Tanh-squashed Gaussian and Beta action distributions, and analytic KL helpers.

The squashed head works on the *pre-squash* sample ``u``: the policy returns ``u``, the rollout
buffer stores ``u`` and the environment receives ``a = low + (tanh(u) + 1) / 2 * (high - low)``
(see :meth:`sb3_ppo_ext.policies.PPOExtActorCriticPolicy.unscale_action`). Scoring the stored ``u``
instead of inverting a saturated float32 action through ``atanh`` is what keeps the PPO ratio
exact (SB3's ``SquashedDiagGaussianDistribution`` inverts the action and is off for ``|u| > ~9``).

The Beta head (:class:`BetaDistribution`) works the same way on the *logit* ``u = log(x / (1 - x))``
of its Beta sample ``x`` in (0, 1): the environment receives ``a = low + sigmoid(u) * (high - low)``.
A float32 ``x`` rounds to 1 from ``1 - 6e-8`` on, where ``log(1 - x)`` is ``-inf``; its logit is
finite, and ``log x = -softplus(-u)``, ``log(1 - x) = -softplus(u)`` are exact for any finite ``u``.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
import torch as th
from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution, MaskableMultiCategoricalDistribution
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    Distribution,
    MultiCategoricalDistribution,
    StateDependentNoiseDistribution,
    sum_independent_dims,
)
from torch import nn
from torch.distributions import Bernoulli, Beta, Categorical, Gamma, Normal
from torch.distributions import kl_divergence as th_kl_divergence
from torch.nn import functional as F

from sb3_ppo_ext.validation import ENTROPY_ESTIMATORS, InvalidSettingError

_TWO_LOG_TWO = 2.0 * math.log(2.0)
_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)


def log_tanh_jacobian(u: th.Tensor) -> th.Tensor:
    """
    Element-wise ``log(1 - tanh(u)^2)``, computed stably.

    ``1 - tanh(u)^2`` underflows to 0 in float32 for ``|u| > ~9``; the identity
    ``log(1 - tanh(u)^2) = 2 * (log(2) - log(exp(u) + exp(-u)))`` stays finite for any finite ``u``
    (``logaddexp`` is computed as ``|u| + log1p(exp(-2|u|))``).

    :param u: pre-squash values
    :return: ``log(1 - tanh(u)^2)``, same shape as ``u``
    """
    return _TWO_LOG_TWO - 2.0 * th.logaddexp(u, -u)


def log_tanh_jacobian_sum(u: th.Tensor) -> th.Tensor:
    """
    ``log_tanh_jacobian(u).sum(dim=-1)`` with fewer tensor operations (the constant is added once).

    :param u: pre-squash values, action dimensions last
    :return: ``sum_i log(1 - tanh(u_i)^2)``, shape ``u.shape[:-1]``
    """
    return (_TWO_LOG_TWO * u.shape[-1]) - 2.0 * th.logaddexp(u, -u).sum(dim=-1)


def squashed_log_prob(
    actions: th.Tensor,
    loc: th.Tensor,
    scale: th.Tensor,
    log_half_range_sum: float,
    scale_terms: tuple[th.Tensor, th.Tensor] | None = None,
) -> th.Tensor:
    """
    :meth:`TanhSquashedDistribution.log_prob` from the base Gaussian's parameters (what a rollout step
    computes without building the distribution).

    :param actions: pre-squash values ``u``
    :param loc: the base Gaussian's mean
    :param scale: the base Gaussian's standard deviation
    :param log_half_range_sum: ``sum(log((high - low) / 2))`` over the action dimensions
    :param scale_terms: :func:`gaussian_scale_terms` of ``scale``, computed beforehand (rollout steps, no autograd)
    :return: log-density of the environment action, summed over action dimensions
    """
    z = (actions - loc) / scale
    jacobian = th.logaddexp(actions, -actions).mul(2.0)  # log(scale) after it, as before: the update's graph unchanged
    per_dimension = th.addcmul(jacobian - (scale.log() if scale_terms is None else scale_terms[1]), z, z, value=-0.5)
    constant = (_HALF_LOG_TWO_PI + _TWO_LOG_TWO) * actions.shape[-1] + log_half_range_sum
    return per_dimension.sum(dim=-1) - constant


# torch's constant in ``Normal.log_prob``, written as torch writes it (a different rounding would change bits).
_LOG_SQRT_TWO_PI = math.log(math.sqrt(2 * math.pi))
_HUGE_NEG_LOGIT = -1e8  # sb3-contrib's logit of a masked-out action (MaskableCategorical.apply_masking)


def gaussian_scale_terms(scale: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """``(2 * scale**2, scale.log())``: what ``Normal.log_prob`` computes from the scale, as it computes it."""
    return 2 * scale**2, scale.log()


def gaussian_log_prob(
    actions: th.Tensor, mean: th.Tensor, scale: th.Tensor, scale_terms: tuple[th.Tensor, th.Tensor] | None = None
) -> th.Tensor:
    """
    SB3's ``DiagGaussianDistribution.log_prob`` from the Gaussian's parameters: torch's ``Normal.log_prob``,
    operation for operation (the same bits and autograd graph), summed over the action dimensions.
    ``scale_terms`` (:func:`gaussian_scale_terms` of ``scale``, computed beforehand: rollout steps, whose
    scale does not change between steps and which record no autograd graph) are the same values.
    """
    if scale_terms is None:  # in torch's order (the update's autograd graph is torch's, node for node)
        return sum_independent_dims(-((actions - mean) ** 2) / (2 * scale**2) - scale.log() - _LOG_SQRT_TWO_PI)
    two_variance, log_scale = scale_terms
    return sum_independent_dims(-((actions - mean) ** 2) / two_variance - log_scale - _LOG_SQRT_TWO_PI)


def gaussian_entropy(scale: th.Tensor) -> th.Tensor:
    """SB3's ``DiagGaussianDistribution.entropy``: torch's ``Normal.entropy``, operation for operation, summed."""
    return (0.5 + 0.5 * math.log(2 * math.pi) + th.log(scale)).sum(dim=-1)


def direct_gaussian(
    mean: th.Tensor,
    scale: th.Tensor,
    deterministic: bool,
    log_half_range_sum: float | None = None,
    noise: th.Tensor | None = None,
    scale_terms: tuple[th.Tensor, th.Tensor] | None = None,
) -> tuple[th.Tensor, th.Tensor]:
    """
    A rollout step of SB3's ``DiagGaussianDistribution`` or ``StateDependentNoiseDistribution`` (or
    of the squashed head over either, with ``log_half_range_sum``) without distribution objects:
    ``get_actions`` and ``log_prob`` as SB3 and torch compute them, the same operations in the same
    order, so the same bits and the same random draws.

    :param mean: the action head's output
    :param scale: the Gaussian's standard deviation, as SB3's ``proba_distribution`` computes it
    :param deterministic: the mean instead of a sample (SB3's ``mode``)
    :param log_half_range_sum: the squashed head's constant; ``None`` for the unsquashed Gaussian
    :param noise: gSDE's exploration noise (``get_noise`` of the latent); ``None``: a diagonal Gaussian's draw
    :param scale_terms: :func:`gaussian_scale_terms` of ``scale`` where computed beforehand (the same values)
    :return: actions (pre-squash for the squashed head) and their log-probability
    """
    if deterministic:
        actions = mean
    elif noise is not None:
        actions = mean + noise
    else:  # SB3 samples with ``rsample`` (reparametrised): torch draws a standard normal and moves it.
        actions = mean + th.empty(mean.shape, dtype=mean.dtype, device=mean.device).normal_() * scale
    if log_half_range_sum is not None:
        log_prob = squashed_log_prob(actions, mean, scale, log_half_range_sum, scale_terms)
    else:
        log_prob = gaussian_log_prob(actions, mean, scale, scale_terms)
    return actions, log_prob


def gaussian_step_from_noise(
    mean: np.ndarray,
    scale: np.ndarray,
    noise: np.ndarray | None,
    log_prob_constant: float,
    squashed: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """
    The fast mode's rollout step of a diagonal Gaussian head (squashed or not), in NumPy: the action
    ``u = mean + scale * noise`` and its log-probability computed *from the standard-normal draw*,
    ``-noise**2 / 2`` summed, instead of from ``(u - mean) / scale`` as torch's ``Normal.log_prob``
    does: the same density, fewer operations, and float rounding of its own (so not bit for bit).

    :param mean: the action head's output, ``(n, d)``
    :param scale: the Gaussian's standard deviation, broadcastable to ``mean``
    :param noise: the standard-normal draw of ``mean``'s shape; ``None``: the mean (SB3's ``mode``)
    :param log_prob_constant: what the log-probability subtracts besides the draw's and the squashing's
        terms: :func:`gaussian_log_prob_constant`
    :param squashed: the tanh-squashed head: add ``2 * log(2 cosh u)`` per dimension (the Jacobian's
        ``-log(1 - tanh(u)**2)``, whose ``2 log 2`` is in the constant)
    :return: actions (pre-squash for the squashed head) and their log-probability, ``(n,)``; NaN for a row
        whose mean is not finite, as torch's ``log_prob`` would be (the draw alone would hide it)
    """
    if noise is None:
        actions, log_prob = mean, np.full(mean.shape[0], -log_prob_constant, dtype=mean.dtype)
    else:
        actions = mean + scale * noise
        log_prob = np.einsum("ij,ij->i", noise, noise) * -0.5 - log_prob_constant  # float32 stays float32
    if squashed:
        log_prob = log_prob + 2.0 * np.logaddexp(actions, -actions).sum(axis=-1)
    if not math.isfinite(mean.sum()):  # NaN (as torch's formula gives it) where the network's output is not finite
        log_prob = np.where(np.isfinite(mean).all(axis=-1), log_prob, np.nan)
    return actions, log_prob


def gaussian_log_prob_constant(log_scale: np.ndarray, log_half_range_sum: float | None = None) -> float:
    """
    The part of a diagonal Gaussian's log-density (summed over its ``d`` dimensions) that does not depend on
    the draw: ``sum(log scale) + d log(sqrt(2 pi))``, plus, for the squashed head, ``d * 2 log 2`` and the
    action range's ``log_half_range_sum``; see :func:`gaussian_step_from_noise`.
    """
    dimensions = log_scale.shape[-1]
    constant = float(log_scale.sum()) + _HALF_LOG_TWO_PI * dimensions
    if log_half_range_sum is not None:
        constant += _TWO_LOG_TWO * dimensions + log_half_range_sum
    return constant


def direct_categorical(
    action_logits: th.Tensor, deterministic: bool, masks: th.Tensor | np.ndarray | None = None, masked: bool = False
) -> tuple[th.Tensor, th.Tensor]:
    """
    A rollout step of SB3's ``CategoricalDistribution`` (``masked``: of sb3-contrib's
    ``MaskableCategoricalDistribution``, with or without ``masks``) without distribution objects,
    bit for bit as they compute it: torch's ``Categorical`` normalises its logits, and
    ``MaskableCategorical`` normalises them again after masking (or, without masks, again as they are).

    :param action_logits: the action head's output, shape ``(batch, n)``
    :param deterministic: the most probable action instead of a sample (SB3's ``mode``)
    :param masks: the masks of the valid actions (``masked`` only)
    :param masked: the maskable distribution's steps
    :return: actions (shape ``(batch,)``) and their log-probability
    """
    logits = action_logits - action_logits.logsumexp(dim=-1, keepdim=True)
    if masked:
        if masks is not None:
            masks = th.as_tensor(masks, dtype=th.bool, device=logits.device).reshape(logits.shape)
            logits = th.where(masks, logits, th.tensor(_HUGE_NEG_LOGIT, dtype=logits.dtype, device=logits.device))
        logits = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = F.softmax(logits, dim=-1)
    if deterministic:
        actions = th.argmax(probs, dim=1)
    else:
        actions = th.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T.reshape(probs.shape[:-1])
    log_prob = logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    return actions, log_prob


class TanhSquashedDistribution(Distribution):
    """
    A Gaussian over the pre-squash value ``u`` (diagonal or gSDE), pushed through ``tanh`` and
    an affine map to the action space's ``[low, high]``.

    Everything that SB3 calls an "action" on this distribution is the pre-squash ``u``
    (``get_actions``, ``sample``, ``mode``, ``log_prob``'s argument): that is what the rollout
    buffer keeps. ``log_prob(u)`` is the exact log-density of the *environment* action
    ``a = low + (tanh(u) + 1) (high - low) / 2``:

    ``log p(a) = log N(u) - sum log(1 - tanh(u)^2) - sum log((high - low) / 2)``

    :param base: the SB3 Gaussian distribution over ``u`` (already parametrised)
    :param log_half_range_sum: ``sum(log((high - low) / 2))`` over the action dimensions
    :param entropy_estimator: ``"sample"`` (return ``None``: the algorithm uses ``-log_prob`` of
        the stored actions, SB3's convention), ``"gaussian"`` (closed-form entropy of the
        pre-squash Gaussian, an upper bound of the squashed one minus the affine constant) or
        ``"mc"`` (closed form plus a one-sample reparametrised Monte Carlo estimate of
        ``E[log(1 - tanh(u)^2)]`` plus the affine constant: an unbiased, differentiable estimate
        of the true entropy of the action the environment receives)
    """

    def __init__(
        self,
        base: DiagGaussianDistribution | StateDependentNoiseDistribution,
        log_half_range_sum: float,
        entropy_estimator: str = "mc",
    ):
        super().__init__()
        if entropy_estimator not in ENTROPY_ESTIMATORS:
            raise InvalidSettingError(f"entropy_estimator={entropy_estimator!r} is not one of {ENTROPY_ESTIMATORS}")
        self.base = base
        self.distribution = base.distribution
        self.log_half_range_sum = log_half_range_sum
        self.entropy_estimator = entropy_estimator

    # The network builders belong to the base distribution; the policy builds it.
    def proba_distribution_net(self, *args, **kwargs) -> nn.Module | tuple[nn.Module, nn.Parameter]:
        return self.base.proba_distribution_net(*args, **kwargs)

    def proba_distribution(self, *args, **kwargs) -> TanhSquashedDistribution:
        self.base.proba_distribution(*args, **kwargs)
        self.distribution = self.base.distribution
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """
        :param actions: pre-squash values ``u`` (what the rollout buffer stores)
        :return: log-density of the environment action, summed over action dimensions
        """
        # Per dimension: log N(u) - log(1 - tanh(u)^2) = -z^2 / 2 - log(sigma) - log(2 pi) / 2
        # - 2 log 2 + 2 logaddexp(u, -u), with z = (u - mu) / sigma; the constants are folded into
        # one. Written out rather than through Normal.log_prob: the same formula in fewer tensor
        # operations and without its argument validation (a host sync), on the hot path of every
        # rollout step and minibatch.
        normal: Normal = self.base.distribution
        return squashed_log_prob(actions, normal.loc, normal.scale, self.log_half_range_sum)

    def entropy(self) -> th.Tensor | None:
        if self.entropy_estimator == "sample":
            return None
        gaussian: Normal = self.base.distribution
        gaussian_entropy = gaussian.entropy().sum(dim=-1)
        if self.entropy_estimator == "gaussian":
            return gaussian_entropy
        u = gaussian.rsample()
        return gaussian_entropy + (log_tanh_jacobian_sum(u) + self.log_half_range_sum)

    def sample(self) -> th.Tensor:
        return self.base.sample()

    def mode(self) -> th.Tensor:
        return self.base.mode()

    def actions_from_params(self, *args, deterministic: bool = False, **kwargs) -> th.Tensor:
        self.proba_distribution(*args, **kwargs)
        return self.get_actions(deterministic=deterministic)

    def log_prob_from_params(self, *args, **kwargs) -> tuple[th.Tensor, th.Tensor]:
        actions = self.actions_from_params(*args, **kwargs)
        return actions, self.log_prob(actions)


class BetaDistribution(Distribution):
    """
    Beta(alpha, beta) per action dimension, rescaled to the action space's ``[low, high]`` (Chou et
    al. 2017), with ``alpha = 1 + softplus(z_alpha)`` and ``beta = 1 + softplus(z_beta)`` from one
    linear head of ``2 * action_dim`` outputs on the actor's latent: both exceed 1, so the density
    is unimodal and vanishes at the bounds.

    Everything that SB3 calls an "action" on this distribution is the *logit* ``u`` of the Beta
    sample ``x = sigmoid(u)`` (``get_actions``, ``sample``, ``mode``, ``log_prob``'s argument):
    that is what the rollout buffer keeps, and the environment receives
    ``a = low + sigmoid(u) * (high - low)``. ``log_prob(u)`` is the exact log-density of the
    environment action:

    ``log p(a) = sum [(alpha - 1) log x + (beta - 1) log(1 - x) - log B(alpha, beta)] - sum log(high - low)``

    with ``log x = -softplus(-u)`` and ``log(1 - x) = -softplus(u)``, finite for any finite ``u``.
    Samples are drawn as ``u = log G_alpha - log G_beta`` from two Gamma variables
    (``G_alpha / (G_alpha + G_beta)`` is Beta(alpha, beta)), so a sample at ``x = 1 - 1e-8`` keeps
    its logit ``~18.4`` instead of rounding to ``x = 1``.

    :param action_dim: number of action dimensions
    :param log_range_sum: ``sum(log(high - low))`` over the action dimensions of non-zero width
    """

    distribution: Beta  # set by proba_distribution

    def __init__(self, action_dim: int, log_range_sum: float = 0.0):
        super().__init__()
        self.action_dim = action_dim
        self.log_range_sum = log_range_sum
        self.alpha_minus_one: th.Tensor | None = None
        self.beta_minus_one: th.Tensor | None = None

    def proba_distribution_net(self, latent_dim: int) -> nn.Module:
        """One linear layer giving ``(z_alpha, z_beta)``, ``2 * action_dim`` outputs."""
        return nn.Linear(latent_dim, 2 * self.action_dim)

    def proba_distribution(self, params: th.Tensor) -> BetaDistribution:
        """
        :param params: the head's output ``(z_alpha, z_beta)``, shape ``(batch, 2 * action_dim)``
        :return: self, parametrised
        """
        z_alpha, z_beta = params.split(self.action_dim, dim=-1)
        # alpha - 1 and beta - 1 are kept as computed: 1 + softplus(z) rounds softplus(z) < 6e-8 away.
        self.alpha_minus_one, self.beta_minus_one = F.softplus(z_alpha), F.softplus(z_beta)
        self.distribution = Beta(1.0 + self.alpha_minus_one, 1.0 + self.beta_minus_one, validate_args=False)
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """
        :param actions: logits ``u`` of the Beta samples (what the rollout buffer stores)
        :return: log-density of the environment action, summed over action dimensions
        """
        assert self.alpha_minus_one is not None and self.beta_minus_one is not None
        beta: Beta = self.distribution
        alpha, beta_ = beta.concentration1, beta.concentration0
        log_x, log_one_minus_x = -F.softplus(-actions), -F.softplus(actions)
        # log B(alpha, beta) in float64: in float32, lgamma(alpha) - lgamma(alpha + beta) cancels to 0 for alpha ~ 1e8.
        alpha64, beta64 = alpha.double(), beta_.double()
        log_beta_function = (th.lgamma(alpha64) + th.lgamma(beta64) - th.lgamma(alpha64 + beta64)).to(actions.dtype)
        per_dimension = self.alpha_minus_one * log_x + self.beta_minus_one * log_one_minus_x - log_beta_function
        return per_dimension.sum(dim=-1) - self.log_range_sum

    def entropy(self) -> th.Tensor:
        """Closed-form entropy of the environment action: the Beta's, plus ``sum log(high - low)``."""
        return self.distribution.entropy().sum(dim=-1) + self.log_range_sum

    def sample(self) -> th.Tensor:
        """A logit ``u = log G_alpha - log G_beta`` (no gradient, like SB3's ``sample``)."""
        beta: Beta = self.distribution
        alpha, beta_ = beta.concentration1, beta.concentration0
        g_alpha = Gamma(alpha, th.ones_like(alpha), validate_args=False).sample()
        g_beta = Gamma(beta_, th.ones_like(beta_), validate_args=False).sample()
        return g_alpha.log() - g_beta.log()

    def mode(self) -> th.Tensor:
        """
        The logit of the mode ``(alpha - 1) / (alpha + beta - 2)``: ``log(alpha - 1) - log(beta - 1)``
        (``alpha - 1`` and ``beta - 1`` floored at the smallest normal float, so that it stays finite).
        """
        assert self.alpha_minus_one is not None and self.beta_minus_one is not None
        tiny = th.finfo(self.alpha_minus_one.dtype).tiny
        return self.alpha_minus_one.clamp_min(tiny).log() - self.beta_minus_one.clamp_min(tiny).log()

    def actions_from_params(self, params: th.Tensor, deterministic: bool = False) -> th.Tensor:
        self.proba_distribution(params)
        return self.get_actions(deterministic=deterministic)

    def log_prob_from_params(self, params: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        actions = self.actions_from_params(params)
        return actions, self.log_prob(actions)


def torch_distributions(dist: Distribution) -> list[th.distributions.Distribution]:
    """
    The torch distribution(s) behind an SB3 distribution, with the batch as first dimension.

    For the squashed head this is the base Gaussian: ``tanh`` and the affine map are
    bijections, so the KL divergence between two squashed Gaussians equals the KL between
    their base Gaussians. For the Beta head it is the ``Beta`` on (0, 1), likewise (the map to
    ``[low, high]`` is affine).

    :param dist: a parametrised SB3 distribution
    :return: list of torch distributions whose KL terms add up to the KL of ``dist``
    """
    if isinstance(dist, TanhSquashedDistribution):
        dist = dist.base
    if isinstance(dist, MultiCategoricalDistribution):
        return list(dist.distribution)
    if isinstance(dist, MaskableMultiCategoricalDistribution):  # MultiDiscrete and MultiBinary with masks
        return list(dist.distributions)
    if isinstance(
        dist,
        (
            DiagGaussianDistribution,
            StateDependentNoiseDistribution,
            CategoricalDistribution,
            BernoulliDistribution,
            MaskableCategoricalDistribution,
            BetaDistribution,
        ),
    ):
        return [cast(th.distributions.Distribution, dist.distribution)]  # one torch distribution for these classes
    raise NotImplementedError(f"No analytic KL for {type(dist).__name__}")


def detach_distributions(dists: list[th.distributions.Distribution]) -> list[th.distributions.Distribution]:
    """Copies of ``dists`` whose parameters are detached from the autograd graph."""
    return [index_distribution(d, slice(None), detach=True) for d in dists]


def index_distribution(
    dist: th.distributions.Distribution, index: th.Tensor | slice, detach: bool = False
) -> th.distributions.Distribution:
    """
    Select rows of a batched torch distribution.

    :param dist: a ``Normal``, ``Beta``, ``Categorical`` or ``Bernoulli`` with the batch as first dimension
    :param index: rows to keep
    :param detach: whether to detach the parameters
    :return: a distribution of the same type over the selected rows
    """

    def take(t: th.Tensor) -> th.Tensor:
        t = t[index]
        return t.detach() if detach else t

    if isinstance(dist, Normal):
        return Normal(take(dist.loc), take(dist.scale), validate_args=False)
    if isinstance(dist, Beta):
        return Beta(take(dist.concentration1), take(dist.concentration0), validate_args=False)
    if isinstance(dist, Categorical):
        return Categorical(logits=take(dist.logits), validate_args=False)
    if isinstance(dist, Bernoulli):
        return Bernoulli(logits=take(dist.logits), validate_args=False)
    raise NotImplementedError(f"Cannot index a {type(dist).__name__}")


def concat_distributions(chunks: list[list[th.distributions.Distribution]]) -> list[th.distributions.Distribution]:
    """Concatenate per-chunk lists (as returned by :func:`torch_distributions`) along the batch."""
    out: list[th.distributions.Distribution] = []
    for parts in zip(*chunks, strict=True):
        first = parts[0]
        if isinstance(first, Normal):
            out.append(Normal(th.cat([p.loc for p in parts]), th.cat([p.scale for p in parts]), validate_args=False))
        elif isinstance(first, Beta):
            alphas, betas = th.cat([p.concentration1 for p in parts]), th.cat([p.concentration0 for p in parts])
            out.append(Beta(alphas, betas, validate_args=False))
        elif isinstance(first, Categorical):
            out.append(Categorical(logits=th.cat([p.logits for p in parts]), validate_args=False))
        elif isinstance(first, Bernoulli):
            out.append(Bernoulli(logits=th.cat([p.logits for p in parts]), validate_args=False))
        else:
            raise NotImplementedError(f"Cannot concatenate {type(first).__name__}")
    return out


# The kinds of torch distribution whose parameters a rollout buffer can carry, with the names of the
# parameter tensors that rebuild each one (see :func:`distribution_parameters`).
PARAMETER_NAMES: dict[str, tuple[str, ...]] = {
    "normal": ("loc", "scale"),
    "beta": ("concentration1", "concentration0"),
    "categorical": ("logits",),
    "bernoulli": ("logits",),
}


def distribution_kind(dist: th.distributions.Distribution) -> str:
    """
    The :data:`PARAMETER_NAMES` kind of a torch distribution (a masked categorical is a categorical:
    its masked logits are part of its parameters).

    :raises NotImplementedError: for any other distribution
    """
    for kind, cls in (("normal", Normal), ("beta", Beta), ("categorical", Categorical), ("bernoulli", Bernoulli)):
        if isinstance(dist, cls):
            return kind
    raise NotImplementedError(f"No parameters to carry for {type(dist).__name__}")


def distribution_parameters(dists: list[th.distributions.Distribution]) -> tuple[tuple[str, ...], tuple[th.Tensor, ...]]:
    """
    The kinds of ``dists`` and their parameter tensors, flat in order (batch first): what rebuilds
    them with :func:`distributions_from_parameters`, exactly (the tensors themselves, not a copy).

    :param dists: as :func:`torch_distributions` returns them
    :return: ``(kinds, tensors)``
    """
    if len(dists) == 1:  # the common case, on every rollout step: without the generic loops
        kind = distribution_kind(dists[0])
        return (kind,), tuple(getattr(dists[0], name) for name in PARAMETER_NAMES[kind])
    kinds = tuple(distribution_kind(dist) for dist in dists)
    tensors = tuple(getattr(dist, name) for dist, kind in zip(dists, kinds, strict=True) for name in PARAMETER_NAMES[kind])
    return kinds, tensors


def distributions_from_parameters(
    kinds: tuple[str, ...], tensors: tuple[th.Tensor, ...] | list[th.Tensor]
) -> list[th.distributions.Distribution]:
    """
    The torch distributions of :func:`distribution_parameters`' ``(kinds, tensors)`` (without
    argument validation). A categorical is rebuilt from its normalised logits, which it normalises
    again: its probabilities are the same up to float rounding (the KL between the two is 0 to
    within 1e-7).
    """
    dists: list[th.distributions.Distribution] = []
    position = 0
    for kind in kinds:
        count = len(PARAMETER_NAMES[kind])
        params = tensors[position : position + count]
        position += count
        if kind == "normal":
            dists.append(Normal(params[0], params[1], validate_args=False))
        elif kind == "beta":
            dists.append(Beta(params[0], params[1], validate_args=False))
        elif kind == "categorical":
            dists.append(Categorical(logits=params[0], validate_args=False))
        else:
            dists.append(Bernoulli(logits=params[0], validate_args=False))
    if position != len(tensors):
        raise ValueError(f"{len(tensors)} parameter tensors for the kinds {kinds}: expected {position}")
    return dists


def categorical_kl(p: Categorical, q: Categorical) -> th.Tensor:
    """
    ``KL(p || q) = sum_k p_k (log p_k - log q_k)`` over the categories with ``p_k > 0``: torch's
    formula, without its rule that makes the KL infinite where ``q_k`` underflows to 0. Masked
    categories (sb3-contrib sets their logits to -1e8) have ``p_k = q_k = 0`` and add nothing, so the
    KL between two masked distributions is finite, and 0 when they are equal.

    :param p: e.g. the old policy's categorical distribution (batch first)
    :param q: the new policy's, same shape
    :return: tensor of shape ``batch_shape``
    """
    p_probs = p.probs
    terms = p_probs * (p.logits - q.logits)
    return th.where(p_probs == 0, th.zeros_like(terms), terms).sum(-1)


def _kl(p: th.distributions.Distribution, q: th.distributions.Distribution) -> th.Tensor:
    if isinstance(p, Categorical) and isinstance(q, Categorical):
        return categorical_kl(p, q)
    if type(p) is Normal and type(q) is Normal:  # torch's formula, without its dispatch
        return _normal_kl(p.loc, p.scale, q.loc, q.scale)
    return th_kl_divergence(p, q)


def analytic_kl(p: list[th.distributions.Distribution], q: list[th.distributions.Distribution]) -> th.Tensor:
    """
    Per-sample analytic ``KL(p || q)``, summed over action dimensions and sub-distributions.

    :param p: e.g. the old policy's distributions (``torch_distributions``)
    :param q: e.g. the new policy's distributions, same structure
    :return: tensor of shape ``(batch,)``
    """
    total = None
    for p_i, q_i in zip(p, q, strict=True):
        kl = _kl(p_i, q_i)
        if kl.dim() > 1:
            kl = kl.flatten(start_dim=1).sum(dim=1)
        total = kl if total is None else total + kl
    assert total is not None
    return total


def _normal_kl(p_loc: th.Tensor, p_scale: th.Tensor, q_loc: th.Tensor, q_scale: th.Tensor) -> th.Tensor:
    """``torch.distributions.kl._kl_normal_normal`` written on the parameters (same operations)."""
    var_ratio = (p_scale / q_scale).pow(2)
    t1 = ((p_loc - q_loc) / q_scale).pow(2)
    return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())


def mean_std(dists: list[th.distributions.Distribution]) -> float | None:
    """
    Mean standard deviation of Gaussian distributions (the pre-squash ``u``'s for the squashed head)
    or of Beta distributions on (0, 1), i.e. the action's std as a fraction of its range ``high - low``
    (``None`` for discrete ones).
    """
    scales = [d.scale if isinstance(d, Normal) else d.variance.sqrt() for d in dists if isinstance(d, (Normal, Beta))]
    if not scales:
        return None
    return float(th.cat([s.flatten() for s in scales]).mean().item())


def rescale_tanh(u: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """
    Map pre-squash values to ``[low, high]``: ``low + (tanh(u) + 1) / 2 * (high - low)``.

    Computed in float64 and returned in the dtype of ``low``; the final clip only removes
    floating-point rounding (the map itself never leaves the box), so no action is ever out of
    bounds, asymmetric bounds included.
    """
    low64, high64 = low.astype(np.float64), high.astype(np.float64)
    return rescale_tanh64(u, low64, high64, high64 - low64, low.dtype)


def rescale_tanh64(u: np.ndarray, low64: np.ndarray, high64: np.ndarray, range64: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """
    :func:`rescale_tanh` with the float64 bounds and ``range64 = high64 - low64`` precomputed
    (the policy caches them): the same arithmetic, bit for bit, without the per-call conversions.
    """
    actions = low64 + 0.5 * (np.tanh(np.asarray(u, dtype=np.float64)) + 1.0) * range64
    # np.maximum/np.minimum: the same result as np.clip (NaN included) at a fraction of its call overhead.
    np.maximum(actions, low64, out=actions)
    np.minimum(actions, high64, out=actions)
    return actions.astype(dtype)
