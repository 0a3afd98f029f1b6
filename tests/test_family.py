"""MaskablePPOExt and RecurrentPPOExt: drop-in for sb3-contrib's MaskablePPO / RecurrentPPO, and the extensions on them."""

import io

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.evaluation import evaluate_policy as maskable_evaluate_policy
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import AffineTransform, TanhTransform

from sb3_ppo_ext import MaskablePPOExt, NonFiniteLossError, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.callbacks import ActionMonitor, KLAdaptiveLR, ParameterScheduler, TrainingHealthGuard
from sb3_ppo_ext.distributions import analytic_kl, categorical_kl, torch_distributions
from sb3_ppo_ext.engine import Minibatch
from sb3_ppo_ext.reliability import ModelFileError

MASK_ENVS = {
    "discrete": lambda: InvalidActionEnvDiscrete(dim=12, n_invalid_actions=6),
    "multidiscrete": lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2),
    "multibinary": lambda: InvalidActionEnvMultiBinary(dims=4, n_invalid_actions=2),
}
MASK_TINY = dict(n_steps=64, batch_size=16, n_epochs=3, seed=0, policy_kwargs=dict(net_arch=[16]))
LSTM_TINY = dict(n_steps=32, batch_size=16, n_epochs=3, seed=0)
LSTM_POLICY = dict(net_arch=[16], lstm_hidden_size=8)


def weights(model):
    return th.nn.utils.parameters_to_vector(model.policy.parameters()).detach().clone()


def quiet(model):
    model.set_logger(configure(None, []))
    return model


# ---------------------------------------------------------------- drop-in: bit for bit with the extensions off


@pytest.mark.parametrize("env_name", list(MASK_ENVS))
@pytest.mark.parametrize("extra", [{}, dict(clip_range_vf=0.1, target_kl=0.005, ent_coef=0.01)], ids=["plain", "vf_kl_ent"])
def test_maskable_trains_bit_for_bit_like_maskable_ppo(env_name, extra):
    trained = []
    for cls in (MaskablePPO, MaskablePPOExt):
        model = cls("MlpPolicy", MASK_ENVS[env_name](), **MASK_TINY, **extra)
        model.learn(192)
        trained.append(weights(model))
    assert th.equal(*trained)


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


def test_minibatches_are_the_buffers_own():
    """
    The engine iterates the buffer's get(): each minibatch holds the rows upstream draws, and pi_old's
    parameters ride with them (the logits of the very rows, as the policy computed them while collecting).
    """
    model = quiet(MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), kl_coef=0.5, **MASK_TINY))
    seen, states, rollout = [], [], {}
    original_losses, original_train = model.minibatch_losses, model.train

    def spy(batch, *args):
        seen.append((batch.samples.old_log_prob.clone(), batch.old_distributions[0].logits.clone()))
        return original_losses(batch, *args)

    def train():
        states.append(np.random.get_state())
        buffer = model.rollout_buffer
        rollout["log_prob"] = th.as_tensor(buffer.swap_and_flatten(buffer.log_probs)).flatten()
        rollout["logits"] = model._rollout_distributions()[0][0].logits  # the policy before the update
        original_train()

    model.minibatch_losses, model.train = spy, train
    model.learn(64)
    np.random.set_state(states[0])  # replay the permutations get() drew, one per epoch
    expected = [perm[16 * k : 16 * (k + 1)] for perm in (np.random.permutation(64) for _ in range(3)) for k in range(4)]
    assert len(seen) == len(expected)
    for (log_prob, logits), rows in zip(seen, expected, strict=True):
        assert th.equal(log_prob, rollout["log_prob"][rows])
        th.testing.assert_close(logits, rollout["logits"][rows])


# ---------------------------------------------------------------- MaskablePPOExt: the masked KL


def masked_kl_by_hand(p_logits, q_logits, mask):
    """KL over the valid categories, each policy renormalised over them, in float64."""
    p_logits, q_logits = p_logits.double(), q_logits.double()
    neg = th.tensor(-np.inf, dtype=th.float64)
    log_p = th.log_softmax(th.where(mask, p_logits, neg), dim=-1)
    log_q = th.log_softmax(th.where(mask, q_logits, neg), dim=-1)
    terms = th.where(mask, log_p.exp() * (log_p - log_q), th.zeros_like(log_p))
    return terms.sum(-1)


