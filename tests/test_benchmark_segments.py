"""scripts/benchmark.py in segments: a run paused or killed at a checkpoint continues from it, on any machine."""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch as th
from benchmarks import checkpoints, records, runner, suites

# Pendulum with the shipped entry's adaptive-KL variant, small rollouts (128 steps, one env) and
# VecNormalize, so that a 1024-step run has eight updates, beta moves and statistics accumulate.
TINY = (
    "ppo_ext",
    {
        "n_envs": 1,
        "n_steps": 128,
        "batch_size": 64,
        "n_epochs": 2,
        "normalize": True,
        "clip_range": None,
        "kl_coef": 1.0,
        "kl_target": 0.001,
    },
    "test variant: adaptive KL, 128-step rollouts, VecNormalize",
)


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    monkeypatch.setitem(suites.ALGOS, "tiny_kl", TINY)
    return records.RunSpec("Pendulum-v1", "tiny_kl", 0, 1024, 256, 1, str(tmp_path / "a"), machine="first machine")


def _rows(spec) -> list[dict[str, str]]:
    with open(spec.csv_path, newline="") as file:
        return list(csv.DictReader(file))


def _returns(rows) -> list[tuple[int, str]]:
    """Evaluation results without the timing columns (which differ from run to run)."""
    return [(int(row["timesteps"]), row["mean_return"]) for row in rows]


def test_paused_run_continues_from_its_checkpoint(tiny, tmp_path, monkeypatch):
    # Uninterrupted, for reference.
    whole = dataclasses.replace(tiny, out=str(tmp_path / "whole"))
    runner.run_one(whole)
    whole_rows = _returns(_rows(whole))
    assert [step for step, _ in whole_rows] == [0, 256, 512, 768, 1024]

    paused = runner.run_one(dataclasses.replace(tiny, segment_steps=384))
    assert paused == {"paused": True, "timesteps": 384, "resumed": "no checkpoint"}
    assert not tiny.marker_path.exists() and not tiny.csv_path.exists()
    state, why = checkpoints.read_checkpoint(tiny)
    assert why == "checkpoint at 384 steps" and state["timesteps"] == 384
    # Evaluations up to the checkpoint are in it, and equal to the uninterrupted run's (same process so far).
    assert [(row[0], f"{row[1]:.6g}") for row in state["rows"]] == whole_rows[:2]
    assert state["next_eval"] == 512
    assert [(part["from_timesteps"], part["to_timesteps"], part["machine"]) for part in state["segments"]] == [
        (0, 384, "first machine")
    ]
    from sb3_ppo_ext import PPOExt

    checkpointed = PPOExt.load(io.BytesIO(state["model"]))  # its beta moved away from the initial 1.0
    assert checkpointed.num_timesteps == 384 and checkpointed.current_kl_coef != 1.0
    arrays = state["arrays"]  # VecNormalize's statistics, read without pickle
    assert arrays["obs_rms.count"] > 384 and arrays["ret_rms.count"] > 384 and arrays["obs_rms.mean"].shape == (3,)

    restored = {}
    original_restore = checkpoints.restore

    def spy(model, state, spec, eval_env):
        model = original_restore(model, state, spec, eval_env)
        vec_normalize = model.get_vec_normalize_env()
        restored.update(
            beta=model.current_kl_coef,
            steps=model.num_timesteps,
            mean=vec_normalize.obs_rms.mean.copy(),
            count=vec_normalize.obs_rms.count,
            params={key: value.clone() for key, value in model.policy.state_dict().items()},
            lr=model.lr_schedule(model._current_progress_remaining),
            torch_rng=th.get_rng_state().numpy().copy(),
            numpy_rng=np.random.get_state()[1].copy(),
        )
        return model

    monkeypatch.setattr(checkpoints, "restore", spy)
    marker = runner.run_one(dataclasses.replace(tiny, machine="second machine"))
    assert restored["beta"] == checkpointed.current_kl_coef and restored["steps"] == 384
    np.testing.assert_array_equal(restored["mean"], arrays["obs_rms.mean"])
    assert restored["count"] == arrays["obs_rms.count"]
    # The generators continue where the checkpoint left them (SB3's load had reseeded them from the model's seed).
    np.testing.assert_array_equal(restored["torch_rng"], arrays["torch_rng"])
    np.testing.assert_array_equal(restored["numpy_rng"], arrays["numpy_rng_keys"])
    for key, value in checkpointed.policy.state_dict().items():
        assert th.equal(restored["params"][key], value), key
    assert restored["lr"] == pytest.approx(checkpointed.lr_schedule(1 - 384 / 1024))

    rows = _rows(tiny)
    assert _returns(rows)[:2] == whole_rows[:2]
    assert [step for step, _ in _returns(rows)] == [0, 256, 512, 768, 1024]
    assert all(float(a["wall_time"]) < float(b["wall_time"]) for a, b in itertools.pairwise(rows[1:]))  # time adds up
    assert [(part["from_timesteps"], part["to_timesteps"], part["machine"]) for part in marker["segments"]] == [
        (0, 384, "first machine"),
        (384, 1024, "second machine"),
    ]
    assert all(part["revision"] == marker["sb3_ppo_ext_revision"] for part in marker["segments"])
    # Each segment names its CPU (where the OS says it): timings are compared within one kind of machine.
    assert all(part["cpu_model"] == records.cpu_model() for part in marker["segments"])
    assert marker["total_wall_time_s"] == pytest.approx(sum(part["wall_time_s"] for part in marker["segments"]))
    assert not tiny.checkpoint_path.exists()  # finished: the CSV and marker are the result
    assert runner.is_finished(tiny)

    # Segmented the same way again: the continuation is deterministic.
    again = dataclasses.replace(tiny, out=str(tmp_path / "again"))
    runner.run_one(dataclasses.replace(again, segment_steps=384))
    runner.run_one(again)
    assert _returns(_rows(again)) == _returns(rows)


