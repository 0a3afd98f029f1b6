"""The squashed head and the analytic KL, each checked against an independent computation."""

import math

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import masked_kl_by_hand
from stable_baselines3.common.distributions import (
    BernoulliDistribution,
    CategoricalDistribution,
    DiagGaussianDistribution,
    MultiCategoricalDistribution,
    StateDependentNoiseDistribution,
)
from torch.distributions import AffineTransform, Beta, Normal, TanhTransform, TransformedDistribution

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.distributions import (
    TanhSquashedDistribution,
    analytic_kl,
    distribution_parameters,
    distributions_from_parameters,
    log_tanh_jacobian_sum,
    rescale_tanh64,
    torch_distributions,
)


def squashed(mean, log_std, low, high, estimator="mc", dtype=th.float64):
    base = DiagGaussianDistribution(mean.shape[-1]).proba_distribution(mean.to(dtype), log_std.to(dtype))
    log_half_range = float(np.log((np.asarray(high, dtype=np.float64) - np.asarray(low, dtype=np.float64)) / 2).sum())
    return TanhSquashedDistribution(base, log_half_range, estimator)


def reference(mean, log_std, low, high):
    """torch's own composition: Normal -> tanh -> affine to [low, high] (transforms cache the pre-image)."""
    low, high = th.as_tensor(low, dtype=th.float64), th.as_tensor(high, dtype=th.float64)
    transforms = [TanhTransform(cache_size=1), AffineTransform((high + low) / 2, (high - low) / 2, cache_size=1)]
    return TransformedDistribution(Normal(mean.double(), log_std.double().exp()), transforms)


@pytest.mark.parametrize("dtype", [th.float64, th.float32])
def test_log_prob_matches_torch_transformed_distribution_up_to_15(dtype):
    low, high = [-1.0, 0.0, -2.0], [3.0, 0.5, 2.0]
    u = th.linspace(-15.0, 15.0, 301, dtype=th.float64).unsqueeze(1).repeat(1, 3)
    u[:, 1] = u[:, 1].flip(0)  # mixed signs across dimensions
    mean = th.tensor([[0.3, -0.5, 1.0]], dtype=th.float64).expand_as(u)
    log_std = th.tensor([0.5, -0.2, 1.5], dtype=th.float64)
    ref = reference(mean, log_std, low, high)
    # The reference scores y through its cached pre-image (exactly u), like PPOExt scores the stored u.
    y = ref.transforms[1](ref.transforms[0](u))
    expected = ref.log_prob(y).sum(dim=1)
    ours = squashed(mean, log_std, low, high, dtype=dtype).log_prob(u.to(dtype))
    assert ours.dtype == dtype
    assert th.allclose(ours.double(), expected, rtol=0, atol=1e-4), (ours.double() - expected).abs().max()


@pytest.mark.parametrize("dtype", [th.float32, th.float64])
def test_log_prob_stays_finite_beyond(dtype):
    u = th.tensor([[-1e4, 40.0], [-88.0, 100.0], [1e3, -30.0]], dtype=dtype)
    dist = squashed(th.zeros(3, 2), th.zeros(2), [-1, -1], [1, 1], dtype=dtype)
    assert th.isfinite(dist.log_prob(u)).all()
    assert th.isfinite(log_tanh_jacobian_sum(u)).all()
    # float32's naive 1 - tanh(u)^2 underflows to 0 (log = -inf) here; the stable form does not.
    assert th.isinf(th.log(1 - th.tanh(th.tensor(20.0)) ** 2))


