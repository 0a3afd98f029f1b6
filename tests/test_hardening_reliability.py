"""Regression tests of the hardening issue's reliability items: checkpoints never poisoned by NaN
(and ``resume`` falling back past broken ones), foreign and truncated model files, atomic saves
that behave like plain saves, literal checkpoint prefixes.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
import warnings
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import A2C, PPO, SAC
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ppo_ext import MaskablePPOExt, NonFiniteLossError, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.reliability import (
    TEMPORARY_PREFIX,
    AtomicCheckpointCallback,
    CheckpointWarning,
    ForeignModelFileError,
    ModelFileError,
    atomic_path,
    check_model_file,
    list_checkpoints,
    model_family,
    remove_stale_temporary_files,
    resume,
    temporary_name,
)

TINY = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8]), device="cpu", seed=0)

th.set_num_threads(1)


def _pendulum() -> DummyVecEnv:
    return DummyVecEnv([lambda: gym.make("Pendulum-v1")])


class NanRewardEnv(gym.Env):
    """A Box env whose reward is NaN from step ``at`` on (a broken simulator)."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, at: int):
        self.at, self.t = at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        reward = float("nan") if self.t >= self.at else float(-np.square(action).sum())
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), reward, False, self.t % 50 == 0, {}


# --- 1. NaN never reaches a checkpoint; resume falls back past broken ones ---------------------


def test_nan_reward_never_poisons_a_checkpoint_and_resume_continues(tmp_path: Path):
    """A NaN reward at step 70 poisons ret_rms; the checkpoint at 96 is skipped (warned), resume takes 64 and trains."""
    env = VecNormalize(DummyVecEnv([lambda: NanRewardEnv(at=70)]))
    model = PPOExt("MlpPolicy", env, **TINY)
    callback = AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path))
    with pytest.warns(
        CheckpointWarning, match=r"checkpoint at 96 steps not written: non-finite VecNormalize statistics \(ret_rms"
    ):
        with pytest.raises(NonFiniteLossError):
            model.learn(160, callback=callback)
    assert [c.timesteps for c in list_checkpoints(tmp_path)] == [32, 64]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # nothing to skip
        loaded = resume(PPOExt, tmp_path, DummyVecEnv([lambda: NanRewardEnv(at=10**9)]), device="cpu")
    stats = loaded.get_vec_normalize_env()
    assert loaded.num_timesteps == 64 and stats is not None and np.isfinite(stats.ret_rms.var)
    loaded.learn(32, reset_num_timesteps=False)
    assert loaded.num_timesteps == 96


def test_checkpoint_with_non_finite_weights_is_not_written(tmp_path: Path):
    model = PPOExt("MlpPolicy", _pendulum(), **TINY)
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
    model = PPOExt("MlpPolicy", VecNormalize(_pendulum()), **TINY)
    model.learn(96, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(folder)))
    return folder


def _nan_statistics(path: Path) -> None:
    vec_normalize = VecNormalize.load(str(path), _pendulum())
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
    "nan_weights": (lambda f: _nan_weights(f / NEWEST_ZIP), r"non-finite weights \(policy\."),
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
        model = resume(PPOExt, folder, _pendulum(), device="cpu")
    assert model.num_timesteps == 64
    stats = model.get_vec_normalize_env()
    expected = VecNormalize.load(str(folder / "rl_model_vecnormalize_64_steps.pkl"), _pendulum())
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
        resume(PPOExt, folder, _pendulum(), device="cpu")


def test_statistics_never_saved_for_a_vec_normalize_run_is_an_error(tmp_path: Path):
    """save_vecnormalize=False on a VecNormalize run: the model file says it had VecNormalize, so resume refuses."""
    model = PPOExt("MlpPolicy", VecNormalize(_pendulum()), **TINY)
    model.learn(64, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path), save_vecnormalize=False))
    with pytest.warns(CheckpointWarning), pytest.raises(ModelFileError, match="trained with VecNormalize"):
        resume(PPOExt, tmp_path, _pendulum(), device="cpu")
    plain = PPOExt("MlpPolicy", _pendulum(), **TINY)
    plain.learn(32, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path / "plain")))
    assert resume(PPOExt, tmp_path / "plain", _pendulum(), device="cpu").get_vec_normalize_env() is None


def test_resume_of_another_algorithms_run_raises_at_once(tmp_path: Path):
    A2C("MlpPolicy", _pendulum(), n_steps=32, policy_kwargs=dict(net_arch=[8]), device="cpu").learn(
        32, callback=AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)
        with pytest.raises(ForeignModelFileError, match="another on-policy algorithm"):
            resume(PPOExt, tmp_path, _pendulum(), device="cpu")


