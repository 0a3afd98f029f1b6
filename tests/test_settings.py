"""The settings owner: whole entries checked before anything runs, on the Python and the rl-zoo3 route."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from sb3_ppo_ext import MaskablePPOExt, RecurrentPPOExt, settings, validation
from sb3_ppo_ext.hyperparams import load_hyperparams
from sb3_ppo_ext.settings import check_entry, entry_problems
from sb3_ppo_ext.validation import InvalidSettingError, policy_parameters

ENTRY_ERRORS = [
    ({"learning_rate": "abc"}, r"learning_rate='abc' is invalid: expected a number or a 'lin_<x>' schedule"),
    ({"learning_rate": "3e-4"}, r"PyYAML reads 3e-4 as a string"),
    ({"learning_rate": "lin_-1"}, r"learning_rate='lin_-1' is invalid"),
    ({"n_envs": 0}, r"n_envs=0 is invalid: expected an int >= 1"),
    ({"n_epochs": 2.0}, r"n_epochs=2.0 is invalid: expected an int >= 1 \(a float: write it without a decimal point\)"),
    ({"n_epochs": 0}, r"n_epochs=0 is invalid: expected an int >= 1"),
    ({"frame_stack": True}, r"frame_stack=True is invalid: expected an int >= 1"),
    ({"n_timesteps": "1e6"}, r"n_timesteps='1e6' is invalid: expected a whole number"),
    ({"batch_size": "64"}, r"batch_size='64' is invalid: expected an int >= 1 \(a string: PyYAML reads"),
    ({"gamma": 1.5}, r"gamma=1.5 is invalid"),
    ({"kl_coef": 1.0, "kl_target": float("inf")}, r"kl_target=inf is invalid"),
    ({"kl_target": 0.01}, r"kl_target=0.01 needs kl_coef > 0"),
    ({"n_steps": 1, "n_envs": 1}, r"n_steps \* n_envs = 1 is invalid with normalize_advantage"),
    ({"normalize_advantage": "false"}, r"a string is not a boolean"),
    ({"policy_kwargs": {"net_archh": [64]}}, r"unknown key 'net_archh' in policy_kwargs of \w+ \(did you mean 'net_arch'\?\)"),
    ({"policy_kwargs": {"squash_output": "false"}}, r"policy_kwargs.squash_output='false' is invalid"),
    ({"policy_kwargs": {"state_dependent_std": "false"}}, r"policy_kwargs.state_dependent_std='false' is invalid"),
    ({"policy_kwargs": {"activation_fn": "swish"}}, r"activation_fn='swish' is not one of"),
    ({"policy_kwargs": {"net_arch": [64, 0]}}, r"policy_kwargs.net_arch: \[64, 0\]' is invalid"),
    ({"policy_kwargs": {"entropy_estimator": "exact"}}, r"policy_kwargs.entropy_estimator='exact' is invalid"),
    ({"policy_kwargs": {"log_std_init": "big"}}, r"policy_kwargs.log_std_init='big' is invalid: expected a finite number"),
    ({"policy_kwargs": {"squash_output": False, "entropy_estimator": "mc"}}, r"entropy_estimator='mc' only applies to the"),
    ({"policy_kwargs": {"log_std_bounds": (-3, 1)}}, r"log_std_bounds=\(-3, 1\) only applies with state_dependent_std"),
    ({"policy_kwargs": {"state_dependent_std": True, "log_std_bounds": (1, 2)}}, r"log_std_init=0.0 must lie strictly inside"),
    ({"policy_kwargs": "dict(net_arch=[64], activaton_fn=nn.ReLU)"}, r"unknown key 'activaton_fn' in policy_kwargs"),
    ({"policy_kwargs": "dict(net_arch=[64"}, r"'policy_kwargs: .*' is not a Python expression"),
    ({"policy_kwargs": {"use_sde": True}}, r"unknown key 'use_sde' in policy_kwargs"),
    ({"normalize": "dict(norm_obs=False, norm_rewrd=True)"}, r"unknown key 'norm_rewrd' in normalize"),
    ({"normalize": "true"}, r"normalize='true' is invalid"),
    ({"seed": 1}, r"'seed' is set by rl-zoo3 itself"),
    ({"kl_targt": 0.1}, r"unknown key 'kl_targt' \(did you mean 'kl_target'\?\)"),
]


# RecurrentPPOExt's LSTM policy_kwargs, and log_std_init, judged by their rows of validation.POLICY_KWARG_RULES.
LSTM_POLICY_KWARG_ERRORS = [
    ({"lstm_hidden_size": 0}, r"policy_kwargs\.lstm_hidden_size=0 is invalid: expected an int >= 1"),
    ({"n_lstm_layers": 0}, r"policy_kwargs\.n_lstm_layers=0 is invalid: expected an int >= 1"),
    ({"shared_lstm": True}, r"policy_kwargs\.shared_lstm=True is invalid with policy_kwargs\.enable_critic_lstm=True"),
    (
        {"shared_lstm": True, "enable_critic_lstm": False, "share_features_extractor": False},
        r"policy_kwargs\.shared_lstm=True is invalid with policy_kwargs\.share_features_extractor=False",
    ),
    ({"lstm_kwargs": {"dropout": 1.5}}, r"policy_kwargs\.lstm_kwargs\.dropout=1\.5 is invalid: .*>= 0\.0 and <= 1\.0"),
    ({"lstm_kwargs": {"dropout": -0.1}}, r"policy_kwargs\.lstm_kwargs\.dropout=-0\.1 is invalid"),
    ({"log_std_init": float("nan")}, r"policy_kwargs\.log_std_init=nan is invalid: expected a finite number"),
    ({"log_std_init": float("inf")}, r"policy_kwargs\.log_std_init=inf is invalid: expected a finite number"),
]


@pytest.mark.parametrize("policy_kwargs, message", LSTM_POLICY_KWARG_ERRORS)
def test_lstm_policy_kwargs_are_checked_by_the_settings_and_at_construction(policy_kwargs, message):
    from sb3_ppo_ext import RecurrentPPOExt

    with pytest.raises(InvalidSettingError, match=rf"^x\.yml \(entry 'E'\): {message}"):
        check_entry({"policy": "MlpLstmPolicy", "policy_kwargs": policy_kwargs}, "x.yml (entry 'E')", "ppo_lstm_ext")
    with pytest.raises(InvalidSettingError, match=rf"^{message}"):
        RecurrentPPOExt("MlpLstmPolicy", "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=policy_kwargs, device="cpu")
    valid = {"shared_lstm": True, "enable_critic_lstm": False, "lstm_kwargs": {"dropout": 0.0}, "lstm_hidden_size": 4}
    assert entry_problems({"policy": "MlpLstmPolicy", "policy_kwargs": valid}, "ppo_lstm_ext") == []


@pytest.mark.parametrize("entry, message", ENTRY_ERRORS)
def test_bad_entry_names_source_and_key(entry, message):
    with pytest.raises(InvalidSettingError, match=rf"^x\.yml \(entry 'E'\): .*{message}"):
        check_entry({"policy": "MlpPolicy", **entry}, "x.yml (entry 'E')")


def test_errors_are_value_and_assertion_errors():
    assert issubclass(InvalidSettingError, ValueError) and issubclass(InvalidSettingError, AssertionError)


def test_entry_that_is_not_a_mapping(tmp_path: Path):
    path = tmp_path / "bad.yml"
    path.write_text("Pendulum-v1: 5\n")
    message = rf"{re.escape(str(path))} \(entry 'Pendulum-v1'\): expected a mapping of settings, got int 5"
    with pytest.raises(InvalidSettingError, match=message):
        load_hyperparams("Pendulum-v1", path)


def test_valid_entries_pass():
    good = {
        "policy": "MlpPolicy",
        "n_envs": np.int64(4),
        "n_timesteps": 1.0e5,
        "n_epochs": np.int32(3),
        "learning_rate": "lin_3e-4",
        "clip_range": None,
        "kl_coef": np.float32(1.0),
        "kl_target": 0.01,
        "max_grad_norm": 5,
        "normalize": "dict(norm_obs=True, norm_reward=False)",
        "policy_kwargs": {"activation_fn": "relu", "squash_output": np.bool_(True), "net_arch": {"pi": [64], "vf": [64]}},
    }
    assert check_entry(good, "x") == good
    assert check_entry({"policy_kwargs": "dict(net_arch=[64, 64], activation_fn=nn.ReLU)"}, "x")
    for env_id, entry in settings.read_entries(settings.PPO_EXT_YML).items():
        assert entry_problems(entry) == [], env_id


def test_partial_entry_skips_the_rules_across_parameters():
    """``-params`` is checked key by key; kl_target may need a kl_coef that the file's entry gives."""
    assert entry_problems({"kl_target": 0.01}, whole=False) == []
    assert entry_problems({"kl_target": 0.01}) != []


