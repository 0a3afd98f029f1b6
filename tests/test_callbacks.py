"""The callback suite with stock PPO, A2C and PPOExt: KL-adaptive LR, schedules, guard, action monitor, pruning, hparams."""

import csv
import itertools
import math
import os
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import optuna
import pytest
import torch as th
from gymnasium import spaces
from helpers import TINY_ONE_BATCH, BrokenRewardEnv, modules_after_imports, pendulum_vec_env
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.logger import configure
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.callbacks import (
    ActionMonitor,
    HParamsCallback,
    KLAdaptiveLR,
    OptunaPruningCallback,
    ParameterSchedule,
    ParameterScheduler,
    TrainingHealthGuard,
    TrainingHealthWarning,
)
from sb3_ppo_ext.reliability import AtomicCheckpointCallback, resume

th.set_num_threads(1)

TINY = dict(n_steps=32, policy_kwargs=dict(net_arch=[16]), seed=0)
PPO_TINY = dict(TINY, batch_size=32, n_epochs=2)
PPO_ALGOS = [PPO, PPOExt]


def tiny(algo, **kwargs):
    return {**(TINY if algo is A2C else PPO_TINY), **kwargs}


def quiet(model):
    model.set_logger(configure(None, []))
    return model


class StepEnv(gym.Env):
    """1-D observations, Box(-2, 3) actions (asymmetric), reward -a^2; NaN observations from global step ``nan_after`` on."""

    def __init__(self, nan_after=None, reward=None, ep_length=8):
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Box(np.float32(-2.0), np.float32(3.0), shape=(2,), dtype=np.float32)
        self.nan_after, self.reward, self.ep_length = nan_after, reward, ep_length
        self.total_steps, self._t = 0, 0
        self.received = []

    def _obs(self):
        obs = self.observation_space.sample()
        if self.nan_after is not None and self.total_steps >= self.nan_after:
            obs[:] = np.nan
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self.received.append(np.array(action, dtype=np.float64, copy=True))
        self._t += 1
        self.total_steps += 1
        reward = self.reward if self.reward is not None else -float(np.sum(np.square(action)))
        return self._obs(), reward, False, self._t >= self.ep_length, {}


def optimizer_lr(model):
    return model.policy.optimizer.param_groups[0]["lr"]


def spy_updates(model, record):
    """Wrap ``model.train`` to call ``record(model)`` after every update."""
    original = model.train

    def train():
        original()
        record(model)

    model.train = train


# ---------------------------------------------------------------- KLAdaptiveLR