# --- 7. foreign, truncated and in-memory model files -------------------------------------------


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")

    def small() -> dict:  # a fresh policy_kwargs each: SB3 algorithms add to it
        return dict(policy_kwargs=dict(net_arch=[8]), device="cpu")

    models = {
        "PPOExt": PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, **small()),
        "PPO": PPO("MlpPolicy", "Pendulum-v1", n_steps=64, **small()),
        "A2C": A2C("MlpPolicy", "Pendulum-v1", **small()),
        "SAC": SAC("MlpPolicy", "Pendulum-v1", buffer_size=64, **small()),
        "MaskablePPO": MaskablePPO("MlpPolicy", InvalidActionEnvDiscrete(dim=8, n_invalid_actions=2), n_steps=64, **small()),
        "RecurrentPPO": RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", n_steps=64, **small()),
    }
    paths = {}
    for name, model in models.items():
        paths[name] = folder / f"{name}.zip"
        model.save(paths[name])
    return paths


def _data(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("data"))


def test_model_family_of_real_files(model_files: dict[str, Path]):
    families = {name: model_family(_data(path)) for name, path in model_files.items()}
    assert families == {
        "PPOExt": "PPO",
        "PPO": "PPO",
        "A2C": "on-policy",
        "SAC": "SAC",
        "MaskablePPO": "MaskablePPO",
        "RecurrentPPO": "RecurrentPPO",
    }
    ppo_data = _data(model_files["PPO"])
    for module, family in [
        ("sb3_ppo_ext.maskable", "MaskablePPO"),
        ("sb3_ppo_ext.maskable_policies", "MaskablePPO"),
        ("sb3_ppo_ext.recurrent.policies", "RecurrentPPO"),
        ("sb3_ppo_ext.policies", "PPO"),
        ("my_project.policies", "PPO"),
    ]:
        assert model_family({**ppo_data, "policy_class": {"__module__": module}}) == family, module


@pytest.mark.parametrize(
    "saved_by, message",
    [
        ("MaskablePPO", r"saved by MaskablePPO \(its policy class comes from sb3_contrib\.common\.maskable\.policies\)"),
        ("RecurrentPPO", r"saved by RecurrentPPO \(its policy class comes from sb3_contrib\.common\.recurrent\.policies\)"),
    ],
)
def test_sb3_contrib_ppo_files_do_not_load_into_ppo_ext(model_files: dict[str, Path], saved_by: str, message: str):
    with pytest.raises(
        ForeignModelFileError, match=rf"{message}, not by the PPO family that PPOExt loads.*sb3_contrib\.{saved_by}"
    ):
        PPOExt.load(model_files[saved_by], device="cpu")


def test_file_objects_are_checked_too(model_files: dict[str, Path]):
    """An A2C zip in a BytesIO is rejected like its path; a good BytesIO loads; the position is kept."""
    foreign = io.BytesIO(model_files["A2C"].read_bytes())
    with pytest.raises(ForeignModelFileError, match=r"<BytesIO> was saved by another on-policy algorithm"):
        PPOExt.load(foreign, device="cpu")
    good = io.BytesIO(model_files["PPOExt"].read_bytes())
    good.seek(7)
    assert check_model_file(good, "PPOExt", {"PPO"}) is good and good.tell() == 7
    assert isinstance(PPOExt.load(io.BytesIO(model_files["PPOExt"].read_bytes()), device="cpu"), PPOExt)
    with open(model_files["SAC"], "rb") as file, pytest.raises(ForeignModelFileError, match=r"SAC\.zip was saved by SAC"):
        PPOExt.load(file, device="cpu")


def test_truncated_files_are_reported_as_truncated(model_files: dict[str, Path], tmp_path: Path):
    """Cut anywhere (zipfile alone reads most cuts as an embedded .pth archive), the file is "truncated or corrupt"."""
    data = model_files["PPOExt"].read_bytes()
    broken = tmp_path / "cut.zip"
    for size in range(1, len(data), 61):
        broken.write_bytes(data[:size])
        with pytest.raises(ModelFileError, match=r"cut\.zip is truncated or corrupt: it starts as a zip archive"):
            check_model_file(broken, "PPOExt", {"PPO"})


def test_a_file_that_is_not_a_zip_keeps_sb3s_words(tmp_path: Path):
    text = tmp_path / "notes.zip"
    text.write_text("not a model\n")
    with pytest.raises(
        ModelFileError, match=rf"is not a valid zip archive: the file {re.escape(str(text))} wasn't a zip-file"
    ):
        PPOExt.load(text, device="cpu")


# --- 8. atomic saves behave like plain saves --------------------------------------------------


def _no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(TEMPORARY_PREFIX)]


