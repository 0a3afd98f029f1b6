"""The update engine (sb3_ppo_ext.engine): what every algorithm built on it checks at construction and does in an update."""

from __future__ import annotations

import copy
import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import (
    FAMILY,
    LSTM_POLICY,
    LSTM_TINY,
    MASK_ENVS,
    MASK_TINY,
    BrokenRewardEnv,
    ImageEnv,
    Member,
    RecordingBoxEnv,
    quiet,
)
from helpers import TINY_NET as TINY
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from torch.distributions import Normal, kl_divergence
from torch.optim.optimizer import register_optimizer_step_post_hook

from sb3_ppo_ext import MaskablePPOExt, NonFiniteLossError, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.distributions import distributions_from_parameters
from sb3_ppo_ext.engine import Minibatch


@pytest.mark.parametrize(
    "algorithm, policy, observations, message",
    [
        (RecurrentPPOExt, "MlpLstmPolicy", "dict", r"`MultiInputLstmPolicy` when working with a Dict .*not MlpLstmPolicy"),
        (RecurrentPPOExt, "CnnLstmPolicy", "dict", r"You must use `MultiInputLstmPolicy` .*not CnnLstmPolicy"),
        (
            RecurrentPPOExt,
            "MultiInputLstmPolicy",
            "box",
            r"You must use `MlpLstmPolicy` or `CnnLstmPolicy` when working with a Box .*not MultiInputLstmPolicy",
        ),
        (PPOExt, "MlpPolicy", "dict", r"You must use `MultiInputPolicy` when working with dict observation space"),  # SB3's
        (PPOExt, "MultiInputPolicy", "box", r"You must use `MlpPolicy` or `CnnPolicy` when working with a Box"),
        (MaskablePPOExt, "MlpPolicy", "dict", r"You must use `MultiInputPolicy` when working with dict observation space"),
    ],
)
def test_a_policy_that_cannot_read_the_observations_is_an_error_at_construction(algorithm, policy, observations, message):
    from stable_baselines3.common.envs import SimpleMultiObsEnv

    env = SimpleMultiObsEnv() if observations == "dict" else gym.make("CartPole-v1")
    with pytest.raises(ValueError, match=message):
        algorithm(policy, env, n_steps=16, batch_size=16, device="cpu")