@pytest.mark.parametrize("scale", [1.0, 60.0])
def test_masked_kl_matches_a_hand_computation_and_is_finite(scale):
    from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution

    gen = th.Generator().manual_seed(0)
    p_logits, q_logits = scale * th.randn(32, 6, generator=gen), scale * th.randn(32, 6, generator=gen)
    mask = th.rand(32, 6, generator=gen) > 0.4
    mask[:, 0] = True
    dists = []
    for logits in (p_logits, q_logits):
        dist = MaskableCategoricalDistribution(6).proba_distribution(logits)
        dist.apply_masking(mask)
        dists.append(torch_distributions(dist))
    kl = analytic_kl(*dists)
    assert th.isfinite(kl).all()
    th.testing.assert_close(kl.double(), masked_kl_by_hand(p_logits, q_logits, mask), rtol=1e-4, atol=1e-5)
    assert th.equal(analytic_kl(dists[0], dists[0]), th.zeros(32))


def test_categorical_kl_stays_finite_where_torch_gives_inf():
    p = th.distributions.Categorical(logits=th.tensor([[0.0, -50.0]]))
    q = th.distributions.Categorical(logits=th.tensor([[0.0, -200.0]]))  # q's second category underflows to 0
    assert th.isinf(th.distributions.kl_divergence(p, q)).all()
    expected = masked_kl_by_hand(p.logits, q.logits, th.ones(1, 2, dtype=th.bool))
    th.testing.assert_close(categorical_kl(p, q).double(), expected, rtol=1e-4, atol=1e-12)


@pytest.mark.parametrize("env_name", list(MASK_ENVS))
def test_maskable_kl_penalty_and_diagnostics(env_name):
    model = quiet(
        MaskablePPOExt(
            "MlpPolicy", MASK_ENVS[env_name](), kl_coef=1.0, kl_target=0.01, clip_range_vf=0.2, vf_clip_mode="max", **MASK_TINY
        )
    )
    model.learn(128)
    logged = model.logger.name_to_value
    for key in (
        "train/kl",
        "train/kl_max",
        "train/kl_penalty",
        "train/kl_coef",
        "train/clip_fraction",
        "train/clip_fraction_vf",
    ):
        assert np.isfinite(logged[key]), key
    assert model.current_kl_coef != 1.0  # the beta rule ran
    # The logged KL is the masked KL(pi_old || pi_new): 0 for the policy against itself after the update.
    assert 0 < logged["train/kl"] <= logged["train/kl_max"]


def test_maskable_frozen_policy_has_zero_kl_penalty():
    model = quiet(MaskablePPOExt("MlpPolicy", MASK_ENVS["multidiscrete"](), kl_coef=1.0, learning_rate=0.0, **MASK_TINY))
    model.learn(64)
    assert model.logger.name_to_value["train/kl_penalty"] == 0.0
    assert model.logger.name_to_value["train/kl"] == 0.0


def test_masked_actions_are_never_taken_or_predicted():
    env = MASK_ENVS["discrete"]()
    model = MaskablePPOExt("MlpPolicy", env, kl_coef=0.5, **MASK_TINY)
    model.learn(128)
    obs, _ = env.reset(seed=1)
    for _ in range(20):
        masks = env.action_masks()
        action, _ = model.predict(obs, action_masks=masks)
        assert masks[int(action)]
        obs, *_ = env.step(action)
    stored = model.rollout_buffer.actions.reshape(-1).astype(int)
    masks = model.rollout_buffer.action_masks.reshape(-1, 12)
    assert masks[np.arange(len(stored)), stored].all()
    mean_reward, _ = maskable_evaluate_policy(model, MASK_ENVS["discrete"](), n_eval_episodes=2, warn=False)
    assert np.isfinite(mean_reward)


