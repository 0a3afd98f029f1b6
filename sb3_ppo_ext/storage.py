"""Optuna storage for tuning: the one place where a storage is opened (URLs, journal files, heartbeat, retries).

A PostgreSQL URL (``postgresql://user:pass@host/db``) goes through SQLAlchemy, which maps
``postgresql://`` to the psycopg 3 driver (SQLAlchemy >= 2.1), the one this package depends on.
Importing this module does not import optuna; :func:`make_storage` does.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import TYPE_CHECKING, Any

from sb3_ppo_ext.validation import check_int

if TYPE_CHECKING:
    import optuna


class StorageError(RuntimeError):
    """An Optuna storage could not be opened; the message names the (password-masked) URL and the reason."""


def _url_secrets(url: str) -> tuple[str, list[str]]:
    """
    ``url`` with every password masked (``***``), and the password texts themselves (to scrub them from messages).

    The password of the user information (``user:password@``, ``:password@``) and of a
    ``password=`` query parameter is masked. A raw ``@`` in a password (it should be written
    ``%40``) is read as part of it: the user information ends at the *last* ``@``, so no part of
    the password is shown, although SQLAlchemy would split at the first one and take the rest
    (the password's tail) for the host name.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url, []
    secrets: list[str] = []
    at = rest.rfind("@")
    userinfo = rest[:at] if at >= 0 else ""
    user, colon, password = userinfo.partition(":")
    if colon and not re.search(r"[/?]", user):  # a user name holds no "/" or "?": else the "@" is past the host
        secrets.append(password)
        rest = f"{user}:***{rest[at:]}"

    def masked_query(match: re.Match[str]) -> str:
        secrets.append(match.group(2))
        return f"{match.group(1)}***"

    rest = re.sub(r"([?&]password=)([^&]*)", masked_query, rest)
    return f"{scheme}://{rest}", [secret for secret in secrets if secret]


def _mask_password(url: str) -> str:
    """``url`` with every form of password masked: ``user:pw@``, ``:pw@``, ``?password=pw``, a raw ``@`` in ``pw``."""
    return _url_secrets(url)[0]


def _error_message(url: str, reason: str) -> str:
    """The :class:`StorageError` text for ``url`` and the driver's ``reason``, with no part of a password in either."""
    masked, secrets = _url_secrets(url)
    for secret in sorted(secrets, key=len, reverse=True):
        reason = reason.replace(secret, "***")
    if any("@" in secret for secret in secrets):
        # SQLAlchemy split at the first "@" and took "<password tail>@<host>" for the host: the driver may print it.
        with contextlib.suppress(Exception):
            from sqlalchemy.engine import make_url

            host = make_url(url).host
            if host and "@" in host:
                reason = reason.replace(host, "***@" + host.rpartition("@")[2])
        reason += " (an '@' in the password must be written %40 in the URL)"
    return f"cannot open Optuna storage {masked}: {reason}"


def _open_rdb_storage(url: str, engine_kwargs: dict[str, Any], heartbeat: dict[str, Any], attempts: int = 3) -> Any:
    """
    ``RDBStorage(url)``; retried when workers started together race to create Optuna's tables
    (PostgreSQL: IntegrityError; SQLite: OperationalError "table ... already exists").
    """
    import time

    import optuna
    from sqlalchemy.exc import IntegrityError, OperationalError

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():  # heartbeat_interval is marked experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **heartbeat)
        except (IntegrityError, OperationalError) as error:
            racing = isinstance(error, IntegrityError) or "already exists" in str(error)
            if not racing or attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))  # another worker is creating the tables: they exist when it is done
    raise AssertionError("unreachable")


# Dead-worker detection on RDB storages: a RUNNING trial whose worker sent no heartbeat for
# ``grace_period`` seconds is marked FAIL by the next worker that starts a trial, and re-queued.
HEARTBEAT_INTERVAL = 60
MAX_RETRY = 3


def make_storage(
    url: str | None,
    heartbeat_interval: int | None = HEARTBEAT_INTERVAL,
    grace_period: int | None = None,
    max_retry: int = MAX_RETRY,
) -> optuna.storages.BaseStorage | None:
    """
    Open the Optuna storage for ``url``: the single place where tuning storage is created.

    - ``None``: in-memory (one process);
    - a path ending in ``.log``: ``JournalStorage(JournalFileBackend(path))`` — several processes
      on one machine, no server (rl-zoo3 uses the same rule);
    - any SQLAlchemy URL (``sqlite:///study.db``, ``postgresql://user:pass@host/db``): an
      ``RDBStorage``, connected (and Optuna's tables created) here, so an unreachable server fails
      now with a :class:`StorageError` and not in the middle of a study. It has Optuna's heartbeat:
      each running trial records a heartbeat every ``heartbeat_interval`` seconds; a trial whose
      worker died (SIGKILL, preemption, lost machine) is marked ``FAIL`` by the next worker that
      starts a trial once ``grace_period`` seconds have passed without one, and
      ``RetryHeartbeatStaleTrialCallback`` (``RetryFailedTrialCallback`` before Optuna 4.9)
      enqueues a copy with the same parameters, up to ``max_retry`` times per original trial; the
      copy's ``system_attrs["failed_trial"]`` is the dead trial's number.

    :param url: storage URL or journal file path
    :param heartbeat_interval: seconds between heartbeats (RDB storages); None or 0 turns dead-worker detection off
    :param grace_period: seconds without a heartbeat after which a trial counts as dead (default: Optuna's, 2 intervals)
    :param max_retry: how many times a dead trial is re-queued
    :return: the storage, or None for in-memory
    :raises StorageError: the storage cannot be opened
    :raises ValueError: a non-positive interval or grace period, or a negative ``max_retry``
    """
    import optuna

    for name, value in (("heartbeat_interval", heartbeat_interval), ("grace_period", grace_period)):
        if value is not None:
            check_int(name, value, low=0)  # whole seconds
    check_int("max_retry", max_retry, low=0)
    if url is None:
        return None
    if url.endswith(".log"):
        from pathlib import Path

        from optuna.storages.journal import JournalFileBackend

        Path(url).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(url))
    if "://" not in url:
        raise StorageError(
            f"Optuna storage {url!r} is neither a database URL (sqlite:///file.db, postgresql://user@host/db) "
            "nor a journal file path ending in .log"
        )
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("postgresql"):
        engine_kwargs["connect_args"] = {"connect_timeout": 10}
    heartbeat: dict[str, Any] = {}
    if heartbeat_interval:
        heartbeat = dict(heartbeat_interval=heartbeat_interval, grace_period=grace_period or None)
        with warnings.catch_warnings():  # the callback is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):  # Optuna >= 4.9
                retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry)
                heartbeat["heartbeat_stale_trial_callback"] = retry
            else:  # the older name of the same callback
                heartbeat["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry)
    try:
        return _open_rdb_storage(url, engine_kwargs, heartbeat)
    except ImportError as error:
        hint = "; for postgresql:// URLs: pip install 'sb3-ppo-ext[postgres]'" if url.startswith("postgresql") else ""
        raise StorageError(_error_message(url, f"missing database driver ({error}){hint}")) from None
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise StorageError(_error_message(url, reason)) from None
