"""Crashes with real processes: SIGKILL in the middle of a save and in the middle of an update, then resume.

Each test starts a Python child that trains or saves, waits until the child reports (through a
marker file) that it is inside the save or the update, kills it with SIGKILL and checks what is
on disk: the previous model file intact, the newest checkpoint complete, and a resume that
restores the timestep count, beta, the adapted learning rate, the VecNormalize statistics and the
weights exactly as they were when that checkpoint was written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from helpers import run_and_sigkill
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.callbacks import KLAdaptiveLR
from sb3_ppo_ext.reliability import (
    TEMPORARY_PREFIX,
    ModelFileError,
    check_model_file,
    latest_checkpoint,
    list_checkpoints,
    resume,
)

# This module: real processes killed with SIGKILL.

th.set_num_threads(1)

# Child: save a model once, then save it again with the zip writer held half-way (marker "mid_save").
SAVE_CHILD = """
import os, sys, time
import torch as th
th.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common import save_util
from sb3_ppo_ext import PPOExt

folder, algorithm = sys.argv[1], {"PPOExt": PPOExt, "PPO": PPO}[sys.argv[2]]
model = algorithm("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, policy_kwargs=dict(net_arch=[8]), device="cpu")
model.save(os.path.join(folder, "model.zip"))
open(os.path.join(folder, "first_saved"), "w").close()
original = save_util.th.save

def held_save(obj, file, *args, **kwargs):
    original(obj, file, *args, **kwargs)
    file.flush()
    open(os.path.join(folder, "mid_save"), "w").close()
    time.sleep(120)

save_util.th.save = held_save
with th.no_grad():
    for parameter in model.policy.parameters():
        parameter.add_(1.0)
model.save(os.path.join(folder, "model.zip"))
"""

# Child: PPOExt with an adaptive beta, KLAdaptiveLR and VecNormalize, checkpointing every 32 steps;
# KL far below both targets: every update halves beta and multiplies the rate by 1.5. It
# records what each checkpoint must restore, and after the third checkpoint it holds inside the
# next update, right after its first gradient step (marker "in_update").
TRAIN_CHILD = """
import json, os, sys, time
import torch as th
th.set_num_threads(1)
import gymnasium as gym
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.callbacks import KLAdaptiveLR
from sb3_ppo_ext.reliability import AtomicCheckpointCallback, atomic_path

folder = sys.argv[1]

class RecordingCheckpoints(AtomicCheckpointCallback):
    def save_checkpoint(self):
        path = super().save_checkpoint()
        model = self.model
        stats = model.get_vec_normalize_env()
        record = dict(
            timesteps=model.num_timesteps,
            kl_coef=model.current_kl_coef,
            learning_rate=model.learning_rate,
            obs_mean=stats.obs_rms.mean.tolist(),
            obs_count=stats.obs_rms.count,
            params=[p.detach().flatten().tolist() for p in model.policy.parameters()],
        )
        with atomic_path(os.path.join(folder, f"expected_{model.num_timesteps}.json")) as file:
            file.write(json.dumps(record).encode())
        self.n_saved = getattr(self, "n_saved", 0) + 1
        return path

checkpoints = RecordingCheckpoints(save_freq=32, save_path=folder)
env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
model = PPOExt(
    "MlpPolicy", env, n_steps=32, batch_size=16, n_epochs=2, learning_rate=3e-4, kl_coef=1.0, kl_target=10.0,
    policy_kwargs=dict(net_arch=[8]), device="cpu", seed=0,
)
step = model.policy.optimizer.step

def held_step(*args, **kwargs):
    result = step(*args, **kwargs)
    if getattr(checkpoints, "n_saved", 0) >= 3:
        open(os.path.join(folder, "in_update"), "w").close()
        time.sleep(120)
    return result

model.policy.optimizer.step = held_step
model.learn(10**6, callback=[KLAdaptiveLR(target_kl=10.0), checkpoints])
"""


def _run_until(command: list[str], marker: Path, **popen_kwargs) -> None:
    """Start ``command``, SIGKILL it as soon as it has written ``marker``."""
    run_and_sigkill(command, marker.exists, **popen_kwargs)


@pytest.mark.parametrize("algorithm", ["PPOExt", "PPO"])
def test_sigkill_mid_save(tmp_path: Path, algorithm: str):
    """PPOExt: the previous file survives a SIGKILL in the middle of a save. Stock PPO (same kill) is left broken."""
    _run_until([sys.executable, "-c", SAVE_CHILD, str(tmp_path), algorithm], tmp_path / "mid_save")
    assert (tmp_path / "first_saved").exists()
    if algorithm == "PPO":
        with pytest.raises(ModelFileError, match=r"model\.zip is truncated or corrupt"):
            check_model_file(tmp_path / "model.zip", "PPO", None)
        return
    model = PPOExt.load(tmp_path / "model.zip", device="cpu")  # the first save, complete
    model.predict(np.zeros(3, np.float32))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(TEMPORARY_PREFIX)]
    assert len(leftovers) == 1  # the killed save's temporary file, never renamed over model.zip
    assert sorted(tmp_path.glob("*.zip")) == [tmp_path / "model.zip"]  # hidden from *.zip patterns


def test_sigkill_mid_update_then_resume(tmp_path: Path):
    """Kill during an update; resume from the last checkpoint with steps, beta, adapted LR, VecNormalize and weights."""
    _run_until([sys.executable, "-c", TRAIN_CHILD, str(tmp_path)], tmp_path / "in_update")
    checkpoint = latest_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.timesteps == 96 and checkpoint.vec_normalize_path is not None
    expected = json.loads((tmp_path / f"expected_{checkpoint.timesteps}.json").read_text())
    assert expected["kl_coef"] == 0.25 and expected["learning_rate"] == pytest.approx(
        3e-4 * 1.5**2
    )  # two updates adapted them

    model = resume(PPOExt, tmp_path, DummyVecEnv([lambda: gym.make("Pendulum-v1")]), device="cpu")
    assert model.num_timesteps == expected["timesteps"]
    assert model.current_kl_coef == expected["kl_coef"]
    assert model.learning_rate == expected["learning_rate"]
    assert model.policy.optimizer.param_groups[0]["lr"] == expected["learning_rate"]
    for parameter, saved in zip(model.policy.parameters(), expected["params"], strict=True):
        assert parameter.detach().flatten().tolist() == saved
    stats = model.get_vec_normalize_env()
    assert stats is not None and stats.obs_rms.mean.tolist() == expected["obs_mean"]
    assert stats.obs_rms.count == expected["obs_count"] and stats.training

    # Training goes on from there: the step count continues, beta and the rate adapt from the saved values.
    adaptive_lr = KLAdaptiveLR(target_kl=10.0)
    model.learn(32, reset_num_timesteps=False, callback=adaptive_lr)
    assert model.num_timesteps == expected["timesteps"] + 32
    assert model.current_kl_coef == expected["kl_coef"] / 2
    assert model.learning_rate == pytest.approx(expected["learning_rate"] * 1.5)


# --- the rl-zoo3 route: --save-freq, SIGKILL mid-update, then -i <checkpoint> ------------------

ZOO_YML = """
Pendulum-v1:
  n_envs: 1
  n_timesteps: 100000
  policy: MlpPolicy
  n_steps: 32
  batch_size: 16
  n_epochs: 2
  normalize: true
  learning_rate: 0.0003
  kl_coef: 1.0
  kl_target: 10.0
  policy_kwargs: {net_arch: [8]}
  callback:
    - sb3_ppo_ext.callbacks.KLAdaptiveLR: {target_kl: 10.0}
    - crash_helpers.HoldInUpdate
"""

# A callback that, when HOLD_AFTER_STEPS is set, holds the process inside the first update that
# starts at or after that many steps, right after its first gradient step (marker "in_update").
CRASH_HELPERS = """
import os, time
from stable_baselines3.common.callbacks import BaseCallback

class HoldInUpdate(BaseCallback):
    def _on_training_start(self):
        after = os.environ.get("HOLD_AFTER_STEPS")
        if after is None:
            return
        optimizer, step = self.model.policy.optimizer, self.model.policy.optimizer.step

        def held_step(*args, **kwargs):
            result = step(*args, **kwargs)
            if self.model.num_timesteps >= int(after):
                open(os.environ["HOLD_MARKER"], "w").close()
                time.sleep(120)
            return result

        optimizer.step = held_step

    def _on_step(self):
        return True
"""


def test_zoo_sigkill_mid_update_then_continue_with_i(tmp_path: Path):
    """rl_zoo3 train --save-freq, killed mid-update; -i <last checkpoint> goes on with steps, beta, LR and VecNormalize."""
    (tmp_path / "ppo_ext.yml").write_text(ZOO_YML)
    (tmp_path / "crash_helpers.py").write_text(CRASH_HELPERS)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path), "HOLD_MARKER": str(tmp_path / "in_update")}
    train = [
        sys.executable, "-m", "sb3_ppo_ext.zoo", "train", "--algo", "ppo_ext", "--env", "Pendulum-v1",
        "--conf-file", str(tmp_path / "ppo_ext.yml"), "-f", str(tmp_path / "logs"), "--eval-freq", "-1",
        "--num-threads", "1", "--seed", "0",
    ]  # fmt: skip
    _run_until([*train, "--save-freq", "32"], tmp_path / "in_update", cwd=tmp_path, env={**env, "HOLD_AFTER_STEPS": "96"})

    run = tmp_path / "logs" / "ppo_ext" / "Pendulum-v1_1"
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None and checkpoint.timesteps == 96 and checkpoint.vec_normalize_path is not None
    saved_stats = VecNormalize.load(str(checkpoint.vec_normalize_path), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))

    result = subprocess.run(
        [*train, "-n", "32", "--save-freq", "32", "-i", str(checkpoint.model_path)], cwd=tmp_path, env=env,
        capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Loading the checkpoint's VecNormalize stats {checkpoint.vec_normalize_path}" in result.stdout
    resumed = tmp_path / "logs" / "ppo_ext" / "Pendulum-v1_2"
    model = PPOExt.load(resumed / "Pendulum-v1.zip", device="cpu")
    # Two updates before the checkpoint, one after: beta 1 -> 0.5 -> 0.25 | -> 0.125; rate x1.5 each time.
    assert model.num_timesteps == 96 + 32
    assert model.current_kl_coef == 0.125
    assert model.learning_rate == pytest.approx(3e-4 * 1.5**3)
    # The resumed run's own checkpoints go on from the step count, and hold only the model's state.
    assert [c.timesteps for c in list_checkpoints(resumed)] == [128]
    with zipfile.ZipFile(resumed / "rl_model_128_steps.zip") as archive:
        assert "learn" not in json.loads(archive.read("data"))
    stats = VecNormalize.load(
        str(resumed / "Pendulum-v1" / "vecnormalize.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    )
    assert stats.obs_rms.count == pytest.approx(saved_stats.obs_rms.count + 1 + 32)  # learn's reset, then 32 steps
