"""Registration of PPOExt with rl-zoo3, and ``python -m sb3_ppo_ext.zoo``: the route that needs no startup hook.

rl-zoo3 has no plugin interface: ``--algo`` choices come from ``rl_zoo3.utils.ALGOS`` when the
arguments are parsed, the default hyperparameter file is looked up inside the rl_zoo3 package and
``-optimize`` reads ``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER``.
This module adds PPOExt at each of these seams, one rl-zoo3 module at a time, right after that
module has executed (:func:`on_zoo_module_imported`, called by the ``sb3_ppo_ext_zoo_hook``
startup hook), or all at once (:func:`register`, used by ``python -m sb3_ppo_ext.zoo``). Each
registration is idempotent: what it installed carries the :data:`_PATCHED` marker.

Every seam acts only when rl-zoo3 runs one of this package's algorithms (:data:`OUR_ALGOS`,
tested by :func:`is_ours`); for rl-zoo3's own algorithms (``--algo ppo``, ``sac``, ...) each one
calls rl-zoo3's original code unchanged, so they behave, save and evaluate exactly as without this
package (``tests/test_zoo_seams.py`` runs ``--algo ppo`` both ways and compares). The seams, and why
each exists:

- ``rl_zoo3.utils.ALGOS``: ``ALGOS["ppo_ext"] = PPOExt`` and every other entry of
  :data:`sb3_ppo_ext.settings.ALGORITHMS` (new keys; existing keys are kept), as
  ``--algo`` choices are read from it when the parser is built.
- ``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER``: new keys, the
  samplers and converters of :mod:`sb3_ppo_ext.samplers` (``-optimize``, ``--trial-id``).
- ``rl_zoo3.exp_manager.ExperimentManager``: replaced, once, by the subclass
  :class:`sb3_ppo_ext.zoo_manager.PPOExtExperimentManager` right after that module executed, so
  ``rl_zoo3.train`` binds the subclass when it imports the name (:func:`_install_experiment_manager`).
  Its overrides (each calls rl-zoo3's method through ``super()``; see that module for the one that
  merges itself) give our algorithms: the ``ppo_ext.yml`` shipped in this package as the default
  ``--conf-file``; the settings read once and each entry checked once by :mod:`sb3_ppo_ext.settings`
  before rl-zoo3 parses schedules or evaluates strings (the yml entry and the ``-params`` values key
  by key, each mistake blamed on its own source, then the merged settings as a whole; nothing is
  written before); ``clip_range: null`` / ``clip_range_vf: null`` passed through rl-zoo3's
  preprocessing and activation names mapped to torch classes without ``eval``; with ``-optimize``,
  the Optuna storage opened first (an unreachable database leaves no folder), on Optuna's
  heartbeat (:func:`_check_storage`), with ``--max-total-trials`` counted by
  :class:`TrialBudgetCallback`; a run folder left by a failed run (or ``-optimize``'s, which holds
  no model) removed, since it would become the "latest" run that ``enjoy`` loads; for a masked
  algorithm, envs checked for ``action_masks()`` and evaluation envs whose observations carry
  them; ``--save-freq`` checkpoints written atomically with their VecNormalize statistics, and
  ``-i <checkpoint>`` resumed with them, with the timestep count and (with
  :class:`~sb3_ppo_ext.callbacks.KLAdaptiveLR`) the checkpoint's learning rate.

Three seams remain wrappers in place, each one function with the :data:`_PATCHED` marker, where
rl-zoo3 offers nothing to subclass or configure (their docstrings say why):

- ``rl_zoo3.utils.StoreDict.__call__`` (:func:`_store_dict_errors`): for our algorithms a
  malformed ``-params`` / ``--env-kwargs`` value becomes an argparse error (usage line, exit
  status 2) naming the value, instead of rl-zoo3's traceback from ``eval``. The algorithm is read
  from the command line, as ``-params`` may come before ``--algo``.
- ``rl_zoo3.utils.create_test_env`` (:func:`_masked_test_envs`): ``enjoy`` / ``record_video``
  with a masked algorithm evaluate on observations that carry their masks.
- ``sys.excepthook`` (:func:`_print_settings_errors`, for our errors only): a settings or storage
  error ends the command with one ``error: ...`` paragraph and exit status 1, without a traceback.

Importing this module imports neither rl_zoo3 nor optuna (:mod:`sb3_ppo_ext.zoo_manager` does,
and is imported only once ``rl_zoo3.exp_manager`` has run).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from sb3_ppo_ext import settings
from sb3_ppo_ext.settings import SettingsError

ALGO_NAME = "ppo_ext"
# The rl-zoo3 algorithm names of this package: the table of sb3_ppo_ext.settings.ALGORITHMS (register
# an algorithm there). Every seam below acts only when rl-zoo3 runs one of them; rl-zoo3's own
# algorithms are left as they are.
OUR_ALGOS = frozenset(settings.ALGORITHMS)
# Keyword arguments that rl-zoo3 passes to the algorithm itself: a yml entry may not set them.
ZOO_RESERVED_KWARGS = settings.RESERVED_KEYS - {"_init_setup_model"}
# Marks what registration installed (the ExperimentManager subclass, each wrapper): registering twice changes nothing.
_PATCHED = "_sb3_ppo_ext_patched"


class ZooConfigError(SettingsError):
    """A setting of one of our algorithms on the rl-zoo3 route is invalid, or its Optuna storage cannot be opened."""


def ppo_ext_parameters(algo: str = ALGO_NAME) -> list[str]:
    """Names of the keyword arguments a yml entry may give to the algorithm (``policy`` included)."""
    return sorted(settings.algorithm_parameters(settings.algorithm_spec(algo).algorithm_class()))


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
    problems = settings.entry_problems(hyperparams, algo)
    if problems:
        raise ZooConfigError(f"invalid {algo} hyperparameters from {source}: {'; '.join(problems)}")
    return resolve_activation(hyperparams)


def resolve_activation(hyperparams: dict[str, Any]) -> dict[str, Any]:
    """
    The settings with an activation name in ``policy_kwargs`` (``activation_fn: tanh``) made the
    torch class (:func:`sb3_ppo_ext.settings.activation_class`), without ``eval``; a new dict if changed.
    """
    policy_kwargs = hyperparams.get("policy_kwargs")
    if isinstance(policy_kwargs, dict) and isinstance(policy_kwargs.get("activation_fn"), str):
        activation = settings.activation_class(policy_kwargs["activation_fn"])
        hyperparams = {**hyperparams, "policy_kwargs": {**policy_kwargs, "activation_fn": activation}}
    return hyperparams


def _print_settings_errors(hook: Any) -> Any:
    """
    ``sys.excepthook`` that prints our settings and storage errors as one ``error:`` paragraph,
    without a traceback (the exit status stays 1); every other exception goes to ``hook``.

    A wrapper of the hook in place, because the error leaves rl-zoo3's ``train`` (its ``__main__``
    has no ``try``), and Python's excepthook is the interpreter's own place to report an uncaught
    exception; installed once, with the manager (:func:`_install_experiment_manager`).
    """

    @functools.wraps(hook)
    def excepthook(kind, error, traceback):
        if isinstance(error, SettingsError):
            print(f"error: {error}", file=sys.stderr)
            return None
        return hook(kind, error, traceback)

    setattr(excepthook, _PATCHED, True)
    return excepthook


# --- rl_zoo3.utils ---------------------------------------------------------------------------


def is_ours(algo: str | None) -> bool:
    """Whether the rl-zoo3 algorithm name ``algo`` is one of this package's (:data:`OUR_ALGOS`)."""
    return algo in OUR_ALGOS


