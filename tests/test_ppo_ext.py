"""PPOExt end to end: objectives x value-clip forms x heads x action spaces, exact ratios, save/load, errors."""

import copy

import numpy as np
import pytest
import torch as th
from helpers import TINY_NET as TINY
from helpers import AsymmetricBoxEnv
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import (
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
)
from stable_baselines3.common.logger import configure

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.distributions import TanhSquashedDistribution
from sb3_ppo_ext.policies import PPOExtActorCriticPolicy

OBJECTIVES = {
    "clip": dict(),
    "kl_fixed": dict(clip_range=None, kl_coef=0.5),
    "kl_adaptive": dict(clip_range=None, kl_coef=1.0, kl_target=0.01),
    "clip_and_kl": dict(clip_range=0.2, kl_coef=1.0, kl_target=0.01),
}
VALUE_CLIPS = {
    "none": dict(),
    "clipped": dict(clip_range_vf=0.2, vf_clip_mode="clipped"),
    "max": dict(clip_range_vf=0.2, vf_clip_mode="max"),
}
ACTION_ENVS = {
    "box_squash": (lambda: IdentityEnvBox(ep_length=10), True),
    "box_gaussian": (lambda: IdentityEnvBox(ep_length=10), False),
    "discrete": (lambda: IdentityEnv(3, ep_length=10), None),
    "multidiscrete": (lambda: IdentityEnvMultiDiscrete(2, ep_length=10), None),
    "multibinary": (lambda: IdentityEnvMultiBinary(2, ep_length=10), None),
}


def kwargs_for(name, squash):
    kwargs = copy.deepcopy(TINY)
    if squash is not None:
        kwargs["policy_kwargs"]["squash_output"] = squash
    return kwargs


@pytest.mark.parametrize("objective", list(OBJECTIVES))
@pytest.mark.parametrize("value_clip", list(VALUE_CLIPS))
@pytest.mark.parametrize("action_env", list(ACTION_ENVS))
def test_learn_matrix(objective, value_clip, action_env):
    make_env, squash = ACTION_ENVS[action_env]
    model = PPOExt(
        "MlpPolicy", make_env(), **OBJECTIVES[objective], **VALUE_CLIPS[value_clip], **kwargs_for(action_env, squash)
    )
    model.set_logger(configure(None, []))
    model.learn(64)
    logged = model.logger.name_to_value
    assert model.policy.squash_output is bool(squash)
    for key in ("train/kl", "train/kl_max", "train/approx_kl", "train/entropy", "train/grad_norm", "train/ratio_min"):
        assert np.isfinite(logged[key]), key
    assert ("train/clip_fraction" in logged) is (OBJECTIVES[objective].get("clip_range", 0.2) is not None)
    assert ("train/clip_fraction_vf" in logged) is (value_clip != "none")
    assert ("train/kl_coef" in logged) is ("kl" in objective)
    assert ("train/action_saturation" in logged) is bool(squash)
    assert logged["train/epochs_completed"] == 2


def test_saturated_rollout_has_exact_ratio(surrogate_ratios):
    captured = surrogate_ratios
    # log_std_init=2.5: std ~ 12 in pre-squash units, so most components saturate.
    model = PPOExt(
        "MlpPolicy",
        make_vec_env("Pendulum-v1", n_envs=2, seed=0),
        n_steps=128,
        batch_size=64,
        n_epochs=1,
        seed=0,
        policy_kwargs=dict(log_std_init=2.5, net_arch=[16]),
    )
    model.learn(256)
    actions = th.as_tensor(model.rollout_buffer.actions)
    saturation = (th.tanh(actions).abs() > 0.999).float().mean().item()
    assert saturation >= 0.10, saturation
    assert (captured[0] - 1).abs().max().item() < 1e-5


