"""Drop-in compatibility: what SB3's own test suite asks of PPO, asked of PPOExt.

Modelled on SB3's tests (test_run, test_spaces, test_save_load, test_predict, test_sde,
test_vec_normalize, test_callbacks); budgets are tiny, the behaviours are the same.
"""

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import TINY as SMALL
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback, EvalCallback, StopTrainingOnMaxEpisodes
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import (
    FakeImageEnv,
    IdentityEnv,
    IdentityEnvBox,
    IdentityEnvMultiBinary,
    IdentityEnvMultiDiscrete,
    SimpleMultiObsEnv,
)
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

from sb3_ppo_ext import PPOExt


@pytest.mark.filterwarnings("ignore:You have specified a mini-batch size")
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(normalize_advantage=False),
        dict(batch_size=20),  # truncated last minibatch
        dict(clip_range_vf=0.2),
        dict(target_kl=0.02),
        dict(learning_rate=lambda progress: 1e-3 * progress, clip_range=lambda progress: 0.2 * progress),
        dict(policy_kwargs=dict(net_arch=dict(pi=[8], vf=[16]), share_features_extractor=False)),
        dict(policy_kwargs=dict(ortho_init=False, activation_fn=th.nn.ReLU)),
        dict(ent_coef=0.01, vf_coef=0.3, max_grad_norm=1.0),
    ],
)
def test_run(env_id, kwargs):
    model = PPOExt("MlpPolicy", env_id, **{**SMALL, **kwargs})
    before = th.nn.utils.parameters_to_vector(model.policy.parameters()).detach().clone()
    model.learn(64)
    after = th.nn.utils.parameters_to_vector(model.policy.parameters())
    assert model.num_timesteps == 64 and model._n_updates > 0
    assert th.isfinite(after).all() and not th.equal(after, before)


@pytest.mark.parametrize(
    "make_env, squash",
    [
        (lambda: IdentityEnv(4), False),
        (lambda: IdentityEnvMultiDiscrete(3), False),
        (lambda: IdentityEnvMultiBinary(3), False),
        (lambda: IdentityEnvBox(), True),
    ],
)
def test_action_spaces_predict_within_space(make_env, squash):
    env = make_env()
    model = PPOExt("MlpPolicy", env, **SMALL).learn(64)
    assert model.policy.squash_output is squash
    obs, _ = env.reset(seed=0)
    for deterministic in (False, True):
        action, _ = model.predict(obs, deterministic=deterministic)
        assert env.action_space.contains(np.asarray(action, dtype=env.action_space.dtype))


@pytest.mark.parametrize(
    "obs_space",
    [
        spaces.Discrete(3),
        spaces.MultiDiscrete([3, 2]),
        spaces.MultiBinary(4),
        spaces.Box(-1, 1, shape=(2, 3), dtype=np.float32),
    ],
)
def test_observation_spaces(obs_space):
    class Env(IdentityEnvBox):
        def __init__(self):
            super().__init__(ep_length=10)
            self.observation_space = obs_space

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            _, reward, terminated, truncated, info = super().step(action)
            return self.observation_space.sample(), reward, terminated, truncated, info

    model = PPOExt("MlpPolicy", Env(), **SMALL).learn(64)
    action, _ = model.predict(obs_space.sample())
    assert model.num_timesteps == 64 and model.action_space.contains(action)


@pytest.mark.parametrize("discrete", [True, False])
def test_image_observations_cnn_policy(discrete):
    env = FakeImageEnv(screen_height=36, screen_width=36, n_channels=1, discrete=discrete)
    model = PPOExt("CnnPolicy", env, policy_kwargs=dict(features_extractor_kwargs=dict(features_dim=16)), **SMALL)
    model.learn(64)
    assert model.policy.squash_output is (not discrete)
    obs, _ = env.reset()
    model.predict(obs)


@pytest.mark.parametrize("discrete", [True, False])
def test_dict_observations_multi_input_policy(discrete, tmp_path):
    env = SimpleMultiObsEnv(discrete_actions=discrete)
    model = PPOExt("MultiInputPolicy", env, **SMALL).learn(64)
    obs, _ = env.reset()
    action, _ = model.predict(obs, deterministic=True)
    model.save(tmp_path / "dict.zip")
    loaded = PPOExt.load(tmp_path / "dict.zip")
    assert np.array_equal(action, loaded.predict(obs, deterministic=True)[0])


def test_predict_shapes_single_and_vectorized():
    model = PPOExt("MlpPolicy", "Pendulum-v1", **SMALL)
    single = np.zeros(3, dtype=np.float32)
    assert model.predict(single)[0].shape == (1,)
    assert model.predict(np.zeros((5, 3), dtype=np.float32))[0].shape == (5, 1)
    vec_env = make_vec_env("Pendulum-v1", n_envs=3)
    assert model.predict(vec_env.reset())[0].shape == (3, 1)
    with pytest.raises(ValueError, match="mixing Gym API"):
        model.predict((single, {}))


