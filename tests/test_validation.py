"""Input validation: numpy scalars, real booleans, drop-in error types and warnings, zero-width action dimensions."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.policies import CnnPolicy, MlpPolicy
from sb3_ppo_ext.validation import (
    InvalidSettingError,
    check_arguments,
    check_bool,
    check_int,
    check_number_or_schedule,
    check_real,
    check_real_pair,
)

TINY = dict(n_steps=32, batch_size=16, n_epochs=1, device="cpu", seed=0)


def test_validators_accept_numpy_scalars_and_reject_bools_and_strings():
    assert check_real("x", np.float32(0.5), low=0.0) == 0.5
    assert check_int("n", np.int64(3)) == 3
    assert check_bool("b", np.bool_(False)) is False
    for bad in (True, "1", None, float("nan"), float("inf")):
        with pytest.raises(InvalidSettingError, match="x="):
            check_real("x", bad)
    assert check_real("x", float("inf"), finite=False) == float("inf")
    with pytest.raises(InvalidSettingError, match=r"n=2\.0 is invalid: expected an int >= 1 \(a float"):
        check_int("n", 2.0)
    with pytest.raises(InvalidSettingError, match="a string is not a boolean"):
        check_bool("b", "false")
    with pytest.raises(InvalidSettingError, match=r"expected .min, max. numbers"):
        check_real_pair("p", (1.0,))
    with pytest.raises(InvalidSettingError, match="schedule whose initial value -1"):
        check_number_or_schedule("lr", lambda _: -1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_grad_norm=np.float32(0.5)),
        dict(n_epochs=np.int64(1), n_steps=np.int64(32), batch_size=np.int32(16)),
        dict(target_kl=np.float32(0.02)),
        dict(kl_coef=np.float32(0.5), kl_target=np.float64(0.01)),
        dict(gamma=np.float32(0.9), gae_lambda=np.float64(0.9), ent_coef=np.float32(0.01), vf_coef=np.float16(0.5)),
        dict(kl_coef_bounds=(np.float32(1e-3), np.float64(10.0)), kl_coef=np.float32(1.0), kl_target=0.01),
    ],
)
def test_numpy_scalars_are_accepted_like_ppo(kwargs):
    settings = {**TINY, **kwargs}
    PPO("MlpPolicy", "Pendulum-v1", **{k: v for k, v in settings.items() if not k.startswith("kl_")})
    model = PPOExt("MlpPolicy", "Pendulum-v1", **settings)
    model.learn(32)
    assert model._n_updates > 0 and model.n_epochs == int(settings["n_epochs"]) and isinstance(model.n_epochs, int)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kl_coef=1.0, kl_target=float("inf")), "kl_target=inf is invalid: expected a finite number > 0"),
        (dict(n_epochs=0), "n_epochs=0 is invalid: expected an int >= 1"),
        (dict(n_epochs=2.0), r"n_epochs=2\.0 is invalid: expected an int"),
        (dict(batch_size=0), "batch_size=0 is invalid"),
        (dict(n_steps=0), "n_steps=0 is invalid"),
        (dict(max_grad_norm=float("nan")), "max_grad_norm=nan"),
        (dict(normalize_advantage="false"), "normalize_advantage='false'"),
        (dict(policy_kwargs=dict(squash_output="false")), "squash_output='false' is invalid"),
        (dict(policy_kwargs=dict(state_dependent_std="false")), "state_dependent_std='false' is invalid"),
    ],
)
def test_invalid_settings_are_construction_time_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOExt("MlpPolicy", "Pendulum-v1", **{**TINY, **kwargs})


@pytest.mark.parametrize(
    "kwargs",
    [dict(clip_range_vf=-0.5), dict(batch_size=1), dict(n_steps=1, batch_size=2)],
)
def test_settings_ppo_asserts_stay_assertion_errors(kwargs):
    """Code written against PPO catches AssertionError for these; PPOExt's errors are also ValueErrors."""
    env = gym.make("Pendulum-v1")  # one env: n_steps=1 gives a one-sample buffer
    settings = {**TINY, **kwargs}
    with pytest.raises(AssertionError):
        PPO("MlpPolicy", env, **settings)
    with pytest.raises(AssertionError) as error:
        PPOExt("MlpPolicy", env, **settings)
    if not isinstance(error.value, ValueError):  # raised by PPO's own assert (n_steps * n_envs == 1)
        assert "n_steps * n_envs" in str(error.value)


def test_truncated_minibatch_warning_is_kept():
    with pytest.warns(UserWarning, match="truncated mini-batch of size 36"):
        PPOExt("MlpPolicy", "Pendulum-v1", n_steps=100, batch_size=64, device="cpu")


@pytest.mark.parametrize("policy, warns", [("MlpPolicy", True), (MlpPolicy, True), ("CnnPolicy", False), (CnnPolicy, False)])
def test_cpu_recommendation_for_mlp_policy_on_gpu(policy, warns):
    """SB3 recognises its MlpPolicy by class name; PPOExt's has another name and must still get the warning."""
    env = gym.make("Pendulum-v1") if "Mlp" in str(policy) else _ImageEnv()
    model = PPOExt(policy, env, device="cpu", _init_setup_model=False)
    model.device = th.device("cuda")  # what device="auto" gives on a GPU machine
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model._maybe_recommend_cpu()
    assert any("primarily intended to run on the CPU" in str(w.message) for w in caught) == warns


