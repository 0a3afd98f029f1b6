"""RecurrentPPOExt (sb3_ppo_ext.recurrent): bit for bit like sb3-contrib's RecurrentPPO with the extensions off.

And the extensions on LSTM policies: the squashed head, the KL penalty, diagnostics over the unpadded steps.
"""

import io

import numpy as np
import pytest
import torch as th
from helpers import LSTM_POLICY, LSTM_TINY, MASK_ENVS, RecordingBoxEnv, quiet, weights
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

from sb3_ppo_ext import NonFiniteLossError, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.callbacks import ActionMonitor, KLAdaptiveLR, ParameterScheduler, TrainingHealthGuard
from sb3_ppo_ext.engine import Minibatch
from sb3_ppo_ext.reliability import ModelFileError


@pytest.mark.parametrize(
    "env_id, extra",
    [
        ("Pendulum-v1", {}),
        ("Pendulum-v1", dict(clip_range_vf=0.2, target_kl=0.002, ent_coef=0.01)),
        ("CartPole-v1", dict(clip_range_vf=0.2)),
        ("CartPole-v1", dict(policy_kwargs=dict(shared_lstm=True, enable_critic_lstm=False))),
    ],
    ids=["box", "box_vf_kl_ent", "discrete_vf", "discrete_shared_lstm"],
)
def test_recurrent_trains_bit_for_bit_like_recurrent_ppo(env_id, extra):
    extra = dict(extra)
    policy_kwargs = {**LSTM_POLICY, **extra.pop("policy_kwargs", {})}
    trained = []
    for cls in (RecurrentPPO, RecurrentPPOExt):
        kwargs = dict(policy_kwargs)
        if cls is RecurrentPPOExt and env_id == "Pendulum-v1":
            kwargs["squash_output"] = False
        model = cls("MlpLstmPolicy", make_vec_env(env_id, n_envs=2, seed=0), policy_kwargs=kwargs, **LSTM_TINY, **extra)
        model.learn(192)
        trained.append(weights(model))
    assert th.equal(*trained)


