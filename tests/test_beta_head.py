"""The Beta head: its math against independent float64 references (scipy), and the head end to end."""

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import TINY, AsymmetricBoxEnv
from scipy import integrate, stats
from stable_baselines3 import PPO
from stable_baselines3.common.logger import configure
from torch.distributions import Beta

from sb3_ppo_ext import PPOExt, RecurrentPPOExt
from sb3_ppo_ext.distributions import (
    BetaDistribution,
    analytic_kl,
    concat_distributions,
    index_distribution,
    mean_std,
    torch_distributions,
)
from sb3_ppo_ext.validation import InvalidSettingError

LOW, HIGH = np.array([-1.0, 0.0, -2.0]), np.array([3.0, 0.5, 2.0])
BETA = dict(net_arch=[16], action_dist="beta")


def beta_head(z, dtype=th.float64, low=LOW, high=HIGH):
    dist = BetaDistribution(z.shape[-1] // 2, float(np.log(high - low).sum()))
    return dist.proba_distribution(z.to(dtype))


def alphas_betas(z):
    """The head's parameters by hand, in float64: 1 + log(1 + exp(z))."""
    a_b = 1.0 + np.logaddexp(0.0, np.asarray(z, dtype=np.float64))
    return a_b[..., :3], a_b[..., 3:]


def test_log_prob_matches_scipy_beta_in_float64_and_float32_near_the_bounds():
    z = th.tensor([[0.3, -1.0, 4.0, 2.0, 0.5, -0.7]], dtype=th.float64)
    a, b = alphas_betas(z.numpy())
    # x from 1e-7 to 1 - 1e-7 on a logit grid: near both bounds, where float32 x itself rounds badly.
    u = th.linspace(-16.0, 16.0, 161, dtype=th.float64).unsqueeze(1).repeat(1, 3)
    u[:, 1] = u[:, 1].flip(0)
    x = 1.0 / (1.0 + np.exp(-u.numpy()))
    expected = (stats.beta.logpdf(x, a, b) - np.log(HIGH - LOW)).sum(axis=1)
    ours64 = beta_head(z.expand(len(u), -1)).log_prob(u).numpy()
    np.testing.assert_allclose(ours64, expected, rtol=1e-9, atol=1e-9)
    ours32 = beta_head(z.expand(len(u), -1), th.float32).log_prob(u.float())
    assert ours32.dtype == th.float32
    np.testing.assert_allclose(ours32.double().numpy(), expected, rtol=1e-5, atol=2e-4)


def test_a_sample_at_one_minus_1e_8_keeps_a_finite_exact_log_prob_in_float32():
    z = th.tensor([[2.0, 2.0, 2.0, 1.0, 1.0, 1.0]])
    x64 = 1.0 - 1e-8
    u = th.full((1, 3), float(np.log(x64) - np.log1p(-x64)))  # the stored logit, ~18.42 in float32
    assert float(th.sigmoid(u)[0, 0]) == 1.0  # the float32 sample itself is 1: log(1 - x) = -inf
    assert th.isinf(Beta(th.tensor(2.0), th.tensor(3.0)).log_prob(th.sigmoid(u)[0, 0]))
    a, b = alphas_betas(z.numpy())
    x = 1.0 / (1.0 + np.exp(-u.double().numpy()))
    expected = (stats.beta.logpdf(x, a, b) - np.log(HIGH - LOW)).sum()
    ours = beta_head(z, th.float32).log_prob(u)
    assert th.isfinite(ours).all()
    assert abs(float(ours) - expected) < 1e-3 * abs(expected)


def test_log_prob_is_exact_for_huge_concentrations():
    """log B(alpha, beta) is computed in float64: in float32 lgamma(1e8) - lgamma(1e8 + 1) cancels to 0 (off by 18)."""
    z = th.tensor([[1e8, 1e8, 1e8, -30.0, -30.0, -30.0]], dtype=th.float32)
    u = th.full((1, 3), 19.0)
    a, b = alphas_betas(z.double().numpy())
    x = 1.0 / (1.0 + np.exp(-19.0))
    expected = (stats.beta.logpdf(x, a, b) - np.log(HIGH - LOW)).sum()
    assert abs(float(beta_head(z, th.float32).log_prob(u)) - expected) < 1e-3 * abs(expected) + 1.0


def test_samples_are_beta_distributed_and_mode_is_the_formula():
    th.manual_seed(0)
    z = th.tensor([[0.5, -2.0, 3.0, 1.0, 0.2, -0.3]], dtype=th.float64)
    a, b = alphas_betas(z.numpy())
    dist = beta_head(z.expand(20000, -1))
    x = th.sigmoid(dist.sample()).numpy()
    for i in range(3):
        assert stats.kstest(x[:, i], stats.beta(a[0, i], b[0, i]).cdf).pvalue > 1e-3
    mode = th.sigmoid(beta_head(z).mode()).numpy()
    np.testing.assert_allclose(mode, (a - 1) / (a + b - 2), rtol=1e-12)


def test_entropy_matches_numerical_integration():
    z = th.tensor([[0.5, -2.0, 3.0, 1.0, 0.2, -0.3]], dtype=th.float64)
    a, b = alphas_betas(z.numpy())
    expected = 0.0
    for i in range(3):
        density = stats.beta(a[0, i], b[0, i])
        h, _ = integrate.quad(lambda x, d=density: -d.pdf(x) * d.logpdf(x), 0.0, 1.0, limit=200)
        expected += h + np.log(HIGH[i] - LOW[i])  # the affine map to [low, high] adds log(high - low)
    assert abs(float(beta_head(z).entropy()) - expected) < 1e-7


def test_analytic_kl_matches_monte_carlo():
    th.manual_seed(1)
    zp = th.tensor([[0.5, -1.0, 2.0, 1.0, 0.0, -0.5]], dtype=th.float64)
    zq = th.tensor([[0.2, -0.5, 1.5, 1.5, 0.3, -1.0]], dtype=th.float64)
    p, q = beta_head(zp.expand(200000, -1)), beta_head(zq.expand(200000, -1))
    u = p.sample()
    monte_carlo = (p.log_prob(u) - q.log_prob(u)).mean().item()
    kl = analytic_kl(torch_distributions(beta_head(zp)), torch_distributions(beta_head(zq))).item()
    assert kl > 0.01
    assert abs(kl - monte_carlo) < 0.01 * kl + 1e-3


def test_index_concat_indexed_kl_and_mean_std_handle_the_beta():
    z = th.randn(6, 6, dtype=th.float64, generator=th.Generator().manual_seed(0))
    (dist,) = torch_distributions(beta_head(z))
    assert isinstance(dist, Beta)
    picked = index_distribution(dist, th.tensor([4, 1]))
    th.testing.assert_close(picked.concentration1, dist.concentration1[[4, 1]])
    th.testing.assert_close(picked.concentration0, dist.concentration0[[4, 1]])
    (joined,) = concat_distributions([[index_distribution(dist, slice(0, 2))], [index_distribution(dist, slice(2, 6))]])
    th.testing.assert_close(joined.concentration1, dist.concentration1)
    (other,) = torch_distributions(beta_head(z.flip(0)))
    rows = th.tensor([0, 3])
    th.testing.assert_close(
        analytic_kl([index_distribution(dist, rows)], [index_distribution(other, rows)]),
        th.distributions.kl_divergence(index_distribution(dist, rows), index_distribution(other, rows)).sum(dim=1),
    )
    a, b = alphas_betas(z.numpy())
    by_hand = np.sqrt(a * b / ((a + b) ** 2 * (a + b + 1))).mean()
    assert abs(mean_std([dist]) - by_hand) < 1e-12


def saturate_towards_high(policy, concentration=1e8):
    """Freeze the head at alpha ~ 1e8, beta ~ 1: almost every float32 sample x rounds to 1."""
    with th.no_grad():
        policy.action_net.weight.zero_()
        dim = policy.action_net.out_features // 2
        policy.action_net.bias[:dim] = concentration
        policy.action_net.bias[dim:] = -30.0


@pytest.mark.parametrize("algorithm", ["ppo_ext", "recurrent", "stock_ppo"])
def test_frozen_beta_policy_has_ratio_one_on_a_saturated_rollout(algorithm, surrogate_ratios):
    env = AsymmetricBoxEnv()
    if algorithm == "ppo_ext":
        model = PPOExt("MlpPolicy", env, learning_rate=0.0, policy_kwargs=BETA, **TINY)
    elif algorithm == "recurrent":
        model = RecurrentPPOExt("MlpLstmPolicy", env, learning_rate=0.0, policy_kwargs=dict(BETA, lstm_hidden_size=8), **TINY)
    else:
        from sb3_ppo_ext.policies import PPOExtActorCriticPolicy

        model = PPO(PPOExtActorCriticPolicy, env, learning_rate=0.0, policy_kwargs=BETA, **TINY)
    saturate_towards_high(model.policy)
    model.set_logger(configure(None, []))
    model.learn(32)
    stored = model.rollout_buffer.actions
    assert (th.sigmoid(th.as_tensor(stored)) == 1.0).float().mean() > 0.5  # float32 x would score log(0)
    assert np.isfinite(model.rollout_buffer.log_probs).all()
    received = np.array(env.received)
    assert np.all(received >= env.action_space.low) and np.all(received <= env.action_space.high)
    np.testing.assert_allclose(received[-8:], np.broadcast_to(env.action_space.high, received[-8:].shape), atol=1e-5)
    if algorithm == "stock_ppo":
        assert model.logger.name_to_value["train/clip_fraction"] == 0.0
    else:
        assert max((r - 1).abs().max().item() for r in surrogate_ratios) < 1e-5
        assert model.logger.name_to_value["train/action_saturation"] == 1.0
        assert model.logger.name_to_value["train/kl"] == 0.0


def test_beta_head_trains_with_the_kl_penalty_entropy_bonus_and_logs_its_std():
    model = PPOExt("MlpPolicy", AsymmetricBoxEnv(), kl_coef=0.5, kl_target=0.01, ent_coef=0.01, policy_kwargs=BETA, **TINY)
    assert model.policy.squash_output and isinstance(model.policy.action_dist, BetaDistribution)
    assert not hasattr(model.policy, "log_std")
    assert model.policy.entropy_estimator is None  # closed form
    model.set_logger(configure(None, []))
    model.learn(64)
    logged = model.logger.name_to_value
    for key in ("train/kl", "train/kl_penalty", "train/entropy", "train/std", "train/action_saturation"):
        assert np.isfinite(logged[key]), key
    # Initial head: alpha = beta = 1 + softplus(~0) = 1.69, whose std on (0, 1) is ~0.26.
    assert 0.15 < logged["train/std"] < 0.35


def test_deterministic_predict_is_the_rescaled_mode_and_save_load_keeps_it(tmp_path):
    env = AsymmetricBoxEnv()
    model = PPOExt("MlpPolicy", env, policy_kwargs=BETA, **TINY)
    obs = np.stack([env.observation_space.sample() for _ in range(4)])
    with th.no_grad():
        beta = model.policy.get_distribution(th.as_tensor(obs)).distribution
    a, b = beta.concentration1.double().numpy(), beta.concentration0.double().numpy()
    expected = env.action_space.low + (a - 1) / (a + b - 2) * (env.action_space.high - env.action_space.low)
    action, _ = model.predict(obs, deterministic=True)
    np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-6)
    model.save(tmp_path / "beta")
    loaded = PPOExt.load(tmp_path / "beta", env=env)
    assert loaded.policy.action_dist_name == "beta"
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], action)