@pytest.mark.parametrize("algo", PPO_ALGOS)
@pytest.mark.parametrize("direction", ["down", "up"])
def test_kl_adaptive_lr_follows_measured_kl(algo, direction):
    # A tiny target makes every measured KL "too high", a huge one "too low".
    target = 1e-10 if direction == "down" else 10.0
    callback = KLAdaptiveLR(target_kl=target, lr_factor=2.0, min_lr=2e-4, max_lr=4e-3)
    model = quiet(algo("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, **tiny(algo)))
    seen = []
    spy_updates(model, lambda m: seen.append((optimizer_lr(m), m.logger.name_to_value.get("train/kl", None))))
    model.learn(5 * 32, callback=callback)
    used = [lr for lr, _ in seen]
    expected = (
        [max(1e-3 / 2**i, 2e-4) for i in range(5)] if direction == "down" else [min(1e-3 * 2**i, 4e-3) for i in range(5)]
    )
    np.testing.assert_allclose(used, expected)
    final = 2e-4 if direction == "down" else 4e-3
    assert optimizer_lr(model) == pytest.approx(final) == model.learning_rate
    # PPOExt's analytic KL is the one used when present.
    assert (seen[0][1] is not None) is (algo is PPOExt)


@pytest.mark.parametrize("algo", PPO_ALGOS)
def test_kl_adaptive_lr_direction_from_each_update(algo):
    """Each update's measured KL decides the next rate: down above 2x target, up below target/2, within bounds."""
    callback = KLAdaptiveLR(target_kl=2e-4, min_lr=1e-5, max_lr=3e-2)
    model = quiet(algo("MlpPolicy", "Pendulum-v1", learning_rate=1e-2, **tiny(algo)))
    key = "train/kl" if algo is PPOExt else "train/approx_kl"
    seen = []
    spy_updates(model, lambda m: seen.append((optimizer_lr(m), m.logger.name_to_value[key])))
    model.learn(6 * 32, callback=callback)
    for (lr, kl), (next_lr, _) in itertools.pairwise(seen):
        assert 1e-5 <= next_lr <= 3e-2
        if kl > 4e-4:
            assert next_lr == pytest.approx(max(lr / 1.5, 1e-5))
        elif kl < 1e-4:
            assert next_lr == pytest.approx(min(lr * 1.5, 3e-2))
        else:
            assert next_lr == pytest.approx(lr)


@pytest.mark.parametrize("algo", PPO_ALGOS)
def test_kl_adaptive_lr_survives_save_load(algo, tmp_path):
    model = quiet(algo("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, **tiny(algo)))
    model.learn(2 * 32, callback=KLAdaptiveLR(target_kl=1e-7, lr_factor=2.0, min_lr=1e-6))
    assert model.learning_rate == pytest.approx(1e-3 / 4)  # adapted after each of the two updates
    model.save(tmp_path / "model")
    loaded = algo.load(tmp_path / "model", env=model.get_env())
    assert loaded.learning_rate == pytest.approx(1e-3 / 4)
    assert loaded.lr_schedule(1.0) == pytest.approx(1e-3 / 4)
    assert optimizer_lr(loaded) == pytest.approx(1e-3 / 4)
    quiet(loaded)
    used = []
    spy_updates(loaded, lambda m: used.append(optimizer_lr(m)))
    loaded.learn(2 * 32, callback=KLAdaptiveLR(target_kl=1e-7, lr_factor=2.0, min_lr=1e-6), reset_num_timesteps=False)
    np.testing.assert_allclose(used, [1e-3 / 4, 1e-3 / 8])
    assert loaded.learning_rate == pytest.approx(1e-3 / 16)


def test_kl_adaptive_lr_needs_a_kl():
    model = quiet(A2C("MlpPolicy", "Pendulum-v1", **tiny(A2C)))
    with pytest.raises(ValueError, match="kl_key"):
        model.learn(2 * 32, callback=KLAdaptiveLR(target_kl=0.01))


# ---------------------------------------------------------------- ParameterScheduler


@pytest.mark.parametrize("algo", [PPO, PPOExt, A2C])
def test_scheduled_values_reach_the_algorithm(algo):
    total = 4 * 32
    schedules = {
        "ent_coef": {"kind": "linear", "start": 0.1, "end": 0.0},
        "vf_coef": {"kind": "step", "values": [0.5, 0.25], "boundaries": [64], "by": "timesteps"},
        "max_grad_norm": {"kind": "cosine", "start": 1.0, "end": 0.2},
        "learning_rate": {"kind": "piecewise", "points": [[0, 1e-3], [64, 1e-3], [128, 1e-4]], "by": "timesteps"},
    }
    if algo is not A2C:
        schedules["clip_range"] = {"kind": "piecewise", "points": [[0.0, 0.3], [1.0, 0.1]]}
        schedules["target_kl"] = {"kind": "constant", "value": 0.5}
        schedules["n_epochs"] = {"kind": "step", "values": [1, 2], "boundaries": [0.5]}
    if algo is PPOExt:
        schedules["clip_range_vf"] = {"kind": "linear", "start": 1.0, "end": 0.5}
    model = quiet(algo("MlpPolicy", "Pendulum-v1", max_grad_norm=1, **tiny(algo)))  # an int: values must not be rounded
    seen = []

    def record(m):
        values = {name: getattr(m, name) for name in schedules if name != "learning_rate"}
        values["learning_rate"] = m.lr_schedule(m._current_progress_remaining)
        seen.append((m.num_timesteps, m._current_progress_remaining, values))

    original = model.train
    applied = []
    model.train = lambda: (record(model), original(), applied.append(optimizer_lr(model)))
    model.learn(total, callback=ParameterScheduler(schedules))
    assert [steps for steps, _, _ in seen] == [32, 64, 96, 128]
    np.testing.assert_allclose(applied, [1e-3, 1e-3, 5.5e-4, 1e-4])  # the rate each update really used
    for steps, progress_remaining, values in seen:
        done = steps / total
        assert values["ent_coef"] == pytest.approx(0.1 * (1 - done))
        assert values["vf_coef"] == (0.5 if steps < 64 else 0.25)
        # train() sets the optimizer's rate from lr_schedule, which the scheduler made constant
        assert values["learning_rate"] == pytest.approx(1e-3 if steps <= 64 else 1e-3 - 9e-4 * (steps - 64) / 64)
        assert values["max_grad_norm"] == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * done)))
        if algo is not A2C:
            # clip_range stays a schedule, called by train() with the progress remaining it sees
            assert values["clip_range"](progress_remaining) == pytest.approx(0.3 - 0.2 * done)
            assert values["target_kl"] == 0.5
            assert values["n_epochs"] == (1 if done < 0.5 else 2) and isinstance(values["n_epochs"], int)
        if algo is PPOExt:
            assert values["clip_range_vf"](progress_remaining) == pytest.approx(1.0 - 0.5 * done)


def test_scheduled_values_are_logged(tmp_path):
    model = PPOExt("MlpPolicy", "Pendulum-v1", **PPO_TINY)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(3 * 32, callback=ParameterScheduler({"kl_target": {"kind": "linear", "start": 0.02, "end": 0.01}}))
    with open(tmp_path / "progress.csv") as file:
        rows = list(csv.DictReader(file))
    logged = [float(row["schedule/kl_target"]) for row in rows]
    assert logged == pytest.approx([0.02 - 0.01 * k / 3 for k in (1, 2, 3)])


# ---------------------------------------------------------------- TrainingHealthGuard


@pytest.mark.parametrize("algo", [PPO, PPOExt, A2C])
def test_guard_stops_on_nan_observations_and_leaves_a_loadable_checkpoint(algo, tmp_path):
    env = StepEnv(nan_after=70)
    guard = TrainingHealthGuard(save_path=str(tmp_path))
    model = quiet(algo("MlpPolicy", env, **tiny(algo)))
    with pytest.warns(TrainingHealthWarning, match="non-finite new_obs"):
        model.learn(10 * 32, callback=guard)
    assert guard.stopped_by == "non_finite"
    assert model.num_timesteps == 70  # stopped at the step that returned the first NaN observation
    assert all(th.isfinite(p).all() for p in model.policy.parameters())
    assert guard.checkpoint_path == os.path.join(str(tmp_path), "last_good_model_70_steps.zip")
    loaded = algo.load(guard.checkpoint_path)
    obs = np.zeros((4, 3), dtype=np.float32)
    actions, _ = loaded.predict(obs, deterministic=False)
    assert actions.shape == (4, 2) and np.isfinite(actions).all()


class TerminalNanEnv(StepEnv):
    """StepEnv whose last observation of each episode (the one DummyVecEnv keeps as ``terminal_observation``) is NaN."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return (np.full(3, np.nan, np.float32) if truncated else obs), reward, terminated, truncated, info


@pytest.mark.parametrize(
    "make_env, steps, message",
    [
        (lambda: StepEnv(nan_after=5), 5, "non-finite new_obs"),
        (lambda: StepEnv(reward=float("nan")), 1, "non-finite rewards"),
        (TerminalNanEnv, 8, "non-finite terminal observation"),
    ],
)
def test_guard_names_what_is_non_finite_at_the_step_it_comes(make_env, steps, message, tmp_path):
    guard = TrainingHealthGuard(save_path=str(tmp_path))
    model = quiet(PPOExt("MlpPolicy", make_env(), **PPO_TINY))
    with pytest.warns(TrainingHealthWarning, match=message):
        model.learn(64, callback=guard)
    assert model.num_timesteps == steps and [condition for _, condition, _ in guard.events] == ["non_finite"]


def test_guard_checkpoint_keeps_finite_vec_normalize_statistics(tmp_path):
    """The NaN observation reaches VecNormalize's running mean first; the saved statistics are the last good ones."""
    env = VecNormalize(DummyVecEnv([lambda: StepEnv(nan_after=70)]))
    guard = TrainingHealthGuard(save_path=str(tmp_path))
    model = quiet(PPOExt("MlpPolicy", env, **PPO_TINY))
    with pytest.warns(TrainingHealthWarning):
        model.learn(10 * 32, callback=guard)
    assert guard.stopped_by == "non_finite" and model.num_timesteps == 70
    assert np.isfinite(env.obs_rms.mean).all()
    stats = VecNormalize.load(guard.vec_normalize_path, DummyVecEnv([StepEnv]))
    # Statistics as of the last good update: the 1e-4 prior, the reset observation and 64 steps.
    assert np.isfinite(stats.obs_rms.mean).all() and stats.obs_rms.count == pytest.approx(1e-4 + 1 + 64)
    loaded = PPOExt.load(guard.checkpoint_path)
    actions, _ = loaded.predict(stats.normalize_obs(np.zeros((1, 3), dtype=np.float32)))
    assert np.isfinite(actions).all()


@pytest.mark.parametrize("algo", PPO_ALGOS)
def test_guard_never_saves_non_finite_weights_and_a_checkpoint_keeps_the_state_before_the_update(algo, tmp_path):
    """An update that leaves NaN weights: the guard raises and saves nothing; AtomicCheckpointCallback(save_freq=n_steps)
    beside it holds the state from before that update."""
    model = quiet(algo("MlpPolicy", StepEnv(), **tiny(algo)))
    snapshots = []

    def poison(m):
        snapshots.append([p.detach().clone() for p in m.policy.parameters()])
        if len(snapshots) == 2:
            with th.no_grad():
                next(m.policy.parameters()).fill_(float("nan"))

    spy_updates(model, poison)
    guard = TrainingHealthGuard(save_path=str(tmp_path / "guard"))
    checkpoints = AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path / "checkpoints"))
    with (
        pytest.warns(TrainingHealthWarning, match="non-finite policy parameters"),
        pytest.raises(FloatingPointError, match=r"at 64 steps: non-finite weights .* nothing to save .*AtomicCheckpoint"),
    ):
        model.learn(10 * 32, callback=[checkpoints, guard])
    assert guard.stopped_by == "non_finite" and guard.checkpoint_path is None and not (tmp_path / "guard").exists()
    before = resume(algo, tmp_path / "checkpoints", DummyVecEnv([StepEnv]))
    assert before.num_timesteps == 64
    for restored, good in zip(before.policy.parameters(), snapshots[0], strict=True):
        assert th.equal(restored, good)