def test_entropy_estimators():
    th.manual_seed(0)
    mean, log_std = th.tensor([[0.5, -1.0]]).repeat(200_000, 1), th.tensor([0.3, -0.5])
    low, high = [-2.0, 0.0], [2.0, 1.0]
    ref = reference(mean[:1], log_std, low, high)
    # Monte Carlo entropy of the squashed, rescaled action: -E[log p(a)]
    y = ref.rsample((200_000,))
    true_entropy = -ref.log_prob(y).sum(dim=-1).mean()
    mc = squashed(mean, log_std, low, high, "mc").entropy()
    assert mc.shape == (200_000,)
    assert abs(mc.mean() - true_entropy) < 0.01
    gaussian = squashed(mean, log_std, low, high, "gaussian").entropy()
    assert th.allclose(gaussian, Normal(mean.double(), log_std.double().exp()).entropy().sum(1))
    assert squashed(mean, log_std, low, high, "sample").entropy() is None


def test_mc_entropy_is_differentiable():
    mean = th.zeros(64, 2, requires_grad=True)
    log_std = th.zeros(2, requires_grad=True)
    dist = squashed(mean, log_std, [-1, -1], [1, 1], dtype=th.float32)
    dist.entropy().mean().backward()
    assert log_std.grad is not None and th.isfinite(log_std.grad).all()
    # Squashed entropy is bounded: far into saturation, more std lowers it, unlike the Gaussian's.
    wide = squashed(th.zeros(20_000, 1), th.tensor([3.0]), [-1], [1], dtype=th.float32).entropy().mean()
    narrow = squashed(th.zeros(20_000, 1), th.tensor([0.0]), [-1], [1], dtype=th.float32).entropy().mean()
    assert wide < narrow


def mc_kl(p, q, n=100_000):
    """Monte Carlo KL(p || q) from n samples of p, with its standard error."""
    samples = p.sample((n,))
    log_ratio = p.log_prob(samples) - q.log_prob(samples)
    if log_ratio.dim() > 1:
        log_ratio = log_ratio.flatten(1).sum(1)
    return log_ratio.mean().item(), log_ratio.std().item() / math.sqrt(n)


def gaussian_pair(squash):
    p_mean, q_mean = th.tensor([[0.2, -0.4, 1.5]]), th.tensor([[0.5, -0.1, 1.2]])
    p_log_std, q_log_std = th.tensor([0.1, -0.3, 0.4]), th.tensor([0.3, -0.5, 0.2])
    if squash:
        low, high = [-1, 0, -3], [2, 0.5, 3]
        p, q = squashed(p_mean, p_log_std, low, high), squashed(q_mean, q_log_std, low, high)
        # Monte Carlo in the *action* space, through torch's own transformed distribution.
        return p, q, reference(p_mean[0], p_log_std, low, high), reference(q_mean[0], q_log_std, low, high)
    p = DiagGaussianDistribution(3).proba_distribution(p_mean, p_log_std)
    q = DiagGaussianDistribution(3).proba_distribution(q_mean, q_log_std)
    return p, q, Normal(p_mean[0], p_log_std.exp()), Normal(q_mean[0], q_log_std.exp())


@pytest.mark.parametrize("squash", [False, True])
def test_analytic_kl_matches_monte_carlo_gaussian(squash):
    th.manual_seed(1)
    p, q, p_ref, q_ref = gaussian_pair(squash)
    kl = analytic_kl(torch_distributions(p), torch_distributions(q)).item()
    estimate, stderr = mc_kl(p_ref, q_ref)
    assert abs(kl - estimate) < 3 * stderr, (kl, estimate, stderr)