@pytest.mark.parametrize(
    "policy_kwargs, extra, match",
    [
        (dict(squash_output=False), {}, r"policy_kwargs\.squash_output=False is invalid with policy_kwargs\.action_dist"),
        (dict(state_dependent_std=True), {}, r"policy_kwargs\.state_dependent_std=True is invalid"),
        (dict(entropy_estimator="mc"), {}, r"policy_kwargs\.entropy_estimator='mc' is invalid"),
        (dict(log_std_init=-1.0), {}, r"policy_kwargs\.log_std_init=-1\.0 is invalid"),
        ({}, dict(use_sde=True), r"use_sde=True is invalid with policy_kwargs\.action_dist='beta'"),
        (dict(action_dist="gamma"), {}, r"action_dist=.gamma. is invalid: expected one of \(.gaussian., .beta.\)"),
    ],
)
def test_contradictory_beta_settings_are_errors_naming_the_setting(policy_kwargs, extra, match):
    with pytest.raises(InvalidSettingError, match=match):
        PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs={**BETA, **policy_kwargs}, **extra, **TINY)


def test_beta_needs_finite_bounds_and_a_box():
    from stable_baselines3.common.utils import FloatSchedule

    from sb3_ppo_ext.policies import PPOExtActorCriticPolicy

    # SB3's algorithms assert finite bounds first; the policy says it too, for a policy built directly.
    unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    observations = spaces.Box(-1.0, 1.0, (3,), np.float32)
    with pytest.raises(InvalidSettingError, match=r"action_dist='beta' needs finite action bounds") as error:
        PPOExtActorCriticPolicy(observations, unbounded, FloatSchedule(1e-3), action_dist="beta")
    # The advice is a setting that works there (squash_output=False alone is refused with the Beta head).
    assert "actions use policy_kwargs=dict(action_dist='gaussian', squash_output=False)" in str(error.value)
    PPOExtActorCriticPolicy(observations, unbounded, FloatSchedule(1e-3), action_dist="gaussian", squash_output=False)
    with pytest.raises(InvalidSettingError, match=r"action_dist='beta' needs a Box action space"):
        PPOExt("MlpPolicy", "CartPole-v1", policy_kwargs=BETA, **TINY)


def test_actions_and_log_prob_from_params_are_the_distributions_own():
    """SB3's ``*_from_params`` entry points: a sample and its log-prob, the mode when deterministic."""
    th.manual_seed(0)
    params = th.randn(64, 4, dtype=th.float64)
    dist = BetaDistribution(2)
    np.testing.assert_array_equal(dist.actions_from_params(params, deterministic=True), dist.proba_distribution(params).mode())
    actions, log_prob = dist.log_prob_from_params(params)
    assert actions.shape == (64, 2) and th.isfinite(actions).all()
    th.testing.assert_close(log_prob, dist.log_prob(actions))
    x = th.sigmoid(actions)
    alpha, beta = 1 + th.nn.functional.softplus(params[:, :2]), 1 + th.nn.functional.softplus(params[:, 2:])
    reference = stats.beta.logpdf(x.numpy(), alpha.numpy(), beta.numpy()).sum(axis=1)
    np.testing.assert_allclose(log_prob.numpy(), reference, rtol=1e-9, atol=1e-9)
