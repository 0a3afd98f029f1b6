"""EnvPoolVecEnv: SB3's VecEnv semantics on EnvPool, checked against gymnasium's own envs and SB3's tools."""

from __future__ import annotations

import importlib.util
import sys

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.envpool import EnvPoolVecEnv

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11) or importlib.util.find_spec("envpool") is None,
    reason="EnvPool 1.2.5 has wheels for Linux x86-64 and Python >= 3.11 only",
)

TINY = dict(n_steps=32, batch_size=64, n_epochs=1, policy_kwargs=dict(net_arch=[16]), device="cpu")


def _step_both(pool: EnvPoolVecEnv, reference: DummyVecEnv, steps: int, seed: int = 0):
    """Step both with the same random float32 actions; yield (pool's step, reference's step) per step."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        actions = rng.uniform(-1, 1, (pool.num_envs, *pool.action_space.shape)).astype(np.float32)
        yield pool.step(actions), reference.step(actions)


def test_hopper_steps_resets_and_terminal_observations_match_gymnasium():
    pool = EnvPoolVecEnv("Hopper-v5", 2, seed=0, reset_noise_scale=0.0)
    reference = make_vec_env("Hopper-v5", n_envs=2, env_kwargs={"reset_noise_scale": 0.0})  # Monitor-wrapped, as SB3 makes it
    assert pool.observation_space == reference.observation_space and pool.action_space == reference.action_space
    np.testing.assert_array_equal(pool.reset(), reference.reset())
    ended = 0
    for (obs, rewards, dones, infos), (ref_obs, ref_rewards, ref_dones, ref_infos) in _step_both(pool, reference, 150):
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=1e-12)  # after a reset too: the reset observation
        np.testing.assert_allclose(rewards, ref_rewards, rtol=0, atol=1e-6)
        assert rewards.dtype == ref_rewards.dtype and np.array_equal(dones, ref_dones)
        for i in np.flatnonzero(dones):
            ended += 1
            info, ref_info = infos[i], ref_infos[i]
            np.testing.assert_allclose(info["terminal_observation"], ref_info["terminal_observation"], rtol=0, atol=1e-12)
            assert info["TimeLimit.truncated"] is ref_info["TimeLimit.truncated"] is False  # Hopper fell: terminated
            assert info["episode"]["l"] == ref_info["episode"]["l"]
            assert info["episode"]["r"] == pytest.approx(ref_info["episode"]["r"], abs=1e-6)
        # Every step is a step of the task: EnvPool's own reset step (elapsed_step 0, action ignored) never happens.
        assert all(info["elapsed_step"] >= 1 for info in infos)
    assert ended >= 2


def test_reacher_truncates_at_50_steps_and_the_next_step_is_real():
    pool = EnvPoolVecEnv("Reacher-v5", 3, seed=1)
    reference = make_vec_env("Reacher-v5", n_envs=3, seed=1)
    pool.reset(), reference.reset()
    lengths = []
    for step, ((obs, rewards, dones, infos), (_, _, ref_dones, ref_infos)) in enumerate(
        _step_both(pool, reference, 120), start=1
    ):
        assert np.array_equal(dones, ref_dones) and dones.all() == (step % 50 == 0)
        assert [info["elapsed_step"] for info in infos] == [(step - 1) % 50 + 1] * 3
        assert np.all(rewards < 0)  # a real reward (distance to the target) on every step, the first after a reset too
        for info, ref_info in zip(infos, ref_infos, strict=True):
            if "episode" in info:
                lengths.append(info["episode"]["l"])
                assert info["TimeLimit.truncated"] is ref_info["TimeLimit.truncated"] is True
                assert info["terminal_observation"].shape == (10,) and not np.array_equal(info["terminal_observation"], obs[0])
    assert lengths == [50] * 6


def test_seed_reseeds_at_the_next_reset():
    first, second = EnvPoolVecEnv("Hopper-v5", 2, seed=3), EnvPoolVecEnv("Hopper-v5", 2, seed=0)
    initial = second.reset()
    assert second.seed(3) == [3, 4]
    reseeded = second.reset()
    np.testing.assert_array_equal(reseeded, first.reset())
    assert not np.array_equal(initial, reseeded)
    for (obs, *_), (same, *_) in _step_both(first, second, 60):  # the same actions: the same trajectories
        np.testing.assert_array_equal(obs, same)
    # Env i is seeded seed + i, as SB3 seeds a DummyVecEnv: env 1 of seed 3 is env 0 of seed 4.
    seeded_4, seeded_3 = EnvPoolVecEnv("Hopper-v5", 1, seed=4), EnvPoolVecEnv("Hopper-v5", 2, seed=3)
    np.testing.assert_array_equal(seeded_4.reset()[0], seeded_3.reset()[1])
    # The seeds SB3 and rl-zoo3 draw (up to 2**32 - 1) are taken modulo 2**31 - 1 (EnvPool asserts int32 seeds).
    large = EnvPoolVecEnv("Hopper-v5", 2, seed=2**31 - 1 + 3)
    np.testing.assert_array_equal(large.reset(), EnvPoolVecEnv("Hopper-v5", 2, seed=3).reset())
    for seed in (2**32 - 2, None):  # None: a random seed, drawn as SB3 draws it
        large.seed(seed)
        assert large.reset().shape == (2, 11)


def test_alignment_per_task_as_the_guide_states_it():
    """docs/guide/envpool.md: Hopper-v5 and Walker2d-v5 follow gymnasium's to rounding; HalfCheetah-v5 and Ant-v5 drift."""
    from envpool_alignment import compare  # scripts/envpool_alignment.py

    for task in ("Hopper-v5", "Walker2d-v5"):
        result = compare(task, steps=200, num_envs=1, seed=0)
        assert result["done_mismatch"] is None and result["episodes"] >= 5 and result["obs"] < 1e-10, result
    for task in ("HalfCheetah-v5", "Ant-v5"):
        result = compare(task, steps=200, num_envs=1, seed=0)
        assert result["first_obs_step"] <= 100 and result["obs"] > 1.0, result