def test_minibatches_are_the_buffers_own():
    """
    The engine iterates the buffer's get(): each minibatch holds the rows upstream draws, and pi_old's
    parameters ride with them (the logits of the very rows, as the policy computed them before the update).
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
        rollout["logits"] = model._rollout_distributions()[0].logits  # the policy before the update
        original_train()

    model.minibatch_losses, model.train = spy, train
    model.learn(64)
    np.random.set_state(states[0])  # replay the permutations get() drew, one per epoch
    expected = [perm[16 * k : 16 * (k + 1)] for perm in (np.random.permutation(64) for _ in range(3)) for k in range(4)]
    assert len(seen) == len(expected)
    for (log_prob, logits), rows in zip(seen, expected, strict=True):
        assert th.equal(log_prob, rollout["log_prob"][rows])
        th.testing.assert_close(logits, rollout["logits"][rows])


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
def test_pi_old_is_the_policy_that_collected_the_rollout(family: Member, n_envs: int):
    """pi_old, scored once before the update, gives every stored action the log-probability it was collected with."""
    kwargs: dict = dict(n_steps=16, batch_size=16, kl_coef=0.5)
    if family.name != "maskable":  # the unsquashed Gaussian: its stored log_prob is the base distribution's
        kwargs["policy_kwargs"] = {**family.tiny.get("policy_kwargs", {}), "squash_output": False}
    model = family.model(n_envs, **kwargs)
    compared = []
    original = model.train

    def train():
        original()
        buffer = model.rollout_buffer  # flattened by the update
        old = distributions_from_parameters(buffer.distribution_kinds, [th.as_tensor(a) for a in buffer.old_distribution])
        actions = th.as_tensor(buffer.actions)
        log_prob = sum(
            dist.log_prob(actions).sum(-1) if isinstance(dist, Normal) else dist.log_prob(actions[:, column].long())
            for column, dist in enumerate(old)
        )
        th.testing.assert_close(log_prob, th.as_tensor(buffer.log_probs).flatten(), rtol=1e-5, atol=1e-5)
        compared.append(len(log_prob))

    model.train = train
    model.learn(32 * n_envs)
    assert compared == [16 * n_envs] * 2


class _Snapshot(BaseCallback):
    """Keeps the policy and the observations of every rollout, as they are before its update."""

    def __init__(self):
        super().__init__()
        self.snapshots = []

    def _on_rollout_end(self):
        self.snapshots.append((copy.deepcopy(self.model.policy), self.model.rollout_buffer.observations.copy()))

    def _on_step(self):
        return True


def test_logged_kl_is_analytic_kl_of_the_update():
    """train/kl equals KL(pi_old || pi_new) recomputed with torch.distributions from a snapshot."""
    model = PPOExt("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0), **TINY)
    model.set_logger(configure(None, []))
    snapshot = _Snapshot()
    model.learn(64, callback=snapshot)
    old_policy, observations = snapshot.snapshots[-1]
    obs = th.as_tensor(observations.reshape(-1, observations.shape[-1]))
    with th.no_grad():
        old = old_policy.get_distribution(obs).distribution
        new = model.policy.get_distribution(obs).distribution
        kl = kl_divergence(old, new).sum(-1)
    assert model.logger.name_to_value["train/kl"] == pytest.approx(kl.mean().item(), rel=1e-4)
    assert model.logger.name_to_value["train/kl_max"] == pytest.approx(kl.max().item(), rel=1e-4)


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_logged_kl_of_a_large_rollout_reads_every_kth_sample_without_the_penalty(kl_coef):
    """On a rollout of 4 x 1024 samples train/kl and kl_max are the analytic KL (torch.distributions, from a snapshot)
    over every 2nd sample (the buffer's env-major row order) without the penalty, and over all samples with it."""
    settings = dict(n_steps=1024, batch_size=1024, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[16]), kl_coef=kl_coef)
    model = PPOExt("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=4, seed=0), **settings)
    model.set_logger(configure(None, []))
    snapshot = _Snapshot()
    model.learn(4096, callback=snapshot)
    old_policy, observations = snapshot.snapshots[-1]
    rows = th.as_tensor(observations.swapaxes(0, 1).reshape(-1, observations.shape[-1]))
    obs = rows if kl_coef > 0 else rows[::2]
    with th.no_grad():
        kl = kl_divergence(old_policy.get_distribution(obs).distribution, model.policy.get_distribution(obs).distribution)
    kl = kl.sum(-1)
    assert len(kl) == (4096 if kl_coef > 0 else 2048)
    assert model.logger.name_to_value["train/kl"] == pytest.approx(kl.mean().item(), rel=1e-4)
    assert model.logger.name_to_value["train/kl_max"] == pytest.approx(kl.max().item(), rel=1e-4)


def test_target_kl_early_stop_is_reported():
    model = PPOExt(
        "MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=16, n_epochs=10, target_kl=1e-6, seed=0, learning_rate=1e-2
    )
    model.set_logger(configure(None, []))
    model.learn(64)
    assert model.logger.name_to_value["train/epochs_completed"] < 10


def test_diagnostic_means_are_sample_weighted():
    from sb3_ppo_ext.engine import _UpdateStats

    stats = _UpdateStats()
    stats.add(3, dict(loss=th.tensor(1.0), x=th.tensor(2.0), ratio=th.tensor([0.9, 1.1])))
    stats.add(1, dict(loss=th.tensor(5.0), x=th.tensor(6.0), ratio=th.tensor([0.8, 1.0])))
    assert stats.means() == pytest.approx(dict(loss=2.0, x=3.0))
    assert stats.ratio_extremes() == pytest.approx((0.8, 1.1))
    stats.add(4, dict(loss=th.tensor(0.0), x=th.tensor(0.0), ratio=th.tensor([1.2])))  # added after a read: counted
    assert stats.means() == pytest.approx(dict(loss=1.0, x=1.5))
    assert stats.ratio_extremes() == pytest.approx((0.8, 1.2))


@pytest.mark.parametrize("squash", [True, False])
def test_entropy_logged_without_grad_changes_neither_loss_nor_gradient(monkeypatch, squash):
    """With ent_coef == 0 the entropy is computed outside the graph: the same loss, gradient, entropy and RNG draws as
    computing it with its graph; with ent_coef > 0 the gradient is the ent_coef == 0 one minus ent_coef x grad(entropy)."""
    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0)
    model = PPOExt("MlpPolicy", env, **dict(TINY, policy_kwargs=dict(TINY["policy_kwargs"], squash_output=squash)))
    model.set_logger(configure(None, []))
    model.learn(64)
    next(model.rollout_buffer.get(batch_size=None))  # flattens the buffer
    index = th.arange(0, 64, 3)
    rollout = model.rollout_buffer._get_samples(index.numpy())
    batch = Minibatch(rollout, None)
    model.policy.set_training_mode(True)

    def losses_and_grads():
        model.policy.optimizer.zero_grad()
        th.manual_seed(7)
        terms = model.minibatch_losses(batch, 0.2, None, 0.0)
        terms["loss"].backward()
        grads = [p.grad.clone() for p in model.policy.parameters()]
        return terms, grads, th.get_rng_state()

    calls = []
    original = type(model.policy).evaluate_actions_and_distribution

    def spy(self, obs, actions, entropy_requires_grad=True, **kwargs):
        calls.append(entropy_requires_grad)
        return original(self, obs, actions, entropy_requires_grad=entropy_requires_grad, **kwargs)

    monkeypatch.setattr(type(model.policy), "evaluate_actions_and_distribution", spy)
    terms, grads, rng = losses_and_grads()
    assert calls == [False]

    def with_graph(self, obs, actions, entropy_requires_grad=True, **kwargs):
        return original(self, obs, actions, entropy_requires_grad=True, **kwargs)

    monkeypatch.setattr(type(model.policy), "evaluate_actions_and_distribution", with_graph)
    ref_terms, ref_grads, ref_rng = losses_and_grads()
    assert th.equal(th.get_rng_state(), ref_rng) and th.equal(rng, ref_rng)
    for key in ("loss", "entropy", "policy_gradient_loss", "value_loss"):
        assert th.equal(terms[key], ref_terms[key]), key
    for got, want in zip(grads, ref_grads, strict=True):
        assert th.equal(got, want)

    # ent_coef > 0: the entropy term's own gradient (same draws) is added.
    monkeypatch.setattr(type(model.policy), "evaluate_actions_and_distribution", spy)
    calls.clear()
    model.ent_coef = 0.1
    with_bonus_terms, with_bonus, _ = losses_and_grads()
    assert calls == [True]
    model.policy.optimizer.zero_grad()
    th.manual_seed(7)
    obs = rollout.observations
    _, log_prob, entropy, _ = original(model.policy, obs, rollout.actions)
    entropy_mean = -log_prob.mean() if entropy is None else entropy.mean()
    entropy_grads = th.autograd.grad(entropy_mean, list(model.policy.parameters()), allow_unused=True)
    assert th.allclose(with_bonus_terms["entropy"], ref_terms["entropy"])
    for got, base, ent in zip(with_bonus, grads, entropy_grads, strict=True):
        expected = base if ent is None else base - 0.1 * ent
        assert th.allclose(got, expected, atol=1e-6)