@pytest.mark.parametrize("algo", PPO_ALGOS)
def test_guard_conditions_log_warn_and_stop(algo, tmp_path):
    guard = TrainingHealthGuard(
        responses={"kl": "log", "clip_fraction": "warn", "entropy": "stop"},
        kl_target=1e-9,
        kl_limit=2.0,
        max_clip_fraction=1e-9,
        min_entropy=1e6,
        save_path=str(tmp_path),
    )
    # Ten epochs of 8-sample minibatches: the first update already clips. With 2 epochs of one 32-sample minibatch
    # its clip fraction is 0 when this test runs alone (it passed only after some other tests of this file).
    model = quiet(algo("MlpPolicy", "Pendulum-v1", learning_rate=3e-3, **tiny(algo, batch_size=8, n_epochs=10)))
    initial = [p.detach().clone() for p in model.policy.parameters()]
    with pytest.warns(TrainingHealthWarning) as caught:
        model.learn(5 * 32, callback=guard)
    conditions = [condition for _, condition, _ in guard.events]
    assert conditions == ["kl", "entropy", "clip_fraction"]  # the update's checks, in their order
    assert {type(w.message) for w in caught} == {TrainingHealthWarning}
    assert len(caught) == 2  # "log" only logs
    assert guard.stopped_by == "entropy"
    # The first update's entropy already "collapsed": the model saved is the one that update left.
    saved = algo.load(guard.checkpoint_path).policy.parameters()
    assert all(th.equal(p, q) for p, q in zip(saved, model.policy.parameters(), strict=True))
    assert not all(th.equal(p, q) for p, q in zip(model.policy.parameters(), initial, strict=True))