def test_policy_parameters_follow_the_constructor_chain():
    from stable_baselines3.common.policies import ActorCriticPolicy

    from sb3_ppo_ext import PPOExt

    names = policy_parameters(PPOExt.policy_aliases["CnnPolicy"])
    assert {"features_extractor_class", "squash_output", "entropy_estimator", "net_arch", "ortho_init"} <= set(names)
    assert not {"observation_space", "action_space", "lr_schedule", "use_sde"} & set(names)
    assert set(policy_parameters(ActorCriticPolicy)) < set(names)


@pytest.mark.parametrize(
    "algorithm, policy, good_policy_kwargs",
    [
        (
            RecurrentPPOExt,
            "MlpLstmPolicy",
            {"lstm_hidden_size": 32, "n_lstm_layers": 1, "shared_lstm": False, "enable_critic_lstm": True, "lstm_kwargs": {}},
        ),
        (MaskablePPOExt, "MlpPolicy", {"net_arch": [64], "ortho_init": False}),
    ],
)
def test_settings_are_parameterised_by_the_algorithm_class(
    monkeypatch: pytest.MonkeyPatch, algorithm, policy, good_policy_kwargs
):
    """An algorithm added to the table gets its own names, its policy's policy_kwargs and the shared argument check."""
    spec = settings.AlgorithmSpec("algo_under_test", algorithm)
    monkeypatch.setitem(settings.ALGORITHMS, spec.name, spec)
    entry = {"policy": policy, "n_steps": 128, "kl_coef": 1.0, "kl_target": 0.01, "policy_kwargs": good_policy_kwargs}
    assert entry_problems(entry, spec.name) == []
    policy_name = spec.algorithm.policy_aliases[policy].__name__
    bad = {"policy": policy, "n_epochs": 0, "policy_kwargs": {"net_arc": [64], "ortho_init": "no"}}
    assert entry_problems(bad, spec.name) == [
        "n_epochs=0 is invalid: expected an int >= 1",
        f"unknown key 'net_arc' in policy_kwargs of {policy_name} (did you mean 'net_arch'?)",
        "policy_kwargs.ortho_init='no' is invalid: expected True or False, got str (a string is not a boolean: "
        "write true/false without quotes)",
    ]
    assert entry_problems({"policy": policy, "kl_target": 0.01}, spec.name) == [
        "kl_target=0.01 needs kl_coef > 0 (the initial beta); with kl_coef=0 the penalty is off"
    ]
    assert "unknown key 'lstm_hidden_siz'" in " ".join(
        entry_problems({"policy": policy, "policy_kwargs": {"lstm_hidden_siz": 8}}, spec.name)
    )