def test_non_finite_loss_raises_before_any_update(tmp_path):
    snapshots = []

    class Snapshot(BaseCallback):
        def _on_rollout_end(self):
            snapshots.append(copy.deepcopy(self.model.policy.state_dict()))
            self.model.save(tmp_path / f"ckpt_{len(snapshots)}.zip")

        def _on_step(self):
            return True

    model = PPOExt("MlpPolicy", BrokenRewardEnv(at=101), n_steps=32, batch_size=16, seed=0)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss .*No parameter was updated"):
        model.learn(320, callback=Snapshot())
    assert len(snapshots) >= 2
    for key, value in model.policy.state_dict().items():
        assert th.equal(value, snapshots[-1][key]), key
    checkpoint = PPOExt.load(tmp_path / f"ckpt_{len(snapshots)}.zip")
    actions, _ = checkpoint.predict(np.zeros((4, 3), dtype=np.float32))
    assert np.all(np.isfinite(actions))


def test_ppo1_mode_adapts_beta_once_per_update():
    model = PPOExt("MlpPolicy", "Pendulum-v1", clip_range=None, kl_coef=1.0, kl_target=0.01, **TINY)
    model.set_logger(configure(None, []))
    betas = []

    class Spy(BaseCallback):
        def _on_rollout_start(self):
            betas.append(self.model.current_kl_coef)

        def _on_step(self):
            # Within a rollout and across the minibatches of one update, beta never moves.
            assert self.model.current_kl_coef == betas[-1]
            return True

    model.learn(32 * 4, callback=Spy())
    ratios = [b / a for a, b in itertools.pairwise(betas)]
    assert all(r in (0.5, 1.0, 2.0) for r in ratios), ratios
    assert "train/clip_range" not in model.logger.name_to_value