def test_maskable_bad_input():
    with pytest.raises(ValueError, match="squash_output=True"):
        MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), policy_kwargs=dict(squash_output=True))
    with pytest.raises(ValueError, match="kl_target"):
        MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), kl_target=0.01)
    with pytest.raises(ValueError, match="vf_clip_mode"):
        MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), vf_clip_mode="huber")
    model = MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), **MASK_TINY)
    obs, _ = model.env.reset(), None
    with pytest.raises(ValueError, match=r"action_masks of shape \(5,\).*12"):
        model.predict(obs, action_masks=np.ones(5, dtype=bool))


class WrongMaskEnv(InvalidActionEnvDiscrete):
    def action_masks(self):
        return super().action_masks()[:-1]


def test_env_masks_of_the_wrong_size_are_a_clear_error():
    model = MaskablePPOExt("MlpPolicy", WrongMaskEnv(dim=12, n_invalid_actions=6), **MASK_TINY)
    with pytest.raises(ValueError, match=r"env.action_masks\(\).*expected 1 mask\(s\) of 12"):
        model.learn(64)


def test_maskable_save_load_and_upstream_files(tmp_path):
    model = MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), kl_coef=1.0, kl_target=0.01, **MASK_TINY)
    model.learn(64)
    model.save(tmp_path / "ext")
    loaded = MaskablePPOExt.load(tmp_path / "ext", env=MASK_ENVS["discrete"]())
    assert loaded.current_kl_coef == model.current_kl_coef and loaded.kl_target == 0.01
    assert th.equal(weights(loaded), weights(model))
    loaded.learn(64, reset_num_timesteps=False)

    upstream = MaskablePPO("MlpPolicy", MASK_ENVS["discrete"](), **MASK_TINY)
    upstream.learn(64)
    upstream.save(tmp_path / "upstream")
    from_upstream = MaskablePPOExt.load(tmp_path / "upstream", env=MASK_ENVS["discrete"]())
    assert type(from_upstream.policy) is MaskableActorCriticPolicy and from_upstream.kl_coef == 0
    assert th.equal(weights(from_upstream), weights(upstream))
    quiet(from_upstream).learn(64, reset_num_timesteps=False)  # upstream policy, engine's update

    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=16).save(tmp_path / "ppo")
    with pytest.raises(ModelFileError, match="MaskablePPOExt"):
        MaskablePPOExt.load(tmp_path / "ppo")
    with pytest.raises(ModelFileError):
        PPOExt.load(tmp_path / "upstream")


# ---------------------------------------------------------------- RecurrentPPOExt: squashed head on LSTM policies


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


class RecordingBoxEnv(gym.Env):
    """Asymmetric bounds; records every action it receives; short episodes so that sequences are padded."""

    def __init__(self):
        self.action_space = spaces.Box(np.array([-1.0, 0.0], dtype=np.float32), np.array([3.0, 0.5], dtype=np.float32))
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.received, self._t = [], 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        self._t += 1
        return self.observation_space.sample(), float(action[0]), False, self._t >= 7, {}


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


# ---------------------------------------------------------------- rl-zoo3: the shipped ppo_lstm_ext.yml and the sampler