def test_guard_value_loss_explosion():
    guard = TrainingHealthGuard(value_loss_factor=1.5, value_loss_window=2, responses={"value_loss": "log"})
    model = quiet(PPO("MlpPolicy", StepEnv(), **PPO_TINY))
    losses = iter([1.0, 1.2, 5.0, 1.0])
    spy_updates(model, lambda m: m.logger.record("train/value_loss", next(losses)))
    model.learn(4 * 32, callback=guard)
    # Flagged after the third update: 5.0 > 1.5 x mean(1.0, 1.2)
    assert [(steps, condition) for steps, condition, _ in guard.events] == [(3 * 32, "value_loss")]


# ---------------------------------------------------------------- ActionMonitor


def test_action_monitor_scripted_rollout():
    """Statistics of a scripted sequence of env actions against a hand count."""
    model = quiet(PPO("MlpPolicy", StepEnv(), **PPO_TINY))
    monitor = ActionMonitor(bound_tolerance=0.01)  # within 0.05 of a bound (range 5)
    monitor.init_callback(model)
    script = np.array([[-2.0, 3.0], [-1.96, 0.0], [2.96, 2.94], [0.0, -2.0], [3.0, 1.0]])
    monitor.on_rollout_start()
    for action in script:
        monitor.update_locals({"clipped_actions": action[None], "actions": action[None]})
        monitor.on_step()
    monitor.on_rollout_end()
    logged = model.logger.name_to_value
    # dim 0 at low: -2.0, -1.96; at high: 2.96, 3.0 | dim 1 at low: -2.0; at high: 3.0
    assert logged["actions/at_low_0"] == 2 / 5 and logged["actions/at_high_0"] == 2 / 5
    assert logged["actions/at_bounds_0"] == 4 / 5 and logged["actions/at_bounds_1"] == 2 / 5
    assert logged["actions/at_bounds"] == 6 / 10
    assert logged["actions/mean_1"] == pytest.approx(script[:, 1].mean())
    assert logged["actions/std_0"] == pytest.approx(script[:, 0].std())
    assert (logged["actions/min_0"], logged["actions/max_1"]) == (-2.0, 3.0)
    assert not any("pre_squash" in key for key in logged)


