"""Distributed tuning: concurrent worker processes on one Optuna study in a real PostgreSQL database.

Needs ``SB3_PPO_EXT_TEST_POSTGRES_URL`` (``scripts/start_postgres.sh`` starts a server and prints
it; ``.ci/run`` does this in CI, where a missing server fails the tests instead of skipping them).
Workers are separate processes, as they would be on separate machines; each runs its own
``--n-trials``, so the study must end with exactly workers x n-trials finished trials.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import gymnasium as gym
import optuna
import pytest
from helpers import REPO_ROOT
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.samplers import ppo_ext_kwargs_from_params
from sb3_ppo_ext.storage import StorageError, make_storage
from sb3_ppo_ext.validation import to_algorithm_kwargs

# This module: concurrent worker processes, PostgreSQL.

N_WORKERS = 2
N_TRIALS = 3  # per worker
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def _start_workers(commands: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Start every worker at once, then wait for all (they run concurrently)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    results = []
    for command, process in zip(commands, processes, strict=True):
        stdout, stderr = process.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(command, process.returncode, stdout, stderr))
    for result in results:
        assert result.returncode == 0, f"{result.args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return results


def _check_study(url: str, study_name: str, expected: int) -> optuna.Study:
    """Exactly ``expected`` finished trials, numbered 0..expected-1, none lost, running or failed, from every worker."""
    study = optuna.load_study(study_name=study_name, storage=make_storage(url))
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == list(range(expected))
    assert len({t._trial_id for t in trials}) == expected
    assert all(t.state in FINISHED for t in trials), [t.state for t in trials]
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    return study


def _train_briefly(kwargs: dict) -> None:
    env = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
    kwargs = {**kwargs, "n_steps": min(kwargs["n_steps"], 128), "batch_size": min(kwargs["batch_size"], 128)}
    model = PPOExt("MlpPolicy", env, device="cpu", seed=0, **kwargs)
    model.learn(total_timesteps=128)
    assert model._n_updates > 0
    env.close()


def test_plain_optuna_workers_share_one_study(postgres_url: str, tmp_path: Path):
    """scripts/tune_ppo_ext.py x 2 processes -> one study; the best trial's params load back into a PPOExt that trains."""
    study_name = f"test-plain-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, str(REPO_ROOT / "scripts" / "tune_ppo_ext.py"), "--env", "Pendulum-v1", "--n-trials", str(N_TRIALS),
        "--n-timesteps", "256", "--n-evaluations", "1", "--eval-episodes", "1", "--n-startup-trials", "2",
        "--storage", postgres_url, "--study-name", study_name,
    ]  # fmt: skip
    results = _start_workers([[*command, "--seed", str(seed)] for seed in range(N_WORKERS)], tmp_path)
    assert all("best trial" in r.stdout for r in results)
    study = _check_study(postgres_url, study_name, N_WORKERS * N_TRIALS)
    assert len({t.user_attrs["worker"] for t in study.trials}) == N_WORKERS  # both workers ran trials
    _train_briefly(ppo_ext_kwargs_from_params(study.best_trial.params))