def test_save_through_a_symlink_replaces_its_target(tmp_path: Path):
    real = tmp_path / "store" / "model.zip"
    real.parent.mkdir()
    real.write_bytes(b"old")
    link = tmp_path / "latest.zip"
    link.symlink_to(real)
    PPOExt("MlpPolicy", _pendulum(), **TINY).save(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert zipfile.is_zipfile(real) and PPOExt.load(link, device="cpu").n_steps == 32
    assert _no_temporaries(tmp_path) and _no_temporaries(real.parent)


def test_save_keeps_the_mode_of_the_file_and_gives_a_new_file_the_umask_mode(tmp_path: Path):
    model = PPOExt("MlpPolicy", _pendulum(), **TINY)
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
    PPOExt("MlpPolicy", _pendulum(), **TINY).save(path)
    assert zipfile.is_zipfile(path) and len(temporary_name()) < 100


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


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_temporary_files_of_dead_processes_are_removed_on_the_next_save(tmp_path: Path):
    ours = temporary_name()
    host, pid = re.fullmatch(rf"{re.escape(TEMPORARY_PREFIX)}([0-9a-f]+)-(\d+)-.*", ours).groups()
    dead = tmp_path / ours.replace(f"-{pid}-", f"-{_dead_pid()}-")
    alive = tmp_path / temporary_name()  # this process: a save in progress
    other_host = tmp_path / dead.name.replace(host, "0" * 8 if host != "0" * 8 else "1" * 8)
    unrelated = [tmp_path / ".model.zip.tmp-999999", tmp_path / "notes.txt"]
    for file in (dead, alive, other_host, *unrelated):
        file.write_bytes(b"partial")
    PPOExt("MlpPolicy", _pendulum(), **TINY).save(tmp_path / "model.zip")
    assert not dead.exists()
    assert all(file.exists() for file in (alive, other_host, *unrelated))
    assert remove_stale_temporary_files(tmp_path) == []


# --- 9. literal prefixes, scheduler ranges, overflow in the health guard, the hook switch -------


def test_name_prefix_with_glob_characters_works_with_keep_last_and_resume(tmp_path: Path):
    (tmp_path / "run1_999_steps.zip").write_bytes(b"another run's file, which the glob run[1]_* would match")
    model = PPOExt("MlpPolicy", _pendulum(), **TINY)
    callback = AtomicCheckpointCallback(save_freq=32, save_path=str(tmp_path), name_prefix="run[1]", keep_last=2)
    model.learn(128, callback=callback)
    assert [c.timesteps for c in list_checkpoints(tmp_path, "run[1]")] == [96, 128]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run1_999_steps.zip", "run[1]_128_steps.zip", "run[1]_96_steps.zip"]
    assert resume(PPOExt, tmp_path, _pendulum(), name_prefix="run[1]", device="cpu").num_timesteps == 128


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

    model = PPOExt("MlpPolicy", _pendulum(), **TINY)
    scheduler = ParameterScheduler({"clip_range": lambda progress_remaining: 0.2 if progress_remaining > 0.5 else -0.1})
    with pytest.raises(
        ValueError, match=r"schedules\['clip_range'\] gives clip_range=-0\.1 at 64 steps; clip_range: expected"
    ):
        model.learn(96, callback=scheduler)


def test_parameter_schedule_lives_in_its_own_module():
    from sb3_ppo_ext import callbacks, schedules

    assert callbacks.ParameterSchedule is schedules.ParameterSchedule
    assert schedules.ParameterSchedule("linear", start=1.0, end=3.0).extremes() == (1.0, 3.0)
    probe = "import sys, sb3_ppo_ext.schedules; print(sorted(m for m in sys.modules if m.startswith('sb3_ppo_ext.')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "sb3_ppo_ext.callbacks" not in loaded  # imports stay one-way: schedules -> validation


class HugeRewardEnv(NanRewardEnv):
    """Rewards of 1e30 from step ``at`` on: finite, but their squares overflow float32."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, (1e30 if self.t >= self.at else reward), terminated, truncated, info


@pytest.mark.parametrize("algorithm", [PPOExt, PPO])
def test_health_guard_stops_before_overflowing_rewards_reach_an_update(tmp_path: Path, algorithm):
    from sb3_ppo_ext.callbacks import TrainingHealthGuard, TrainingHealthWarning

    model = algorithm("MlpPolicy", DummyVecEnv([lambda: HugeRewardEnv(at=10**9)]), **TINY)
    model.learn(64)
    good = [p.detach().clone() for p in model.policy.parameters()]
    model.set_env(DummyVecEnv([lambda: HugeRewardEnv(at=6)]))
    guard = TrainingHealthGuard(save_path=str(tmp_path))
    with pytest.warns(TrainingHealthWarning, match=r"rewards up to 1e\+30 .* overflow the update"):
        model.learn(128, callback=guard, reset_num_timesteps=False)
    assert guard.stopped_by == "non_finite" and model.num_timesteps == 70
    saved = algorithm.load(guard.checkpoint_path, device="cpu")
    assert all(th.equal(p, q) for p, q in zip(saved.policy.parameters(), good, strict=True))


def test_health_guard_stop_keeps_the_beta_from_before_the_bad_update(tmp_path: Path):
    from sb3_ppo_ext.callbacks import TrainingHealthGuard, TrainingHealthWarning

    reference = PPOExt("MlpPolicy", _pendulum(), kl_coef=1.0, kl_target=1e-9, **TINY)
    reference.learn(32)
    assert reference.current_kl_coef != 1.0  # one update adapts beta
    model = PPOExt("MlpPolicy", _pendulum(), kl_coef=1.0, kl_target=1e-9, **TINY)
    guard = TrainingHealthGuard(responses={"kl": "stop"}, kl_target=1e-9, kl_limit=1.0, save_path=str(tmp_path))
    with pytest.warns(TrainingHealthWarning, match="train/kl"):
        model.learn(128, callback=guard)
    assert guard.stopped_by == "kl" and model.current_kl_coef == 1.0
    assert PPOExt.load(guard.checkpoint_path, device="cpu").current_kl_coef == 1.0


@pytest.mark.parametrize(
    "value, on",
    [
        *[(value, True) for value in ("", "0", "false", "False", "no", "off")],
        *[(value, False) for value in ("1", "true", " Yes ", "ON")],
    ],
)
def test_zoo_hook_switch_takes_only_true_values(monkeypatch: pytest.MonkeyPatch, value: str, on: bool):
    """SB3_PPO_EXT_NO_ZOO_HOOK=false leaves the hook on, in the module and in the .pth line alike."""
    import types

    import sb3_ppo_ext_zoo_hook as hook

    monkeypatch.setenv(hook.DISABLE_ENV_VAR, value)
    assert hook.enabled() is on
    calls = []
    fake = types.ModuleType("sb3_ppo_ext_zoo_hook")
    fake.install = lambda: calls.append("install")
    monkeypatch.setitem(sys.modules, "sb3_ppo_ext_zoo_hook", fake)
    line = (Path(__file__).resolve().parent.parent / "sb3_ppo_ext_zoo_hook.pth").read_text().strip()
    exec(line, {})  # what site.addpackage does with a .pth line that starts with "import"
    assert calls == (["install"] if on else [])


# --- 10. saves in a shared sticky folder, clean-up across PID namespaces ---------------------

OTHER_UID = 54321  # a local user other than the tester (no account needed: the files are chowned to it)
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chowns files to another user")


def _sticky_folder(tmp_path: Path) -> Path:
    """A world-writable sticky folder, as /tmp is, made by the test."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


@needs_root
def test_save_refuses_another_users_symlink_in_a_sticky_folder(tmp_path: Path):
    victim = tmp_path / "victim" / "precious.zip"
    victim.parent.mkdir()
    victim.write_bytes(b"precious")
    shared = _sticky_folder(tmp_path)
    model = PPOExt("MlpPolicy", _pendulum(), **TINY)
    planted = [(shared / "model.zip", victim), (shared / "runs", victim.parent)]  # the link itself, a link to a folder
    for link, target in planted:
        link.symlink_to(target)
        os.lchown(link, OTHER_UID, OTHER_UID)
    for path in (shared / "model.zip", shared / "runs" / "precious.zip"):
        with pytest.raises(PermissionError, match=rf"refusing to save through the symlink {re.escape(str(shared))}/"):
            model.save(path)
    assert victim.read_bytes() == b"precious" and _no_temporaries(victim.parent) and _no_temporaries(shared)
    # This user's own link in the sticky folder is followed, as open() follows it; so is another
    # user's link in an ordinary folder (the existing behaviour, test_save_through_a_symlink_...).
    own = shared / "own.zip"
    own.symlink_to(victim)
    model.save(own)
    assert own.is_symlink() and zipfile.is_zipfile(victim)
    ordinary = tmp_path / "ordinary.zip"
    ordinary.symlink_to(victim)
    os.lchown(ordinary, OTHER_UID, OTHER_UID)
    model.save(ordinary)
    assert ordinary.is_symlink() and zipfile.is_zipfile(victim)


@needs_root
def test_save_never_gives_a_new_model_to_another_user_in_a_sticky_folder(tmp_path: Path):
    shared = _sticky_folder(tmp_path)
    model = PPOExt("MlpPolicy", _pendulum(), **TINY)
    planted = shared / "model.zip"
    planted.write_bytes(b"planted")
    os.chown(planted, OTHER_UID, OTHER_UID)
    planted.chmod(0o666)
    with pytest.raises(PermissionError, match=r"refusing to save through the file .*model\.zip: it belongs to uid 54321"):
        model.save(planted)
    assert planted.read_bytes() == b"planted" and _no_temporaries(shared)
    # This user's own file there keeps its mode and stays this user's.
    mine = shared / "mine.zip"
    mine.write_bytes(b"old")
    mine.chmod(0o640)
    model.save(mine)
    info = mine.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o640) and zipfile.is_zipfile(mine)
    # In an ordinary folder the old file's owner and mode are kept, as before.
    ordinary = tmp_path / "ordinary.zip"
    ordinary.write_bytes(b"old")
    os.chown(ordinary, OTHER_UID, OTHER_UID)
    ordinary.chmod(0o640)
    model.save(ordinary)
    assert ordinary.stat().st_uid == OTHER_UID and stat.S_IMODE(ordinary.stat().st_mode) == 0o640