@pytest.mark.parametrize("use_sde_squash", [True, False])
@pytest.mark.parametrize("sde_sample_freq", [-1, 4])
def test_sde(use_sde_squash, sde_sample_freq):
    model = PPOExt(
        "MlpPolicy",
        "Pendulum-v1",
        use_sde=True,
        sde_sample_freq=sde_sample_freq,
        policy_kwargs=dict(squash_output=use_sde_squash, log_std_init=-2, net_arch=[16]),
        **SMALL,
    ).learn(64)
    model.policy.reset_noise()
    obs = np.zeros(3, dtype=np.float32)
    action, _ = model.predict(obs, deterministic=True)
    assert np.all(np.abs(action) <= 2.0)


def test_vec_normalize_save_load(tmp_path):
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = PPOExt("MlpPolicy", env, **SMALL).learn(128)
    model.save(tmp_path / "model.zip")
    env.save(tmp_path / "vecnormalize.pkl")
    loaded_env = VecNormalize.load(tmp_path / "vecnormalize.pkl", make_vec_env("Pendulum-v1", n_envs=2))
    assert np.allclose(loaded_env.obs_rms.mean, env.obs_rms.mean)
    loaded = PPOExt.load(tmp_path / "model.zip", env=loaded_env)
    loaded.learn(64, reset_num_timesteps=False)
    assert loaded.num_timesteps == model.num_timesteps + 64


def test_subproc_vec_env():
    env = make_vec_env("Pendulum-v1", n_envs=2, vec_env_cls=SubprocVecEnv, vec_env_kwargs=dict(start_method="fork"))
    try:
        model = PPOExt("MlpPolicy", env, **SMALL).learn(128)
        assert model.num_timesteps == 128 and model.n_envs == 2
    finally:
        env.close()


def test_callbacks_checkpoint_eval_and_stop(tmp_path):
    eval_env = make_vec_env("Pendulum-v1", n_envs=1, seed=1)
    callbacks = CallbackList(
        [
            CheckpointCallback(save_freq=64, save_path=str(tmp_path / "ckpt"), save_vecnormalize=True),
            EvalCallback(eval_env, eval_freq=64, n_eval_episodes=1, best_model_save_path=str(tmp_path / "best")),
        ]
    )
    model = PPOExt("MlpPolicy", "Pendulum-v1", **SMALL).learn(128, callback=callbacks)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["rl_model_128_steps.zip", "rl_model_64_steps.zip"]
    best = PPOExt.load(tmp_path / "best" / "best_model.zip")
    assert best.policy.squash_output
    stopped = PPOExt("MlpPolicy", "CartPole-v1", **SMALL).learn(10_000, callback=StopTrainingOnMaxEpisodes(2))
    assert stopped.num_timesteps < 10_000
    assert model.num_timesteps == 128


def test_save_load_parameters_and_policy(tmp_path):
    model = PPOExt("MlpPolicy", "Pendulum-v1", **SMALL).learn(64)
    obs = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    expected = model.predict(obs, deterministic=True)[0]

    # save/load without env, with kwargs overriding attributes
    model.save(tmp_path / "m")
    loaded = PPOExt.load(tmp_path / "m", ent_coef=0.05)
    assert loaded.ent_coef == 0.05 and loaded.env is None
    assert np.array_equal(loaded.predict(obs, deterministic=True)[0], expected)

    # get_parameters / set_parameters between two models
    other = PPOExt("MlpPolicy", "Pendulum-v1", seed=1)
    other.set_parameters(model.get_parameters())
    assert np.array_equal(other.predict(obs, deterministic=True)[0], expected)
    other.set_parameters(str(tmp_path / "m.zip"))
    assert np.array_equal(other.predict(obs, deterministic=True)[0], expected)

    # the policy alone
    model.policy.save(tmp_path / "policy.pth")
    policy = type(model.policy).load(tmp_path / "policy.pth")
    assert policy.squash_output and np.array_equal(policy.predict(obs, deterministic=True)[0], expected)

    # a bare policy loaded by SB3's PPO-agnostic API keeps its constructor parameters
    params = model.policy._get_constructor_parameters()
    assert params["squash_output"] is True and params["entropy_estimator"] == "mc"


def test_evaluate_policy():
    model = PPOExt("MlpPolicy", "Pendulum-v1", **SMALL)
    mean, std = evaluate_policy(model, make_vec_env("Pendulum-v1", n_envs=2), n_eval_episodes=2)
    assert np.isfinite(mean) and np.isfinite(std)
    episode_rewards, lengths = evaluate_policy(model, model.get_env(), n_eval_episodes=2, return_episode_rewards=True)
    assert len(episode_rewards) == 2 and all(length == 200 for length in lengths)


