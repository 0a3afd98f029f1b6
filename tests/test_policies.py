"""The package's policies: what they add to upstream's on the hot path (foreach Adam, one finite check in forward)."""

import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.policies import with_foreach_adam


def test_with_foreach_adam_keeps_sb3s_eps_and_the_users_choices():
    assert with_foreach_adam({}) == {"optimizer_kwargs": {"eps": 1e-5, "foreach": True}}
    # SB3 drops eps=1e-5 once optimizer_kwargs are given: so does this (bit for bit with upstream).
    assert with_foreach_adam({"optimizer_kwargs": {"betas": (0.8, 0.9)}}) == {
        "optimizer_kwargs": {"betas": (0.8, 0.9), "foreach": True}
    }
    assert with_foreach_adam({"optimizer_kwargs": {"foreach": False}}) == {"optimizer_kwargs": {"foreach": False}}
    assert with_foreach_adam({"optimizer_class": th.optim.SGD}) == {"optimizer_class": th.optim.SGD}


@pytest.mark.parametrize(
    "cls, policy, env", [(PPOExt, "MlpPolicy", "Pendulum-v1"), (RecurrentPPOExt, "MlpLstmPolicy", "Pendulum-v1")]
)
def test_policies_build_foreach_adam_with_sb3s_eps(cls, policy, env):
    model = cls(policy, env, n_steps=16, batch_size=16)
    (group,) = model.policy.optimizer.param_groups
    assert group["foreach"] is True and group["eps"] == 1e-5
    stock = PPO("MlpPolicy", env).policy.optimizer.param_groups[0]
    assert stock["eps"] == group["eps"] and stock["foreach"] is None  # upstream: the per-tensor loop on CPU


def test_maskable_policy_builds_foreach_adam():
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete

    model = MaskablePPOExt("MlpPolicy", InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1), n_steps=16, batch_size=16)
    assert model.policy.optimizer.param_groups[0]["foreach"] is True


def test_forward_raises_for_a_non_finite_log_prob_and_leaves_torchs_checks_on():
    model = PPOExt("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    obs = th.as_tensor(np.array([[1.0, 0.0, 0.5], [np.nan, 0.0, 0.0]], dtype=np.float32))
    with pytest.raises(ValueError, match="non-finite log-probability of the sampled actions"), th.no_grad():
        model.policy(obs)
    assert th.distributions.Distribution._validate_args is True  # restored after the raise
    actions, values, log_prob = model.policy(obs[:1])
    assert th.isfinite(log_prob).all() and actions.shape == (1, 1) and values.shape == (1, 1)