@pytest.mark.parametrize("algo", [PPO, PPOExt, A2C])
def test_action_monitor_matches_the_actions_the_env_received(algo, tmp_path):
    env = StepEnv()
    monitor = ActionMonitor()
    model = algo("MlpPolicy", env, **tiny(algo, policy_kwargs=dict(net_arch=[16], log_std_init=1.5)))
    model.set_logger(configure(str(tmp_path), ["tensorboard"]))
    model.learn(32, callback=monitor)
    received = np.array(env.received)
    assert received.shape == (32, 2)
    low, high = env.action_space.low, env.action_space.high
    margin = 0.005 * (high - low)
    at_bounds = ((received <= low + margin) | (received >= high - margin)).mean(axis=0)
    np.testing.assert_allclose(monitor.last_stats["at_bounds"], at_bounds)
    assert at_bounds.max() > 0.1  # a wide Gaussian hits the bounds often
    np.testing.assert_allclose(monitor.last_stats["mean"], received.mean(axis=0), rtol=1e-6)
    squashed = algo is PPOExt
    assert ("pre_squash_mean" in monitor.last_stats) is squashed
    if squashed:  # the buffer's pre-squash samples reach far beyond the bounds' [-1, 1] image
        stored = model.rollout_buffer.actions.reshape(-1, 2)
        np.testing.assert_allclose(monitor.last_stats["pre_squash_max"], stored.max(axis=0), rtol=1e-6)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0}).Reload()
    assert {"actions/dim_0", "actions/dim_1"} <= set(events.Tags()["histograms"])
    assert ("actions/pre_squash_dim_0" in events.Tags()["histograms"]) is squashed


def test_action_monitor_rejects_discrete_actions():
    model = quiet(PPO("MlpPolicy", "CartPole-v1", **PPO_TINY))
    with pytest.raises(ValueError, match="Box action space"):
        model.learn(32, callback=ActionMonitor())


# ---------------------------------------------------------------- OptunaPruningCallback


