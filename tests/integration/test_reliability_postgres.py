"""A tuning worker killed mid-trial on a real PostgreSQL study: its trial is failed by Optuna's heartbeat and retried.

Needs ``SB3_PPO_EXT_TEST_POSTGRES_URL`` (see ``integration/test_zoo_postgres.py``). Worker A starts a long
trial and is killed with SIGKILL while the trial is RUNNING; worker B, started after the grace
period, marks A's trial FAIL (its heartbeat is stale), runs the re-queued copy with the same
parameters, and stops when the study has its ``--max-total-trials`` finished trials.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from helpers import REPO_ROOT, run_and_sigkill

from sb3_ppo_ext.storage import make_storage

HEARTBEAT, GRACE = 1, 3
TOTAL = 2
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def _kill_while_running(command: list[str], url: str, study_name: str, cwd: Path, env: dict[str, str]) -> int:
    """Start a worker, SIGKILL it once its trial has been RUNNING for two heartbeats; return that trial's number."""
    running: list[optuna.trial.FrozenTrial] = []
    first_seen: list[float] = []

    def trial_under_way() -> bool:
        if not running:
            try:
                study = optuna.load_study(study_name=study_name, storage=url)
                running.extend(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
            except KeyError:  # the study does not exist yet
                return False
            if not running:
                return False
            first_seen.append(time.monotonic())
        return time.monotonic() - first_seen[0] > 2 * HEARTBEAT

    run_and_sigkill(command, trial_under_way, cwd=cwd, env=env)
    return running[0].number


def _check_recovered(url: str, study_name: str, dead: int) -> None:
    study = optuna.load_study(study_name=study_name, storage=make_storage(url))
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert trials[dead].state == optuna.trial.TrialState.FAIL
    retries = [t for t in trials.values() if t.system_attrs.get("failed_trial") == dead]
    assert len(retries) == 1 and retries[0].state in FINISHED
    assert retries[0].params == trials[dead].params
    states = [t.state for t in trials.values()]
    assert sum(state in FINISHED for state in states) == TOTAL
    assert optuna.trial.TrialState.RUNNING not in states and optuna.trial.TrialState.WAITING not in states


# PostgreSQL, SIGKILLed worker
def test_plain_optuna_dead_worker_trial_is_failed_and_retried(postgres_url: str, tmp_path: Path):
    study_name = f"test-heartbeat-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, str(REPO_ROOT / "scripts" / "tune_ppo_ext.py"), "--env", "Pendulum-v1", "--n-trials", "10",
        "--max-total-trials", str(TOTAL), "--n-evaluations", "1", "--eval-episodes", "1", "--n-startup-trials", "1",
        "--storage", postgres_url, "--study-name", study_name,
        "--heartbeat-interval", str(HEARTBEAT), "--grace-period", str(GRACE),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    dead = _kill_while_running([*command, "--n-timesteps", "1000000"], postgres_url, study_name, tmp_path, env)
    time.sleep(GRACE + 0.5)
    result = subprocess.run(
        [*command, "--n-timesteps", "256"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _check_recovered(postgres_url, study_name, dead)


# PostgreSQL, SIGKILLed worker
def test_zoo_optimize_dead_worker_trial_is_failed_and_retried(postgres_url: str, tmp_path: Path):
    study_name = f"test-zoo-heartbeat-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, "-m", "sb3_ppo_ext.zoo", "train", "--algo", "ppo_ext", "--env", "Pendulum-v1", "-optimize",
        "--n-trials", "10", "--max-total-trials", str(TOTAL), "--n-startup-trials", "1", "--n-evaluations", "1",
        "--eval-episodes", "1", "--no-optim-plots", "--num-threads", "1", "--storage", postgres_url,
        "--study-name", study_name, "-params", "n_envs:1", "--pruner", "none",
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SB3_PPO_EXT_HEARTBEAT_INTERVAL": str(HEARTBEAT),
        "SB3_PPO_EXT_GRACE_PERIOD": str(GRACE),
    }
    dead = _kill_while_running([*command, "-n", "1000000"], postgres_url, study_name, tmp_path, env)
    time.sleep(GRACE + 0.5)
    result = subprocess.run([*command, "-n", "256"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_recovered(postgres_url, study_name, dead)


def _zoo_optimize(storage: str, study_name: str, total: int, n_timesteps: int) -> list[str]:
    return [
        sys.executable, "-m", "sb3_ppo_ext.zoo", "train", "--algo", "ppo_ext", "--env", "Pendulum-v1", "-optimize",
        "--n-trials", "10", "--max-total-trials", str(total), "--n-startup-trials", "1", "--n-evaluations", "1",
        "--eval-episodes", "1", "--no-optim-plots", "--num-threads", "1", "--storage", storage,
        "--study-name", study_name, "-params", "n_envs:1", "--pruner", "none", "-n", str(n_timesteps),
    ]  # fmt: skip


# two rl-zoo3 workers, one SIGKILLed
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_zoo_optimize_two_workers_one_killed_reach_max_total_trials(backend: str, request, tmp_path: Path):
    """
    Worker B runs a long trial; worker A starts its first trial while B is alive (B's heartbeat is
    fresh, so nothing is stale when A's trial starts), then B is SIGKILLed. rl-zoo3 counts B's
    RUNNING trial against --max-total-trials after A's trial: before the fix A stopped there with
    one finished trial. Now A fails B's trial before counting (waiting for it to go stale if its
    grace period has not passed yet), runs its copy, and the study ends with --max-total-trials
    finished trials, nothing RUNNING or WAITING.
    """
    storage = f"sqlite:///{tmp_path / 'study.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    study_name = f"test-zoo-budget-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SB3_PPO_EXT_HEARTBEAT_INTERVAL": str(HEARTBEAT),
        "SB3_PPO_EXT_GRACE_PERIOD": str(GRACE),
    }
    survivor: list[subprocess.Popen] = []
    seen: dict[str, int] = {}

    def survivor_trial_started() -> bool:
        try:
            trials = optuna.load_study(study_name=study_name, storage=storage).get_trials(deepcopy=False)
        except KeyError:  # the study does not exist yet
            return False
        if not trials:
            return False
        seen.setdefault("dead", trials[0].number)
        if not survivor:  # B's trial is under way: start A, with short trials
            survivor.append(
                subprocess.Popen(
                    _zoo_optimize(storage, study_name, TOTAL, 256),
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        return len(trials) > 1  # A's first trial has started, while B is alive

    try:
        run_and_sigkill(_zoo_optimize(storage, study_name, TOTAL, 10**6), survivor_trial_started, cwd=tmp_path, env=env)
        _, stderr = survivor[0].communicate(timeout=300)
    finally:
        for process in survivor:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert survivor[0].returncode == 0, stderr[-3000:]
    _check_recovered(storage, study_name, seen["dead"])