def test_analytic_kl_matches_monte_carlo_discrete():
    th.manual_seed(2)
    logits_p, logits_q = th.tensor([[0.1, 1.0, -0.5]]), th.tensor([[0.4, 0.2, 0.0]])
    p = CategoricalDistribution(3).proba_distribution(logits_p)
    q = CategoricalDistribution(3).proba_distribution(logits_q)
    estimate, stderr = mc_kl(p.distribution, q.distribution)
    assert abs(analytic_kl(torch_distributions(p), torch_distributions(q)).item() - estimate) < 3 * stderr

    multi_p = MultiCategoricalDistribution([3, 2]).proba_distribution(th.tensor([[0.1, 1.0, -0.5, 0.3, -0.3]]))
    multi_q = MultiCategoricalDistribution([3, 2]).proba_distribution(th.tensor([[0.4, 0.2, 0.0, -1.0, 0.5]]))
    n = 100_000
    samples = [d.sample((n,)) for d in multi_p.distribution]
    pairs = zip(multi_p.distribution, multi_q.distribution, samples, strict=True)
    log_ratio = sum(dp.log_prob(s) - dq.log_prob(s) for dp, dq, s in pairs)
    estimate, stderr = log_ratio.mean().item(), log_ratio.std().item() / math.sqrt(n)
    assert abs(analytic_kl(torch_distributions(multi_p), torch_distributions(multi_q)).item() - estimate) < 3 * stderr

    bern_p = BernoulliDistribution(3).proba_distribution(th.tensor([[0.5, -1.0, 2.0]]))
    bern_q = BernoulliDistribution(3).proba_distribution(th.tensor([[0.0, 0.3, 1.0]]))
    estimate, stderr = mc_kl(bern_p.distribution, bern_q.distribution)
    assert abs(analytic_kl(torch_distributions(bern_p), torch_distributions(bern_q)).item() - estimate) < 3 * stderr


def test_analytic_kl_gsde_matches_monte_carlo():
    th.manual_seed(3)
    latent = th.randn(1, 4)
    p = StateDependentNoiseDistribution(2).proba_distribution(th.tensor([[0.2, -0.3]]), th.full((4, 2), -0.5), latent)
    p_params = (p.distribution.loc.clone(), p.distribution.scale.clone())
    q = StateDependentNoiseDistribution(2).proba_distribution(th.tensor([[0.0, -0.1]]), th.full((4, 2), -0.3), latent)
    kl = analytic_kl([Normal(*p_params)], torch_distributions(q)).item()
    estimate, stderr = mc_kl(Normal(p_params[0][0], p_params[1][0]), Normal(q.distribution.loc[0], q.distribution.scale[0]))
    assert abs(kl - estimate) < 3 * stderr


def test_rescale_never_leaves_asymmetric_bounds():
    space = spaces.Box(low=np.array([-1.0, 0.0], dtype=np.float32), high=np.array([3.0, 0.5], dtype=np.float32))
    u = np.concatenate([np.random.default_rng(0).normal(0, 20, size=(10_000, 2)), [[1e6, -1e6], [-1e6, 1e6]]])
    low64, high64 = space.low.astype(np.float64), space.high.astype(np.float64)
    actions = rescale_tanh64(u.astype(np.float32), low64, high64, high64 - low64, space.low.dtype)
    assert actions.dtype == np.float32
    assert np.all(actions >= space.low) and np.all(actions <= space.high)
    assert np.allclose(actions[-2], [3.0, 0.0]) and np.allclose(actions[-1], [-1.0, 0.5])
    assert np.allclose(rescale_tanh64(np.zeros((1, 2)), low64, high64, high64 - low64, space.low.dtype), [[1.0, 0.25]])


def test_actions_from_params_pass_deterministic_to_sampling_only():
    dist = squashed(th.zeros(2, 1), th.zeros(1), [-1], [1], dtype=th.float32)
    mean = th.tensor([[0.5], [-1.0]])
    actions = dist.actions_from_params(mean, th.zeros(1), deterministic=True)
    assert th.equal(actions, mean)
    actions, log_prob = dist.log_prob_from_params(mean, th.zeros(1), deterministic=True)
    assert th.allclose(log_prob, dist.log_prob(mean))