class _ImageEnv(gym.Env):
    observation_space = spaces.Box(0, 255, (36, 36, 1), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class FixedActuatorEnv(gym.Env):
    """A 2-d Box action whose second dimension is a fixed actuator (low == high == 0.5)."""

    def __init__(self):
        self.observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Box(np.array([-1.0, 0.5], np.float32), np.array([1.0, 0.5], np.float32))
        self.actions: list[np.ndarray] = []

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.actions.append(np.array(action))
        self.t += 1
        return np.full(3, action[0], np.float32), -float(action[0] ** 2), self.t >= 20, False, {}


@pytest.mark.parametrize("algorithm", [PPO, PPOExt])
def test_zero_width_action_dimension_trains(algorithm):
    env = FixedActuatorEnv()
    model = algorithm("MlpPolicy", env, **{**TINY, "n_epochs": 2})
    model.learn(96)
    values = model.logger.name_to_value
    assert np.isfinite(values["train/loss"]) and np.isfinite(values["train/value_loss"])
    actions = np.array(env.actions)
    assert (actions[:, 1] == np.float32(0.5)).all()
    assert actions[:, 0].min() < actions[:, 0].max()
    if algorithm is PPOExt:
        assert model.policy.squash_output and np.isfinite(model.policy._log_half_range_sum)
        obs = th.zeros((4, 3))
        _, log_prob, _ = model.policy.evaluate_actions(obs, th.randn(4, 2))
        assert th.isfinite(log_prob).all()
        assert model.policy.unscale_action(np.array([[30.0, -30.0]]))[0, 1] == np.float32(0.5)


def test_non_finite_bounds_with_the_squashed_head_are_an_error():
    action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    with pytest.raises(ValueError, match="squash_output=True needs finite action bounds"):
        MlpPolicy(spaces.Box(-1.0, 1.0, (3,)), action_space, lambda _: 1e-3)
    MlpPolicy(spaces.Box(-1.0, 1.0, (3,)), action_space, lambda _: 1e-3, squash_output=False)


def test_check_arguments_takes_any_subset_of_the_table():
    """The three algorithms check their arguments with the one table's ``check_arguments``, on any subset of its rows."""
    arguments = dict(
        clip_range=0.2,
        clip_range_vf=None,
        vf_clip_mode="clipped",
        kl_coef=np.float32(1.0),
        kl_target=0.01,
        kl_adapt_factor=2.0,
        kl_adapt_tolerance=1.5,
        kl_coef_bounds=(1e-4, 1e4),
        max_grad_norm=np.float32(0.5),
        target_kl=None,
    )
    check_arguments(arguments)
    check_arguments({**arguments, "n_epochs": np.int64(3), "gamma": 0.9}, check_schedules=False)
    with pytest.raises(InvalidSettingError, match="n_epochs=0"):
        check_arguments({**arguments, "n_epochs": 0})
    with pytest.raises(TypeError, match="unexpected arguments"):
        check_arguments({**arguments, "n_epoch": 3})


@pytest.mark.parametrize(
    ("algorithm", "policy", "env_id", "owner"),
    [
        ("RecurrentPPOExt", "MlpPolicy", "Pendulum-v1", "MaskablePPOExt and PPOExt"),
        ("PPOExt", "MlpLstmPolicy", "Pendulum-v1", "RecurrentPPOExt"),
        ("PPOExt", "NoSuchPolicy", "Pendulum-v1", None),
    ],
)
def test_an_unknown_policy_alias_lists_the_aliases_and_the_class_it_belongs_to(algorithm, policy, env_id, owner):
    import sb3_ppo_ext

    cls = getattr(sb3_ppo_ext, algorithm)
    with pytest.raises(ValueError, match=rf"Policy '{policy}' unknown for {algorithm}: expected one of \[") as error:
        cls(policy, env_id, **TINY)
    if owner is None:
        assert "is a policy of" not in str(error.value)
    else:
        assert f"'{policy}' is a policy of {owner}" in str(error.value)


@pytest.mark.parametrize("algorithm", ["PPOExt", "RecurrentPPOExt"])
def test_a_policy_kwargs_typo_from_python_names_the_closest_key(algorithm):
    import sb3_ppo_ext
    from sb3_ppo_ext.engine import UnknownPolicyKwargError

    policy = "MlpLstmPolicy" if algorithm == "RecurrentPPOExt" else "MlpPolicy"
    with pytest.raises(
        TypeError, match=r"unknown key 'squash_outputs' in policy_kwargs of .*did you mean 'squash_output'"
    ) as error:
        getattr(sb3_ppo_ext, algorithm)(policy, "Pendulum-v1", policy_kwargs=dict(squash_outputs=False), **TINY)
    assert isinstance(error.value, UnknownPolicyKwargError) and isinstance(error.value, ValueError)


def test_no_trust_region_warns_and_a_trust_region_does_not():
    from sb3_ppo_ext.engine import NoTrustRegionWarning

    with pytest.warns(NoTrustRegionWarning, match=r"clip_range=None with kl_coef=0 leaves no trust region"):
        PPOExt("MlpPolicy", "Pendulum-v1", clip_range=None, **TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoTrustRegionWarning)
        PPOExt("MlpPolicy", "Pendulum-v1", clip_range=None, kl_coef=1.0, **TINY)
        PPOExt("MlpPolicy", "Pendulum-v1", **TINY)
