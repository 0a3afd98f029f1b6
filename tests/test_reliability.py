"""Fault tolerance in one process: atomic saves, corrupt / foreign model files, bad hyperparameter files, hostile envs.

The tests that kill real processes are in ``integration/test_reliability_crash.py``.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import threading
import warnings
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import REPO_ROOT, TINY_ONE_BATCH, BrokenRewardEnv, modules_after_imports, pendulum_vec_env
from stable_baselines3 import A2C, PPO, SAC
from stable_baselines3.common import save_util
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ppo_ext import NonFiniteLossError, PPOExt
from sb3_ppo_ext.hyperparams import load_hyperparams
from sb3_ppo_ext.reliability import (
    TEMPORARY_PREFIX,
    AtomicCheckpointCallback,
    CheckpointWarning,
    ForeignModelFileError,
    ModelFileError,
    atomic_path,
    check_model_file,
    latest_checkpoint,
    list_checkpoints,
    resume,
)
from sb3_ppo_ext.validation import InvalidSettingError
from sb3_ppo_ext.zoo_support import ZooConfigError, check_hyperparams

th.set_num_threads(1)


def _model(env_id: str = "Pendulum-v1", **kwargs) -> PPOExt:
    return PPOExt("MlpPolicy", DummyVecEnv([lambda: gym.make(env_id)]), **{**TINY_ONE_BATCH, **kwargs})


def _params(model) -> list[np.ndarray]:
    return [p.detach().cpu().numpy().copy() for p in model.policy.parameters()]


def _same_params(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(_params(a), _params(b), strict=True))


# --- atomic saves ------------------------------------------------------------------------------


def test_interrupted_save_keeps_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An exception in the middle of writing the zip (after some members) leaves the old file loadable and no temp file."""
    model = _model()
    path = tmp_path / "model.zip"
    model.save(path)
    good = path.read_bytes()
    model.learn(32)  # different weights from here on

    original = save_util.th.save
    calls = []

    def failing_save(obj, file, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # pytorch_variables already written, policy.pth half-written
            file.write(b"partial")
            raise OSError("disk full (simulated)")
        return original(obj, file, *args, **kwargs)

    monkeypatch.setattr(save_util.th, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        model.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.zip"]
    PPOExt.load(path, device="cpu").predict(np.zeros(3, dtype=np.float32))


def test_save_appends_zip_and_accepts_file_objects(tmp_path: Path):
    model = _model()
    model.save(str(tmp_path / "a"))
    with open(tmp_path / "b.zip", "wb") as file:
        model.save(file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zip", "b.zip"]
    for name in ("a", "b.zip"):
        assert _same_params(PPOExt.load(tmp_path / name, device="cpu"), model)


class RecordingCheckpoints(AtomicCheckpointCallback):
    """Records, at each checkpoint, what a resume must restore."""

    def save_checkpoint(self):
        path = super().save_checkpoint()
        vec_normalize = self.model.get_vec_normalize_env()
        self.saved = dict(
            timesteps=self.model.num_timesteps,
            kl_coef=self.model.current_kl_coef,
            learning_rate=self.model.learning_rate,
            obs_mean=vec_normalize.obs_rms.mean.copy(),
            params=_params(self.model),
        )
        return path


def test_atomic_checkpoints_with_vecnormalize_resume(tmp_path: Path):
    """Checkpoints (statistics before model), keep_last, then resume(): steps, beta, LR, VecNormalize, weights."""
    from sb3_ppo_ext.callbacks import KLAdaptiveLR

    env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    model = PPOExt("MlpPolicy", env, kl_coef=1.0, kl_target=1e-6, learning_rate=3e-4, **TINY_ONE_BATCH)
    callback = RecordingCheckpoints(save_freq=32, save_path=str(tmp_path), keep_last=2)
    model.learn(96, callback=[KLAdaptiveLR(target_kl=1e-6), callback])
    checkpoints = list_checkpoints(tmp_path)
    assert [c.timesteps for c in checkpoints] == [64, 96]
    assert all(c.vec_normalize_path is not None for c in checkpoints)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    saved = callback.saved
    assert saved["kl_coef"] != 1.0 and saved["learning_rate"] != 3e-4  # both adapted before the last checkpoint

    loaded = resume(PPOExt, tmp_path, DummyVecEnv([lambda: gym.make("Pendulum-v1")]), device="cpu")
    assert loaded.num_timesteps == saved["timesteps"] == 96
    assert loaded.current_kl_coef == saved["kl_coef"] and loaded.learning_rate == saved["learning_rate"]
    assert all(np.array_equal(x, y) for x, y in zip(_params(loaded), saved["params"], strict=True))
    stats = loaded.get_vec_normalize_env()
    assert stats is not None and np.array_equal(stats.obs_rms.mean, saved["obs_mean"])
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded.num_timesteps == 128


def test_resume_without_checkpoint_is_clear(tmp_path: Path):
    assert latest_checkpoint(tmp_path / "missing") is None
    with pytest.raises(FileNotFoundError, match=r"no checkpoint rl_model_<steps>_steps\.zip"):
        resume(PPOExt, tmp_path, DummyVecEnv([lambda: gym.make("Pendulum-v1")]))


@pytest.mark.parametrize("keep_last", [0, "2", 1.5])
def test_keep_last_is_checked(keep_last):
    """A string or a float was a TypeError or accepted; each is an InvalidSettingError naming the value."""
    from sb3_ppo_ext.validation import InvalidSettingError

    with pytest.raises(InvalidSettingError, match=f"keep_last={keep_last!r} is invalid: expected an int >= 1"):
        AtomicCheckpointCallback(1, "x", keep_last=keep_last)


# --- corrupt and foreign model files -----------------------------------------------------------


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "model.zip"
    _model().save(path)
    return path


def _corrupt(source: Path, target: Path, how: str) -> Path:
    data = source.read_bytes()
    if how == "truncated":
        target.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        target.write_bytes(b"")
    elif how == "not_a_zip":
        target.write_text("this is a text file, not a model\n")
    elif how == "flipped_byte":
        with zipfile.ZipFile(source) as archive:
            info = archive.getinfo("policy.pth")
        offset = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size // 2
        target.write_bytes(data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1 :])
    elif how == "not_a_model":
        with zipfile.ZipFile(target, "w") as archive:
            archive.writestr("readme.txt", "hello")
    elif how == "bad_data_json":
        with zipfile.ZipFile(source) as archive, zipfile.ZipFile(target, "w") as out:
            for name in archive.namelist():
                out.writestr(name, b"{not json" if name == "data" else archive.read(name))
    return target


@pytest.mark.parametrize(
    "how, message",
    [
        ("truncated", "is truncated or corrupt"),
        ("empty", r"is empty \(0 bytes\)"),
        ("not_a_zip", "is not a valid zip archive"),
        ("flipped_byte", "is corrupt: member 'policy.pth' fails its CRC check"),
        ("not_a_model", "is a zip archive but not a Stable-Baselines3 model"),
        ("bad_data_json", "has a corrupt 'data' member"),
    ],
)
def test_corrupt_model_file_is_a_clear_error(saved_model: Path, tmp_path: Path, how: str, message: str):
    broken = _corrupt(saved_model, tmp_path / f"{how}.zip", how)
    with pytest.raises(ModelFileError, match=rf"PPOExt\.load: .*{re.escape(str(broken))}.* {message}"):
        PPOExt.load(broken, device="cpu")


def test_missing_model_file_names_both_paths(tmp_path: Path):
    with pytest.raises(ModelFileError, match=r"nowhere does not exist \(nor .*nowhere\.zip\)"):
        PPOExt.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "algorithm, saved_by",
    [(A2C, "another on-policy algorithm"), (SAC, "SAC")],
)
def test_model_of_another_algorithm_is_a_clear_error(tmp_path: Path, algorithm, saved_by: str):
    extra = {"buffer_size": 64} if algorithm is SAC else {}
    path = tmp_path / "other.zip"
    algorithm("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[8]), device="cpu", **extra).save(path)
    expected = rf"{re.escape(str(path))} was saved by {saved_by}.*not by the PPO family that PPOExt loads"
    with pytest.raises(ModelFileError, match=expected):
        PPOExt.load(path, device="cpu")


def test_stock_ppo_file_loads_into_ppo_ext(tmp_path: Path):
    """Decision: a stock PPO file loads (its stock policy, PPOExt's extras at their defaults) and trains on."""
    stock = PPO("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, policy_kwargs=dict(net_arch=[8]), device="cpu")
    stock.save(tmp_path / "stock.zip")
    model = PPOExt.load(tmp_path / "stock.zip", env=DummyVecEnv([lambda: gym.make("Pendulum-v1")]), device="cpu")
    assert type(model.policy) is type(stock.policy) and model.kl_coef == 0.0 and model.vf_clip_mode == "clipped"
    assert _same_params(model, stock)
    model.learn(32)


def test_check_model_file_accepts_good_file(saved_model: Path):
    assert check_model_file(saved_model.with_suffix(""), "PPOExt", {"PPO"}) == saved_model


# --- observation / action spaces that change between save and load ------------------------------


def test_observation_space_change_between_save_and_load(saved_model: Path):
    """Pendulum (3 obs) saved; MountainCarContinuous (2 obs) given at load: a ModelFileError naming file and spaces."""
    env = DummyVecEnv([lambda: gym.make("MountainCarContinuous-v0")])
    with pytest.raises(ModelFileError, match=rf"{re.escape(str(saved_model))} does not fit the given env: Observation spaces"):
        PPOExt.load(saved_model, env=env, device="cpu")
    model = PPOExt.load(saved_model, device="cpu")
    with pytest.raises(ValueError, match="Observation spaces do not match"):
        model.set_env(env)


# --- hyperparameter files ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("Pendulum-v1:\n  n_epochs: ten\n", r"n_epochs='ten' is invalid: expected an int >= 1"),
        ("Pendulum-v1:\n  n_steps: 64.5\n", r"n_steps=64\.5 is invalid: expected an int >= 1"),
        ("Pendulum-v1:\n  normalize_advantage: 1.0\n", "normalize_advantage=1.0 is invalid: expected True or False"),
        ("Pendulum-v1:\n  n_envs: [1]\n", r"n_envs=\[1\] is invalid: expected an int >= 1"),
        ("Pendulum-v1:\n  kl_targt: 0.01\n", r"unknown key 'kl_targt' \(did you mean 'kl_target'\?\)"),
        ("Pendulum-v1: [1, 2]\n", "expected a mapping of settings, got list"),
        ("- a\n- b\n", "expected a mapping of env ids to settings, got list"),
        ("Pendulum-v1:\n  n_steps: [1\n", "not a valid \\(safe\\) YAML file"),
        ("Pendulum-v1:\n  policy: !!python/object/apply:os.system [echo pwned]\n", "not a valid \\(safe\\) YAML file"),
    ],
)
def test_bad_hyperparameter_file_is_a_clear_error(tmp_path: Path, text: str, message: str):
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(InvalidSettingError, match=rf"{re.escape(str(path))}.*{message}"):
        load_hyperparams("Pendulum-v1", path)


def test_zoo_check_names_wrong_types():
    with pytest.raises(ZooConfigError, match=r"from x.yml \(env E\): batch_size='64' is invalid: expected an int"):
        check_hyperparams({"batch_size": "64", "learning_rate": lambda _: 1e-3}, "x.yml (env E)")
    assert check_hyperparams({"learning_rate": "lin_0.001", "clip_range": None, "kl_coef_bounds": [0.1, 10]}, "x")


def test_our_code_never_evaluates_configuration():
    """No eval/exec and no unsafe YAML loader in the package or scripts (rl-zoo3's own eval of policy_kwargs strings aside)."""
    offenders = []
    pattern = re.compile(r"\b(eval|exec)\(|yaml\.(load|unsafe_load|full_load)\(|yaml\.(Unsafe|Full)?Loader\b|pickle\.loads?\(")
    for file in [*(REPO_ROOT / "sb3_ppo_ext").rglob("*.py"), *(REPO_ROOT / "scripts").glob("*.py"), REPO_ROOT / "setup.py"]:
        for number, line in enumerate(file.read_text().splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{file.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert offenders == []


# --- hostile environments ----------------------------------------------------------------------


class HostileEnv(gym.Env):
    """A Box env that turns hostile at step ``at``: NaN/inf observation or reward, or a changing observation shape."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, fault: str, at: int = 20):
        self.fault, self.at, self.t = fault, at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        obs, reward = self.np_random.uniform(-1, 1, 3).astype(np.float32), 0.0
        if self.t >= self.at:
            if self.fault in {"nan_obs", "inf_obs"}:
                obs[0] = np.nan if self.fault == "nan_obs" else np.inf
            elif self.fault in {"nan_reward", "inf_reward"}:
                reward = float("nan") if self.fault == "nan_reward" else float("inf")
            elif self.fault == "obs_shape":
                obs = np.zeros(4, np.float32)
        return obs, reward, False, self.t % 50 == 0, {}


@pytest.mark.parametrize(
    "fault, error, message",
    [
        ("nan_obs", ValueError, "non-finite log-probability of the sampled actions"),
        ("inf_obs", NonFiniteLossError, "non-finite (loss|gradient)"),
        ("nan_reward", NonFiniteLossError, "non-finite loss"),
        ("inf_reward", NonFiniteLossError, "non-finite loss"),
        ("obs_shape", ValueError, r"could not broadcast|shape"),
    ],
)
def test_hostile_env_raises_and_leaves_weights_finite(fault: str, error: type, message: str):
    """Without a guard: a clear error, and no update ever applied non-finite values to the weights."""
    model = PPOExt("MlpPolicy", DummyVecEnv([lambda: HostileEnv(fault)]), **TINY_ONE_BATCH)
    before = _params(model)
    with pytest.raises(error, match=message):
        model.learn(128)
    after = _params(model)
    assert all(np.isfinite(p).all() for p in after)
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))  # the fault came before the first update


@pytest.mark.parametrize("fault", ["nan_obs", "nan_reward", "inf_reward"])
def test_hostile_env_with_health_guard_stops_with_a_good_checkpoint(tmp_path: Path, fault: str):
    """The documented guard behaviour: stop at the faulty step, before any update sees it, and save the model."""
    from sb3_ppo_ext.callbacks import TrainingHealthGuard

    model = PPOExt("MlpPolicy", DummyVecEnv([lambda: HostileEnv(fault, at=70)]), **TINY_ONE_BATCH)
    guard = TrainingHealthGuard(save_path=str(tmp_path))
    model.learn(256, callback=guard)
    assert guard.stopped_by == "non_finite" and model.num_timesteps < 256
    saved = PPOExt.load(guard.checkpoint_path, device="cpu")
    assert all(np.isfinite(p).all() for p in _params(saved))


class StrictActionEnv(HostileEnv):
    """Raises TypeError for any action that is not of the declared space's dtype and shape, inside the space."""

    def __init__(self, action_space: spaces.Space):
        super().__init__("none")
        self.action_space = action_space

    def step(self, action):
        action = np.asarray(action)
        if action.dtype != self.action_space.dtype or action.shape != self.action_space.shape:
            raise TypeError(f"bad action {action!r} for {self.action_space}")
        if not self.action_space.contains(action):
            raise TypeError(f"action {action!r} outside {self.action_space}")
        return super().step(action)


@pytest.mark.parametrize(
    "action_space, squash",
    [
        (spaces.Box(-1.0, 1.0, (1,), np.float32), True),
        (spaces.Box(-1.0, 1.0, (1,), np.float32), False),
        (spaces.Discrete(3), None),
        (spaces.MultiDiscrete([2, 3]), None),
    ],
)
def test_env_receives_actions_of_its_declared_dtype_and_shape(action_space: spaces.Space, squash: bool | None):
    policy_kwargs = dict(net_arch=[8]) if squash is None else dict(net_arch=[8], squash_output=squash)
    model = PPOExt(
        "MlpPolicy", DummyVecEnv([lambda: StrictActionEnv(action_space)]), **{**TINY_ONE_BATCH, "policy_kwargs": policy_kwargs}
    )
    model.learn(64)  # StrictActionEnv raises on any action outside its declared dtype, shape and space
    assert model.num_timesteps == 64 and model._n_updates == 2


def test_wrong_observation_or_action_space_at_use_is_a_clear_error(saved_model: Path):
    """predict() with an observation of the wrong shape, and load() into an env with another action space."""
    model = PPOExt.load(saved_model, device="cpu")
    with pytest.raises(ValueError, match="Unexpected observation shape"):
        model.predict(np.zeros(5, np.float32))

    class TwoActions(HostileEnv):
        action_space = spaces.Box(-2.0, 2.0, (2,), np.float32)
        observation_space = gym.make("Pendulum-v1").observation_space

    with pytest.raises(ModelFileError, match=rf"{re.escape(str(saved_model))} does not fit the given env: Action spaces"):
        PPOExt.load(saved_model, env=DummyVecEnv([lambda: TwoActions("none")]), device="cpu")


def test_bad_env_is_caught_by_env_checker():
    """SB3's env checker, the documented way to vet an env, rejects an env whose observations disagree with its space."""
    from stable_baselines3.common.env_checker import check_env

    with pytest.raises(AssertionError, match="observation"):
        check_env(HostileEnv("obs_shape", at=1))


def test_installed_module_runs_without_optuna_or_zoo():
    """reliability imports neither rl_zoo3 nor optuna (it sits on PPOExt's import path)."""
    assert not {"optuna", "rl_zoo3"} & modules_after_imports()["sb3_ppo_ext.reliability"]


def test_nan_reward_never_poisons_a_checkpoint_and_resume_continues(tmp_path: Path):
    """A NaN reward at step 70 poisons ret_rms; the checkpoint at 96 is skipped (warned), resume takes 64 and trains."""
    env = VecNormalize(DummyVecEnv([lambda: BrokenRewardEnv(at=70)]))
    model = PPOExt("MlpPolicy", env, **TINY_ONE_BATCH)
    callback = AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path))
    with pytest.warns(
        CheckpointWarning, match=r"checkpoint at 96 steps not written: non-finite VecNormalize statistics \(ret_rms"
    ):
        with pytest.raises(NonFiniteLossError):
            model.learn(160, callback=callback)
    assert [c.timesteps for c in list_checkpoints(tmp_path)] == [32, 64]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # nothing to skip
        loaded = resume(PPOExt, tmp_path, DummyVecEnv([lambda: BrokenRewardEnv(at=10**9)]), device="cpu")
    stats = loaded.get_vec_normalize_env()
    assert loaded.num_timesteps == 64 and stats is not None and np.isfinite(stats.ret_rms.var)
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded.num_timesteps == 96


def test_checkpoint_with_non_finite_weights_is_not_written(tmp_path: Path):
    model = PPOExt("MlpPolicy", pendulum_vec_env(), **TINY_ONE_BATCH)
    callback = AtomicCheckpointCallback(save_freq=1, save_path=str(tmp_path))
    callback.init_callback(model)
    with th.no_grad():
        next(model.policy.parameters())[0] = float("inf")
    with pytest.warns(CheckpointWarning, match=r"non-finite weights or optimizer state \(policy\."):
        assert callback.save_checkpoint() is None
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three checkpoints (32, 64, 96 steps) of a VecNormalize run."""
    folder = tmp_path_factory.mktemp("run")
    model = PPOExt("MlpPolicy", VecNormalize(pendulum_vec_env()), **TINY_ONE_BATCH)
    model.learn(96, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(folder)))
    return folder


def _nan_statistics(path: Path) -> None:
    vec_normalize = VecNormalize.load(str(path), pendulum_vec_env())
    vec_normalize.ret_rms.var = np.float64("nan")
    vec_normalize.save(str(path))


def _nan_weights(path: Path) -> None:
    model = PPOExt.load(path, device="cpu")
    with th.no_grad():
        next(model.policy.parameters()).fill_(float("nan"))
    model.save(path)


NEWEST_ZIP, NEWEST_PKL = "rl_model_96_steps.zip", "rl_model_vecnormalize_96_steps.pkl"


BREAKAGES = {
    "truncated_zip": (lambda f: (f / NEWEST_ZIP).write_bytes((f / NEWEST_ZIP).read_bytes()[:5000]), "truncated or corrupt"),
    "not_a_zip": (lambda f: (f / NEWEST_ZIP).write_text("garbage"), "wasn't a zip-file"),
    "truncated_pkl": (lambda f: (f / NEWEST_PKL).write_bytes((f / NEWEST_PKL).read_bytes()[:100]), "cannot be read"),
    "nan_statistics": (lambda f: _nan_statistics(f / NEWEST_PKL), r"non-finite VecNormalize statistics \(ret_rms\.var\)"),
    "nan_weights": (lambda f: _nan_weights(f / NEWEST_ZIP), r"non-finite weights or optimizer state \(policy\."),
    "missing_pkl": (lambda f: (f / NEWEST_PKL).unlink(), r"statistics rl_model_vecnormalize_96_steps\.pkl are missing"),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_resume_skips_a_broken_newest_checkpoint(run_folder: Path, tmp_path: Path, breakage: str):
    folder = Path(shutil.copytree(run_folder, tmp_path / "run"))
    breakage_of, reason = BREAKAGES[breakage]
    breakage_of(folder)
    with pytest.warns(
        CheckpointWarning, match=rf"skipped checkpoint .*{re.escape(NEWEST_ZIP)} \(.*{reason}.*trying the previous"
    ):
        model = resume(PPOExt, folder, pendulum_vec_env(), device="cpu")
    assert model.num_timesteps == 64
    stats = model.get_vec_normalize_env()
    expected = VecNormalize.load(str(folder / "rl_model_vecnormalize_64_steps.pkl"), pendulum_vec_env())
    assert stats is not None and np.array_equal(stats.obs_rms.mean, expected.obs_rms.mean)
    model.learn(32, reset_num_timesteps=False)


def test_resume_with_no_usable_checkpoint_lists_each_reason(run_folder: Path, tmp_path: Path):
    folder = Path(shutil.copytree(run_folder, tmp_path / "run"))
    for pkl in folder.glob("*.pkl"):
        pkl.write_bytes(b"")
    with (
        pytest.warns(CheckpointWarning),
        pytest.raises(ModelFileError, match=r"no usable checkpoint .*rl_model_96_steps.zip: .*rl_model_32_steps.zip: "),
    ):
        resume(PPOExt, folder, pendulum_vec_env(), device="cpu")


def test_statistics_never_saved_for_a_vec_normalize_run_is_an_error(tmp_path: Path):
    """save_vecnormalize=False on a VecNormalize run: the model file says it had VecNormalize, so resume refuses."""
    model = PPOExt("MlpPolicy", VecNormalize(pendulum_vec_env()), **TINY_ONE_BATCH)
    model.learn(64, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path), save_vecnormalize=False))
    with pytest.warns(CheckpointWarning), pytest.raises(ModelFileError, match="trained with VecNormalize"):
        resume(PPOExt, tmp_path, pendulum_vec_env(), device="cpu")
    plain = PPOExt("MlpPolicy", pendulum_vec_env(), **TINY_ONE_BATCH)
    plain.learn(32, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path / "plain")))
    assert resume(PPOExt, tmp_path / "plain", pendulum_vec_env(), device="cpu").get_vec_normalize_env() is None


def test_resume_of_another_algorithms_run_raises_at_once(tmp_path: Path):
    A2C("MlpPolicy", pendulum_vec_env(), n_steps=32, policy_kwargs=dict(net_arch=[8]), device="cpu").learn(
        32, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        with pytest.raises(ForeignModelFileError, match="another on-policy algorithm"):
            resume(PPOExt, tmp_path, pendulum_vec_env(), device="cpu")


def _no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(TEMPORARY_PREFIX)]


def test_save_through_a_symlink_replaces_its_target(tmp_path: Path):
    real = tmp_path / "store" / "model.zip"
    real.parent.mkdir()
    real.write_bytes(b"old")
    link = tmp_path / "latest.zip"
    link.symlink_to(real)
    PPOExt("MlpPolicy", pendulum_vec_env(), **TINY_ONE_BATCH).save(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert zipfile.is_zipfile(real) and PPOExt.load(link, device="cpu").n_steps == 32
    assert _no_temporaries(tmp_path) and _no_temporaries(real.parent)


def test_save_keeps_the_mode_of_the_file_and_gives_a_new_file_the_umask_mode(tmp_path: Path):
    model = PPOExt("MlpPolicy", pendulum_vec_env(), **TINY_ONE_BATCH)
    existing = tmp_path / "shared.zip"
    existing.write_bytes(b"old")
    existing.chmod(0o640)
    model.save(existing)
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640
    old_umask = os.umask(0o027)
    try:
        model.save(tmp_path / "new.zip")
        with open(tmp_path / "plain", "wb"):
            pass
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "new.zip").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o640


def test_save_to_a_name_at_the_file_name_limit(tmp_path: Path):
    path = tmp_path / ("m" * 251 + ".zip")  # 255 bytes
    PPOExt("MlpPolicy", pendulum_vec_env(), **TINY_ONE_BATCH).save(path)
    assert zipfile.is_zipfile(path) and _no_temporaries(tmp_path)


def test_two_threads_saving_to_one_path_never_mix(tmp_path: Path):
    path = tmp_path / "shared.bin"
    contents = [bytes([n]) * 3_000_000 for n in (1, 2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def writer(content: bytes) -> None:
        try:
            barrier.wait()
            for _ in range(10):
                with atomic_path(path) as file:
                    for start in range(0, len(content), 100_000):
                        file.write(content[start : start + 100_000])
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(content,)) for content in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and path.read_bytes() in contents and _no_temporaries(tmp_path)


def test_name_prefix_with_glob_characters_works_with_keep_last_and_resume(tmp_path: Path):
    (tmp_path / "run1_999_steps.zip").write_bytes(b"another run's file, which the glob run[1]_* would match")
    model = PPOExt("MlpPolicy", pendulum_vec_env(), **TINY_ONE_BATCH)
    callback = AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path), name_prefix="run[1]", keep_last=2)
    model.learn(128, callback=callback)
    assert [c.timesteps for c in list_checkpoints(tmp_path, "run[1]")] == [96, 128]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1_999_steps.zip", "run[1]_128_steps.zip", "run[1]_96_steps.zip"]
    assert resume(PPOExt, tmp_path, pendulum_vec_env(), name_prefix="run[1]", device="cpu").num_timesteps == 128


def test_the_reliability_table_names_tests_that_exist():
    """Each ``[folder/]test_<module>.py::test_<name>`` of docs/RELIABILITY.md is a test function of that module here."""
    tests = REPO_ROOT / "tests"
    table = (REPO_ROOT / "docs" / "RELIABILITY.md").read_text()
    named = set(re.findall(r"\b((?:integration/|slow/)?test_\w+\.py)::(test_\w+)", table))
    ours = {(module, name) for module, name in named if (tests / module).exists()}
    assert len(ours) >= 40
    missing = [f"{module}::{name}" for module, name in sorted(ours) if f"\ndef {name}(" not in (tests / module).read_text()]
    assert missing == []
    # a module named without its folder would not be checked: every module of this suite is named by its path
    moved = {module for module, _ in named if not (tests / module).exists() and list(tests.rglob(module))}
    assert moved == set()