def test_log_tanh_jacobian_sum_value_and_gradient():
    """The fused sum against the naive formula (value) and d/du log(1 - tanh(u)^2) = -2 tanh(u) (gradient)."""
    u = th.linspace(-6, 6, 40, dtype=th.float64).reshape(10, 4).requires_grad_()
    total = log_tanh_jacobian_sum(u)
    assert total.shape == (10,)
    assert th.allclose(total, th.log(1 - th.tanh(u) ** 2).sum(dim=-1), atol=1e-10)
    (grad,) = th.autograd.grad(total.sum(), u)
    assert th.allclose(grad, -2 * th.tanh(u.detach()), atol=1e-12)
    # Saturated float32 values: finite, and the gradient is -2 sign(u).
    big = th.tensor([[-1e4, 50.0, 0.0]], requires_grad=True)
    value = log_tanh_jacobian_sum(big)
    assert th.isfinite(value).all()
    assert value.item() == pytest.approx(3 * 2 * math.log(2) - 2 * (1e4 + 50 + math.log(2)), rel=1e-6)
    (grad,) = th.autograd.grad(value.sum(), big)
    assert th.equal(grad, th.tensor([[2.0, -2.0, 0.0]]))


def test_squashed_log_prob_is_the_change_of_variables_formula_with_its_gradient():
    """log N(u) - sum log(1 - tanh^2 u) - sum log(half range), written out naively in float64, value and gradient."""
    th.manual_seed(1)
    mean = th.randn(16, 3, dtype=th.float64, requires_grad=True)
    log_std = th.randn(3, dtype=th.float64, requires_grad=True)
    u = 3 * th.randn(16, 3, dtype=th.float64)
    low, high = np.array([-1.0, 0.0, -3.0]), np.array([2.0, 0.5, 3.0])
    ours = squashed(mean, log_std, low, high).log_prob(u)
    normal = -0.5 * ((u - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    naive = (normal - th.log(1 - th.tanh(u) ** 2)).sum(dim=-1) - float(np.log((high - low) / 2).sum())
    assert th.allclose(ours, naive, atol=1e-9)
    weights = th.randn(16, dtype=th.float64)
    grads = th.autograd.grad((ours * weights).sum(), (mean, log_std))
    expected = th.autograd.grad((naive * weights).sum(), (mean, log_std))
    for got, want in zip(grads, expected, strict=True):
        assert th.allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("kind", ["gaussian", "categorical", "multicategorical", "bernoulli", "beta"])
def test_carried_parameters_rebuild_pi_old_and_its_kl(kind):
    """
    pi_old rebuilt from the parameters a buffer carries (distribution_parameters ->
    distributions_from_parameters) is the same distribution, and analytic_kl against it equals torch's
    kl_divergence (a separate computation), gradients of pi_new included.
    """
    th.manual_seed(2)
    n = 6
    if kind == "gaussian":
        old = [Normal(th.randn(n, 2), th.rand(n, 2) + 0.1)]
        params = (th.randn(n, 2, requires_grad=True), th.randn(n, 2, requires_grad=True))
        new = [Normal(params[0], params[1].exp())]
    elif kind == "categorical":
        old = [th.distributions.Categorical(logits=th.randn(n, 4))]
        params = (th.randn(n, 4, requires_grad=True),)
        new = [th.distributions.Categorical(logits=params[0])]
    elif kind == "multicategorical":
        old = [th.distributions.Categorical(logits=th.randn(n, k)) for k in (3, 5)]
        params = (th.randn(n, 3, requires_grad=True), th.randn(n, 5, requires_grad=True))
        new = [th.distributions.Categorical(logits=p) for p in params]
    elif kind == "bernoulli":
        old = [th.distributions.Bernoulli(logits=th.randn(n, 3))]
        params = (th.randn(n, 3, requires_grad=True),)
        new = [th.distributions.Bernoulli(logits=params[0])]
    else:
        old = [Beta(th.rand(n, 2) + 1.0, th.rand(n, 2) + 1.0)]
        params = (th.randn(n, 2, requires_grad=True),)
        new = [Beta(1.0 + params[0].exp(), 1.0 + (-params[0]).exp())]
    kinds, tensors = distribution_parameters(old)
    rebuilt = distributions_from_parameters(kinds, [t.clone() for t in tensors])
    for got, want in zip(rebuilt, old, strict=True):
        assert type(got) is type(want)
        for name in (
            ("probs",)
            if isinstance(want, (th.distributions.Categorical, th.distributions.Bernoulli))
            else ("mean", "variance")
        ):
            th.testing.assert_close(getattr(got, name), getattr(want, name))
    ours = analytic_kl(rebuilt, new)
    expected = sum(th.distributions.kl_divergence(d, q).reshape(n, -1).sum(dim=1) for d, q in zip(old, new, strict=True))
    assert ours.shape == (n,)
    assert th.allclose(ours, expected, atol=1e-6)
    grads = th.autograd.grad(ours.sum(), params, retain_graph=True)
    expected_grads = th.autograd.grad(expected.sum(), params)
    for got, want in zip(grads, expected_grads, strict=True):
        assert th.allclose(got, want, atol=1e-5)


def test_rescale_tanh64_is_bit_identical_to_the_clipped_float64_formula():
    rng = np.random.default_rng(3)
    low, high = np.array([-2.0, 0.0, -1e-3], dtype=np.float32), np.array([2.0, 0.25, 5.0], dtype=np.float32)
    u = (rng.standard_normal((5000, 3)) * 8).astype(np.float32)
    u[0] = [np.nan, np.inf, -np.inf]
    low64, high64 = low.astype(np.float64), high.astype(np.float64)
    expected = np.clip(low64 + 0.5 * (np.tanh(u.astype(np.float64)) + 1.0) * (high64 - low64), low64, high64)
    expected = expected.astype(np.float32)
    ours = rescale_tanh64(u, low64, high64, high64 - low64, low.dtype)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, expected)
    assert np.isnan(ours[0, 0]) and ours[0, 1] == high[1] and ours[0, 2] == low[2]


def test_entropy_without_grad_is_the_same_estimate_from_the_same_draws():
    """What PPOExt computes for logging with ent_coef == 0: no graph, same value, same RNG consumption."""
    mean, log_std = th.randn(64, 2, requires_grad=True), th.zeros(2, requires_grad=True)
    dist = squashed(mean, log_std, [-1, -1], [1, 1], dtype=th.float32)
    th.manual_seed(4)
    with_grad = dist.entropy()
    state_after_grad = th.get_rng_state()
    th.manual_seed(4)
    with th.no_grad():
        without_grad = dist.entropy()
    assert with_grad.requires_grad and not without_grad.requires_grad
    assert th.equal(with_grad.detach(), without_grad)
    assert th.equal(th.get_rng_state(), state_after_grad)


def test_proba_distribution_net_is_the_base_gaussians():
    """The squashed head's network is the pre-squash Gaussian's: a mean layer and a log-std parameter."""
    from stable_baselines3.common.distributions import DiagGaussianDistribution

    base = DiagGaussianDistribution(2).proba_distribution(th.zeros(1, 2), th.zeros(2))
    squashed = TanhSquashedDistribution(base, 0.0, "mc")
    mean_net, log_std = squashed.proba_distribution_net(latent_dim=5, log_std_init=-1.0)
    assert mean_net.in_features == 5 and mean_net.out_features == 2
    assert th.equal(log_std.data, th.full((2,), -1.0))


def test_scale_action_inverts_unscale_action_inside_the_float32_range():

    model = PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32)
    u = np.array([[-3.0], [-0.5], [0.0], [2.0], [4.0]], dtype=np.float32)
    actions = model.policy.unscale_action(u)
    np.testing.assert_allclose(model.policy.scale_action(actions), u, rtol=1e-3, atol=1e-3)
    # Saturated actions come back clamped at |u| <= 9 (float32 tanh saturates there), never inf.
    assert np.isfinite(model.policy.scale_action(model.policy.unscale_action(np.array([[40.0]])))).all()
    gaussian = PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(squash_output=False))
    np.testing.assert_allclose(gaussian.policy.scale_action(np.array([[1.0]], dtype=np.float32)), [[0.5]])


