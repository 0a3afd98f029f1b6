"""PPO loss terms as small pure functions, each named after its formula.

Every value loss is on SB3's scale, the mean squared error without a 0.5 factor, so ``vf_coef`` means the same
in every mode and as in stock PPO (CleanRL's and PPO2's ``vf_coef=0.5`` on ``0.5 * MSE`` is ``0.25`` here).
"""

from __future__ import annotations

import math

import torch as th
from torch.nn import functional as F

from sb3_ppo_ext.validation import VF_CLIP_MODES, InvalidSettingError


def masked_mean(values: th.Tensor, valid: th.Tensor | None) -> th.Tensor:
    """``values.mean()``, or over the ``valid`` samples only (``th.mean(values[valid])``, as RecurrentPPO)."""
    return values.mean() if valid is None else th.mean(values[valid])


def clipped_surrogate_loss(
    advantages: th.Tensor, ratio: th.Tensor, clip_range: float | None, valid: th.Tensor | None = None
) -> th.Tensor:
    """
    PPO's clipped surrogate, negated (Schulman et al. 2017, eq. 7): ``-mean(min(A * r, A * clip(r, 1 - eps, 1 + eps)))``;
    with ``clip_range=None`` the unclipped ``-mean(A * r)`` of the KL-penalty objective (eq. 8).

    :param advantages: advantage estimates ``A``
    :param ratio: probability ratios ``r = pi(a|s) / pi_old(a|s)``
    :param clip_range: ``eps``, or ``None`` for no clipping
    :param valid: boolean mask of the samples that count (padded sequences), ``None`` for all
    """
    surrogate = advantages * ratio
    if clip_range is None:
        return -masked_mean(surrogate, valid)
    clipped = advantages * th.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return -masked_mean(th.min(surrogate, clipped), valid)


def kl_penalty_loss(kl: th.Tensor, kl_coef: float) -> th.Tensor:
    """PPO1's KL penalty (Schulman et al. 2017, eq. 8): ``beta * mean(KL(pi_old || pi))`` of per-sample KLs."""
    return kl_coef * kl.mean()


def clip_values(values: th.Tensor, old_values: th.Tensor, clip_range_vf: float) -> th.Tensor:
    """``V_old + clip(V - V_old, -eps_v, eps_v)``: the value prediction kept near its rollout value."""
    return old_values + th.clamp(values - old_values, -clip_range_vf, clip_range_vf)


def value_loss(
    values: th.Tensor,
    old_values: th.Tensor,
    returns: th.Tensor,
    clip_range_vf: float | None = None,
    mode: str = "clipped",
    valid: th.Tensor | None = None,
) -> th.Tensor:
    """
    Value loss on the ``mean((V - R)^2)`` scale: unclipped with ``clip_range_vf=None``; ``"clipped"`` (SB3)
    ``mean((V_clip - R)^2)``; ``"max"`` (PPO2, CleanRL) ``mean(max((V - R)^2, (V_clip - R)^2))``.

    :param values: new value predictions ``V``
    :param old_values: value predictions at rollout time ``V_old``
    :param returns: value targets ``R``
    :param clip_range_vf: ``eps_v``, or ``None`` for no clipping
    :param mode: ``"clipped"`` or ``"max"``
    :param valid: boolean mask of the samples that count (padded sequences), ``None`` for all
    """
    if mode not in VF_CLIP_MODES:
        raise InvalidSettingError(f"vf_clip_mode={mode!r} is not one of {VF_CLIP_MODES}")
    predicted = values if clip_range_vf is None else clip_values(values, old_values, clip_range_vf)
    if clip_range_vf is not None and mode == "max":
        return masked_mean(th.max((values - returns) ** 2, (predicted - returns) ** 2), valid)
    if valid is None:
        return F.mse_loss(returns, predicted)  # as stock PPO (same kernel, same bits)
    return th.mean(((returns - predicted) ** 2)[valid])  # RecurrentPPO's masked form


def clip_fraction(ratio: th.Tensor, clip_range: float) -> th.Tensor:
    """Fraction of samples whose ratio is outside ``[1 - eps, 1 + eps]`` (SB3's definition)."""
    return (th.abs(ratio - 1.0) > clip_range).float().mean()


def value_clip_fraction(values: th.Tensor, old_values: th.Tensor, clip_range_vf: float) -> th.Tensor:
    """Fraction of samples whose value prediction moved more than ``eps_v`` from its rollout value."""
    return (th.abs(values - old_values) > clip_range_vf).float().mean()


def approx_kl_k3(log_ratio: th.Tensor, valid: th.Tensor | None = None) -> th.Tensor:
    """
    Schulman's ``k3`` estimator of ``KL(pi_old || pi)``: ``mean((r - 1) - log r)``, with stock PPO's operations
    (``exp(log r) - 1``, not ``expm1``) so that a ``target_kl`` early stop decides exactly as PPO's.

    :param log_ratio: ``log pi(a|s) - log pi_old(a|s)`` for actions sampled from ``pi_old``
    :param valid: boolean mask of the samples that count (padded sequences), ``None`` for all
    """
    return masked_mean((th.exp(log_ratio) - 1) - log_ratio, valid)


def adapt_kl_coef(
    kl_coef: float,
    kl: float,
    kl_target: float,
    factor: float = 2.0,
    tolerance: float = 1.5,
    bounds: tuple[float, float] = (1e-4, 1e4),
) -> float:
    """
    The adaptive KL coefficient (Schulman et al. 2017, section 4), once per update: ``beta / factor`` when
    ``kl < kl_target / tolerance``, ``beta * factor`` when ``kl > kl_target * tolerance``, clamped to ``bounds``.

    :param kl_coef: current ``beta``
    :param kl: measured mean ``KL(pi_old || pi)`` after the update
    :param kl_target: ``d_targ``
    :param factor: multiplicative step (paper: 2)
    :param tolerance: band half-width as a ratio (paper: 1.5)
    :param bounds: ``(min, max)`` of ``beta``
    """
    if not math.isfinite(kl):
        raise FloatingPointError(f"cannot adapt the KL coefficient from a non-finite KL ({kl})")
    if kl < kl_target / tolerance:
        kl_coef = kl_coef / factor
    elif kl > kl_target * tolerance:
        kl_coef = kl_coef * factor
    return float(min(max(kl_coef, bounds[0]), bounds[1]))
