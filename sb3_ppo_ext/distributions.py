"""The squashed Gaussian and Beta heads (:doc:`/guide/squashed_head`, :doc:`/guide/beta_head`), direct steps, analytic KL."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch as th
from sb3_contrib.common.maskable.distributions import MaskableMultiCategoricalDistribution
from stable_baselines3.common.distributions import (
    DiagGaussianDistribution,
    Distribution,
    StateDependentNoiseDistribution,
    sum_independent_dims,
)
from torch import nn
from torch.distributions import Bernoulli, Beta, Categorical, Gamma, Normal
from torch.distributions import kl_divergence as th_kl_divergence
from torch.nn import functional as F

TorchDistribution = th.distributions.Distribution
_TWO_LOG_TWO = 2.0 * math.log(2.0)
_HALF_LOG_TWO_PI = 0.5 * math.log(2.0 * math.pi)
# torch's constant in ``Normal.log_prob``, written as torch writes it (a different rounding would change bits).
_LOG_SQRT_TWO_PI = math.log(math.sqrt(2 * math.pi))
_HUGE_NEG_LOGIT = -1e8  # sb3-contrib's logit of a masked-out action (MaskableCategorical.apply_masking)


def log_tanh_jacobian_sum(u: th.Tensor) -> th.Tensor:
    """
    ``sum_i log(1 - tanh(u_i)^2)`` over the last dimension, as ``2 (log 2 - logaddexp(u, -u))``: finite for
    any finite ``u`` (the naive form underflows in float32 for ``|u| > ~9``).

    :param u: pre-squash values, action dimensions last
    :return: the sum, shape ``u.shape[:-1]``
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
    :meth:`TanhSquashedDistribution.log_prob` of the pre-squash ``actions`` from the base Gaussian's ``loc`` and
    ``scale`` (and its :func:`gaussian_scale_terms`, where computed beforehand: the same values).
    """
    z = (actions - loc) / scale
    jacobian = th.logaddexp(actions, -actions).mul(2.0)  # log(scale) after it: the update's graph unchanged
    per_dimension = th.addcmul(jacobian - (scale.log() if scale_terms is None else scale_terms[1]), z, z, value=-0.5)
    constant = (_HALF_LOG_TWO_PI + _TWO_LOG_TWO) * actions.shape[-1] + log_half_range_sum
    return per_dimension.sum(dim=-1) - constant


def gaussian_scale_terms(scale: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """``(2 * scale**2, scale.log())``: what ``Normal.log_prob`` computes from the scale, as it computes it."""
    return 2 * scale**2, scale.log()


def gaussian_log_prob(
    actions: th.Tensor, mean: th.Tensor, scale: th.Tensor, scale_terms: tuple[th.Tensor, th.Tensor] | None = None
) -> th.Tensor:
    """
    SB3's ``DiagGaussianDistribution.log_prob``: torch's ``Normal.log_prob`` operation for operation (the same
    bits and autograd graph), summed; ``scale_terms`` as in :func:`squashed_log_prob`.
    """
    if scale_terms is None:
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
    A rollout step (actions, log-probabilities) of SB3's ``DiagGaussianDistribution`` or
    ``StateDependentNoiseDistribution`` (gSDE's ``noise`` given), squashed with ``log_half_range_sum``, without
    distribution objects: the same operations, bits and random draws.
    """
    if deterministic:
        actions = mean
    elif noise is not None:
        actions = mean + noise
    else:  # SB3's ``rsample``: torch draws a standard normal and moves it
        actions = mean + th.empty(mean.shape, dtype=mean.dtype, device=mean.device).normal_() * scale
    if log_half_range_sum is not None:
        return actions, squashed_log_prob(actions, mean, scale, log_half_range_sum, scale_terms)
    return actions, gaussian_log_prob(actions, mean, scale, scale_terms)