def test_user_patches_and_torch_hooks_run_at_every_minibatch_step_as_under_upstream(family: Member, monkeypatch):
    """
    A class-level replacement of ``Adam.step``, a module-level replacement of ``clip_grad_norm_`` and torch's
    optimizer hooks (global and per optimizer) run once per minibatch step, as many times as under the upstream class.
    """
    member = family
    counts: dict[str, int] = {}

    def count(key: str) -> None:
        counts[key] = counts.get(key, 0) + 1

    adam_step, clip = th.optim.Adam.step, th.nn.utils.clip_grad_norm_

    def patched_step(self, *args, **kwargs):
        count("Adam.step")
        return adam_step(self, *args, **kwargs)

    def patched_clip(*args, **kwargs):
        count("clip_grad_norm_")
        return clip(*args, **kwargs)

    monkeypatch.setattr(th.optim.Adam, "step", patched_step)
    monkeypatch.setattr(th.nn.utils, "clip_grad_norm_", patched_clip)
    handle = register_optimizer_step_post_hook(lambda *_: count("global hook"))
    try:
        seen = []
        for algorithm in (member.upstream, member.algorithm):
            counts.clear()
            model = algorithm(member.policy, member.make_env(), **member.tiny)
            own = model.policy.optimizer.register_step_pre_hook(lambda *_: count("own hook"))
            model.learn(2 * model.n_steps * model.n_envs)
            own.remove()
            seen.append(dict(counts))
    finally:
        handle.remove()
    upstream, ext = seen
    assert upstream["Adam.step"] > 1
    assert ext == upstream
    assert set(ext) == {"Adam.step", "clip_grad_norm_", "global hook", "own hook"}


@pytest.mark.parametrize(
    "module, name",
    [("torch.optim.adam", "adam"), ("torch.nn.utils.clip_grad", "_get_total_norm")],
    ids=["functional_adam", "clip_total_norm"],
)
def test_a_patch_below_torchs_three_calls_runs_as_under_upstream(module, name, monkeypatch):
    """A user's replacement of a function that Adam.step or clip_grad_norm_ calls runs once per minibatch step, as upstream."""
    import importlib

    target = importlib.import_module(module)
    original, counts = getattr(target, name), []

    def patched(*args, **kwargs):
        counts.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, patched)
    seen = []
    for algorithm in (FAMILY["ppo"].upstream, FAMILY["ppo"].algorithm):
        counts.clear()
        model = algorithm("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=16, n_epochs=2, seed=0)
        model.learn(64)
        seen.append(len(counts))
    assert seen[0] == seen[1] == 8


def test_the_update_under_torchs_profiler_records_torchs_optimizer_scopes():
    """With torch's profiler on, the optimizer calls are torch's own (their profiling scopes are recorded)."""
    model = PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0)
    model.learn(64)  # Adam's state exists: the lean step would apply
    with th.profiler.profile(activities=[th.profiler.ProfilerActivity.CPU]) as profile:
        model.learn(64, reset_num_timesteps=False)
    names = {event.name for event in profile.events()}
    assert any("Adam.step" in name for name in names) and any("zero_grad" in name for name in names)
