"""Per-network learning rates (policy_kwargs learning_rates): groups, schedules, errors, save/load, callbacks, user groups."""

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import TINY
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.callbacks import KLAdaptiveLR, ParameterScheduler
from sb3_ppo_ext.validation import InvalidSettingError


def quiet(model):
    model.set_logger(configure(None, []))
    return model


def ids(parameters):
    return {id(p) for p in parameters}


def groups_of(model):
    return {group["network"]: group for group in model.policy.optimizer.param_groups}


class AfterEachUpdate(BaseCallback):
    """Records, after each update (at the next rollout's start), the progress, the groups' rates and what was logged."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _on_rollout_start(self) -> None:
        if self.model._n_updates:
            rates = {group["network"]: group["lr"] for group in self.model.policy.optimizer.param_groups}
            logged = {key: self.logger.name_to_value.get(f"train/{key}") for key in ("learning_rate_pi", "learning_rate_vf")}
            self.seen.append((self.model._current_progress_remaining, rates, logged))

    def _on_step(self) -> bool:
        return True


def test_each_group_follows_its_own_schedule_at_every_update():
    rates = {"pi": "lin_1e-3", "vf": lambda progress: 2e-3 * progress**2}
    model = quiet(PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[16], learning_rates=rates), **TINY))
    assert {n: g["lr"] for n, g in groups_of(model).items()} == {"pi": 1e-3, "vf": 2e-3}
    callback = AfterEachUpdate()
    model.learn(96, callback=callback)  # updates at progress 2/3, 1/3 and 0 remaining
    assert [round(progress, 6) for progress, _, _ in callback.seen] == [round(2 / 3, 6), round(1 / 3, 6)]
    for progress, rates_set, logged in callback.seen:
        assert rates_set["pi"] == pytest.approx(1e-3 * progress, rel=1e-12)
        assert rates_set["vf"] == pytest.approx(2e-3 * progress**2, rel=1e-12)
        assert logged == {"learning_rate_pi": rates_set["pi"], "learning_rate_vf": rates_set["vf"]}
    assert model.logger.name_to_value["train/learning_rate"] == model.logger.name_to_value["train/learning_rate_pi"]


def test_the_groups_are_the_actor_and_the_critic_and_cover_every_parameter():
    model = PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(learning_rates={"pi": 1e-3, "vf": 1e-3}), **TINY)
    policy, groups = model.policy, groups_of(model)
    actor = [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters(), policy.log_std]
    critic = [*policy.mlp_extractor.value_net.parameters(), *policy.value_net.parameters()]
    assert ids(groups["pi"]["params"]) == ids(actor) and ids(groups["vf"]["params"]) == ids(critic)
    lstm = RecurrentPPOExt(
        "MlpLstmPolicy",
        "Pendulum-v1",
        policy_kwargs=dict(net_arch=[8], lstm_hidden_size=8, action_dist="beta", learning_rates={"pi": 1e-3, "vf": 2e-3}),
        **TINY,
    ).policy
    lstm_groups = {g["network"]: ids(g["params"]) for g in lstm.optimizer.param_groups}
    assert ids(lstm.lstm_actor.parameters()) <= lstm_groups["pi"] and ids(lstm.action_net.parameters()) <= lstm_groups["pi"]
    assert ids(lstm.lstm_critic.parameters()) <= lstm_groups["vf"]
    assert lstm_groups["pi"] | lstm_groups["vf"] == ids(lstm.parameters()) and not lstm_groups["pi"] & lstm_groups["vf"]


@pytest.mark.parametrize("algorithm", ["ppo_ext", "maskable"])
def test_equal_rates_train_bit_for_bit_like_learning_rate(algorithm):
    """Adam is per parameter: two groups at the algorithm's rate are the one group, if every parameter is in one."""

    def trained(**policy_kwargs):
        if algorithm == "ppo_ext":
            model = PPOExt(
                "MlpPolicy", "Pendulum-v1", learning_rate=3e-4, policy_kwargs=dict(net_arch=[16], **policy_kwargs), **TINY
            )
        else:
            env = InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1)
            model = MaskablePPOExt(
                "MlpPolicy", env, learning_rate=3e-4, policy_kwargs=dict(net_arch=[16], **policy_kwargs), **TINY
            )
        quiet(model).learn(64)
        return [p.detach().clone() for p in model.policy.parameters()]

    for ours, reference in zip(trained(learning_rates={"pi": 3e-4, "vf": 3e-4}), trained(), strict=True):
        assert th.equal(ours, reference)


