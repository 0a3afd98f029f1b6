"""What the parts of the rl-zoo3 integration share: which algorithms are ours, their settings check, masks, storage.

Which algorithms are this package's, their settings check under rl-zoo3, action masks for their
evaluation envs, and the Optuna storage and trial budget of ``-optimize``.

:mod:`sb3_ppo_ext.zoo` (the registration the startup hook runs) and :mod:`sb3_ppo_ext.zoo_manager` (the
``ExperimentManager`` subclass) both use these; keeping them here, below both, keeps the import graph acyclic.
Importing this module imports neither rl_zoo3 nor optuna.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from sb3_ppo_ext import settings
from sb3_ppo_ext.validation import InvalidSettingError, activation_class

ALGO_NAME = "ppo_ext"


# The rl-zoo3 algorithm names of this package: the table of sb3_ppo_ext.settings.ALGORITHMS (register
# an algorithm there). Every seam below acts only when rl-zoo3 runs one of them; rl-zoo3's own
# algorithms are left as they are.
OUR_ALGOS = frozenset(settings.ALGORITHMS)


# Keyword arguments that rl-zoo3 passes to the algorithm itself: a yml entry may not set them.
ZOO_RESERVED_KWARGS = settings.RESERVED_KEYS - {"_init_setup_model"}


# Marks what registration installed (the ExperimentManager subclass, each wrapper): registering twice changes nothing.
_PATCHED = "_sb3_ppo_ext_patched"


class ZooConfigError(InvalidSettingError):
    """A setting of one of our algorithms on the rl-zoo3 route is invalid, or its Optuna storage cannot be opened."""


def ppo_ext_parameters(algo: str = ALGO_NAME) -> list[str]:
    """Names of the keyword arguments a yml entry may give to the algorithm (``policy`` included)."""
    return sorted(settings.algorithm_parameters(settings.algorithm_spec(algo).algorithm))


def check_hyperparams(hyperparams: dict[str, Any], source: str, algo: str = ALGO_NAME) -> dict[str, Any]:
    """
    Check the settings rl-zoo3 is about to pass to the algorithm (:func:`sb3_ppo_ext.settings.entry_problems`)
    and resolve activation names.

    :param hyperparams: the settings left after rl-zoo3's preprocessing
    :param source: where they come from (file, env id), for the message
    :param algo: the algorithm's rl-zoo3 name
    :return: the settings, with ``policy_kwargs["activation_fn"]`` a torch class (a new dict if changed)
    :raises ZooConfigError: naming the source and each problem (unknown names with close matches)
    """
    raise_problems(settings.entry_problems(hyperparams, algo), algo, f"from {source}")
    return resolve_activation(hyperparams)


def raise_problems(problems: list[str], algo: str, where: str) -> None:
    """
    A :class:`ZooConfigError` naming where the settings come from and each problem, if there is one.

    :param where: e.g. ``"in <file> (entry ...)"`` or ``"from <source>"``; the message reads
        ``invalid <algo> hyperparameters <where>: ...``
    """
    if problems:
        raise ZooConfigError(f"invalid {algo} hyperparameters {where}: {'; '.join(problems)}")


def resolve_activation(hyperparams: dict[str, Any]) -> dict[str, Any]:
    """
    The settings with an activation name in ``policy_kwargs`` (``activation_fn: tanh``) made the
    torch class (:func:`sb3_ppo_ext.validation.activation_class`), without ``eval``; a new dict if changed.
    """
    policy_kwargs = hyperparams.get("policy_kwargs")
    if isinstance(policy_kwargs, dict) and isinstance(policy_kwargs.get("activation_fn"), str):
        activation = activation_class(policy_kwargs["activation_fn"])
        hyperparams = {**hyperparams, "policy_kwargs": {**policy_kwargs, "activation_fn": activation}}
    return hyperparams


def is_ours(algo: str | None) -> bool:
    """Whether the rl-zoo3 algorithm name ``algo`` is one of this package's (:data:`OUR_ALGOS`)."""
    return algo in OUR_ALGOS


def is_masked(algo: str | None) -> bool:
    """Whether ``algo`` is one of this package's algorithms that need action masks (``ppo_mask_ext``)."""
    return is_ours(algo) and settings.ALGORITHMS[algo].masked  # type: ignore[index]


def masked_env(env: Any, algo: str, env_id: str, carry_masks: bool) -> Any:
    """
    ``env``, checked for ``action_masks()``, for a masked algorithm; with ``carry_masks`` (``enjoy``,
    ``record_video``, whose loops call ``predict(obs)`` without masks), wrapped in
    :class:`sb3_ppo_ext.envs.MaskedObservations`, outermost. Training and the evaluation callbacks read the
    masks from the env itself (:class:`sb3_ppo_ext.zoo_manager.PPOExtExperimentManager`), so their envs are
    not wrapped.

    :raises ZooConfigError: when the env provides no ``action_masks()``
    """
    from sb3_contrib.common.maskable.utils import is_masking_supported

    from sb3_ppo_ext.envs import MaskedObservations

    if not is_masking_supported(env):
        raise ZooConfigError(
            f"--algo {algo} needs action masks, but the env {env_id} provides no action_masks(): give it a wrapper that "
            "does in the entry's env_wrapper (sb3_ppo_ext.envs.ActionMaskFromInfo for an env that reports its mask in "
            "info['action_mask'], as Taxi-v4 does; sb3_contrib.common.wrappers.ActionMasker for a mask function)"
        )
    return MaskedObservations(env) if carry_masks else env