# --- the rl-zoo3 route: a subprocess of the development environment (the startup hook is installed) ----------


# The Beta head's and the per-network learning rates' policy_kwargs, judged by the policies' own checks
# (validation.POLICY_KWARG_RULES and check_policy_kwargs_together): the settings check and construction agree.
HEAD_AND_RATE_ERRORS = [
    ({"action_dist": "gamma"}, r"policy_kwargs\.action_dist='gamma' is invalid: expected one of \('gaussian', 'beta'\)"),
    (
        {"action_dist": "beta", "squash_output": False},
        r"policy_kwargs\.squash_output=False is invalid with policy_kwargs\.action_dist='beta'",
    ),
    (
        {"action_dist": "beta", "entropy_estimator": "mc"},
        r"policy_kwargs\.entropy_estimator='mc' is invalid with policy_kwargs\.action_dist",
    ),
    (
        {"action_dist": "beta", "state_dependent_std": True},
        r"policy_kwargs\.state_dependent_std=True is invalid with policy_kwargs\.action",
    ),
    (
        {"learning_rates": {"pi": 1e-3, "critic": 1e-3}},
        r"policy_kwargs\.learning_rates=.* expected a mapping with exactly the keys 'pi'",
    ),
    ({"learning_rates": {"pi": "lin_0", "vf": 1e-3}}, r"policy_kwargs\.learning_rates\.pi='lin_0' is invalid"),
    ({"learning_rates": {"pi": 1e-3, "vf": "3e-4"}}, r"policy_kwargs\.learning_rates\.vf='3e-4' is invalid"),
]


@pytest.mark.parametrize("policy_kwargs, message", HEAD_AND_RATE_ERRORS)
@pytest.mark.parametrize("algo", ["ppo_ext", "ppo_lstm_ext"])
def test_head_and_learning_rates_are_checked_by_the_settings_and_at_construction(policy_kwargs, message, algo):
    policy = "MlpLstmPolicy" if algo == "ppo_lstm_ext" else "MlpPolicy"
    with pytest.raises(InvalidSettingError, match=rf"^x\.yml \(entry 'E'\): {message}"):
        check_entry({"policy": policy, "policy_kwargs": policy_kwargs}, "x.yml (entry 'E')", algo)
    algorithm = settings.algorithm_spec(algo).algorithm
    with pytest.raises(InvalidSettingError, match=rf"^{message}"):
        algorithm(policy, "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=policy_kwargs, device="cpu")


def test_head_and_learning_rates_from_a_yml_entry_build_and_train():
    entry = {"policy": "MlpPolicy", "policy_kwargs": "dict(action_dist='beta', learning_rates={'pi': 'lin_3e-4', 'vf': 1e-3})"}
    assert check_entry(entry, "x") == entry
    kwargs = validation.to_algorithm_kwargs(
        {"policy_kwargs": dict(action_dist="beta", learning_rates={"pi": "lin_3e-4", "vf": 1e-3})}
    )
    from sb3_ppo_ext import PPOExt

    model = PPOExt("MlpPolicy", "Pendulum-v1", n_steps=16, batch_size=16, n_epochs=1, device="cpu", **kwargs)
    model.learn(16)
    assert model.policy.learning_rates == {"pi": "lin_3e-4", "vf": 1e-3}
    assert model.logger.name_to_value["train/learning_rate_vf"] == 1e-3