class LinearExtractor(BaseFeaturesExtractor):
    """A features extractor with parameters: shared by actor and critic, it is a trunk."""

    def __init__(self, observation_space: spaces.Box):
        super().__init__(observation_space, features_dim=8)
        self.linear = nn.Linear(int(np.prod(observation_space.shape)), 8)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return th.tanh(self.linear(observations))


def test_a_shared_trunk_is_an_error_that_says_why_and_what_to_set():
    kwargs = dict(features_extractor_class=LinearExtractor, learning_rates={"pi": 1e-3, "vf": 1e-3})
    with pytest.raises(
        InvalidSettingError, match=r"shared by both \(share_features_extractor=True\).*share_features_extractor=False"
    ):
        PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=kwargs, **TINY)
    model = PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(kwargs, share_features_extractor=False), **TINY)
    groups = groups_of(model)
    assert ids(model.policy.vf_features_extractor.parameters()) <= ids(groups["vf"]["params"])
    assert ids(model.policy.pi_features_extractor.parameters()) <= ids(groups["pi"]["params"])


@pytest.mark.parametrize(
    "rates, match",
    [
        ({"pi": 1e-3}, r"policy_kwargs\.learning_rates=\{'pi': 0\.001\} is invalid: expected a mapping with exactly the keys"),
        ({"pi": 1e-3, "vf": -1.0}, r"policy_kwargs\.learning_rates\.vf=-1\.0 is invalid"),
        ({"pi": "lin_x", "vf": 1e-3}, r"policy_kwargs\.learning_rates\.pi='lin_x' is invalid"),
        (3e-4, r"policy_kwargs\.learning_rates=0\.0003 is invalid"),
    ],
)
def test_bad_learning_rates_are_errors_naming_the_setting(rates, match):
    with pytest.raises(InvalidSettingError, match=match):
        PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(learning_rates=rates), **TINY)


def test_save_load_keeps_both_rates_and_the_optimizer_state(tmp_path):
    rates = {"pi": "lin_1e-3", "vf": 4e-3}
    model = quiet(PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[16], learning_rates=rates), **TINY))
    model.learn(64)
    model.save(tmp_path / "m")
    loaded = PPOExt.load(tmp_path / "m", env=model.get_env())
    assert loaded.policy.learning_rates == rates
    saved, restored = model.policy.optimizer.state_dict(), loaded.policy.optimizer.state_dict()
    assert [(g["network"], g["lr"]) for g in saved["param_groups"]] == [
        (g["network"], g["lr"]) for g in restored["param_groups"]
    ]
    for key, state in saved["state"].items():
        for name, value in state.items():
            assert th.equal(th.as_tensor(value), th.as_tensor(restored["state"][key][name])), (key, name)
    quiet(loaded).learn(32, reset_num_timesteps=False)
    assert loaded.logger.name_to_value["train/learning_rate_vf"] == 4e-3


def test_kl_adaptive_lr_adapts_both_groups_proportionally_and_save_load_keeps_them(tmp_path):
    policy_kwargs = dict(net_arch=[16], learning_rates={"pi": 1e-4, "vf": 5e-4})
    model = quiet(PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=policy_kwargs, **TINY))
    callback = KLAdaptiveLR(target_kl=1.0, lr_factor=2.0)  # every update's KL is far below 1: the rate doubles
    model.learn(96, callback=callback)
    groups = groups_of(model)
    assert callback.learning_rate == pytest.approx(8e-4)
    assert groups["pi"]["lr"] == pytest.approx(8e-4) and groups["vf"]["lr"] == pytest.approx(4e-3)
    assert model.logger.name_to_value["train/learning_rate_pi"] == pytest.approx(4e-4)  # applied by the last update
    assert policy_kwargs["learning_rates"] == {"pi": 1e-4, "vf": 5e-4}  # the caller's dict is untouched
    model.save(tmp_path / "m")
    loaded = PPOExt.load(tmp_path / "m", env=model.get_env())
    assert loaded.policy.learning_rates == pytest.approx({"pi": 8e-4, "vf": 4e-3})
    quiet(loaded).learn(32, reset_num_timesteps=False)
    assert loaded.logger.name_to_value["train/learning_rate_vf"] == pytest.approx(4e-3)