def test_recurrent_squashed_log_prob_matches_torch_transformed_distribution():
    model = RecurrentPPOExt("MlpLstmPolicy", "Pendulum-v1", policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    assert model.policy.squash_output
    obs = th.as_tensor(np.stack([model.observation_space.sample() for _ in range(5)]))
    lstm = model.policy.lstm_actor
    states = (th.zeros(lstm.num_layers, 5, lstm.hidden_size), th.zeros(lstm.num_layers, 5, lstm.hidden_size))
    with th.no_grad():
        distribution, _ = model.policy.get_distribution(obs, states, th.ones(5))
        u = distribution.sample()
        base = distribution.base.distribution
        low, high = (th.as_tensor(b, dtype=th.float64) for b in (model.action_space.low, model.action_space.high))
        reference = TransformedDistribution(
            Normal(base.loc.double(), base.scale.double()),
            [TanhTransform(), AffineTransform(loc=(low + high) / 2, scale=(high - low) / 2)],
        )
        action = th.as_tensor(model.policy.unscale_action(u.numpy()), dtype=th.float64)
        th.testing.assert_close(distribution.log_prob(u).double(), reference.log_prob(action).sum(-1), rtol=1e-4, atol=1e-4)


def test_recurrent_saturated_rollout_has_exact_ratio(surrogate_ratios):
    captured = surrogate_ratios
    policy_kwargs = dict(LSTM_POLICY, log_std_init=2.5)
    model = RecurrentPPOExt(
        "MlpLstmPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), policy_kwargs=policy_kwargs, **LSTM_TINY
    )
    model.learn(64)
    actions = th.as_tensor(model.rollout_buffer.actions)
    assert (th.tanh(actions).abs() > 0.999).float().mean().item() >= 0.10
    assert (captured[0] - 1).abs().max().item() < 1e-5


def test_recurrent_env_receives_squashed_actions_within_bounds_and_predict_keeps_state():
    env = RecordingBoxEnv()
    model = RecurrentPPOExt("MlpLstmPolicy", env, policy_kwargs=dict(LSTM_POLICY, log_std_init=1.5), **LSTM_TINY)
    model.learn(64)
    received = np.array(env.received)
    low, high = env.action_space.low, env.action_space.high
    assert ((received >= low) & (received <= high)).all()
    expected = model.policy.unscale_action(model.rollout_buffer.actions.reshape(-1, 2))
    np.testing.assert_array_equal(received[-len(expected) :], expected)  # buffer order == collection order (1 env)
    obs, _ = env.reset()
    state, start = None, np.ones((1,), dtype=bool)
    for _ in range(3):
        action, state = model.predict(obs, state=state, episode_start=start, deterministic=True)
        assert state[0].shape == (1, 1, 8) and ((action >= low) & (action <= high)).all()
        start = np.zeros((1,), dtype=bool)
    mean_reward, _ = evaluate_policy(model, model.get_env(), n_eval_episodes=2, warn=False)
    assert np.isfinite(mean_reward)


def test_recurrent_diagnostics_count_only_the_unpadded_steps():
    """Garbage written into the padded steps of a minibatch changes no loss term and no diagnostic."""
    model = quiet(
        RecurrentPPOExt(
            "MlpLstmPolicy",
            DummyVecEnv([RecordingBoxEnv, RecordingBoxEnv]),
            kl_coef=0.5,
            clip_range_vf=0.1,
            policy_kwargs=LSTM_POLICY,
            **LSTM_TINY,
        )
    )
    model.learn(64)
    batches = []
    model.policy.set_training_mode(True)
    for batch in model._minibatches(with_old=True):
        if (~batch.valid).any():
            batches.append(batch)
    assert batches, "no padded minibatch"
    batch = batches[0]
    assert batch.old_distributions[0].batch_shape[0] == int(batch.n_valid)
    th.manual_seed(0)  # the squashed head's entropy estimate draws one sample per step
    clean = model.minibatch_losses(batch, 0.2, 0.1, 0.5)
    pad = ~batch.valid
    samples = batch.samples
    dirty = samples._replace(
        old_log_prob=th.where(pad, th.full_like(samples.old_log_prob, 50.0), samples.old_log_prob),
        advantages=th.where(pad, th.full_like(samples.advantages, 1e6), samples.advantages),
        returns=th.where(pad, th.full_like(samples.returns, -1e6), samples.returns),
        old_values=th.where(pad, th.full_like(samples.old_values, 1e6), samples.old_values),
    )
    th.manual_seed(0)
    dirty_terms = model.minibatch_losses(Minibatch(dirty, batch.valid, batch.old_distributions), 0.2, 0.1, 0.5)
    for key, value in clean.items():
        th.testing.assert_close(dirty_terms[key], value, msg=key)


def test_recurrent_kl_penalty_frozen_policy_and_logged_kl():
    model = quiet(
        RecurrentPPOExt(
            "MlpLstmPolicy",
            make_vec_env("Pendulum-v1", n_envs=2, seed=0),
            kl_coef=1.0,
            learning_rate=0.0,
            policy_kwargs=LSTM_POLICY,
            **LSTM_TINY,
        )
    )
    model.learn(64)
    logged = model.logger.name_to_value
    # pi_old replayed from the stored LSTM states equals the collection-time policy: ratio 1, KL 0.
    assert logged["train/ratio_min"] == pytest.approx(1.0, abs=1e-5) and logged["train/ratio_max"] == pytest.approx(
        1.0, abs=1e-5
    )
    assert logged["train/kl"] == pytest.approx(0.0, abs=1e-7) and logged["train/kl_penalty"] == pytest.approx(0.0, abs=1e-7)


def test_recurrent_vec_normalize_save_load_callbacks(tmp_path):
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = RecurrentPPOExt("MlpLstmPolicy", venv, kl_coef=1.0, kl_target=0.01, policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    monitor = ActionMonitor(histograms=False)
    callbacks = [
        KLAdaptiveLR(target_kl=0.01),
        TrainingHealthGuard(save_path=str(tmp_path / "guard")),
        ParameterScheduler({"ent_coef": dict(kind="linear", start=0.01, end=0.0)}),
        monitor,
    ]
    model.learn(128, callback=callbacks)
    assert "pre_squash_mean" in monitor.last_stats and "at_bounds" in monitor.last_stats
    assert model.ent_coef < 0.01
    model.save(tmp_path / "model")
    venv.save(tmp_path / "vecnormalize.pkl")
    loaded = RecurrentPPOExt.load(tmp_path / "model", env=venv)
    assert th.equal(weights(loaded), weights(model)) and loaded.current_kl_coef == model.current_kl_coef
    loaded.learn(64, reset_num_timesteps=False)


def test_recurrent_upstream_files_load_and_foreign_files_do_not(tmp_path):
    upstream = RecurrentPPO("MlpLstmPolicy", "CartPole-v1", policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    upstream.learn(32)
    upstream.save(tmp_path / "upstream")
    loaded = RecurrentPPOExt.load(tmp_path / "upstream", env=make_vec_env("CartPole-v1", n_envs=1))
    assert type(loaded.policy) is RecurrentActorCriticPolicy and th.equal(weights(loaded), weights(upstream))
    quiet(loaded).learn(32, reset_num_timesteps=False)
    buffer = io.BytesIO()
    upstream.save(buffer)
    buffer.seek(0)
    with pytest.raises(ModelFileError):
        PPOExt.load(buffer)
    with pytest.raises(ModelFileError, match="RecurrentPPOExt"):
        MaskablePPO("MlpPolicy", MASK_ENVS["discrete"]()).save(tmp_path / "masked")
        RecurrentPPOExt.load(tmp_path / "masked")


def test_recurrent_non_finite_loss_never_reaches_the_weights():
    class NanRewardEnv(RecordingBoxEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, float("nan"), terminated, truncated, info

    model = RecurrentPPOExt("MlpLstmPolicy", NanRewardEnv(), policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    before = weights(model)
    with pytest.raises(NonFiniteLossError, match=r"RecurrentPPOExt\.train"):
        model.learn(32)
    assert th.equal(weights(model), before)


def test_recurrent_bad_input():
    with pytest.raises(ValueError, match="squash_output"):
        RecurrentPPOExt("MlpLstmPolicy", "CartPole-v1", policy_kwargs=dict(squash_output=True))
    with pytest.raises(ValueError, match="kl_coef"):
        RecurrentPPOExt("MlpLstmPolicy", "Pendulum-v1", kl_coef=-1.0)
    with pytest.raises(ValueError, match="entropy_estimator"):
        RecurrentPPOExt("MlpLstmPolicy", "Pendulum-v1", policy_kwargs=dict(entropy_estimator="exact"))


def test_every_shipped_ppo_lstm_ext_entry_passes_the_settings_check_and_builds():
    import yaml

    from sb3_ppo_ext import settings, validation

    path = settings.ALGORITHMS["ppo_lstm_ext"].hyperparams
    entries = yaml.safe_load(path.read_text())
    assert {"default", "PendulumNoVel-v1", "CartPoleNoVel-v1", "Hopper-v5", "Walker2d-v5"} <= set(entries)
    for env_id, entry in entries.items():
        assert settings.entry_problems(entry, "ppo_lstm_ext") == [], env_id
        if entry["policy"] != "MlpLstmPolicy":
            continue
        kwargs = validation.to_algorithm_kwargs(
            {k: v for k, v in entry.items() if k in settings.algorithm_parameters(RecurrentPPOExt)}
        )
        kwargs.pop("policy")
        discrete = env_id.startswith(("CartPole", "MountainCarNoVel", "Acrobot", "LunarLanderNoVel"))
        model = RecurrentPPOExt("MlpLstmPolicy", "CartPole-v1" if discrete else "Pendulum-v1", **kwargs)
        assert model.policy.squash_output is (not discrete), env_id


def test_recurrent_sampler_adds_the_lstm_knobs_and_replays():
    optuna = pytest.importorskip("optuna")
    from sb3_ppo_ext import samplers

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for continuous in (True, False):
        trial = study.ask()
        kwargs = samplers.sample_recurrent_zoo_params(trial, n_actions=1 if continuous else 0, n_envs=1, additional_args={})
        policy_kwargs = kwargs["policy_kwargs"]
        assert policy_kwargs["lstm_hidden_size"] in samplers.LSTM_HIDDEN_SIZES
        assert not (policy_kwargs["shared_lstm"] and policy_kwargs["enable_critic_lstm"])
        assert ("squash_output" in policy_kwargs) is continuous
        replayed = samplers.convert_recurrent_zoo_params(trial.params)
        assert replayed["policy_kwargs"]["lstm_hidden_size"] == policy_kwargs["lstm_hidden_size"]
        model = RecurrentPPOExt("MlpLstmPolicy", "Pendulum-v1" if continuous else "CartPole-v1", **kwargs)
        assert model.policy.lstm_actor.hidden_size == policy_kwargs["lstm_hidden_size"]


def test_recurrent_gsde_bit_for_bit_and_squashed():
    trained = []
    for cls in (RecurrentPPO, RecurrentPPOExt):
        policy_kwargs = dict(LSTM_POLICY, **({"squash_output": False} if cls is RecurrentPPOExt else {}))
        model = cls("MlpLstmPolicy", "Pendulum-v1", use_sde=True, sde_sample_freq=4, policy_kwargs=policy_kwargs, **LSTM_TINY)
        model.learn(96)
        trained.append(weights(model))
    assert th.equal(*trained)
    model = quiet(
        RecurrentPPOExt("MlpLstmPolicy", "Pendulum-v1", use_sde=True, kl_coef=0.5, policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    )
    model.learn(64)
    assert model.policy.squash_output and np.isfinite(model.logger.name_to_value["train/kl_penalty"])


def test_recurrent_multibinary_actions_train_and_a_frozen_policy_has_ratio_one():
    """sb3-contrib's recurrent buffers hand MultiBinary actions back as int8 (RecurrentPPO crashes on them): they train."""
    env = make_vec_env(MASK_ENVS["multibinary"], n_envs=2, seed=0)
    frozen = RecurrentPPOExt("MlpLstmPolicy", env, kl_coef=1.0, learning_rate=0.0, policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    quiet(frozen).learn(64)
    logged = frozen.logger.name_to_value
    # The update scores the stored actions exactly as collection did: ratio 1, KL 0.
    assert logged["train/ratio_min"] == pytest.approx(1.0, abs=1e-6) and logged["train/ratio_max"] == pytest.approx(
        1.0, abs=1e-6
    )
    assert logged["train/kl"] == pytest.approx(0.0, abs=1e-7)
    model = RecurrentPPOExt("MlpLstmPolicy", env, policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    before = weights(model).clone()
    model.learn(64)
    assert not th.equal(weights(model), before)
    action, _ = model.predict(env.reset(), episode_start=np.ones(2, dtype=bool))
    assert action.shape == (2, 4) and set(np.unique(action)) <= {0, 1}
