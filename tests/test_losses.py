"""Each loss function against hand-computed tensors, gradients included."""

import math

import pytest
import torch as th

from sb3_ppo_ext import losses


def test_clipped_surrogate_hand_computed():
    advantages = th.tensor([1.0, 1.0, -1.0, -1.0])
    ratio = th.tensor([1.5, 0.7, 1.5, 0.7], requires_grad=True)
    # min(A r, A clip(r, 0.8, 1.2)): [1.2, 0.7, -1.5, -0.8] -> mean -0.1 -> loss 0.1
    loss = losses.clipped_surrogate_loss(advantages, ratio, 0.2)
    assert loss.item() == pytest.approx(-(1.2 + 0.7 - 1.5 - 0.8) / 4)
    loss.backward()
    # Gradient flows only where the unclipped term is the minimum: samples 1 and 2.
    assert th.allclose(ratio.grad, th.tensor([0.0, -0.25, 0.25, 0.0]))


def test_unclipped_surrogate_when_clip_range_is_none():
    advantages = th.tensor([2.0, -1.0])
    ratio = th.tensor([1.5, 0.5], requires_grad=True)
    loss = losses.clipped_surrogate_loss(advantages, ratio, None)
    assert loss.item() == pytest.approx(-(3.0 - 0.5) / 2)
    loss.backward()
    assert th.allclose(ratio.grad, th.tensor([-1.0, 0.5]))


def test_kl_penalty_hand_computed():
    kl = th.tensor([0.01, 0.03], requires_grad=True)
    loss = losses.kl_penalty_loss(kl, 2.0)
    assert loss.item() == pytest.approx(0.04)
    loss.backward()
    assert th.allclose(kl.grad, th.tensor([1.0, 1.0]))


# V_old = 0, eps_v = 0.5, R = 1:  V = 0.2 (inside the band), V = 2.0 (above), V = -1.0 (below)
VALUES = [0.2, 2.0, -1.0]
OLD, RETURNS, EPS = th.zeros(3), th.ones(3), 0.5


def test_value_loss_unclipped():
    values = th.tensor(VALUES, requires_grad=True)
    loss = losses.value_loss(values, OLD, RETURNS, None)
    assert loss.item() == pytest.approx((0.64 + 1.0 + 4.0) / 3)
    loss.backward()
    assert th.allclose(values.grad, 2 * (values.detach() - RETURNS) / 3)


def test_value_loss_clipped_form():
    values = th.tensor(VALUES, requires_grad=True)
    # clipped predictions: [0.2, 0.5, -0.5] -> errors [0.64, 0.25, 2.25]
    loss = losses.value_loss(values, OLD, RETURNS, EPS, "clipped")
    assert loss.item() == pytest.approx((0.64 + 0.25 + 2.25) / 3)
    loss.backward()
    # Outside the band the clipped form has no gradient at all.
    assert th.allclose(values.grad, th.tensor([2 * (0.2 - 1) / 3, 0.0, 0.0]))


def test_value_loss_max_form():
    values = th.tensor(VALUES, requires_grad=True)
    # max(unclipped, clipped): [max(.64,.64), max(1, .25), max(4, 2.25)] = [0.64, 1.0, 4.0]
    loss = losses.value_loss(values, OLD, RETURNS, EPS, "max")
    assert loss.item() == pytest.approx((0.64 + 1.0 + 4.0) / 3)
    loss.backward()
    # Outside the band the unclipped term is the larger one here: its gradient survives.
    assert th.allclose(values.grad, th.tensor([2 * (0.2 - 1) / 3, 2 * (2.0 - 1) / 3, 2 * (-1.0 - 1) / 3]))


def test_value_loss_max_form_where_the_clipped_term_wins():
    # V_old = 0, V = 0.9, R = 2, eps 0.5: unclipped (0.9 - 2)^2 = 1.21 < clipped (0.5 - 2)^2 = 2.25,
    # so the max picks the clipped term, whose gradient is zero outside the band.
    values = th.tensor([0.9], requires_grad=True)
    loss = losses.value_loss(values, th.zeros(1), th.tensor([2.0]), 0.5, "max")
    assert loss.item() == pytest.approx(2.25)
    loss.backward()
    assert values.grad.item() == 0.0


def test_value_loss_scale_is_the_same_in_every_mode():
    values = th.tensor([0.1, 0.3])
    expected = ((values - RETURNS[:2]) ** 2).mean()
    for mode in losses.VF_CLIP_MODES:  # inside the band all forms equal the plain MSE (no 0.5 factor)
        assert losses.value_loss(values, th.zeros(2), RETURNS[:2], 10.0, mode).item() == pytest.approx(expected.item())


def test_unknown_value_clip_mode():
    with pytest.raises(ValueError, match="vf_clip_mode='huber'"):
        losses.value_loss(th.zeros(1), th.zeros(1), th.zeros(1), 0.1, "huber")


def test_clip_fractions_and_k3():
    assert losses.clip_fraction(th.tensor([1.0, 1.3, 0.7, 1.1]), 0.2).item() == pytest.approx(0.5)
    assert losses.value_clip_fraction(th.tensor(VALUES), OLD, EPS).item() == pytest.approx(2 / 3)
    log_ratio = th.tensor([0.1, -0.2])
    expected = ((math.exp(0.1) - 1 - 0.1) + (math.exp(-0.2) - 1 + 0.2)) / 2
    assert losses.approx_kl_k3(log_ratio).item() == pytest.approx(expected, rel=1e-5)  # float32 exp(x) - 1


@pytest.mark.parametrize(
    "kl, expected",
    [
        (0.05, 2.0),  # > 1.5 * 0.01: doubles
        (0.001, 0.5),  # < 0.01 / 1.5: halves
        (0.01, 1.0),  # in the band: stays
        (0.0149, 1.0),  # just inside the upper edge
        (0.0067, 1.0),  # just inside the lower edge (0.01 / 1.5 = 0.00667)
    ],
)
def test_adaptive_kl_rule_of_the_paper(kl, expected):
    assert losses.adapt_kl_coef(1.0, kl, 0.01) == pytest.approx(expected)


def test_adaptive_kl_on_a_scripted_sequence_and_bounds():
    beta, trace = 1.0, []
    for kl in [0.05, 0.05, 0.01, 0.001, 0.001, 0.001]:
        beta = losses.adapt_kl_coef(beta, kl, 0.01, factor=2.0, tolerance=1.5, bounds=(0.25, 3.0))
        trace.append(beta)
    assert trace == [2.0, 3.0, 3.0, 1.5, 0.75, 0.375]
    assert losses.adapt_kl_coef(0.3, 0.0, 0.01, bounds=(0.25, 3.0)) == 0.25
    with pytest.raises(FloatingPointError):
        losses.adapt_kl_coef(1.0, float("nan"), 0.01)