@pytest.mark.parametrize("route", ["continued", "reset_num_timesteps", "loaded"])
def test_kl_adaptive_lr_after_a_finished_learn_keeps_the_ratio_of_the_schedules(tmp_path, route):
    """A finished learn leaves progress 0, where 'lin_<x>' rates are 0: the ratio is the schedules' at progress 1."""
    model = quiet(
        PPOExt(
            "MlpPolicy",
            "Pendulum-v1",
            policy_kwargs=dict(net_arch=[16], learning_rates={"pi": "lin_1e-3", "vf": "lin_4e-3"}),
            **TINY,
        )
    )
    model.learn(64)
    if route == "loaded":
        model.save(tmp_path / "m")
        model = quiet(PPOExt.load(tmp_path / "m", env=model.get_env()))
    assert model._current_progress_remaining == 0.0
    callback = KLAdaptiveLR(target_kl=1.0, lr_factor=2.0, min_lr=1e-4)  # starts at min_lr (the rate at progress 0 is 0)
    model.learn(64, callback=callback, reset_num_timesteps=route == "reset_num_timesteps")
    groups = groups_of(model)
    assert callback.learning_rate == pytest.approx(4e-4) and groups["pi"]["lr"] == pytest.approx(4e-4)
    assert groups["vf"]["lr"] == pytest.approx(4 * groups["pi"]["lr"])
    assert model.logger.name_to_value["train/learning_rate_vf"] == pytest.approx(8e-4)  # applied by the last update


def test_parameter_scheduler_refuses_learning_rate_with_per_network_rates():
    """The optimizer follows learning_rates: a scheduled learning_rate would be logged but never used."""
    rates = {"pi": 1e-3, "vf": 2e-3}
    model = quiet(PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[16], learning_rates=rates), **TINY))
    scheduler = ParameterScheduler({"learning_rate": {"kind": "constant", "value": 5e-2}})
    with pytest.raises(
        InvalidSettingError,
        match=r"schedules\['learning_rate'\] is invalid with policy_kwargs\.learning_rates=.*give each its schedule",
    ):
        model.learn(64, callback=scheduler)
    assert model.num_timesteps == 0 and {n: g["lr"] for n, g in groups_of(model).items()} == rates


def test_a_group_added_by_the_user_trains_at_lr_schedule_as_under_stock_ppo():
    """Stock PPO sets every group from lr_schedule; with learning_rates, a group without "network" keeps that rule."""

    def trained(algorithm, **policy_kwargs):
        model = quiet(
            algorithm(
                "MlpPolicy", "Pendulum-v1", learning_rate=5e-4, policy_kwargs=dict(net_arch=[16], **policy_kwargs), **TINY
            )
        )
        optimizer, log_std = model.policy.optimizer, model.policy.log_std
        for group in optimizer.param_groups:  # log_std to a group of its own, at a rate of the user's
            group["params"] = [p for p in group["params"] if p is not log_std]
        optimizer.add_param_group({"params": [log_std], "lr": 1e-2})
        before = log_std.detach().clone()
        model.learn(64)
        assert not th.equal(log_std, before)  # it trains
        return model.policy.optimizer.param_groups

    stock = trained(PPO)
    ours = trained(PPOExt, squash_output=False, learning_rates={"pi": 1e-3, "vf": 2e-3})
    assert stock[-1]["lr"] == ours[-1]["lr"] == 5e-4
    assert [(g.get("network"), g["lr"]) for g in ours[:-1]] == [("pi", 1e-3), ("vf", 2e-3)]