def test_sb3_atanh_scoring_would_not_be_exact():
    """The contrast that motivates storing u: SB3's squashed distribution inverts the saturated action."""
    from stable_baselines3.common.distributions import SquashedDiagGaussianDistribution

    mean, log_std = th.zeros(1, 1), th.full((1,), 2.5)
    u = th.tensor([[12.0]])
    sb3 = SquashedDiagGaussianDistribution(1).proba_distribution(mean, log_std)
    exact = TanhSquashedDistribution(sb3_gaussian(mean, log_std), 0.0, "mc").log_prob(u)
    assert abs(sb3.log_prob(th.tanh(u)) - exact).item() > 1.0


def sb3_gaussian(mean, log_std):
    from stable_baselines3.common.distributions import DiagGaussianDistribution

    return DiagGaussianDistribution(mean.shape[1]).proba_distribution(mean, log_std)


def test_actions_inside_asymmetric_bounds():
    env = AsymmetricBoxEnv()
    model = PPOExt("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=2, seed=0, policy_kwargs=dict(log_std_init=3.0))
    model.learn(256)
    received = np.array(env.received)
    assert len(received) >= 256
    assert np.all(received >= env.action_space.low) and np.all(received <= env.action_space.high)
    # Saturated both ways: bounds are reached, not exceeded, in each dimension.
    assert np.isclose(received[:, 0].max(), 3.0, atol=1e-3) and np.isclose(received[:, 1].min(), 0.0, atol=1e-3)
    obs = np.stack([env.observation_space.sample() for _ in range(50)])
    for deterministic in (True, False):
        actions, _ = model.predict(obs, deterministic=deterministic)
        assert np.all(actions >= env.action_space.low) and np.all(actions <= env.action_space.high)


def test_deterministic_predict_is_squashed_rescaled_mean():
    env = AsymmetricBoxEnv()
    model = PPOExt("MlpPolicy", env, n_steps=32, batch_size=16, seed=0)
    obs = np.stack([env.observation_space.sample() for _ in range(5)])
    actions, _ = model.predict(obs, deterministic=True)
    with th.no_grad():
        mean = model.policy.get_distribution(th.as_tensor(obs)).distribution.mean.numpy()
    low, high = env.action_space.low, env.action_space.high
    assert np.allclose(actions, low + (np.tanh(mean) + 1) / 2 * (high - low), atol=1e-6)


@pytest.mark.parametrize("objective", ["clip", "kl_adaptive"])
def test_save_load_predict_and_continue(tmp_path, objective):
    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0)
    model = PPOExt("MlpPolicy", env, **OBJECTIVES[objective], **TINY)
    model.learn(256)
    if objective == "kl_adaptive":
        assert model.current_kl_coef != 1.0  # adapted at least once
    obs = env.reset()
    before, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "model.zip")

    loaded = PPOExt.load(tmp_path / "model.zip", env=env)
    after, _ = loaded.predict(obs, deterministic=True)
    assert np.array_equal(before, after)
    assert loaded.current_kl_coef == model.current_kl_coef
    assert loaded.kl_coef == model.kl_coef
    assert loaded.policy.squash_output and loaded.policy.entropy_estimator == "mc"

    # A continued learn starts from the saved beta.
    loaded.set_logger(configure(None, []))
    used = []

    class Spy(BaseCallback):
        def _on_rollout_end(self):
            used.append(self.model.current_kl_coef)

        def _on_step(self):
            return True

    loaded.learn(64, reset_num_timesteps=False, callback=Spy())
    assert used[0] == model.current_kl_coef
    if objective == "kl_adaptive":
        assert loaded.logger.name_to_value["train/kl_coef"] == model.current_kl_coef