# Child: an atomic save held half-way, whose temporary file's name claims this host and a pid that
# is dead in the test's PID namespace, as a saver in another container sharing the folder would.
FOREIGN_NAMESPACE_SAVER = """
import os, sys, time
from pathlib import Path
from sb3_ppo_ext import reliability

folder, dead_pid = Path(sys.argv[1]), sys.argv[2]
claimed = reliability.temporary_name().replace(f"-{os.getpid()}-", f"-{dead_pid}-", 1)
reliability.temporary_name = lambda: claimed
with reliability.atomic_path(folder / "theirs.bin") as file:
    file.write(b"their model")
    (folder / "writing").touch()
    while not (folder / "go").exists():
        time.sleep(0.02)
"""


def test_clean_up_leaves_a_save_in_progress_in_another_pid_namespace(tmp_path: Path):
    dead = _dead_pid()
    child = subprocess.Popen(
        [sys.executable, "-c", FOREIGN_NAMESPACE_SAVER, str(tmp_path), str(dead)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "writing").exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stderr and child.stderr.read()
            time.sleep(0.02)
        (theirs,) = [p for p in tmp_path.iterdir() if p.name.startswith(TEMPORARY_PREFIX)]
        assert f"-{dead}-" in theirs.name  # this host, a pid that is dead here
        with atomic_path(tmp_path / "ours.bin") as file:  # cleans the folder first
            file.write(b"our model")
        assert remove_stale_temporary_files(tmp_path) == [] and theirs.exists()
        (tmp_path / "go").touch()
        _, stderr = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, stderr
    assert (tmp_path / "theirs.bin").read_bytes() == b"their model" and (tmp_path / "ours.bin").read_bytes() == b"our model"
    assert _no_temporaries(tmp_path)


# --- round 2: load() runs the constructor's checks; the one beta rule; saved settings checked ---------

LSTM_TINY = dict(n_steps=32, batch_size=32, n_epochs=1, policy_kwargs=dict(net_arch=[8], lstm_hidden_size=8), device="cpu")
FAMILY = {
    "PPOExt": (PPOExt, "MlpPolicy", _pendulum, TINY),
    "MaskablePPOExt": (MaskablePPOExt, "MlpPolicy", lambda: InvalidActionEnvDiscrete(dim=8, n_invalid_actions=2), TINY),
    "RecurrentPPOExt": (RecurrentPPOExt, "MlpLstmPolicy", _pendulum, LSTM_TINY),
}
# Upstream algorithm (same family) of each class, for files saved by stock PPO / MaskablePPO / RecurrentPPO.
UPSTREAM = {"PPOExt": PPO, "MaskablePPOExt": MaskablePPO, "RecurrentPPOExt": RecurrentPPO}
BAD_LOAD_SETTINGS = [
    dict(gamma=1.5),
    dict(gae_lambda=-1),
    dict(normalize_advantage="false"),
    dict(n_epochs=0),
    dict(n_steps=0),
    dict(batch_size=1),
    dict(learning_rate=-1.0),
    dict(ent_coef=float("nan")),
    dict(vf_coef="0.5"),
    dict(max_grad_norm=float("nan")),
    dict(target_kl=-0.1),
    dict(clip_range=-0.2),
    dict(kl_coef=-1.0),
    dict(kl_coef_bounds=(1.0, 0.5)),
    dict(kl_adapt_factor=1.0),
]


def _fresh(kwargs: dict) -> dict:
    """A copy with a fresh policy_kwargs (SB3 algorithms add to it)."""
    return {**kwargs, "policy_kwargs": dict(kwargs["policy_kwargs"])}


def _new(name: str, **kwargs):
    algorithm, policy, env, tiny = FAMILY[name]
    return algorithm(policy, env(), **{**_fresh(tiny), **kwargs})


@pytest.fixture(scope="module")
def family_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per class: its own file with the penalty off ("off"), fixed beta 1 ("fixed"), adapted beta ("adaptive"), and
    a file of the upstream algorithm ("upstream")."""
    folder = tmp_path_factory.mktemp("family")
    files = {}
    for name, (_, policy, env, tiny) in FAMILY.items():
        for kind, kwargs in {"off": {}, "fixed": dict(kl_coef=1.0), "adaptive": dict(kl_coef=1.0, kl_target=10.0)}.items():
            model = _new(name, seed=0, **kwargs)
            if kind == "adaptive":
                model.learn(32)
                assert model.current_kl_coef == 0.5  # one update below the target halves beta
            files[f"{name}/{kind}"] = folder / f"{name}-{kind}.zip"
            model.save(files[f"{name}/{kind}"])
        files[f"{name}/upstream"] = folder / f"{name}-upstream.zip"
        UPSTREAM[name](policy, env(), **_fresh(tiny)).save(files[f"{name}/upstream"])
    return files


@pytest.mark.parametrize("name", list(FAMILY))
@pytest.mark.parametrize("bad", BAD_LOAD_SETTINGS, ids=lambda bad: next(iter(bad)))
def test_load_runs_the_constructors_checks(family_files: dict[str, Path], name: str, bad: dict):
    """load(path, **kwargs) raises the constructor's own error for every setting the constructor checks."""
    from sb3_ppo_ext.validation import InvalidSettingError

    with pytest.raises(InvalidSettingError) as constructed:
        _new(name, **bad)
    with pytest.raises(InvalidSettingError) as loaded:
        FAMILY[name][0].load(family_files[f"{name}/off"], device="cpu", **bad)
    assert str(loaded.value) == str(constructed.value)
    assert not isinstance(loaded.value, ModelFileError)  # the keyword argument is to blame, not the file


def test_load_checks_n_steps_times_n_envs_like_ppos_constructor(family_files: dict[str, Path]):
    with pytest.raises(AssertionError, match=r"n_steps \* n_envs"):
        PPOExt.load(family_files["PPOExt/off"], env=_pendulum(), n_steps=1)
    assert PPOExt.load(family_files["PPOExt/off"], n_steps=1).n_steps == 1  # no env: nothing to multiply


def _rewrite_data(source: Path, target: Path, **changes) -> Path:
    """A copy of the model file ``source`` whose saved attributes ``changes`` are replaced (in its ``data`` JSON)."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for info in original.infolist():
            content = original.read(info.filename)
            if info.filename == "data":
                content = json.dumps({**json.loads(content), **changes}).encode()
            copy.writestr(info, content)
    return target


@pytest.mark.parametrize("name", list(FAMILY))
@pytest.mark.parametrize(
    "saved, message",
    [
        (dict(current_kl_coef=float("nan")), r"current_kl_coef=nan is invalid: expected a finite number >= 0"),
        (dict(current_kl_coef="0.5"), r"current_kl_coef='0\.5' is invalid"),
        (dict(current_kl_coef=None), r"current_kl_coef=None is invalid"),
        (dict(current_kl_coef=-5), r"current_kl_coef=-5 is invalid"),
        (dict(current_kl_coef=1e5), r"current_kl_coef=100000\.0 \(the adaptive beta carried on\) is invalid: .*_bounds"),
        (dict(gamma=1.5), r"gamma=1\.5 is invalid"),
        (dict(n_epochs=0), r"n_epochs=0 is invalid"),
        (dict(normalize_advantage=True, batch_size=1), r"batch_size=1 is invalid with normalize_advantage=True"),
    ],
    ids=lambda value: str(value)[:40],
)
def test_bad_saved_settings_are_model_file_errors_naming_the_file(
    family_files: dict[str, Path], tmp_path: Path, name: str, saved: dict, message: str
):
    """A file whose saved live beta (or another saved setting) is invalid does not load (a NaN beta turned the penalty off)."""
    broken = _rewrite_data(family_files[f"{name}/adaptive"], tmp_path / "broken.zip", **saved)
    where = rf"{name}\.load: model file {re.escape(str(broken))}"
    with pytest.raises(ModelFileError, match=rf"{where} holds an invalid setting: {message}"):
        FAMILY[name][0].load(broken, device="cpu")


def test_a_bad_saved_setting_mended_at_load_loads(family_files: dict[str, Path], tmp_path: Path):
    broken = _rewrite_data(family_files["PPOExt/off"], tmp_path / "broken.zip", gamma=1.5)
    assert PPOExt.load(broken, device="cpu", gamma=0.9).gamma == 0.9


def _beta_used(model) -> float:
    """The beta of one update: ``train/kl_coef`` as logged (and the live beta after it, for a fixed beta)."""
    model.set_logger(configure(None, []))
    model.learn(32, reset_num_timesteps=False)
    return model.logger.name_to_value["train/kl_coef"]


@pytest.mark.parametrize("name", list(FAMILY))
@pytest.mark.parametrize("saved", ["off", "upstream"])
def test_a_penalty_switched_on_at_load_starts_at_the_given_kl_coef(family_files: dict[str, Path], name: str, saved: str):
    algorithm, _, env, _ = FAMILY[name]
    model = algorithm.load(family_files[f"{name}/{saved}"], env=env(), device="cpu", kl_coef=0.5)
    assert model.current_kl_coef == 0.5 and _beta_used(model) == 0.5 and model.current_kl_coef == 0.5
    adaptive = algorithm.load(family_files[f"{name}/{saved}"], env=env(), device="cpu", kl_coef=0.5, kl_target=10.0)
    assert adaptive.current_kl_coef == 0.5 and _beta_used(adaptive) == 0.5 and adaptive.current_kl_coef == 0.25


@pytest.mark.parametrize("name", list(FAMILY))
def test_a_fixed_beta_is_the_configured_kl_coef(family_files: dict[str, Path], name: str):
    algorithm, _, env, _ = FAMILY[name]
    model = algorithm.load(family_files[f"{name}/fixed"], env=env(), device="cpu", kl_coef=0.1)
    assert model.current_kl_coef == 0.1 and _beta_used(model) == 0.1
    # an adaptive file made fixed: its beta is kl_coef (the configured value), not the adapted one
    fixed = algorithm.load(family_files[f"{name}/adaptive"], env=env(), device="cpu", kl_target=None)
    assert fixed.current_kl_coef == 1.0 and _beta_used(fixed) == 1.0


@pytest.mark.parametrize("name", list(FAMILY))
def test_an_adaptive_beta_carries_on_unless_kl_coef_is_changed_at_load(family_files: dict[str, Path], name: str):
    algorithm, _, env, _ = FAMILY[name]
    path = family_files[f"{name}/adaptive"]
    assert algorithm.load(path, device="cpu").current_kl_coef == 0.5
    # the saved kl_coef given again (as rl-zoo3's -i passes the yml's): the adapted beta carries on
    again = algorithm.load(path, env=env(), device="cpu", kl_coef=1.0, kl_target=10.0)
    assert again.current_kl_coef == 0.5 and _beta_used(again) == 0.5
    restarted = algorithm.load(path, env=env(), device="cpu", kl_coef=0.2)
    assert restarted.current_kl_coef == 0.2 and _beta_used(restarted) == 0.2
    assert algorithm.load(path, device="cpu", current_kl_coef=0.3).current_kl_coef == 0.3  # the live beta set directly
    with pytest.raises(ValueError, match=r"current_kl_coef=0\.5 \(the adaptive beta carried on\) is invalid: .*\(0\.9, 2"):
        algorithm.load(path, device="cpu", kl_coef_bounds=(0.9, 2.0))


def test_parameter_scheduler_sets_the_beta_of_a_fixed_penalty_and_refuses_an_adaptive_one():
    from sb3_ppo_ext.callbacks import ParameterScheduler

    model = PPOExt("MlpPolicy", _pendulum(), kl_coef=1.0, **TINY)
    model.set_logger(configure(None, []))
    model.learn(64, callback=ParameterScheduler({"kl_coef": {"kind": "constant", "value": 0.25}}))
    assert model.logger.name_to_value["train/kl_coef"] == 0.25 and model.current_kl_coef == 0.25
    adaptive = PPOExt("MlpPolicy", _pendulum(), kl_coef=1.0, kl_target=0.01, **TINY)
    with pytest.raises(ValueError, match=r"schedules\['kl_coef'\] is invalid with kl_target=0\.01: .*schedule kl_target"):
        adaptive.learn(64, callback=ParameterScheduler({"kl_coef": {"kind": "constant", "value": 0.25}}))


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


# ---- action masks: every fault a ValueError naming action_masks, in rollouts and in predict


class FaultyMasks(gym.Wrapper):
    """The env's own masks for three steps, then ``fault(masks)``; records every action it receives."""

    def __init__(self, env: gym.Env, fault):
        super().__init__(env)
        self.fault, self.received = fault, []

    def step(self, action):
        self.received.append(action)
        return self.env.step(action)

    def action_masks(self):
        masks = np.asarray(self.env.unwrapped.action_masks())
        return masks if len(self.received) < 3 else self.fault(masks)


def _masked_env(space: str) -> gym.Env:
    from sb3_contrib.common.envs import InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete

    if space == "multidiscrete":
        return InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=1)
    if space == "multibinary":
        return InvalidActionEnvMultiBinary(dims=4, n_invalid_actions=1)
    return InvalidActionEnvDiscrete(dim=12, n_invalid_actions=2)