class _RealStepsOnly(BaseCallback):
    """Fails the run if a collected step is EnvPool's own reset step; counts the episodes in the logger's buffer."""

    def _on_step(self) -> bool:
        assert all(info["elapsed_step"] >= 1 for info in self.locals["infos"])
        return True


def test_ppo_ext_with_vec_normalize_eval_callback_save_load_and_set_env(tmp_path):
    env = VecNormalize(EnvPoolVecEnv("Hopper-v5", 4, seed=0))
    eval_env = VecNormalize(make_vec_env("Hopper-v5", n_envs=1, seed=100), training=False, norm_reward=False)
    evaluation = EvalCallback(eval_env, eval_freq=32, n_eval_episodes=2, log_path=str(tmp_path), warn=False, verbose=0)
    model = PPOExt("MlpPolicy", env, seed=0, **TINY)
    model.learn(256, callback=[_RealStepsOnly(), evaluation])
    assert model.num_timesteps == 256 and len(model.ep_info_buffer) > 0  # episode statistics without a Monitor
    assert evaluation.evaluations_timesteps == [128, 256] and np.isfinite(evaluation.best_mean_reward)
    assert eval_env.obs_rms.count == env.obs_rms.count  # EvalCallback synced the training statistics
    model.save(tmp_path / "model")
    env.save(str(tmp_path / "vecnormalize.pkl"))
    # Loaded onto gymnasium's env of the task (the spaces match) to act there; loaded onto a pool, swapped, trained on.
    gym_env = VecNormalize.load(str(tmp_path / "vecnormalize.pkl"), make_vec_env("Hopper-v5", n_envs=1))
    assert PPOExt.load(tmp_path / "model", env=gym_env, device="cpu").predict(gym_env.reset())[0].shape == (1, 3)
    stats = str(tmp_path / "vecnormalize.pkl")
    loaded = PPOExt.load(tmp_path / "model", env=VecNormalize.load(stats, EnvPoolVecEnv("Hopper-v5", 4)), device="cpu")
    loaded.set_env(VecNormalize.load(stats, EnvPoolVecEnv("Hopper-v5", 4, seed=1)))
    loaded.learn(128, reset_num_timesteps=False, callback=_RealStepsOnly())
    assert loaded.num_timesteps == 384