def _check_storage(storage: str | None) -> Any:
    """
    Open an RDB storage URL through :func:`sb3_ppo_ext.storage.make_storage`; ZooConfigError if it fails.

    The storage has Optuna's heartbeat (dead-worker detection and retry); ``SB3_PPO_EXT_HEARTBEAT_INTERVAL``
    and ``SB3_PPO_EXT_GRACE_PERIOD`` (seconds) set its interval and grace period, as rl-zoo3 has no
    option for them.

    :return: the storage object, or None for no storage or a journal file
    """
    if storage is None or storage.endswith(".log"):
        return None
    from sb3_ppo_ext.storage import HEARTBEAT_INTERVAL, StorageError, make_storage

    try:
        interval = int(os.environ.get("SB3_PPO_EXT_HEARTBEAT_INTERVAL", HEARTBEAT_INTERVAL))
        grace = os.environ.get("SB3_PPO_EXT_GRACE_PERIOD")
        return make_storage(storage, heartbeat_interval=interval, grace_period=None if grace is None else int(grace))
    except (StorageError, ValueError) as error:
        raise ZooConfigError(str(error)) from None


def count_trials_against_budget(study: Any, n_trials: int, states: Any, poll_seconds: float) -> int:
    """
    The trials of ``study`` in ``states`` (rl-zoo3's ``--max-total-trials`` count: COMPLETE,
    RUNNING and PRUNED), counted once no dead worker's trial is among them.

    Stale trials (no heartbeat for the grace period) are failed first
    (``optuna.storages.fail_stale_trials``, which re-queues them through the storage's retry
    callback). While the count reaches ``n_trials`` only thanks to RUNNING trials, their workers
    may have died since their last heartbeat: wait, checking every ``poll_seconds``, until each has
    finished or gone stale (failed, and its copy queued for the next trial), so that the study
    ends with ``n_trials`` finished trials and none left RUNNING.

    :param study: the study, on a storage with heartbeats
    :param n_trials: the budget (``--max-total-trials``)
    :param states: the trial states that count against it
    :param poll_seconds: seconds between two checks (the heartbeat interval)
    :return: the count; below ``n_trials`` when trials remain to be run
    """
    import time
    import warnings

    import optuna

    announced = False
    while True:
        with warnings.catch_warnings():  # fail_stale_trials is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        counted = study.get_trials(deepcopy=False, states=tuple(states))
        running = [trial.number for trial in counted if trial.state == optuna.trial.TrialState.RUNNING]
        if len(counted) < n_trials or not running:
            return len(counted)
        if not announced:
            print(
                f"{len(counted) - len(running)} of {n_trials} trials finished: waiting for the running trial(s) "
                f"{running} to finish, or to be failed and retried if their worker died"
            )
            announced = True
        time.sleep(poll_seconds)


class TrialBudgetCallback:
    """
    rl-zoo3's ``MaxTrialsCallback`` (``--max-total-trials``) for a storage with heartbeats: after each
    trial it stops the study once :func:`count_trials_against_budget` reaches ``n_trials``, i.e.
    once ``n_trials`` trials have finished, never with a dead worker's trial still counted.

    :param poll_seconds: seconds between two checks while other trials run (the heartbeat interval)
    :param n_trials: the budget
    :param states: the trial states that count against it (rl-zoo3: COMPLETE, RUNNING, PRUNED)
    """

    def __init__(self, poll_seconds: float, n_trials: int, states: Any = None):
        import optuna

        self.poll_seconds = poll_seconds
        self.n_trials = n_trials
        self.states = (optuna.trial.TrialState.COMPLETE,) if states is None else tuple(states)

    def __call__(self, study: Any, trial: Any) -> None:
        if count_trials_against_budget(study, self.n_trials, self.states, self.poll_seconds) >= self.n_trials:
            study.stop()


@contextlib.contextmanager
def _study_storage(url: str | None, storage: Any, exp_manager: ModuleType, max_total_trials: int | None) -> Iterator[None]:
    """
    While rl-zoo3 runs ``-optimize``, have its ``optuna.create_study(storage=url)`` use ``storage`` instead.

    rl-zoo3 builds the study from the URL string, which gives an RDB storage without heartbeats;
    the object from :func:`_check_storage` has them, so a dead worker's trial is failed and retried.
    With ``--max-total-trials``, rl-zoo3 counts RUNNING trials against the budget, a dead worker's
    included, before the study and after each trial: on a storage with heartbeats, the study is
    handed over only once that count holds no dead trial (:func:`count_trials_against_budget`),
    and rl-zoo3's ``MaxTrialsCallback`` is a :class:`TrialBudgetCallback`, so the study runs
    until ``--max-total-trials`` trials have finished.
    """
    if storage is None:
        yield
        return
    import optuna

    original, original_callback = optuna.create_study, exp_manager.MaxTrialsCallback
    interval = storage.get_heartbeat_interval() if callable(getattr(storage, "get_heartbeat_interval", None)) else None

    @functools.wraps(original)
    def create_study(*args, **kwargs):
        if kwargs.get("storage") == url:
            kwargs["storage"] = storage
        study = original(*args, **kwargs)
        if kwargs.get("storage") is storage and interval and max_total_trials is not None:
            states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.PRUNED)
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the wait; rl-zoo3 then reports the study
                count_trials_against_budget(study, max_total_trials, states, interval)
        return study

    optuna.create_study = create_study
    if interval:
        exp_manager.MaxTrialsCallback = functools.partial(TrialBudgetCallback, interval)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        optuna.create_study, exp_manager.MaxTrialsCallback = original, original_callback  # type: ignore[attr-defined]