MASK_FAULTS = {  # name -> (action space, fault, message)
    "no action": ("discrete", np.zeros_like, r"action_masks row 0 allows no action of Discrete\(12\)"),
    "transposed": ("discrete", lambda m: m.reshape(-1, 1), r"action_masks of shape \(1, 12, 1\).*expected 1 mask\(s\) of 12"),
    "strings": ("discrete", lambda m: m.astype(str), r"action_masks of dtype <U5.*expected 1 mask\(s\) of 12 booleans"),
    "other numbers": ("discrete", lambda m: m * 2, r"action_masks of dtype int64 hold values other than 0 and 1 \(e\.g\. 2\)"),
    "resized": ("discrete", lambda m: m[:-1], r"action_masks of shape \(1, 11\).*expected 1 mask\(s\) of 12"),
    "None": ("discrete", lambda m: None, r"action_masks hold None.*expected 1 mask\(s\) of 12"),
    "no value of a MultiDiscrete block": (
        "multidiscrete",
        lambda m: np.concatenate([m[:3], np.zeros(4, dtype=bool)]),
        r"action_masks row 0 allows no value of sub-action 1 \(mask positions 3:7\) of MultiDiscrete\(\[3 4\]\)",
    ),
    "no value of a binary action": (
        "multibinary",
        lambda m: np.concatenate([m[:2], [False, False], m[4:]]),
        r"action_masks row 0 allows no value of sub-action 1 \(mask positions 2:4\) of MultiBinary\(4\)",
    ),
}


