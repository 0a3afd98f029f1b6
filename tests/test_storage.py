"""Optuna storage lives in sb3_ppo_ext.storage; one PostgreSQL driver, the one SQLAlchemy uses."""

from __future__ import annotations

import re
import time
from pathlib import Path

import optuna
import pytest
import tomllib
from helpers import modules_after_imports
from packaging.requirements import Requirement
from packaging.version import Version

from sb3_ppo_ext import samplers, storage
from sb3_ppo_ext.storage import make_storage

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _dependencies(extra: str | None = None) -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    texts = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    requirements = [Requirement(text) for text in texts]
    return {requirement.name.lower(): requirement for requirement in requirements}


def test_the_algorithms_depend_on_neither_rl_zoo3_nor_optuna_nor_a_database_driver():
    core = _dependencies()
    assert {"torch", "stable-baselines3", "sb3-contrib", "gymnasium"} <= set(core)
    assert not {"rl-zoo3", "optuna", "sqlalchemy", "psycopg", "pandas", "seaborn", "scipy", "requests"} & set(core)
    assert {"rl-zoo3", "optuna"} <= set(_dependencies("zoo"))
    # The extras that need the zoo's packages name it: the test suite and the benchmarks run rl-zoo3.
    for extra in ("postgres", "test", "bench"):
        assert "zoo" in _dependencies(extra)["sb3-ppo-ext"].extras, extra


def test_one_postgresql_driver_the_one_sqlalchemy_uses():
    import sqlalchemy
    from sqlalchemy.engine import make_url

    dependencies = _dependencies("postgres")
    drivers = {name for name in dependencies if re.fullmatch(r"psycopg2?(-binary)?", name)}
    assert drivers == {"psycopg"}, drivers
    # SQLAlchemy >= 2.1 maps postgresql:// to psycopg 3: the declared floor guarantees the mapping.
    assert not dependencies["sqlalchemy"].specifier.contains("2.0.40")
    assert dependencies["sqlalchemy"].specifier.contains(sqlalchemy.__version__)
    assert Version(sqlalchemy.__version__) >= Version("2.1")
    assert make_url("postgresql://user@host/db").get_dialect().driver == "psycopg"


def test_storage_module_owns_storage():
    assert not any(hasattr(samplers, name) for name in ("make_storage", "StorageError", "_open_rdb_storage"))
    loaded = modules_after_imports()["sb3_ppo_ext.settings"]  # after the storage and settings modules
    assert ["optuna" in loaded, "rl_zoo3" in loaded] == [False, False]


SECRET = "t0pSecret"


@pytest.mark.parametrize(
    "url, shown",
    [
        (f"postgresql://user:{SECRET}@127.0.0.1:9/db", "postgresql://user:***@127.0.0.1:9/db"),
        (f"postgresql://:{SECRET}@127.0.0.1:9/db", "postgresql://:***@127.0.0.1:9/db"),
        (f"postgresql://user@127.0.0.1:9/db?password={SECRET}", "postgresql://user@127.0.0.1:9/db?password=***"),
        (
            f"postgresql://127.0.0.1:9/db?sslmode=disable&password={SECRET}&connect_timeout=1",
            "postgresql://127.0.0.1:9/db?sslmode=disable&password=***&connect_timeout=1",
        ),
        # A raw "@" in the password: SQLAlchemy splits at the first one and takes "Secret@127.0.0.1" for the host.
        ("postgresql://user:t0p@Secret@127.0.0.1:9/db", "postgresql://user:***@127.0.0.1:9/db"),
        ("postgresql://user:t0p@Sec@ret@127.0.0.1:9/db", "postgresql://user:***@127.0.0.1:9/db"),
    ],
)
def test_storage_error_shows_no_part_of_any_password(url: str, shown: str):
    with pytest.raises(storage.StorageError) as raised:
        storage.make_storage(url)
    message = str(raised.value)
    assert f"cannot open Optuna storage {shown}: " in message
    for part in ("t0p", "Secret", "Sec", "ret@"):
        assert part not in message, message
    if "@Sec" in url:
        assert "must be written %40" in message


def test_password_free_urls_are_shown_whole():
    for url in ("sqlite:///study.db", "postgresql://user@db-host:5432/optuna?sslmode=require", "postgresql://u:p%40ss@h/db"):
        expected = url.replace(":p%40ss@", ":***@")
        assert storage._url_secrets(url)[0] == expected


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")  # study.ask()
def test_trial_budget_callback_fails_a_dead_workers_trial_and_stops_at_the_budget(tmp_path):
    """
    rl-zoo3's ``--max-total-trials`` counts RUNNING trials: a dead worker's trial (its heartbeat
    stopped) would end the study one short. ``TrialBudgetCallback`` fails it first (Optuna re-queues
    a copy) and stops the study once the budget of trials has finished.
    """
    import time

    import optuna

    from sb3_ppo_ext.zoo_manager import TrialBudgetCallback

    db = storage.make_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=db, study_name="budget")
    dead = study.ask()  # a worker that started a trial and died: its heartbeat stops
    db.record_heartbeat(dead._trial_id)
    time.sleep(2.5)  # past the grace period
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.PRUNED)
    budget = TrialBudgetCallback(poll_seconds=0.2, n_trials=3, states=states)
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=10, callbacks=[budget])
    by_state = {state: [t.number for t in study.trials if t.state == state] for state in optuna.trial.TrialState}
    assert by_state[optuna.trial.TrialState.FAIL] == [dead.number]
    assert len(by_state[optuna.trial.TrialState.COMPLETE]) == 3  # the budget, all finished
    assert not by_state[optuna.trial.TrialState.RUNNING] and not by_state[optuna.trial.TrialState.WAITING]


# The heartbeat of the storage tests, in seconds, and the trial states that count towards a budget.
HEARTBEAT = 1
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def test_make_storage_heartbeat_settings_are_checked():
    with pytest.raises(ValueError, match="heartbeat_interval=-1"):
        make_storage("sqlite://", heartbeat_interval=-1)
    with pytest.raises(ValueError, match="max_retry=-2"):
        make_storage("sqlite://", max_retry=-2)
    storage = make_storage("sqlite://", heartbeat_interval=5, grace_period=7)
    assert storage.heartbeat_interval == 5 and storage.grace_period == 7
    assert make_storage("sqlite://", heartbeat_interval=0).heartbeat_interval is None


def test_make_storage_retries_the_table_creation_race(monkeypatch: pytest.MonkeyPatch):
    """Workers started together on a fresh database race to create Optuna's tables; the loser retries."""
    from sqlalchemy.exc import IntegrityError

    original, calls = optuna.storages.RDBStorage, []

    def racing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise IntegrityError("INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed"))
        return original(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    assert make_storage("sqlite://") is not None and len(calls) == 2


def test_zoo_budget_count_fails_a_dead_workers_trial_before_rl_zoo3_counts(tmp_path: Path):
    """The count rl-zoo3 makes before starting: a RUNNING trial whose heartbeat stopped is failed and re-queued first."""
    from sb3_ppo_ext.zoo_manager import settle_trial_budget

    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = make_storage(url, heartbeat_interval=HEARTBEAT, grace_period=1)
    study = optuna.create_study(storage=storage, study_name="s")
    dead = study.ask()
    storage.record_heartbeat(dead._trial_id)  # a worker's last heartbeat; it then died
    time.sleep(2.5)
    settle_trial_budget(storage, "s", n_trials=1)
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {dead.number: optuna.trial.TrialState.FAIL, dead.number + 1: optuna.trial.TrialState.WAITING}