def test_bad_trial_is_pruned_by_median_pruner():
    def objective(trial):
        reward = trial.suggest_float("reward", -1.0, 1.0)
        model = quiet(PPO("MlpPolicy", StepEnv(reward=0.0), **PPO_TINY))
        callback = OptunaPruningCallback(trial, Monitor(StepEnv(reward=reward)), n_eval_episodes=1, eval_freq=16)
        model.learn(4 * 32, callback=callback)
        if callback.is_pruned:
            raise optuna.TrialPruned()
        return callback.last_mean_reward

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=2))
    for reward in (1.0, 0.5, -1.0):
        study.enqueue_trial({"reward": reward})
    study.optimize(objective, n_trials=3)
    states = [trial.state for trial in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.PRUNED]
    assert study.trials[2].last_step == 1  # pruned at its first evaluation


def test_pruning_can_raise():
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(lower=0.0))
    trial = study.ask()
    model = quiet(PPO("MlpPolicy", StepEnv(), **PPO_TINY))
    callback = OptunaPruningCallback(trial, Monitor(StepEnv(reward=-1.0)), n_eval_episodes=1, eval_freq=16, raise_pruned=True)
    with pytest.raises(optuna.TrialPruned):
        model.learn(64, callback=CallbackList([callback]))
    assert callback.is_pruned and model.num_timesteps == 16


# ---------------------------------------------------------------- HParamsCallback


def test_hparams_written_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    model = PPOExt("MlpPolicy", StepEnv(), kl_coef=1.0, kl_target=0.02, **PPO_TINY)
    model.set_logger(configure(str(tmp_path), ["tensorboard"]))
    # Placed first, it must not hide the last update's records from the callbacks after it.
    guard = TrainingHealthGuard(kl_target=1e-12, kl_limit=1.0, responses={"kl": "log"})
    model.learn(2 * 32, callback=CallbackList([HParamsCallback(extra_hparams={"env_id": "StepEnv"}), guard]))
    assert [(steps, condition) for steps, condition, _ in guard.events] == [(32, "kl"), (64, "kl")]
    events = EventAccumulator(str(tmp_path)).Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hparams = {
        name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind")) for name, value in start.hparams.items()
    }
    assert hparams["algo"] == "PPOExt" and hparams["env_id"] == "StepEnv"
    assert hparams["n_steps"] == 32 and hparams["kl_target"] == pytest.approx(0.02) and hparams["clip_range"] == 0.2
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {info.name.tag for info in experiment.metric_infos} == {
        "rollout/ep_rew_mean",
        "rollout/ep_len_mean",
        "train/value_loss",
    }
    # The final metrics are written at the last step: the last update's value loss included.
    value_loss = events.Scalars("train/value_loss")
    assert value_loss[-1].step == 64 and np.isfinite(value_loss[-1].value)
    assert events.Scalars("rollout/ep_len_mean")[-1].value == 8