def test_vec_monitor_above_reports_the_same_episodes_once():
    pool = EnvPoolVecEnv("Hopper-v5", 2, seed=0)
    monitored = VecMonitor(EnvPoolVecEnv("Hopper-v5", 2, seed=0))
    pool.reset(), monitored.reset()
    episodes = 0
    for (_, _, dones, infos), (_, _, monitored_dones, monitored_infos) in _step_both(pool, monitored, 100):
        assert np.array_equal(dones, monitored_dones)
        for info, monitored_info in zip(infos, monitored_infos, strict=True):
            assert ("episode" in info) == ("episode" in monitored_info)
            if "episode" in info:  # VecMonitor's record replaces the pool's: one per episode, the same return and length
                episodes += 1
                assert monitored_info["episode"]["l"] == info["episode"]["l"]
                assert monitored_info["episode"]["r"] == pytest.approx(info["episode"]["r"], rel=1e-5)
    assert episodes >= 2


def test_what_envpool_cannot_do_is_an_error_naming_the_method():
    env = EnvPoolVecEnv("Hopper-v5", 2)
    assert env.render_mode is None and env.get_attr("render_mode") == [None, None]
    assert env.env_is_wrapped(gym.Wrapper) == [False, False] and not env.has_attr("action_masks")
    with pytest.raises(AttributeError, match=r"EnvPoolVecEnv\.get_attr\('spec'\)"):
        env.get_attr("spec")
    with pytest.raises(NotImplementedError, match=r"EnvPoolVecEnv\.env_method\('action_masks'\)"):
        env.env_method("action_masks")
    with pytest.raises(NotImplementedError, match=r"EnvPoolVecEnv\.set_attr\('x'\)"):
        env.set_attr("x", 1)
    with pytest.raises(NotImplementedError, match=r"EnvPoolVecEnv\.render"):
        env.render()
    with pytest.raises(NotImplementedError, match=r"EnvPoolVecEnv\.get_images"):
        env.get_images()
    env.set_options({"x": 1})
    with pytest.raises(NotImplementedError, match=r"EnvPoolVecEnv\.reset: EnvPool takes no reset options"):
        env.reset()
    with pytest.raises(ValueError, match=r"task='Hoper-v5' is not an EnvPool task"):
        EnvPoolVecEnv("Hoper-v5", 1)
    with pytest.raises(ValueError, match=r"num_envs=0 is invalid"):
        EnvPoolVecEnv("Hopper-v5", 0)
    with pytest.raises(ValueError, match=r"batch_size=1: EnvPoolVecEnv steps all envs together"):
        EnvPoolVecEnv("Hopper-v5", 2, batch_size=1)


def test_missing_envpool_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # what `import envpool` sees when it is not installed
    with pytest.raises(ImportError, match=r'^EnvPool is not installed: pip install "sb3-ppo-ext\[envpool\]"$'):
        EnvPoolVecEnv("Hopper-v5", 1)


# --- the rl-zoo3 route (in this process; the command lines are in tests/integration/test_zoo_envpool.py) ------------


def _manager(folder, **kwargs):
    """rl-zoo3's ExperimentManager for ppo_ext on Hopper-v5 with the shipped EnvPool entries (the package's subclass)."""
    import argparse

    import rl_zoo3.exp_manager

    from sb3_ppo_ext import zoo

    zoo.register()
    options = dict(config="sb3_ppo_ext.hyperparams.envpool", seed=3, verbose=0, **kwargs)
    return rl_zoo3.exp_manager.ExperimentManager(argparse.Namespace(), "ppo_ext", "Hopper-v5", str(folder), **options)