def test_checkpoint_of_other_settings_or_unreadable_is_not_continued(tiny):
    runner.run_one(dataclasses.replace(tiny, segment_steps=256))
    assert checkpoints.read_checkpoint(tiny)[0]["timesteps"] == 256
    # Another budget (here: evaluation episodes) is another run: not mixed with this one.
    other = dataclasses.replace(tiny, eval_episodes=2)
    state, why = checkpoints.read_checkpoint(other)
    assert state is None and "changed since checkpoint" in why
    marker = runner.run_one(other)
    assert [part["from_timesteps"] for part in marker["segments"]] == [0]
    assert marker["budget"]["eval_episodes"] == 2 and not tiny.checkpoint_path.exists()

    # A checkpoint cut short (or any foreign file) is reported and the run starts over.
    runner.run_one(dataclasses.replace(tiny, segment_steps=256))
    tiny.checkpoint_path.write_bytes(tiny.checkpoint_path.read_bytes()[:1000])
    state, why = checkpoints.read_checkpoint(tiny)
    assert state is None and "is unreadable" in why
    with zipfile.ZipFile(tiny.checkpoint_path, "w") as archive:
        archive.writestr("state.json", json.dumps({"format": 0}))
    assert "not a format-1" in checkpoints.read_checkpoint(tiny)[1]
    marker = runner.run_one(tiny)
    assert [part["from_timesteps"] for part in marker["segments"]] == [0]


def test_past_deadline_starts_nothing_and_keeps_the_files(tiny):
    runner.run_one(dataclasses.replace(tiny, segment_steps=256))
    files = {path: path.read_bytes() for path in Path(tiny.out).rglob("*") if path.is_file() and path.suffix != ".log"}
    result = runner.run_one(dataclasses.replace(tiny, deadline=time.time() - 1))
    assert result["paused"] and result["started"] is False and result["timesteps"] == 256
    assert runner.pause_line("run", result) == (
        "NOT RUN run (the --stop-after deadline passed first; stays at its checkpoint of 256 steps)"
    )
    assert {path: path.read_bytes() for path in files} == files
    fresh = dataclasses.replace(tiny, seed=1, deadline=time.time() - 1)
    result = runner.run_one(fresh)
    assert result == {"paused": True, "started": False, "timesteps": 0, "resumed": "no checkpoint"}
    assert runner.pause_line("run", result) == "NOT RUN run (the --stop-after deadline passed first; not started)"
    assert not fresh.csv_path.with_suffix(".csv.tmp").exists()


def test_deadline_pauses_at_the_next_checkpoint(tiny, monkeypatch):
    class Clock:
        """
        time.time() before the deadline (1.0) at the start check and the first rollout, real time (past it)
        afterwards: the deadline passes during training, however slow a loaded machine makes the setup.
        """

        def __init__(self) -> None:
            self.calls = 0

        def __getattr__(self, name: str):
            return getattr(time, name)

        def time(self) -> float:
            self.calls += 1
            return 0.0 if self.calls <= 2 else time.time()

    clock = Clock()
    monkeypatch.setattr(runner, "time", clock)
    long = dataclasses.replace(tiny, steps=1_000_000, deadline=1.0)
    result = runner.run_one(long)
    assert clock.calls > 2
    state, _ = checkpoints.read_checkpoint(long)
    assert result["paused"] and 0 < result["timesteps"] == state["timesteps"] < 1_000_000
    assert runner.pause_line("run", result) == f"PAUSED run at {result['timesteps']} steps (checkpointed)"
    assert result["timesteps"] % 128 == 0  # at a rollout boundary
    assert all(row[0] <= state["timesteps"] for row in state["rows"]) and not long.marker_path.exists()
