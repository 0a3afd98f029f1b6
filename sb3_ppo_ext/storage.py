"""Optuna storage for tuning (URLs, journal files, heartbeat, retries); importing it does not import optuna."""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sb3_ppo_ext.validation import check_int

if TYPE_CHECKING:
    import optuna

# Dead-worker detection on RDB storages: seconds between heartbeats, and how often a dead trial is re-queued.
HEARTBEAT_INTERVAL = 60
MAX_RETRY = 3


class StorageError(RuntimeError):
    """An Optuna storage could not be opened; the message names the (password-masked) URL and the reason."""


def _url_secrets(url: str) -> tuple[str, list[str]]:
    """``url`` with its passwords (``user:pw@`` up to the last ``@``, ``?password=pw``) masked as ``***``, and them."""
    found: list[str] = []

    def mask(match: re.Match[str]) -> str:
        found.append(match.group(2))
        return f"{match.group(1)}***{match.group(3)}"

    masked = re.sub(r"^([^:/?]+://[^:/?]*:)(.*)(@)", mask, url, count=1)
    masked = re.sub(r"([?&]password=)([^&]*)()", mask, masked)
    return masked, [secret for secret in found if secret]


def _error_message(url: str, reason: str) -> str:
    """The :class:`StorageError` text for ``url`` and the driver's ``reason``, with no part of a password in either."""
    masked, found = _url_secrets(url)
    for secret in sorted(found, key=len, reverse=True):
        # SQLAlchemy splits at the first "@", so the driver may name "<password tail>@<host>" as the host.
        reason = reason.replace(secret, "***").replace(secret.partition("@")[2] or secret, "***")
    if any("@" in secret for secret in found):
        reason += " (an '@' in the password must be written %40 in the URL)"
    return f"cannot open Optuna storage {masked}: {reason}"


def make_storage(
    url: str | None,
    heartbeat_interval: int | None = HEARTBEAT_INTERVAL,
    grace_period: int | None = None,
    max_retry: int = MAX_RETRY,
    rdb_class: type[optuna.storages.RDBStorage] | None = None,
) -> optuna.storages.BaseStorage | None:
    """
    Open the Optuna storage for ``url``: in-memory (``None``), a journal file (``*.log``) or a connected ``RDBStorage``.

    :param url: storage URL or journal file path
    :param heartbeat_interval: seconds between heartbeats (RDB storages); None or 0 turns dead-worker detection off
    :param grace_period: seconds without a heartbeat after which a trial counts as dead (default: Optuna's, 2 intervals)
    :param max_retry: how many times a dead trial is re-queued
    :param rdb_class: the class of a database URL's storage (default: ``optuna.storages.RDBStorage``)
    :return: the storage, or None for in-memory
    :raises StorageError: the storage cannot be opened
    """
    import optuna

    for name, value in (("heartbeat_interval", heartbeat_interval), ("grace_period", grace_period)):
        if value is not None:
            check_int(name, value, low=0)
    check_int("max_retry", max_retry, low=0)
    if url is None:
        return None
    if url.endswith(".log"):
        from optuna.storages.journal import JournalFileBackend

        Path(url).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(url))
    if "://" not in url:
        raise StorageError(
            f"Optuna storage {url!r} is neither a database URL (sqlite:///file.db, postgresql://user@host/db) "
            "nor a journal file path ending in .log"
        )
    from sqlalchemy.exc import IntegrityError, OperationalError

    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("postgresql"):
        engine_kwargs["connect_args"] = {"connect_timeout": 10}
    heartbeat: dict[str, Any] = {}
    with warnings.catch_warnings():  # the heartbeat and its callback are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if heartbeat_interval:
            heartbeat = dict(heartbeat_interval=heartbeat_interval, grace_period=grace_period or None)
            if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):  # Optuna >= 4.9
                heartbeat["heartbeat_stale_trial_callback"] = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry)
            else:
                heartbeat["failed_trial_callback"] = optuna.storages.RetryFailedTrialCallback(max_retry)
        attempt = 0
        while True:
            attempt += 1
            try:
                return (rdb_class or optuna.storages.RDBStorage)(url, engine_kwargs=engine_kwargs, **heartbeat)
            except ImportError as error:
                hint = "; for postgresql:// URLs: pip install 'sb3-ppo-ext[postgres]'" if url.startswith("postgresql") else ""
                raise StorageError(_error_message(url, f"missing database driver ({error}){hint}")) from None
            except Exception as error:
                # Workers started together race to create Optuna's tables (SQLite: "table ... already exists").
                racing = isinstance(error, IntegrityError) or (
                    isinstance(error, OperationalError) and "already exists" in str(error)
                )
                if racing and attempt < 3:
                    time.sleep(0.5 * attempt)
                    continue
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise StorageError(_error_message(url, reason)) from None
