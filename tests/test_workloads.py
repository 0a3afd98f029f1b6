"""
The speed workloads (``scripts/throughput.py --workload NAME``: rl-zoo3's settings for each env, the batched settings
and the shipped Hopper-v5 EnvPool entry's), bit for bit:
with the extensions off, each Ext class trains on them exactly as the class it replaces (rollouts, weights, Adam's
state, ``VecNormalize`` statistics and logged losses). The rollouts are shortened to about 512 steps where
rl-zoo3's are longer; every other setting is the workload's.
"""

import importlib.util

import numpy as np
import pytest
import throughput  # scripts/throughput.py (scripts/ is on the tests' sys.path)
import torch as th
from stable_baselines3.common.vec_env import VecNormalize

# The bit-for-bit variant of each family (the first variant is the upstream class).
BIT_FOR_BIT = {"ppo": "PPOExt, squash off", "maskable": "MaskablePPOExt", "recurrent": "RecurrentPPOExt, squash off"}


def _train(family: str, name: str, env_id: str, n_envs: int, normalize: bool, hyperparams: dict):
    variants, policy, _ = throughput.FAMILIES[family]
    algo, kwargs = variants[name]
    policy_kwargs = {**hyperparams.get("policy_kwargs", {}), **kwargs.get("policy_kwargs", {})}
    merged = {**hyperparams, **kwargs, **({"policy_kwargs": policy_kwargs} if policy_kwargs else {})}
    model = algo(policy, throughput.make_env(env_id, n_envs, 3, normalize), seed=3, **merged)
    rollouts = 4 if hyperparams["n_steps"] * n_envs < 64 else 2
    return model.learn(rollouts * hyperparams["n_steps"] * n_envs)


@pytest.mark.parametrize("workload", sorted(throughput.WORKLOADS))
def test_each_speed_workload_trains_bit_for_bit_like_upstream(workload):
    family, env_id, n_envs, normalize, hyperparams = throughput.WORKLOADS[workload]
    hyperparams = dict(hyperparams)
    if hyperparams.get("n_steps", 2048) * n_envs > 1024:
        hyperparams["n_steps"] = 512 // n_envs
    upstream_name = next(iter(throughput.FAMILIES[family][0]))
    upstream, ext = (
        _train(family, name, env_id, n_envs, normalize, hyperparams) for name in (upstream_name, BIT_FOR_BIT[family])
    )
    assert ext.num_timesteps == upstream.num_timesteps and ext._n_updates == upstream._n_updates > 0
    for field in ("observations", "actions", "rewards", "returns", "values", "log_probs"):
        stored, own = getattr(upstream.rollout_buffer, field), getattr(ext.rollout_buffer, field)
        assert np.array_equal(stored, own), field
    for (key, value), (own_key, own) in zip(
        upstream.policy.state_dict().items(), ext.policy.state_dict().items(), strict=True
    ):
        assert key == own_key and th.equal(value, own), key
    moments = [
        [state[key] for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq", "step")]
        for optimizer in (upstream.policy.optimizer, ext.policy.optimizer)
    ]
    assert len(moments[0]) == len(moments[1]) > 0
    assert all(th.equal(a, b) for a, b in zip(*moments, strict=True))
    if normalize:
        for model in (upstream, ext):
            assert isinstance(model.get_env(), VecNormalize)
        assert np.array_equal(upstream.get_env().obs_rms.mean, ext.get_env().obs_rms.mean)
        assert np.array_equal(upstream.get_env().ret_rms.var, ext.get_env().ret_rms.var)
    # means over the update in both (train/loss is upstream's last minibatch's, PPOExt's the update's mean)
    for key in ("train/value_loss", "train/policy_gradient_loss", "train/entropy_loss"):
        assert upstream.logger.name_to_value[key] == ext.logger.name_to_value[key], key
    # the lean optimizer step was taken: Adam's state in flat buffers (the last update's layout)
    exp_avgs = [state["exp_avg"] for state in ext.policy.optimizer.state.values()]
    assert len({t.untyped_storage().data_ptr() for t in exp_avgs}) == 1


def test_hopper_entry_workload_is_the_shipped_envpool_entry():
    import yaml

    from sb3_ppo_ext.hyperparams import __path__ as hyperparams_path

    with open(f"{hyperparams_path[0]}/ppo_ext_envpool.yml") as file:
        entry = yaml.safe_load(file)["Hopper-v5"]
    _, env_id, n_envs, normalize, hyperparams = throughput.WORKLOADS["hopper-entry"]
    assert (env_id, n_envs, normalize) == ("Hopper-v5", entry["n_envs"], entry["normalize"])
    for key in ("n_steps", "batch_size", "n_epochs", "target_kl"):
        assert hyperparams[key] == entry[key], key
    # a linear schedule ("lin_X") is timed at its initial value X, where a long run's first steps are
    learning_rate = entry["learning_rate"]
    assert hyperparams["learning_rate"] == float(str(learning_rate).removeprefix("lin_"))
    # the entry's Gaussian head (squash_output false) is what the workload's stock PPO and bit-for-bit variants run
    entry_kwargs = dict(entry["policy_kwargs"])
    assert entry_kwargs.pop("squash_output") is False and entry_kwargs.pop("activation_fn") == "tanh"
    policy_kwargs = dict(hyperparams["policy_kwargs"])
    assert policy_kwargs.pop("activation_fn") is th.nn.Tanh and policy_kwargs == entry_kwargs


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="EnvPool is not installed (the envpool extra)")
def test_env_backend_envpool_times_the_task_on_envpool():
    from sb3_ppo_ext.envpool import EnvPoolVecEnv

    env = throughput.make_env("Hopper-v5", 2, 0, normalize=True, backend="envpool")
    assert isinstance(env, VecNormalize) and isinstance(env.venv, EnvPoolVecEnv) and env.num_envs == 2
    variants, policy, _ = throughput.FAMILIES["ppo"]
    algo, kwargs = variants["PPOExt, squash off"]
    cpu_fps, wall_fps = throughput.measure(
        algo, kwargs, "Hopper-v5", 128, 2, 0, dict(n_steps=32, batch_size=64, n_epochs=1), policy, True, backend="envpool"
    )
    assert cpu_fps > 0 and wall_fps > 0