def test_zoo_optimize_workers_share_one_study(postgres_url: str, tmp_path: Path):
    """rl-zoo3 -optimize x 2 processes -> one study; rl-zoo3's load_trial gives settings that train a PPOExt."""
    study_name = f"test-zoo-{uuid.uuid4().hex[:8]}"
    command = [
        # The route without the startup hook, so that the test also runs from an editable dev install.
        sys.executable, "-m", "sb3_ppo_ext.zoo", "train", "--algo", "ppo_ext", "--env", "Pendulum-v1", "-optimize",
        "-n", "256", "--n-trials", str(N_TRIALS), "--n-startup-trials", "2", "--n-evaluations", "1", "--eval-episodes", "1",
        "--no-optim-plots", "--num-threads", "1", "--storage", postgres_url, "--study-name", study_name, "-params", "n_envs:1",
        "--pruner", "none",  # every trial completes, so a trial number > 0 exists for --trial-id below
    ]  # fmt: skip
    results = _start_workers([[*command, "--seed", str(seed)] for seed in range(N_WORKERS)], tmp_path)
    assert all("Best trial:" in r.stdout for r in results)
    _check_study(postgres_url, study_name, N_WORKERS * N_TRIALS)

    from sb3_ppo_ext import zoo

    zoo.register()  # before the import: the name must be bound to the installed subclass
    from rl_zoo3.exp_manager import ExperimentManager

    manager = ExperimentManager.__new__(ExperimentManager)
    manager.algo = "ppo_ext"
    settings = manager.load_trial(postgres_url, study_name)  # the best trial, converted for the zoo's yml form
    _train_briefly(to_algorithm_kwargs(settings))

    # The command-line route: train with a finished trial's settings (rl-zoo3 ignores --trial-id 0).
    study = optuna.load_study(study_name=study_name, storage=make_storage(postgres_url))
    trial_id = max(t.number for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.number > 0)
    train = [
        sys.executable, "-m", "sb3_ppo_ext.zoo", "train", "--algo", "ppo_ext", "--env", "Pendulum-v1", "-n", "256",
        "--eval-freq", "-1", "--num-threads", "1", "--storage", postgres_url, "--study-name", study_name,
        "--trial-id", str(trial_id), "-params", "n_envs:1",
    ]  # fmt: skip
    (result,) = _start_workers([train], tmp_path)
    assert "Loading from Optuna study" in result.stdout
    assert list((tmp_path / "logs" / "ppo_ext").glob("Pendulum-v1_*/Pendulum-v1.zip"))


def test_unreachable_postgres_fails_clearly(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "tune_ppo_ext.py"), "--storage", "postgresql://u:secret@127.0.0.1:9/x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "cannot open Optuna storage postgresql://u:***@127.0.0.1:9/x" in result.stderr and "secret" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite", "journal"])
def test_embedded_storage_two_workers(url: str, tmp_path: Path):
    """The no-server defaults for one machine: SQLite file and Optuna journal file, two concurrent workers."""
    storage = f"sqlite:///{tmp_path / 'study.db'}" if url == "sqlite" else str(tmp_path / "study.log")
    command = [
        sys.executable, str(REPO_ROOT / "scripts" / "tune_ppo_ext.py"), "--env", "CartPole-v1", "--n-trials", "2",
        "--n-timesteps", "128", "--n-evaluations", "1", "--eval-episodes", "1", "--storage", storage, "--study-name", "s",
    ]  # fmt: skip
    _start_workers([command, command], tmp_path)
    _check_study(storage, "s", 4)


def test_password_from_pgpassword_instead_of_the_url(postgres_url: str, monkeypatch: pytest.MonkeyPatch):
    """
    docs/guide/zoo.md: a URL without password works with PGPASSWORD, on a server that checks the
    password of the role ``sb3_ppo_ext_tuner`` (a pg_hba.conf line ``host all sb3_ppo_ext_tuner
    127.0.0.1/32 scram-sha-256`` above the others; skipped where the server trusts every role).
    """
    import sqlalchemy
    from sqlalchemy.engine import make_url

    role, password = "sb3_ppo_ext_tuner", uuid.uuid4().hex
    admin = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)"))
        connection.execute(sqlalchemy.text(f"DROP ROLE IF EXISTS {role}"))
        connection.execute(sqlalchemy.text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {role} OWNER {role}"))
    url = make_url(postgres_url).set(username=role, password=None, database=role).render_as_string(hide_password=False)
    assert password not in url and ":@" not in url
    try:
        monkeypatch.setenv("PGPASSWORD", "wrong")
        try:
            make_storage(url)
        except StorageError as error:
            assert "password authentication failed" in str(error) and "wrong" not in str(error)
        else:
            reason = "the server does not check passwords (trust authentication): nothing to show"
            if os.environ.get("CI", "").lower() == "true":  # scripts/start_postgres.sh's server checks this role's
                pytest.fail(f"{reason}; CI's server (scripts/start_postgres.sh) should check the password of {role}")
            pytest.skip(reason)
        monkeypatch.setenv("PGPASSWORD", password)
        study = optuna.create_study(storage=make_storage(url), study_name="s")
        study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
        assert len(optuna.load_study(study_name="s", storage=make_storage(url)).trials) == 1
    finally:
        with admin.connect() as connection:
            connection.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {role} WITH (FORCE)"))
            connection.execute(sqlalchemy.text(f"DROP ROLE IF EXISTS {role}"))
        admin.dispose()