def test_every_shipped_ppo_lstm_ext_entry_passes_the_settings_check_and_builds():
    import yaml

    from sb3_ppo_ext import settings

    path = settings.ALGORITHMS["ppo_lstm_ext"].hyperparams
    entries = yaml.safe_load(path.read_text())
    assert {"default", "PendulumNoVel-v1", "CartPoleNoVel-v1", "Hopper-v5", "Walker2d-v5"} <= set(entries)
    for env_id, entry in entries.items():
        assert settings.entry_problems(entry, "ppo_lstm_ext") == [], env_id
        if entry["policy"] != "MlpLstmPolicy":
            continue
        kwargs = settings.to_algorithm_kwargs(
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


class ImageEnv(gym.Env):
    """Channel-last images (SB3 transposes them), one-step episodes, action 1 masked."""

    observation_space = spaces.Box(0, 255, (36, 36, 1), dtype=np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 1.0, False, True, {}

    def action_masks(self):
        return np.array([True, False, True])


@pytest.mark.parametrize("family", ["maskable", "recurrent"])
def test_cnn_and_dict_policies(family):
    """The CnnPolicy / MultiInputPolicy aliases build the upstream extractors and train."""
    from stable_baselines3.common.envs import SimpleMultiObsEnv
    from stable_baselines3.common.torch_layers import CombinedExtractor, NatureCNN

    class MaskedMultiObsEnv(SimpleMultiObsEnv):
        def action_masks(self):
            return np.array([True, True, False, True])

    if family == "maskable":
        cnn = MaskablePPOExt("CnnPolicy", ImageEnv(), n_steps=16, batch_size=8, n_epochs=1, seed=0)
        multi = MaskablePPOExt("MultiInputPolicy", MaskedMultiObsEnv(), n_steps=16, batch_size=8, n_epochs=1, seed=0)
    else:
        cnn = RecurrentPPOExt("CnnLstmPolicy", ImageEnv(), n_steps=16, batch_size=8, n_epochs=1, seed=0)
        multi = RecurrentPPOExt("MultiInputLstmPolicy", SimpleMultiObsEnv(), n_steps=16, batch_size=8, n_epochs=1, seed=0)
    assert isinstance(cnn.policy.features_extractor, NatureCNN)
    assert isinstance(multi.policy.features_extractor, CombinedExtractor)
    for model in (cnn, multi):
        quiet(model).learn(16)
        values, log_prob, _ = model.policy.evaluate_actions(*_evaluation_inputs(model))
        assert th.isfinite(values).all() and th.isfinite(log_prob).all()


def _evaluation_inputs(model):
    """The inputs of the policy's evaluate_actions on the model's first rollout rows."""
    samples = next(model.rollout_buffer.get(8))
    actions = samples.actions.long().flatten() if isinstance(model.action_space, spaces.Discrete) else samples.actions
    if isinstance(model, MaskablePPOExt):
        return samples.observations, actions, samples.action_masks
    return samples.observations, actions, samples.lstm_states, samples.episode_starts


def no_instance_patches(model):
    """
    No method of the model, its policy or its buffer is replaced on the instance (an instance attribute
    shadowing a class attribute that is callable), and the collection's forward hook is gone.
    """
    for obj in (model, model.policy, model.rollout_buffer):
        patched = {name for name, value in vars(obj).items() if callable(value) and callable(getattr(type(obj), name, None))}
        if obj is model:
            patched -= {"train"}  # the tests' own spies
        assert not patched, (type(obj).__name__, patched)
    assert not model.policy._forward_hooks
    return True


def test_no_instance_patches_and_no_hook_outlive_early_stops_and_errors():
    """Collection records pi_old through a forward hook that never outlives it; nothing is patched on an instance."""
    model = quiet(PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=16, target_kl=1e-9, learning_rate=1e-2))
    model.learn(128)
    assert model.logger.name_to_value["train/epochs_completed"] < 10  # stopped early
    assert no_instance_patches(model)

    class NanRewardEnv(RecordingBoxEnv):
        def step(self, action):
            obs, _, terminated, truncated, info = super().step(action)
            return obs, float("nan"), terminated, truncated, info

    model = MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), **MASK_TINY)
    model.train = lambda: (_ for _ in ()).throw(NonFiniteLossError("stop"))  # an update that fails
    with pytest.raises(NonFiniteLossError):
        model.learn(64)
    assert no_instance_patches(model)
    model = RecurrentPPOExt("MlpLstmPolicy", NanRewardEnv(), policy_kwargs=LSTM_POLICY, **LSTM_TINY)
    with pytest.raises(NonFiniteLossError):
        model.learn(32)
    assert no_instance_patches(model)