@pytest.mark.parametrize("fault", list(MASK_FAULTS))
def test_a_bad_mask_in_a_rollout_stops_it_before_the_env_gets_an_action(fault: str):
    space, change, message = MASK_FAULTS[fault]
    from sb3_ppo_ext import MaskablePPOExt

    env = FaultyMasks(_masked_env(space), change)
    model = MaskablePPOExt("MlpPolicy", env, **TINY)
    with pytest.raises(ValueError, match=r"env\.action_masks\(\) during the rollout: " + message):
        model.learn(64)
    assert len(env.received) == 3  # no action was chosen with the bad masks


@pytest.mark.parametrize("fault", [name for name in MASK_FAULTS if name != "None"])  # predict(action_masks=None): unmasked
def test_a_bad_mask_in_predict_is_the_same_error(fault: str):
    space, change, message = MASK_FAULTS[fault]
    from sb3_ppo_ext import MaskablePPOExt

    env = _masked_env(space)
    model = MaskablePPOExt("MlpPolicy", env, **TINY)
    obs, _ = env.reset(seed=0)
    bad = np.stack([change(np.asarray(env.action_masks()))])  # as the rollout stacks one env's masks
    with pytest.raises(ValueError, match=r"MaskablePPOExt\.predict: " + message):
        model.predict(obs, action_masks=bad)


