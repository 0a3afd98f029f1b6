"""PPO loss terms as small pure functions, each named after its formula.

All value losses share one scale, the mean squared error *without* a 0.5 factor (SB3's
``F.mse_loss``), so that ``vf_coef`` means the same thing in every mode and the same as in stock
SB3 PPO. CleanRL and baselines PPO2 use ``0.5 * MSE``: their ``vf_coef=0.5`` corresponds to
``vf_coef=0.25`` here.
"""

from __future__ import annotations

import math

import torch as th
from torch.nn import functional as F

from sb3_ppo_ext.validation import VF_CLIP_MODES, InvalidSettingError


def masked_mean(values: th.Tensor, valid: th.Tensor | None) -> th.Tensor:
    """``values.mean()``, or the mean over the ``valid`` samples only (``th.mean(values[valid])``,
    the operations of sb3-contrib's RecurrentPPO for padded sequences)."""
    return values.mean() if valid is None else th.mean(values[valid])


def clipped_surrogate_loss(
    advantages: th.Tensor, ratio: th.Tensor, clip_range: float | None, valid: th.Tensor | None = None
) -> th.Tensor:
    """
    PPO's clipped surrogate objective, negated for minimisation (Schulman et al. 2017, eq. 7):

    ``L = -mean(min(A * r, A * clip(r, 1 - eps, 1 + eps)))``; with ``clip_range=None`` the
    unclipped ``-mean(A * r)`` (the surrogate of the KL-penalty objective, eq. 8).

    :param advantages: advantage estimates ``A``
    :param ratio: probability ratios ``r = pi(a|s) / pi_old(a|s)``
    :param clip_range: ``eps``, or ``None`` for no clipping
    :param valid: boolean mask of the samples that count (padded sequences), ``None`` for all
    :return: scalar loss
    """
    surrogate = advantages * ratio
    if clip_range is None:
        return -masked_mean(surrogate, valid)
    clipped = advantages * th.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return -masked_mean(th.min(surrogate, clipped), valid)


def kl_penalty_loss(kl: th.Tensor, kl_coef: float) -> th.Tensor:
    """
    KL penalty of PPO1 (Schulman et al. 2017, eq. 8): ``beta * mean(KL(pi_old || pi))``.

    :param kl: per-sample ``KL(pi_old(.|s) || pi(.|s))``
    :param kl_coef: ``beta``
    :return: scalar loss
    """
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
    Value-function loss, always on the ``mean((V - R)^2)`` scale.

    - ``clip_range_vf=None``: ``mean((V - R)^2)``
    - ``mode="clipped"`` (SB3): ``mean((V_clip - R)^2)``; no gradient where ``|V - V_old| > eps_v``
    - ``mode="max"`` (baselines PPO2, CleanRL, labml): ``mean(max((V - R)^2, (V_clip - R)^2))``;
      outside the band the unclipped term still pushes ``V`` towards ``R`` whenever it is the larger

    :param values: new value predictions ``V``
    :param old_values: value predictions at rollout time ``V_old``
    :param returns: value targets ``R``
    :param clip_range_vf: ``eps_v``, or ``None`` for no clipping
    :param mode: ``"clipped"`` or ``"max"``
    :param valid: boolean mask of the samples that count (padded sequences), ``None`` for all
    :return: scalar loss
    """
    if mode not in VF_CLIP_MODES:
        raise InvalidSettingError(f"vf_clip_mode={mode!r} is not one of {VF_CLIP_MODES}")
    predicted = values if clip_range_vf is None else clip_values(values, old_values, clip_range_vf)
    if clip_range_vf is not None and mode == "max":
        return masked_mean(th.max((values - returns) ** 2, (predicted - returns) ** 2), valid)
    if valid is None:
        # F.mse_loss(R, .) as stock PPO computes it (same kernel, hence the same bits, in its two forms).
        return F.mse_loss(returns, predicted)
    # RecurrentPPO's masked form, operation for operation.
    return th.mean(((returns - predicted) ** 2)[valid])


def clip_fraction(ratio: th.Tensor, clip_range: float) -> th.Tensor:
    """Fraction of samples whose ratio is outside ``[1 - eps, 1 + eps]`` (SB3's definition)."""
    return (th.abs(ratio - 1.0) > clip_range).float().mean()


def value_clip_fraction(values: th.Tensor, old_values: th.Tensor, clip_range_vf: float) -> th.Tensor:
    """Fraction of samples whose value prediction moved more than ``eps_v`` from its rollout value."""
    return (th.abs(values - old_values) > clip_range_vf).float().mean()


def approx_kl_k3(log_ratio: th.Tensor, valid: th.Tensor | None = None) -> th.Tensor:
    """
    Schulman's unbiased, non-negative ``k3`` estimator of ``KL(pi_old || pi)`` from samples of
    ``pi_old``: ``mean((r - 1) - log r)`` with ``log r = log pi - log pi_old``.

    Computed with the same operations as stock PPO (``exp(log r) - 1`` rather than the slightly
    more accurate ``expm1``), so that a ``target_kl`` early stop decides exactly as PPO's does.

    :param log_ratio: ``log pi(a|s) - log pi_old(a|s)`` for actions sampled from ``pi_old``
    :param valid: boolean mask of the samples that count (padded sequences), ``None`` for all
    :return: scalar estimate
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
    Adaptive KL coefficient of Schulman et al. 2017, section 4, applied once per update:
    with ``d`` the mean ``KL(pi_old || pi)`` after the update,
    ``d < d_targ / tolerance`` -> ``beta / factor``; ``d > d_targ * tolerance`` -> ``beta * factor``;
    otherwise ``beta`` is unchanged. The result is clamped to ``bounds``.

    :param kl_coef: current ``beta``
    :param kl: measured mean KL ``d``
    :param kl_target: ``d_targ``
    :param factor: multiplicative step (paper: 2)
    :param tolerance: band half-width as a ratio (paper: 1.5)
    :param bounds: ``(min, max)`` of ``beta``
    :return: the new ``beta``
    """
    if not math.isfinite(kl):
        raise FloatingPointError(f"cannot adapt the KL coefficient from a non-finite KL ({kl})")
    if kl < kl_target / tolerance:
        kl_coef = kl_coef / factor
    elif kl > kl_target * tolerance:
        kl_coef = kl_coef * factor
    return float(min(max(kl_coef, bounds[0]), bounds[1]))