def _command_line_algo(namespace: Any) -> str | None:
    """
    The ``--algo`` of the command line being parsed, wherever it stands among the arguments.

    argparse fills the namespace in command-line order, so while ``-params`` is parsed the
    namespace may still hold the default algorithm: read ``--algo`` from ``sys.argv`` first.
    """
    import argparse

    pre_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre_parser.add_argument("--algo")
    try:
        algo = pre_parser.parse_known_args(sys.argv[1:])[0].algo
    except SystemExit:  # a malformed --algo: rl-zoo3's own parser reports it
        algo = None
    return algo if algo is not None else getattr(namespace, "algo", None)


def is_masked(algo: str | None) -> bool:
    """Whether ``algo`` is one of this package's algorithms that need action masks (``ppo_mask_ext``)."""
    return is_ours(algo) and settings.ALGORITHMS[algo].masked  # type: ignore[index]


def masked_env(env: Any, algo: str, env_id: str, evaluation: bool) -> Any:
    """
    The VecEnv a masked algorithm trains or is evaluated on: ``env`` itself for training (the
    algorithm reads the masks while collecting), and :class:`sb3_ppo_ext.envs.MaskedObservations`
    around it for evaluation and ``enjoy``, whose loops call ``predict(obs)`` without masks.

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
    return MaskedObservations(env) if evaluation else env


def _register_algo(utils: ModuleType) -> None:
    from sb3_ppo_ext.envs import register_envs

    register_envs()  # sb3-contrib's masked test envs as --env ids (new ids only)
    for name, spec in settings.ALGORITHMS.items():
        utils.ALGOS.setdefault(name, spec.algorithm_class())
    if not getattr(utils.create_test_env, _PATCHED, False):
        utils.create_test_env = _masked_test_envs(utils.create_test_env)  # type: ignore[attr-defined]
    if not getattr(utils.StoreDict.__call__, _PATCHED, False):
        utils.StoreDict.__call__ = _store_dict_errors(utils.StoreDict.__call__)


def _store_dict_errors(call: Any) -> Any:
    """
    ``StoreDict.__call__`` (``-params``, ``--env-kwargs``) for which, with our algorithms, a
    malformed value is an argparse error (usage line, exit status 2) naming the value instead of
    rl-zoo3's traceback from ``eval``; for any other algorithm the error propagates as before.

    A wrapper of rl-zoo3's method in place, because rl-zoo3 has no seam for it: ``train``,
    ``enjoy`` and ``record_video`` build their parsers inside their functions, with
    ``action=StoreDict`` bound at their import.
    """

    @functools.wraps(call)
    def __call__(self, parser, namespace, values, option_string=None):
        try:
            return call(self, parser, namespace, values, option_string)
        except Exception as error:
            if not is_ours(_command_line_algo(namespace)):
                raise  # rl-zoo3's own algorithms keep rl-zoo3's behaviour (a traceback)
            # rl-zoo3 evaluates each value as a Python expression: report which one failed.
            parser.error(
                f"argument {option_string}: cannot parse {' '.join(values)!r} ({type(error).__name__}: {error}); "
                "expected key:value pairs with Python literal values, e.g. kl_target:0.01 clip_range:None"
            )

    setattr(__call__, _PATCHED, True)
    return __call__


def _masked_test_envs(create_test_env: Any) -> Any:
    """
    ``rl_zoo3.utils.create_test_env`` (``enjoy``, ``record_video``) whose env, for a masked
    algorithm, is :func:`masked_env`'s: its observations carry their masks to ``predict``.

    A wrapper of the function in place, because rl-zoo3 has no seam for it: ``enjoy`` calls the
    module function (bound at its import from ``rl_zoo3``, which the hook reaches after
    ``rl_zoo3.utils`` ran and before ``rl_zoo3/__init__`` binds it), with no manager involved.
    """

    @functools.wraps(create_test_env)
    def wrapper(env_id, *args, **kwargs):
        env = create_test_env(env_id, *args, **kwargs)
        algo = _command_line_algo(None)
        return masked_env(env, algo, env_id, evaluation=True) if is_masked(algo) else env

    setattr(wrapper, _PATCHED, True)
    return wrapper


# --- rl_zoo3.hyperparams_opt -----------------------------------------------------------------


def _register_sampler(hyperparams_opt: ModuleType) -> None:
    for name, spec in settings.ALGORITHMS.items():
        if spec.sampler is not None:
            hyperparams_opt.HYPERPARAMS_SAMPLER.setdefault(name, spec.sampler)
        if spec.converter is not None:
            hyperparams_opt.HYPERPARAMS_CONVERTER.setdefault(name, spec.converter)


# --- rl_zoo3.exp_manager ---------------------------------------------------------------------


def _install_experiment_manager(exp_manager: ModuleType) -> None:
    """
    Set ``exp_manager.ExperimentManager`` to :class:`sb3_ppo_ext.zoo_manager.PPOExtExperimentManager`, once.

    A class that carries the :data:`_PATCHED` marker is ours already: nothing changes (a second
    registration, or the hook and :func:`register` both). When the module holds another class
    than the one our subclass derives from, ``rl_zoo3.exp_manager`` has run again
    (``importlib.reload``): ``zoo_manager`` is reloaded, so the new subclass derives from the new class.
    """
    if exp_manager.ExperimentManager.__dict__.get(_PATCHED, False):
        return
    import importlib

    from sb3_ppo_ext import zoo_manager

    if zoo_manager.UPSTREAM is not exp_manager.ExperimentManager:
        zoo_manager = importlib.reload(zoo_manager)
    exp_manager.ExperimentManager = zoo_manager.PPOExtExperimentManager  # type: ignore[attr-defined]
    if not getattr(sys.excepthook, _PATCHED, False):
        sys.excepthook = _print_settings_errors(sys.excepthook)


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


_REGISTRARS = {
    "rl_zoo3.utils": _register_algo,
    "rl_zoo3.hyperparams_opt": _register_sampler,
    "rl_zoo3.exp_manager": _install_experiment_manager,
}


def on_zoo_module_imported(name: str, module: ModuleType) -> None:
    """Register PPOExt at the seam of the rl-zoo3 module ``name`` that has just been imported."""
    registrar = _REGISTRARS.get(name)
    if registrar is not None:
        registrar(module)


def register() -> None:
    """Import rl-zoo3's modules and register PPOExt at every seam (idempotent)."""
    import importlib

    for name, registrar in _REGISTRARS.items():
        registrar(importlib.import_module(name))


# --- python -m sb3_ppo_ext.zoo ---------------------------------------------------------------

COMMANDS = ("train", "enjoy", "record_video", "record_training")
USAGE = f"""usage: python -m sb3_ppo_ext.zoo {{{",".join(COMMANDS)}}} [rl-zoo3 arguments ...]

Runs rl-zoo3's command with ppo_ext registered, without the startup hook (for python -S, or
where .pth files are not processed), e.g.:
  python -m sb3_ppo_ext.zoo train --algo ppo_ext --env Pendulum-v1
"""


def main(argv: list[str] | None = None) -> int:
    """Run ``rl_zoo3.<command>`` as ``__main__`` after :func:`register`; return an exit status."""
    import runpy

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0].replace("-", "_"), argv[1:]
    if command not in COMMANDS:
        print(USAGE + f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    register()
    sys.argv = [f"python -m sb3_ppo_ext.zoo {command}", *rest]
    try:
        runpy.run_module(f"rl_zoo3.{command}", run_name="__main__", alter_sys=True)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