BAD_ARGUMENTS = [
    (dict(clip_range=0.0), "clip_range=0.0"),
    (dict(clip_range=-0.1), "clip_range=-0.1"),
    (dict(clip_range=lambda _: -1.0), "clip_range is a schedule"),
    (dict(clip_range_vf=0), "clip_range_vf=0"),
    (dict(clip_range_vf=-1.0), "clip_range_vf=-1.0"),
    (dict(kl_target=0.0, kl_coef=1.0), "kl_target=0.0"),
    (dict(kl_target=-0.01, kl_coef=1.0), "kl_target=-0.01"),
    (dict(kl_target=0.01), "kl_target=0.01 needs kl_coef > 0"),
    (dict(kl_coef=-1.0), "kl_coef=-1.0"),
    (dict(kl_coef=float("nan")), "kl_coef=nan"),
    (dict(kl_adapt_factor=1.0), "kl_adapt_factor=1.0"),
    (dict(kl_adapt_tolerance=0.5), "kl_adapt_tolerance=0.5"),
    (dict(kl_coef_bounds=(1.0, 0.1)), "kl_coef_bounds"),
    (dict(kl_coef=1e6, kl_target=0.01), "kl_coef=1000000.0 must lie within kl_coef_bounds"),
    (dict(vf_clip_mode="huber"), "vf_clip_mode='huber'"),
    (dict(vf_clip_mode="max"), "vf_clip_mode='max' needs clip_range_vf"),
    (dict(max_grad_norm=0.0), "max_grad_norm=0.0"),
    (dict(target_kl=-0.1), "target_kl=-0.1"),
    (dict(policy_kwargs=dict(entropy_estimator="exact")), "entropy_estimator='exact'"),
    (dict(policy_kwargs=dict(squash_output=False, entropy_estimator="mc")), "only applies to the squashed head"),
    (dict(policy_kwargs=dict(state_dependent_std=True, log_std_bounds=(2.0, -5.0))), "log_std_bounds=\\(2.0, -5.0\\)"),
    (dict(policy_kwargs=dict(log_std_bounds=(-5.0, 2.0))), "only applies with state_dependent_std=True"),
    (dict(policy_kwargs=dict(state_dependent_std=True, log_std_init=3.0)), "log_std_init=3.0 must lie strictly inside"),
    (dict(use_sde=True, policy_kwargs=dict(state_dependent_std=True)), "cannot be combined with use_sde"),
]


@pytest.mark.parametrize("kwargs, message", BAD_ARGUMENTS)
def test_bad_input_is_a_value_error_naming_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOExt("MlpPolicy", "Pendulum-v1", **kwargs)


@pytest.mark.parametrize("env", [IdentityEnv(3), IdentityEnvMultiDiscrete(2), IdentityEnvMultiBinary(2)])
def test_squashing_a_non_box_space_is_a_value_error(env):
    with pytest.raises(ValueError, match="squash_output=True needs a Box action space"):
        PPOExt("MlpPolicy", env, policy_kwargs=dict(squash_output=True))
    with pytest.raises(ValueError, match="state_dependent_std=True needs a Box action space"):
        PPOExt("MlpPolicy", env, policy_kwargs=dict(state_dependent_std=True))


def test_state_dependent_std_head():
    model = PPOExt(
        "MlpPolicy",
        "Pendulum-v1",
        policy_kwargs=dict(state_dependent_std=True, log_std_init=-0.5, log_std_bounds=(-3.0, 1.0), net_arch=[16]),
        n_steps=32,
        batch_size=16,
        seed=0,
    )
    assert not hasattr(model.policy, "log_std")
    obs = th.as_tensor(np.stack([model.observation_space.sample() for _ in range(8)]))
    with th.no_grad():
        log_std = model.policy.get_distribution(obs).distribution.scale.log()
    assert th.allclose(log_std, th.full_like(log_std, -0.5), atol=0.05)
    # The head is trained: its parameters are in the optimizer.
    optimized = {id(p) for group in model.policy.optimizer.param_groups for p in group["params"]}
    assert all(id(p) in optimized for p in model.policy.log_std_net.parameters())
    model.set_logger(configure(None, []))
    model.learn(64)
    assert np.isfinite(model.logger.name_to_value["train/std"])
    with th.no_grad():
        far = model.policy.get_distribution(obs * 1e4).distribution.scale.log()
    assert far.min() >= -3.0 - 1e-6 and far.max() <= 1.0 + 1e-6