def test_training_leaves_torchs_process_wide_validation_default_alone(family, monkeypatch):
    """No process-global switch on the hot path: collection and update never change torch's validation default."""
    calls = []
    monkeypatch.setattr(th.distributions.Distribution, "set_default_validate_args", staticmethod(calls.append))
    model = family.model(n_envs=2)
    model.learn(2 * model.n_steps * model.n_envs)
    assert model._n_updates > 0 and calls == []


def test_categorical_kl_stays_finite_where_torch_gives_inf():
    p = th.distributions.Categorical(logits=th.tensor([[0.0, -50.0]]))
    q = th.distributions.Categorical(logits=th.tensor([[0.0, -200.0]]))  # q's second category underflows to 0
    assert th.isinf(th.distributions.kl_divergence(p, q)).all()
    expected = masked_kl_by_hand(p.logits, q.logits, th.ones(1, 2, dtype=th.bool))
    th.testing.assert_close(analytic_kl([p], [q]).double(), expected, rtol=1e-4, atol=1e-12)


@pytest.mark.parametrize("squash", [False, True])
def test_gaussian_step_from_noise_is_torchs_density(squash):
    """The fast mode's step: u = mean + scale * noise, its log-density from the draw, against torch's float64 distributions."""
    from torch.distributions import Independent

    from sb3_ppo_ext.distributions import gaussian_log_prob_constant, gaussian_step_from_noise

    generator = np.random.default_rng(0)
    mean = generator.normal(size=(5, 3)).astype(np.float32)
    log_std = generator.normal(scale=0.5, size=3).astype(np.float32)
    noise = generator.normal(size=(5, 3)).astype(np.float32)
    low, high = np.array([-1.0, -2.0, 0.0]), np.array([1.0, 3.0, 0.5])
    log_half_range_sum = float(np.log((high - low) / 2).sum()) if squash else None
    constant = gaussian_log_prob_constant(log_std, log_half_range_sum)
    scale = np.exp(log_std)
    actions, log_prob = gaussian_step_from_noise(mean, scale, noise, constant, squash)
    assert actions.dtype == log_prob.dtype == np.float32 and log_prob.shape == (5,)
    np.testing.assert_allclose(actions, mean + scale * noise, rtol=1e-6)
    base = Normal(th.as_tensor(mean, dtype=th.float64), th.as_tensor(scale, dtype=th.float64))
    u = th.as_tensor(actions, dtype=th.float64)
    if squash:  # the environment's action a = low + (tanh(u) + 1) / 2 * (high - low), scored by torch
        half, middle = th.as_tensor((high - low) / 2), th.as_tensor((high + low) / 2)
        reference = TransformedDistribution(base, [TanhTransform(), AffineTransform(middle, half)])
        want = reference.log_prob(middle + half * th.tanh(u)).sum(-1)
    else:
        want = Independent(base, 1).log_prob(u)
    np.testing.assert_allclose(log_prob, want.numpy(), rtol=1e-5, atol=1e-5)
    # the mean (SB3's mode), and NaN for a row whose mean is not finite, as torch's formula gives it
    mode, mode_log_prob = gaussian_step_from_noise(mean, scale, None, constant, squash)
    np.testing.assert_array_equal(mode, mean)
    if squash:
        want_mode = reference.log_prob(middle + half * th.tanh(base.mean)).sum(-1)
    else:
        want_mode = Independent(base, 1).log_prob(base.mean)
    np.testing.assert_allclose(mode_log_prob, want_mode.numpy(), rtol=1e-5, atol=1e-5)
    mean[2, 1] = np.nan
    _, with_nan = gaussian_step_from_noise(mean, scale, noise, constant, squash)
    assert np.isnan(with_nan[2]) and np.isfinite(np.delete(with_nan, 2)).all()