def test_hparams_without_a_tensorboard_logger_warns_and_writes_nothing(tmp_path):
    from sb3_ppo_ext.callbacks import HParamsWarning

    model = PPOExt("MlpPolicy", StepEnv(), **PPO_TINY)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    with pytest.warns(HParamsWarning, match=r"no TensorBoard logger.*tensorboard_log"):
        model.learn(32, callback=HParamsCallback())
    assert not list(tmp_path.glob("events.out.tfevents*"))
    with_tensorboard = PPOExt("MlpPolicy", StepEnv(), **PPO_TINY)
    with_tensorboard.set_logger(configure(str(tmp_path / "tb"), ["tensorboard"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HParamsWarning)
        with_tensorboard.learn(32, callback=HParamsCallback())


# ---------------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: KLAdaptiveLR(target_kl=0.0), "target_kl"),
        (lambda: KLAdaptiveLR(target_kl=0.01, kl_factor=1.0), "kl_factor"),
        (lambda: KLAdaptiveLR(target_kl=0.01, lr_factor=0.5), "lr_factor"),
        (lambda: KLAdaptiveLR(target_kl=0.01, min_lr=-1.0), "min_lr"),
        (lambda: KLAdaptiveLR(target_kl=0.01, min_lr=1e-3, max_lr=1e-4), "max_lr"),
        (lambda: KLAdaptiveLR(target_kl="0.01"), "target_kl"),
        (lambda: ParameterSchedule("exponential"), "kind"),
        (lambda: ParameterSchedule("linear", start=1.0), "start"),
        (lambda: ParameterSchedule("linear", start=1.0, end=0.0, by="timesteps"), "finish"),
        (lambda: ParameterSchedule("linear", start=1.0, end=0.0, begin=0.5, finish=0.5), "finish"),
        (lambda: ParameterSchedule("step", values=[1.0], boundaries=[0.5]), "values"),
        (lambda: ParameterSchedule("step", values=[1.0, 2.0, 3.0], boundaries=[0.5, 0.2]), "boundaries"),
        (lambda: ParameterSchedule("piecewise", points=[[0.0, 1.0], [0.0, 2.0]]), "points"),
        (lambda: ParameterSchedule("constant", value=1.0, start=2.0), "start"),
        (lambda: ParameterScheduler({}), "schedules"),
        (lambda: ParameterScheduler({"ent_coef": {"start": 1.0}}), "kind"),
        (lambda: ParameterScheduler({"ent_coef": {"kind": "linear", "start": 1, "end": 0, "speed": 2}}), "speed"),
        (lambda: TrainingHealthGuard(responses={"kl": "explode"}), "responses"),
        (lambda: TrainingHealthGuard(responses={"nan": "stop"}), "responses key"),
        (lambda: TrainingHealthGuard(kl_limit=0.0), "kl_limit"),
        (lambda: TrainingHealthGuard(max_clip_fraction=1.5), "max_clip_fraction"),
        (lambda: TrainingHealthGuard(value_loss_factor=0.5), "value_loss_factor"),
        (lambda: TrainingHealthGuard(value_loss_window=0), "value_loss_window"),
        (lambda: ActionMonitor(bound_tolerance=0.5), "bound_tolerance"),
        (lambda: OptunaPruningCallback(object(), StepEnv()), "trial"),
        (lambda: OptunaPruningCallback(optuna.create_study().ask(), StepEnv(), eval_freq=0), "eval_freq"),
        (lambda: HParamsCallback(metrics=[]), "metrics"),
        (lambda: HParamsCallback(hparams="gamma"), "hparams"),
    ],
)
def test_bad_configuration_is_a_value_error_naming_the_parameter(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_scheduling_an_unknown_attribute_fails_at_init():
    model = quiet(PPO("MlpPolicy", "Pendulum-v1", **PPO_TINY))
    with pytest.raises(ValueError, match="kl_target"):
        model.learn(32, callback=ParameterScheduler({"kl_target": {"kind": "constant", "value": 0.01}}))


def test_import_does_not_import_optuna():
    loaded = modules_after_imports()["sb3_ppo_ext.callbacks"]
    assert "sb3_ppo_ext.callbacks" in loaded and "optuna" not in loaded


# ---------------------------------------------------------------- rl-zoo3


@pytest.mark.parametrize(
    "name, schedule, message",
    [
        ("clip_range", {"kind": "linear", "start": 0.2, "end": -0.1}, r"clip_range=-0\.1; clip_range: expected .* > 0"),
        ("learning_rate", {"kind": "step", "values": [3e-4, 0.0], "boundaries": [0.5]}, r"learning_rate=0\.0; .* > 0"),
        ("n_epochs", {"kind": "linear", "start": 10, "end": 0.4}, r"n_epochs=0\.4; .*>= 1 \(after rounding"),
        ("kl_target", {"kind": "piecewise", "points": [[0.0, 0.01], [1.0, -0.01]]}, r"kl_target=-0\.01"),
        ("gamma", {"kind": "constant", "value": 1.5}, r"gamma=1\.5; .*<= 1"),
    ],
)
def test_parameter_scheduler_rejects_a_schedule_that_leaves_the_range(name: str, schedule: dict, message: str):
    from sb3_ppo_ext.callbacks import ParameterScheduler

    with pytest.raises(ValueError, match=rf"schedules\['{name}'\]=ParameterSchedule\(.*\) is invalid: it would set {message}"):
        ParameterScheduler({name: schedule})
    ParameterScheduler({"ent_coef": {"kind": "linear", "start": 0.01, "end": -0.01}})  # unbounded attributes pass


def test_parameter_scheduler_checks_a_callable_schedule_when_it_applies_it():
    from sb3_ppo_ext.callbacks import ParameterScheduler

    model = PPOExt("MlpPolicy", pendulum_vec_env(), **TINY_ONE_BATCH)
    scheduler = ParameterScheduler({"clip_range": lambda progress_remaining: 0.2 if progress_remaining > 0.5 else -0.1})
    with pytest.raises(
        ValueError, match=r"schedules\['clip_range'\] gives clip_range=-0\.1 at 64 steps; clip_range: expected"
    ):
        model.learn(96, callback=scheduler)


@pytest.mark.parametrize("algorithm", [PPOExt, PPO])
def test_health_guard_stops_before_overflowing_rewards_reach_an_update(tmp_path: Path, algorithm):
    from sb3_ppo_ext.callbacks import TrainingHealthGuard, TrainingHealthWarning

    model = algorithm("MlpPolicy", DummyVecEnv([lambda: BrokenRewardEnv(at=10**9, reward=1e30)]), **TINY_ONE_BATCH)
    model.learn(64)
    good = [p.detach().clone() for p in model.policy.parameters()]
    model.set_env(DummyVecEnv([lambda: BrokenRewardEnv(at=6, reward=1e30)]))
    guard = TrainingHealthGuard(save_path=str(tmp_path))
    with pytest.warns(TrainingHealthWarning, match=r"rewards up to 1e\+30 .* overflow the update"):
        model.learn(128, callback=guard, reset_num_timesteps=False)
    assert guard.stopped_by == "non_finite" and model.num_timesteps == 70
    saved = algorithm.load(guard.checkpoint_path, device="cpu")
    assert all(th.equal(p, q) for p, q in zip(saved.policy.parameters(), good, strict=True))


def test_health_guard_stop_saves_one_state_and_a_checkpoint_keeps_the_one_before(tmp_path: Path):
    """A stop after an update (here the KL check) saves weights, beta and rate of that one state; the checkpoint of
    AtomicCheckpointCallback(save_freq=n_steps) before it has the state from before that update."""
    model = PPOExt("MlpPolicy", pendulum_vec_env(), kl_coef=1.0, kl_target=1e-9, **TINY_ONE_BATCH)
    guard = TrainingHealthGuard(responses={"kl": "stop"}, kl_target=1e-9, kl_limit=1.0, save_path=str(tmp_path / "guard"))
    checkpoints = AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path / "checkpoints"))
    with pytest.warns(TrainingHealthWarning, match="train/kl"):
        model.learn(128, callback=[checkpoints, guard])
    assert guard.stopped_by == "kl" and model.current_kl_coef != 1.0  # the flagged update adapted beta
    saved = PPOExt.load(guard.checkpoint_path, device="cpu")
    assert (saved.current_kl_coef, saved.learning_rate) == (model.current_kl_coef, model.learning_rate)
    assert all(th.equal(p, q) for p, q in zip(saved.policy.parameters(), model.policy.parameters(), strict=True))
    before = resume(PPOExt, tmp_path / "checkpoints", pendulum_vec_env(), device="cpu")
    assert before.num_timesteps == 32 and before.current_kl_coef == 1.0


def test_parameter_scheduler_sets_the_beta_of_a_fixed_penalty_and_refuses_an_adaptive_one():
    from sb3_ppo_ext.callbacks import ParameterScheduler

    model = PPOExt("MlpPolicy", pendulum_vec_env(), kl_coef=1.0, **TINY_ONE_BATCH)
    model.set_logger(configure(None, []))
    model.learn(64, callback=ParameterScheduler({"kl_coef": {"kind": "constant", "value": 0.25}}))
    assert model.logger.name_to_value["train/kl_coef"] == 0.25 and model.current_kl_coef == 0.25
    adaptive = PPOExt("MlpPolicy", pendulum_vec_env(), kl_coef=1.0, kl_target=0.01, **TINY_ONE_BATCH)
    with pytest.raises(ValueError, match=r"schedules\['kl_coef'\] is invalid with kl_target=0\.01: .*schedule kl_target"):
        adaptive.learn(64, callback=ParameterScheduler({"kl_coef": {"kind": "constant", "value": 0.25}}))