def gaussian_step_from_noise(
    mean: np.ndarray, scale: np.ndarray, noise: np.ndarray | None, log_prob_constant: float, squashed: bool
) -> tuple[np.ndarray, np.ndarray]:
    """
    The fast mode's rollout step of a diagonal Gaussian head (``squashed`` or not) in NumPy: ``u = mean + scale *
    noise`` (``noise=None``: the mean) and its log-probability from the standard-normal draw, ``-noise**2 / 2``
    summed less :func:`gaussian_log_prob_constant`: torch's density with float rounding of its own (NaN where
    ``mean`` is not finite).
    """
    if noise is None:
        actions, log_prob = mean, np.full(mean.shape[0], -log_prob_constant, dtype=mean.dtype)
    else:
        actions = mean + scale * noise
        log_prob = np.einsum("ij,ij->i", noise, noise) * -0.5 - log_prob_constant  # float32 stays float32
    if squashed:
        log_prob = log_prob + 2.0 * np.logaddexp(actions, -actions).sum(axis=-1)
    if not math.isfinite(mean.sum()):
        log_prob = np.where(np.isfinite(mean).all(axis=-1), log_prob, np.nan)
    return actions, log_prob


def gaussian_log_prob_constant(log_scale: np.ndarray, log_half_range_sum: float | None = None) -> float:
    """
    What :func:`gaussian_step_from_noise` subtracts: ``sum(log scale) + d log(sqrt(2 pi))``, plus, for the
    squashed head, ``d * 2 log 2 + log_half_range_sum``.
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
    A rollout step (actions, log-probabilities) of SB3's ``CategoricalDistribution`` (``masked``: sb3-contrib's
    ``MaskableCategoricalDistribution``, with or without ``masks``) without distribution objects, bit for bit:
    ``Categorical`` normalises the logits, ``MaskableCategorical`` normalises them again after masking.
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
    return actions, logits.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


class TanhSquashedDistribution(Distribution):
    """
    A Gaussian over the pre-squash ``u`` (diagonal or gSDE), pushed through ``tanh`` and an affine map to
    ``[low, high]``. SB3's "actions" on it are ``u``; ``log_prob(u)`` is the log-density of the environment
    action: ``log N(u) - sum log(1 - tanh(u)^2) - sum log((high - low) / 2)``.

    :param base: the SB3 Gaussian distribution over ``u``
    :param log_half_range_sum: ``sum(log((high - low) / 2))`` over the action dimensions
    :param entropy_estimator: ``"sample"`` (``None``: SB3's ``-log_prob``), ``"gaussian"`` (the pre-squash Gaussian's
        closed form) or ``"mc"`` (closed form plus a one-sample reparametrised estimate of the Jacobian term: the
        entropy of the environment action); the policy's rule table checks it
    """

    def __init__(
        self,
        base: DiagGaussianDistribution | StateDependentNoiseDistribution,
        log_half_range_sum: float,
        entropy_estimator: str = "mc",
    ):
        super().__init__()
        self.base = base
        self.distribution = base.distribution
        self.log_half_range_sum = log_half_range_sum
        self.entropy_estimator = entropy_estimator

    def proba_distribution_net(self, *args, **kwargs) -> nn.Module | tuple[nn.Module, nn.Parameter]:
        return self.base.proba_distribution_net(*args, **kwargs)

    def proba_distribution(self, *args, **kwargs) -> TanhSquashedDistribution:
        self.base.proba_distribution(*args, **kwargs)
        self.distribution = self.base.distribution
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """:param actions: pre-squash values ``u`` (what the rollout buffer stores)"""
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
    Beta(alpha, beta) per action dimension on ``[low, high]`` (Chou et al. 2017), ``alpha = 1 + softplus(z_alpha)``,
    ``beta = 1 + softplus(z_beta)`` from one linear head. SB3's "actions" on it are the logit ``u`` of the Beta
    sample ``x = sigmoid(u)``, drawn as ``log G_alpha - log G_beta`` from two Gamma variables; ``log_prob(u)`` is
    the log-density of the environment action ``low + x (high - low)``.

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
        """:param params: the head's output ``(z_alpha, z_beta)``, shape ``(batch, 2 * action_dim)``"""
        z_alpha, z_beta = params.split(self.action_dim, dim=-1)
        # alpha - 1 and beta - 1 kept as computed: 1 + softplus(z) rounds softplus(z) < 6e-8 away.
        self.alpha_minus_one, self.beta_minus_one = F.softplus(z_alpha), F.softplus(z_beta)
        self.distribution = Beta(1.0 + self.alpha_minus_one, 1.0 + self.beta_minus_one, validate_args=False)
        return self

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """
        ``sum [(alpha - 1) log x + (beta - 1) log(1 - x) - log B(alpha, beta)] - sum log(high - low)``, with
        ``log x = -softplus(-u)`` and ``log(1 - x) = -softplus(u)``, exact for any finite logit ``u``.
        """
        assert self.alpha_minus_one is not None and self.beta_minus_one is not None
        alpha, beta_ = self.distribution.concentration1, self.distribution.concentration0
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
        alpha, beta_ = self.distribution.concentration1, self.distribution.concentration0
        g_alpha = Gamma(alpha, th.ones_like(alpha), validate_args=False).sample()
        g_beta = Gamma(beta_, th.ones_like(beta_), validate_args=False).sample()
        return g_alpha.log() - g_beta.log()

    def mode(self) -> th.Tensor:
        """The logit ``log(alpha - 1) - log(beta - 1)`` of the mode, both terms floored at the smallest normal float."""
        assert self.alpha_minus_one is not None and self.beta_minus_one is not None
        tiny = th.finfo(self.alpha_minus_one.dtype).tiny
        return self.alpha_minus_one.clamp_min(tiny).log() - self.beta_minus_one.clamp_min(tiny).log()

    def actions_from_params(self, params: th.Tensor, deterministic: bool = False) -> th.Tensor:
        self.proba_distribution(params)
        return self.get_actions(deterministic=deterministic)

    def log_prob_from_params(self, params: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        actions = self.actions_from_params(params)
        return actions, self.log_prob(actions)


def torch_distributions(dist: Distribution) -> list[TorchDistribution]:
    """
    The torch distributions (batch first) whose KL terms add up to the KL of a parametrised SB3 distribution;
    for the squashed and Beta heads those before the bijection to ``[low, high]`` (which leaves the KL alone).
    """
    if isinstance(dist, TanhSquashedDistribution):
        dist = dist.base
    if isinstance(dist, MaskableMultiCategoricalDistribution):  # MultiDiscrete and MultiBinary with masks
        return list(dist.distributions)
    inner = getattr(dist, "distribution", None)
    if isinstance(inner, list):  # MultiCategoricalDistribution
        return list(inner)
    if isinstance(inner, TorchDistribution):
        return [inner]
    raise NotImplementedError(f"No analytic KL for {type(dist).__name__}")


# The torch distributions the heads produce by kind, with the parameters that rebuild them (batch first).
_KINDS: dict[str, tuple[type[TorchDistribution], tuple[str, ...]]] = {
    "normal": (Normal, ("loc", "scale")),
    "beta": (Beta, ("concentration1", "concentration0")),
    "categorical": (Categorical, ("logits",)),
    "bernoulli": (Bernoulli, ("logits",)),
}


def _kind(dist: TorchDistribution) -> str:
    """The :data:`_KINDS` key of ``dist`` (a masked categorical is a categorical of its masked logits)."""
    for kind, (cls, _) in _KINDS.items():
        if isinstance(dist, cls):
            return kind
    raise NotImplementedError(f"No parameters for {type(dist).__name__}")


def _build(kind: str, params: Sequence[th.Tensor]) -> TorchDistribution:
    """The ``kind`` distribution of ``params`` (in :data:`_KINDS` order), without argument validation."""
    if kind == "normal":
        return Normal(params[0], params[1], validate_args=False)
    if kind == "beta":
        return Beta(params[0], params[1], validate_args=False)
    return (Categorical if kind == "categorical" else Bernoulli)(logits=params[0], validate_args=False)


def index_distribution(dist: TorchDistribution, index: th.Tensor | slice) -> TorchDistribution:
    """The rows ``index`` of a batched ``Normal``, ``Beta``, ``Categorical`` or ``Bernoulli``."""
    kind = _kind(dist)
    return _build(kind, [getattr(dist, name)[index] for name in _KINDS[kind][1]])


def concat_distributions(chunks: list[list[TorchDistribution]]) -> list[TorchDistribution]:
    """Concatenate per-chunk lists (as :func:`torch_distributions` returns them) along the batch."""
    out = []
    for parts in zip(*chunks, strict=True):
        kind = _kind(parts[0])
        out.append(_build(kind, [th.cat([getattr(part, name) for part in parts]) for name in _KINDS[kind][1]]))
    return out


def distribution_parameters(dists: list[TorchDistribution]) -> tuple[tuple[str, ...], tuple[th.Tensor, ...]]:
    """
    ``(kinds, tensors)``: the kinds of ``dists`` and their parameter tensors, flat in order (the tensors
    themselves), which :func:`distributions_from_parameters` rebuilds them from.
    """
    kinds = tuple(_kind(dist) for dist in dists)
    tensors = tuple(getattr(dist, name) for dist, kind in zip(dists, kinds, strict=True) for name in _KINDS[kind][1])
    return kinds, tensors


def distributions_from_parameters(kinds: tuple[str, ...], tensors: Sequence[th.Tensor]) -> list[TorchDistribution]:
    """
    The distributions of :func:`distribution_parameters`' ``(kinds, tensors)``. A categorical is rebuilt from its
    normalised logits, which it normalises again (the same probabilities up to float rounding).
    """
    dists = []
    position = 0
    for kind in kinds:
        count = len(_KINDS[kind][1])
        dists.append(_build(kind, tensors[position : position + count]))
        position += count
    return dists


def _kl(p: TorchDistribution, q: TorchDistribution) -> th.Tensor:
    if isinstance(p, Categorical) and isinstance(q, Categorical):
        # torch's sum_k p_k (log p_k - log q_k) over the categories with p_k > 0, without its infinity where q_k
        # underflows to 0: masked categories (logits -1e8 in both) add nothing
        terms = p.probs * (p.logits - q.logits)
        return th.where(p.probs == 0, th.zeros_like(terms), terms).sum(-1)
    if type(p) is Normal and type(q) is Normal:  # torch's _kl_normal_normal, without its dispatch
        var_ratio = (p.scale / q.scale).pow(2)
        t1 = ((p.loc - q.loc) / q.scale).pow(2)
        return 0.5 * (var_ratio + t1 - 1 - var_ratio.log())
    return th_kl_divergence(p, q)


def analytic_kl(p: list[TorchDistribution], q: list[TorchDistribution]) -> th.Tensor:
    """
    Per-sample analytic ``KL(p || q)``, summed over action dimensions and sub-distributions.

    :param p: e.g. the old policy's distributions (:func:`torch_distributions`)
    :param q: e.g. the new policy's, same structure
    :return: tensor of shape ``(batch,)``
    """
    total: th.Tensor | None = None
    for p_i, q_i in zip(p, q, strict=True):
        kl = _kl(p_i, q_i)
        if kl.dim() > 1:
            kl = kl.flatten(start_dim=1).sum(dim=1)
        total = kl if total is None else total + kl
    assert total is not None
    return total


def mean_std(dists: list[TorchDistribution]) -> float | None:
    """Mean std of Gaussians (the squashed head's ``u``) or of Betas on (0, 1); ``None`` for discrete distributions."""
    scales = [d.scale if isinstance(d, Normal) else d.variance.sqrt() for d in dists if isinstance(d, (Normal, Beta))]
    if not scales:
        return None
    return float(th.cat([s.flatten() for s in scales]).mean().item())


def rescale_tanh64(u: np.ndarray, low64: np.ndarray, high64: np.ndarray, range64: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``low + (tanh(u) + 1) / 2 * range`` in float64, in ``dtype``; the clip only removes rounding (never out of bounds)."""
    actions = low64 + 0.5 * (np.tanh(np.asarray(u, dtype=np.float64)) + 1.0) * range64
    np.maximum(actions, low64, out=actions)  # np.clip's result (NaN included) at a fraction of its call overhead
    np.minimum(actions, high64, out=actions)
    return actions.astype(dtype)