@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("family", ["ppo", "maskable", "recurrent"])
def test_pi_old_recorded_during_collection_equals_a_recomputation(family, n_envs):
    """The distributions kept at collection are the policy's on every rollout row, in the buffer's row order."""
    if family == "maskable":
        env = make_vec_env(MASK_ENVS["multidiscrete"], n_envs=n_envs, seed=0)
        model = MaskablePPOExt("MlpPolicy", env, n_steps=16, batch_size=16, seed=0)
    elif family == "recurrent":
        env = make_vec_env("Pendulum-v1", n_envs=n_envs, seed=0)
        model = RecurrentPPOExt("MlpLstmPolicy", env, n_steps=16, batch_size=16, seed=0, policy_kwargs=LSTM_POLICY)
    else:
        model = PPOExt("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=n_envs, seed=0), n_steps=16, batch_size=16, seed=0)
    compared = []
    original = model.train

    def train():
        assert model.rollout_buffer.carries_pi_old
        recomputed, recorded = model._rollout_distributions(with_old=True)
        for got, want in zip(recorded, recomputed, strict=True):
            params = ("loc", "scale") if isinstance(want, Normal) else ("logits",)
            for name in params:
                th.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-5)
        compared.append(True)
        original()

    model.train = train
    model.learn(32 * n_envs)
    assert len(compared) == 2


def test_env_masks_are_checked_without_an_extra_env_call():
    env = make_vec_env(MASK_ENVS["discrete"], n_envs=1, seed=0)
    calls = []
    original = env.env_method

    def env_method(name, *args, **kwargs):
        calls.append(name)
        return original(name, *args, **kwargs)

    env.env_method = env_method
    model = MaskablePPOExt("MlpPolicy", env, **MASK_TINY)
    model.learn(3 * 64)
    assert calls.count("action_masks") == 3 * 64  # upstream's one per step: its masks are the ones checked
    model.save(io.BytesIO())  # the checked env is not part of a saved model


def test_maskable_vec_normalize_and_callbacks(tmp_path):
    # The masked test envs have discrete observations: VecNormalize normalises their rewards only.
    venv = VecNormalize(make_vec_env(MASK_ENVS["multibinary"], n_envs=2, seed=0), norm_obs=False)
    model = MaskablePPOExt("MlpPolicy", venv, kl_coef=1.0, kl_target=0.01, **MASK_TINY)
    guard = TrainingHealthGuard(save_path=str(tmp_path / "guard"))
    schedule = ParameterScheduler({"ent_coef": dict(kind="linear", start=0.01, end=0.0)})
    callbacks = [KLAdaptiveLR(target_kl=0.01), guard, schedule]
    model.learn(256, callback=callbacks)
    assert model.ent_coef < 0.01 and model.policy.optimizer.param_groups[0]["lr"] != 3e-4  # both callbacks acted
    model.save(tmp_path / "model")
    loaded = MaskablePPOExt.load(tmp_path / "model", env=venv)
    assert th.equal(weights(loaded), weights(model)) and loaded.current_kl_coef == model.current_kl_coef


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


class DictImageEnv(ImageEnv):
    """A Dict observation holding a channel-last image and a vector."""

    observation_space = spaces.Dict(
        {"image": ImageEnv.observation_space, "vector": spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)}
    )


@pytest.mark.parametrize("env_class, policy", [(ImageEnv, "CnnPolicy"), (DictImageEnv, "MultiInputPolicy")])
def test_maskable_predict_and_evaluation_on_channel_last_images(env_class, policy):
    """predict(obs, action_masks=...) counts the observations as the policy batches them (after its transpose)."""
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

    model = MaskablePPOExt(policy, env_class(), n_steps=16, batch_size=8, n_epochs=1, seed=0)
    obs, _ = env_class().reset()
    masks = env_class().action_masks()
    action, _ = model.predict(obs, action_masks=masks)
    assert action.shape == () and masks[action]
    batch = {key: np.stack([value] * 2) for key, value in obs.items()} if isinstance(obs, dict) else np.stack([obs] * 2)
    actions, _ = model.predict(batch, action_masks=np.stack([masks] * 2))
    assert actions.shape == (2,) and masks[actions].all()
    with pytest.raises(ValueError, match=r"action_masks of shape \(3,\).*expected 2 mask\(s\)"):
        model.predict(batch, action_masks=masks)
    # sb3-contrib's evaluation passes the masks to predict with the env's channel-last observations.
    maskable_evaluate_policy(model, env_class(), n_eval_episodes=2, warn=False)
    evaluation = MaskableEvalCallback(env_class(), eval_freq=8, n_eval_episodes=2, warn=False, verbose=0)
    quiet(model).learn(16, callback=evaluation)
    assert evaluation.last_mean_reward == 1.0