def test_zoo_trains_on_envpool_and_evaluates_on_gymnasium(tmp_path):
    from stable_baselines3.common.vec_env import unwrap_vec_normalize

    manager = _manager(tmp_path, hyperparams={"n_envs": 8}, eval_freq=64)
    model, saved = manager.setup_experiment()
    assert saved["env_backend"] == "envpool" and "env_backend" not in manager._hyperparams  # read, not passed to PPOExt
    training = model.get_env()
    assert isinstance(training, VecNormalize) and isinstance(training.venv, EnvPoolVecEnv) and training.num_envs == 8
    assert (model.n_steps, model.batch_size, model.policy.squash_output) == (64, 128, False)
    (evaluation,) = [callback for callback in manager.callbacks if isinstance(callback, EvalCallback)]
    assert isinstance(unwrap_vec_normalize(evaluation.eval_env).venv, DummyVecEnv)  # gymnasium's own Hopper-v5
    assert evaluation.eval_env.envs[0].unwrapped.__class__.__module__.startswith("gymnasium.envs.mujoco")
    # The pool is seeded with --seed, as rl-zoo3 seeds its DummyVecEnv: env i gets seed + i.
    seeded = EnvPoolVecEnv("Hopper-v5", 8, seed=3).reset()
    np.testing.assert_array_equal(training.venv.reset(), seeded)


def test_zoo_envpool_options_in_env_kwargs_reach_the_pool_only(tmp_path):
    """``--env-kwargs num_threads:1``: EnvPool's pool takes it; the gymnasium envs of evaluation and enjoy do not get it."""
    import rl_zoo3.utils

    manager = _manager(tmp_path, hyperparams={"n_envs": 8}, env_kwargs={"num_threads": 1, "reset_noise_scale": 0.0})
    model, saved = manager.setup_experiment()
    assert model.get_env().venv.num_threads == 1 and model.get_env().venv.make_kwargs == {"reset_noise_scale": 0.0}
    assert manager.eval_env_kwargs == {"reset_noise_scale": 0.0} and manager.env_kwargs["num_threads"] == 1
    (evaluation,) = [callback for callback in manager.callbacks if isinstance(callback, EvalCallback)]
    assert evaluation.eval_env.num_envs == 1
    kwargs = dict(n_envs=1, env_kwargs={"num_threads": 1}, should_render=False)
    assert rl_zoo3.utils.create_test_env("Hopper-v5", hyperparams=dict(saved), **kwargs).num_envs == 1  # enjoy's call
    with pytest.raises(TypeError, match="num_threads"):  # a gymnasium-trained run keeps rl-zoo3's behaviour
        rl_zoo3.utils.create_test_env("Hopper-v5", hyperparams={}, **kwargs)


def test_zoo_env_backend_gymnasium_runs_the_same_entry_on_gymnasium(tmp_path):
    manager = _manager(tmp_path, hyperparams={"n_envs": 8, "env_backend": "gymnasium"})
    model, saved = manager.setup_experiment()
    assert saved["env_backend"] == "gymnasium" and isinstance(model.get_env().venv, DummyVecEnv)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(hyperparams={"env_backend": "envpol"}),
            r"in -params: env_backend='envpol' is invalid: expected one of \('gymnasium', 'envpool'\)",
        ),
        (dict(vec_env_type="subproc"), r"--vec-env SubprocVecEnv does not apply to env_backend: envpool"),
        (
            dict(hyperparams={"env_wrapper": "gymnasium.wrappers.ClipAction"}),
            r"env_wrapper does not apply to env_backend: envpool",
        ),
    ],
)
def test_zoo_settings_envpool_cannot_take_are_errors(tmp_path, kwargs, message):
    from sb3_ppo_ext.zoo_support import ZooConfigError

    with pytest.raises(SystemExit, match=f"^error: .*{message}") as exit_info:  # the command ends with this line
        _manager(tmp_path / "logs", **kwargs).setup_experiment()
    assert isinstance(exit_info.value.__cause__, ZooConfigError)
    assert not (tmp_path / "logs").exists()  # found before rl-zoo3 made any folder


def test_zoo_missing_envpool_is_an_error_naming_the_extra_before_any_folder(tmp_path, monkeypatch: pytest.MonkeyPatch):
    from sb3_ppo_ext.zoo_support import ZooConfigError

    monkeypatch.setitem(sys.modules, "envpool", None)
    manager = _manager(tmp_path / "logs")
    with pytest.raises(
        SystemExit, match=r'^error: EnvPool is not installed: pip install "sb3-ppo-ext\[envpool\]" \(the Hopper-v5 entry'
    ) as exit_info:
        manager.setup_experiment()
    assert isinstance(exit_info.value.__cause__, ZooConfigError)
    assert not (tmp_path / "logs").exists()