@pytest.mark.parametrize("device", ["cpu", "auto", "cuda"])
def test_devices(device, tmp_path):
    if device == "cuda" and not th.cuda.is_available():
        pytest.skip("no CUDA device on this machine (scripts/ runs the GPU check where one exists)")
    model = PPOExt("MlpPolicy", "Pendulum-v1", device=device, clip_range_vf=0.2, kl_coef=0.5, kl_target=0.01, **SMALL)
    model.learn(64)
    expected = th.device("cuda" if device == "cuda" or (device == "auto" and th.cuda.is_available()) else "cpu")
    assert model.policy.device.type == expected.type
    model.save(tmp_path / "m")
    assert PPOExt.load(tmp_path / "m", device="cpu").policy.device.type == "cpu"


def test_same_interface_as_ppo():
    """Every constructor argument of PPO is accepted by PPOExt with the same default."""
    import inspect

    ppo, ext = inspect.signature(PPO.__init__).parameters, inspect.signature(PPOExt.__init__).parameters
    for name, parameter in ppo.items():
        assert name in ext, name
        if name not in ("policy", "env"):
            assert ext[name].default == parameter.default, name
    assert set(PPOExt.policy_aliases) == set(PPO.policy_aliases)


def test_dummy_and_gym_env_and_string_env():
    for env in (DummyVecEnv([lambda: IdentityEnvBox()]), IdentityEnvBox(), "Pendulum-v1"):
        model = PPOExt("MlpPolicy", env, **SMALL).learn(64)
        assert isinstance(model.get_env(), DummyVecEnv) and model.num_timesteps == 64


@pytest.mark.parametrize("kwargs", [dict(), dict(clip_range_vf=0.1, ent_coef=0.01), dict(use_sde=True)])
def test_squash_off_update_equals_stock_ppo(kwargs):
    """With full-batch minibatches (order cannot matter), squash-off PPOExt and PPO make the same update."""
    common = dict(n_steps=64, batch_size=128, n_epochs=3, seed=3, **kwargs)
    models = []
    # Built and trained one after the other: each constructor seeds the global RNGs.
    for algo, policy_kwargs in ((PPO, dict(net_arch=[16])), (PPOExt, dict(net_arch=[16], squash_output=False))):
        model = algo("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=3), policy_kwargs=policy_kwargs, **common)
        initial = {name: value.clone() for name, value in model.policy.state_dict().items()}
        models.append((model.learn(128), initial))
    (stock, stock_initial), (ext, ext_initial) = models
    for name, value in stock_initial.items():
        assert th.equal(value, ext_initial[name]), name
    assert np.array_equal(stock.rollout_buffer.actions, ext.rollout_buffer.actions)
    changed = False
    for name, value in stock.policy.state_dict().items():
        assert th.allclose(value, ext.policy.state_dict()[name], atol=1e-5), name
        changed |= not th.equal(value, stock_initial[name])
    assert changed


@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("Pendulum-v1", dict()),
        ("Pendulum-v1", dict(ent_coef=0.01, clip_range_vf=0.2, max_grad_norm=0.3)),
        ("Pendulum-v1", dict(use_sde=True, sde_sample_freq=4)),
        ("CartPole-v1", dict(ent_coef=0.01)),
        ("Pendulum-v1", dict(target_kl=0.002, learning_rate=3e-3)),  # early stops in some updates
    ],
)
def test_squash_off_training_is_stock_ppo_bit_for_bit(env_id, kwargs):
    """
    Over several updates with shuffled minibatches, squash-off PPOExt (no penalty) trains exactly
    as stock PPO: same minibatch rows in the same order, same loss summation, same random draws,
    so the rollouts, the losses logged and the final weights are identical, not merely close.
    """
    common = dict(n_steps=64, batch_size=16, n_epochs=3, seed=5, **kwargs)
    policy_kwargs = dict(net_arch=[16])
    results = []
    for algo, extra in ((PPO, {}), (PPOExt, dict(squash_output=False) if env_id == "Pendulum-v1" else {})):
        model = algo("MlpPolicy", make_vec_env(env_id, n_envs=2, seed=5), policy_kwargs={**policy_kwargs, **extra}, **common)
        model.learn(64 * 2 * 4)  # 4 updates of 8 minibatches x 3 epochs
        results.append(model)
    stock, ext = results
    assert ext._n_updates == stock._n_updates
    assert stock._n_updates == 12 or "target_kl" in kwargs
    if "target_kl" in kwargs:
        assert stock._n_updates < 12  # the early stop did happen, at the same epochs in both
    assert np.array_equal(stock.rollout_buffer.actions, ext.rollout_buffer.actions)
    assert np.array_equal(stock.rollout_buffer.returns, ext.rollout_buffer.returns)
    for name, value in stock.policy.state_dict().items():
        assert th.equal(value, ext.policy.state_dict()[name]), name
    for key in ("train/value_loss", "train/policy_gradient_loss", "train/entropy_loss"):
        assert stock.logger.name_to_value[key] == pytest.approx(ext.logger.name_to_value[key], rel=1e-6), key