def test_policy_with_stock_ppo_is_exact_too():
    """Stock PPO handed our policy stores the pre-squash sample and scores it exactly."""
    env = AsymmetricBoxEnv()
    model = PPO(
        PPOExtActorCriticPolicy,
        env,
        n_steps=64,
        batch_size=32,
        n_epochs=1,
        learning_rate=0.0,  # the policy does not move: every ratio must be exactly 1
        seed=0,
        policy_kwargs=dict(log_std_init=2.5),
    )
    model.set_logger(configure(None, []))
    model.learn(64)
    stored = model.rollout_buffer.actions
    assert (np.abs(np.tanh(stored)) > 0.999).mean() > 0.1  # pre-squash values, many saturated
    received = np.array(env.received)
    assert np.all(received >= env.action_space.low) and np.all(received <= env.action_space.high)
    assert model.logger.name_to_value["train/approx_kl"] < 1e-6
    assert model.logger.name_to_value["train/clip_fraction"] == 0.0


def test_gsde_with_squashing():
    model = PPOExt("MlpPolicy", "Pendulum-v1", use_sde=True, sde_sample_freq=4, **TINY)
    assert model.policy.squash_output
    model.set_logger(configure(None, []))
    model.learn(64)
    assert np.isfinite(model.logger.name_to_value["train/kl"])


def test_load_keyword_overrides_are_validated(tmp_path):
    PPOExt("MlpPolicy", "Pendulum-v1", **TINY).save(tmp_path / "m")
    with pytest.raises(ValueError, match="vf_clip_mode='bogus'"):
        PPOExt.load(tmp_path / "m", vf_clip_mode="bogus")
    with pytest.raises(ValueError, match=r"kl_target=0\.01 needs kl_coef > 0"):
        PPOExt.load(tmp_path / "m", kl_target=0.01)
    loaded = PPOExt.load(tmp_path / "m", kl_coef=1.0, kl_target=0.01)
    assert loaded.uses_kl_penalty and loaded.kl_target == 0.01


def test_every_shipped_yml_entry_builds_a_model_through_the_quickstart_entry():
    import yaml

    from sb3_ppo_ext.__main__ import split_settings
    from sb3_ppo_ext.hyperparams import PPO_EXT_YML

    entries = yaml.safe_load(PPO_EXT_YML.read_text())
    for env_id, entry in entries.items():
        settings = split_settings(entry)
        env = (
            "Pendulum-v1"
            if entry.get("use_sde") or env_id not in ("CartPole-v1", "LunarLander-v3", "Acrobot-v1")
            else "CartPole-v1"
        )
        model = PPOExt(settings["policy"], env, **settings["model_kwargs"])
        assert model.n_steps == entry.get("n_steps", 2048), env_id


def test_load_accepts_custom_objects_for_a_model_that_will_not_train(tmp_path):
    """rl-zoo3's enjoy loads with zero schedules; only constructor-time schedules must start positive."""
    PPOExt("MlpPolicy", "Pendulum-v1", **TINY).save(tmp_path / "m")
    zero = {"learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0}
    loaded = PPOExt.load(tmp_path / "m", custom_objects=zero)
    assert loaded.predict(np.zeros(3, dtype=np.float32))[0].shape == (1,)


def test_quickstart_entry_with_reward_only_normalisation(monkeypatch):
    """``python -m sb3_ppo_ext`` with ``normalize: {norm_obs: False}`` (VecNormalize then has no obs_rms)."""
    import sb3_ppo_ext.__main__ as quickstart

    entry = dict(normalize={"norm_obs": False, "norm_reward": True}, n_envs=1, n_timesteps=256, n_steps=128, batch_size=64)
    monkeypatch.setattr(quickstart, "load_hyperparams", lambda env_id: entry)
    assert np.isfinite(quickstart.main(["--env", "Pendulum-v1", "--eval-episodes", "1"]))