def test_predict_names_the_row_of_a_batch_and_refuses_a_transposed_batch_mask():
    from sb3_ppo_ext import MaskablePPOExt

    env = _masked_env("discrete")
    model = MaskablePPOExt("MlpPolicy", env, **TINY)
    obs, _ = env.reset(seed=0)
    masks = np.stack([env.action_masks()] * 2)
    model.predict(np.stack([obs] * 2), action_masks=masks.astype(np.float32))  # 0/1 numbers are masks too
    with pytest.raises(ValueError, match=r"action_masks of shape \(12, 2\).*expected 2 mask\(s\) of 12 booleans each"):
        model.predict(np.stack([obs] * 2), action_masks=masks.T)  # the right size: upstream reshapes it
    masks[1] = False
    with pytest.raises(ValueError, match=r"action_masks row 1 allows no action"):
        model.predict(np.stack([obs] * 2), action_masks=masks)


# ---- a RecurrentPPOExt file trained by sb3-contrib's RecurrentPPO (which ignores squash_output)


def test_stock_recurrent_ppo_training_a_squashed_ext_file_warns_once(tmp_path: Path):
    from sb3_ppo_ext import RecurrentPPOExt
    from sb3_ppo_ext.recurrent import SquashedActionsWarning

    lstm = dict(TINY, n_steps=16, batch_size=16, policy_kwargs=dict(net_arch=[8], lstm_hidden_size=8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SquashedActionsWarning)
        ext = RecurrentPPOExt("MlpLstmPolicy", _pendulum(), **lstm)
        ext.learn(16)  # its own collection squashes the actions it sends
        ext.save(tmp_path / "ext")
        RecurrentPPOExt.load(tmp_path / "ext", env=_pendulum()).learn(16)
        stock = RecurrentPPO.load(tmp_path / "ext", env=_pendulum())
        obs = stock.get_env().reset()
        action, _ = stock.predict(obs, episode_start=np.ones(1, dtype=bool))  # predict squashes under either class
        assert action.shape == (1, 1)
        unsquashed = dict(lstm, policy_kwargs=dict(lstm["policy_kwargs"], squash_output=False))
        RecurrentPPOExt("MlpLstmPolicy", _pendulum(), **unsquashed).save(tmp_path / "unsquashed")
        RecurrentPPO.load(tmp_path / "unsquashed", env=_pendulum()).learn(16)  # upstream's head: nothing to warn of
    with pytest.warns(SquashedActionsWarning, match=r"sb3_contrib\.RecurrentPPO\.load.*RecurrentPPOExt\.load") as caught:
        stock.learn(32)
    assert len([w for w in caught if w.category is SquashedActionsWarning]) == 1  # once, not every step
