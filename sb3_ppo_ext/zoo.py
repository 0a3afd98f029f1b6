"""Registration of PPOExt with rl-zoo3, and ``python -m sb3_ppo_ext.zoo``: the route that needs no startup hook.

rl-zoo3 has no plugin interface: ``--algo`` choices come from ``rl_zoo3.utils.ALGOS`` when the
arguments are parsed, the default hyperparameter file is looked up inside the rl_zoo3 package and
``-optimize`` reads ``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER``.
This module adds PPOExt at each of these seams, one rl-zoo3 module at a time, right after that
module is first imported (:func:`on_zoo_module_imported`, called by the ``sb3_ppo_ext_zoo_hook``
startup hook), or all at once (:func:`register`, used by ``python -m sb3_ppo_ext.zoo``).

Every seam acts only when rl-zoo3 runs one of this package's algorithms (:data:`OUR_ALGOS`,
tested by :func:`is_ours`); for rl-zoo3's own algorithms (``--algo ppo``, ``sac``, ...) each one
calls rl-zoo3's original code unchanged, so they behave, save and evaluate exactly as without this
package (``tests/test_zoo_seams.py`` runs ``--algo ppo`` both ways and compares). The seams, and why
each exists:

- ``rl_zoo3.utils.ALGOS``: ``ALGOS["ppo_ext"] = PPOExt`` and every other entry of
  :data:`sb3_ppo_ext.settings.ALGORITHMS` (new keys; existing keys are kept), as
  ``--algo`` choices are read from it when the parser is built.
- ``rl_zoo3.utils.StoreDict.__call__``: for our algorithms a malformed ``-params`` /
  ``--env-kwargs`` value becomes an argparse error (usage line, exit status 2) naming the value,
  instead of rl-zoo3's traceback from ``eval``. The algorithm is read from the command line, as
  ``-params`` may come before ``--algo``; for any other algorithm the error propagates as before.
- ``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER``: new ``ppo_ext``
  keys, the sampler and converter of :mod:`sb3_ppo_ext.samplers` (``-optimize``, ``--trial-id``).
- ``ExperimentManager.__init__``: the default ``--conf-file`` is the ``ppo_ext.yml`` shipped in this
  package (rl-zoo3 only looks inside its own package).
- ``ExperimentManager.read_hyperparameters``: the settings are checked by
  :mod:`sb3_ppo_ext.settings` before rl-zoo3 merges ``-params``, parses schedules or evaluates
  strings: the yml entry and the ``-params`` values each key by key (a mistake is blamed on its
  own source), then the merged settings as a whole; nothing is written before.
- ``ExperimentManager._preprocess_hyperparams``: ``clip_range: null`` / ``clip_range_vf: null``
  pass through (rl-zoo3 would make schedules of them), and activation names in ``policy_kwargs``
  (``activation_fn: tanh``) are mapped to torch classes without ``eval``.
- ``ExperimentManager.setup_experiment``: with ``-optimize``, the Optuna storage is opened first,
  so an unreachable database leaves no folder; a run folder created by a failed run is removed
  (it would become the "latest" run that ``enjoy`` loads), and so is an empty ``<log-folder>/<algo>``.
- ``sys.excepthook`` (for our errors only): a settings or storage error ends the command with one
  ``error: ...`` paragraph and exit status 1, without a traceback.
- ``ExperimentManager.hyperparameters_optimization`` / ``load_trial``: an Optuna storage URL is
  opened (and checked) through :func:`sb3_ppo_ext.storage.make_storage` before a study starts or
  a ``--trial-id`` is loaded, and ``-optimize`` runs on that storage object (Optuna's heartbeat: a
  dead worker's trial is failed and retried); with ``--max-total-trials``, rl-zoo3's
  ``MaxTrialsCallback`` becomes :class:`TrialBudgetCallback` (stale trials are failed before each
  count, and the study runs until that many trials have finished); a run folder without a model
  is removed afterwards.
- ``ExperimentManager.create_callbacks`` / ``_maybe_normalize`` / ``_load_pretrained_agent`` /
  ``learn``: ``--save-freq`` checkpoints are written atomically with their VecNormalize statistics,
  and ``-i <checkpoint>`` resumes with them, with the timestep count and (when KLAdaptiveLR is
  used) the checkpoint's learning rate.

Importing this module imports neither rl_zoo3 nor optuna.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import shutil
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
# Marks the rl-zoo3 objects already patched, so that registering twice changes nothing.
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
    policy_kwargs = hyperparams.get("policy_kwargs")
    if isinstance(policy_kwargs, dict) and isinstance(policy_kwargs.get("activation_fn"), str):
        activation = settings.activation_class(policy_kwargs["activation_fn"])
        hyperparams = {**hyperparams, "policy_kwargs": {**policy_kwargs, "activation_fn": activation}}
    return hyperparams


def _check_settings_before_zoo(manager: Any) -> str:
    """
    ``read_hyperparameters`` for our algorithms, before rl-zoo3 reads anything: the yml entry it will
    use and the ``-params`` values, each checked key by key and blamed on its own source.

    :return: the name of the settings' source, for the check of the merged settings
    """
    algo, config, env_id = manager.algo, str(manager.config), manager.env_name.gym_id
    source = config
    if config.endswith((".yml", ".yaml")):  # a .py conf file or a module is rl-zoo3's to execute
        entries = settings.read_entries(config)
        name = settings.select_entry(entries, env_id, atari=bool(getattr(manager, "_is_atari", False)))
        if name is not None:
            source = f"{config} (entry {name!r})"
            problems = settings.entry_problems(entries[name], algo, whole=False)
            if problems:
                raise ZooConfigError(f"invalid {algo} hyperparameters in {source}: {'; '.join(problems)}")
    if manager.custom_hyperparams:
        problems = settings.entry_problems(manager.custom_hyperparams, algo, whole=False)
        if problems:
            raise ZooConfigError(f"invalid {algo} hyperparameters in -params: {'; '.join(problems)}")
        source += " with -params"
    return source


def _print_settings_errors(hook: Any) -> Any:
    """
    ``sys.excepthook`` that prints our settings and storage errors as one ``error:`` paragraph,
    without a traceback (the exit status stays 1); every other exception goes to ``hook``.
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
    _patch_create_test_env(utils)
    store_dict = utils.StoreDict
    if getattr(store_dict.__call__, _PATCHED, False):
        return
    original_call = store_dict.__call__

    @functools.wraps(original_call)
    def __call__(self, parser, namespace, values, option_string=None):
        try:
            return original_call(self, parser, namespace, values, option_string)
        except Exception as error:
            if not is_ours(_command_line_algo(namespace)):
                raise  # rl-zoo3's own algorithms keep rl-zoo3's behaviour (a traceback)
            # rl-zoo3 evaluates each value as a Python expression: report which one failed.
            parser.error(
                f"argument {option_string}: cannot parse {' '.join(values)!r} ({type(error).__name__}: {error}); "
                "expected key:value pairs with Python literal values, e.g. kl_target:0.01 clip_range:None"
            )

    setattr(__call__, _PATCHED, True)
    store_dict.__call__ = __call__


def _patch_create_test_env(utils: ModuleType) -> None:
    """``enjoy`` / ``record_video`` with a masked algorithm: the test env's observations carry their masks."""
    original = utils.create_test_env
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def create_test_env(env_id, *args, **kwargs):
        env = original(env_id, *args, **kwargs)
        algo = _command_line_algo(None)
        return masked_env(env, algo, env_id, evaluation=True) if is_masked(algo) else env

    setattr(create_test_env, _PATCHED, True)
    utils.create_test_env = create_test_env  # type: ignore[attr-defined]


# --- rl_zoo3.hyperparams_opt -----------------------------------------------------------------


def _register_sampler(hyperparams_opt: ModuleType) -> None:
    for name, spec in settings.ALGORITHMS.items():
        if spec.sampler is not None:
            hyperparams_opt.HYPERPARAMS_SAMPLER.setdefault(name, spec.sampler)
        if spec.converter is not None:
            hyperparams_opt.HYPERPARAMS_CONVERTER.setdefault(name, spec.converter)


# --- rl_zoo3.exp_manager ---------------------------------------------------------------------


def _patch_experiment_manager(exp_manager: ModuleType) -> None:
    manager_class = exp_manager.ExperimentManager
    if manager_class.__dict__.get(_PATCHED, False):
        return
    original_init = manager_class.__init__
    original_setup = manager_class.setup_experiment
    original_optimization = manager_class.hyperparameters_optimization
    original_load_trial = manager_class.load_trial
    original_create_envs = manager_class.create_envs
    init_signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        bound = init_signature.bind(self, *args, **kwargs)
        algo = bound.arguments.get("algo")
        if is_ours(algo) and bound.arguments.get("config") is None and settings.ALGORITHMS[algo].hyperparams is not None:
            # rl-zoo3 looks for <rl_zoo3 package>/hyperparams/<algo>.yml; ours ship in sb3_ppo_ext.
            bound.arguments["config"] = str(settings.ALGORITHMS[algo].hyperparams)
        original_init(*bound.args, **bound.kwargs)

    @functools.wraps(original_setup)
    def setup_experiment(self):
        if not is_ours(self.algo):
            return original_setup(self)
        log_existed, existed = os.path.exists(self.log_path), os.path.exists(self.save_path)
        try:
            if self.optimize_hyperparameters:
                # Opens the database (and creates Optuna's tables) before any folder is made.
                self._sb3_ppo_ext_storage = _check_storage(self.storage)
            return original_setup(self)
        except BaseException:
            # A run folder left by a failed run would become the "latest" run that enjoy loads.
            if not existed:
                shutil.rmtree(self.save_path, ignore_errors=True)
            if not log_existed:
                _remove_empty_folder(self.log_path)
            raise

    @functools.wraps(original_create_envs)
    def create_envs(self, n_envs, eval_env=False, no_log=False):
        env = original_create_envs(self, n_envs, eval_env=eval_env, no_log=no_log)
        if not is_masked(self.algo):
            return env
        return masked_env(env, self.algo, self.env_name.gym_id, evaluation=eval_env)

    @functools.wraps(original_load_trial)
    def load_trial(self, storage, *args, **kwargs):
        if is_ours(self.algo):
            _check_storage(storage)  # --trial-id: a clear error for an unreachable database
        return original_load_trial(self, storage, *args, **kwargs)

    @functools.wraps(original_optimization)
    def hyperparameters_optimization(self):
        if not is_ours(self.algo):
            return original_optimization(self)
        try:
            # Opened by setup_experiment (a direct call opens it here) before any trial runs.
            storage = getattr(self, "_sb3_ppo_ext_storage", None) or _check_storage(self.storage)
        except ZooConfigError:
            _remove_run_without_model(self.save_path)
            raise
        try:
            with _study_storage(self.storage, storage, exp_manager, self.max_total_trials):
                return original_optimization(self)
        finally:
            # setup_experiment made a run folder (monitor files only) that holds no model: left
            # behind, it would become the "latest" run that enjoy tries to load.
            _remove_run_without_model(self.save_path)

    manager_class.__init__ = __init__
    _patch_settings_checks(manager_class)
    manager_class.setup_experiment = setup_experiment
    manager_class.hyperparameters_optimization = hyperparameters_optimization
    manager_class.load_trial = load_trial
    manager_class.create_envs = create_envs
    _patch_checkpoints_and_resume(manager_class)
    setattr(manager_class, _PATCHED, True)
    if not getattr(sys.excepthook, _PATCHED, False):
        sys.excepthook = _print_settings_errors(sys.excepthook)


def _patch_settings_checks(manager_class: Any) -> None:
    """The settings owner's checks: before rl-zoo3 reads the settings, and after it has preprocessed them."""
    original_preprocess = manager_class._preprocess_hyperparams
    original_read = manager_class.read_hyperparameters

    @functools.wraps(original_preprocess)
    def _preprocess_hyperparams(self, hyperparams):
        if not is_ours(self.algo):
            return original_preprocess(self, hyperparams)
        # rl-zoo3 turns clip_range / clip_range_vf into schedules and rejects None, which for
        # PPOExt means "off" (clip_range: null is the KL-penalty-only objective): keep them aside.
        switched_off = {
            key: None for key in ("clip_range", "clip_range_vf") if key in hyperparams and hyperparams[key] is None
        }
        hyperparams, *rest = original_preprocess(self, {k: v for k, v in hyperparams.items() if k not in switched_off})
        hyperparams = check_hyperparams(
            {**hyperparams, **switched_off}, f"{self.config} (env {self.env_name.gym_id})", self.algo
        )
        return (hyperparams, *rest)

    @functools.wraps(original_read)
    def read_hyperparameters(self):
        if not is_ours(self.algo):
            return original_read(self)
        # Checked before rl-zoo3 merges -params, parses schedules or evaluates strings.
        source = _check_settings_before_zoo(self)
        hyperparams, saved_hyperparams = original_read(self)
        if not isinstance(hyperparams, dict):  # an entry of a .py conf file
            raise ZooConfigError(f"invalid {self.algo} hyperparameters in {source}: expected a mapping of settings")
        # The merged settings (file, trial, -params) as a whole: the rules that tie parameters together.
        problems = settings.entry_problems(hyperparams, self.algo)
        if "n_timesteps" not in hyperparams:
            if self.n_timesteps <= 0:  # rl-zoo3 would end in KeyError: 'n_timesteps'
                problems.append("'n_timesteps' is missing: give the entry a training budget (n_timesteps: 1.0e5) or pass -n")
            else:  # -n gives the budget; rl-zoo3 still reads (and deletes) the key
                hyperparams = {**hyperparams, "n_timesteps": self.n_timesteps}
        if problems:
            raise ZooConfigError(f"invalid {self.algo} hyperparameters in {source}: {'; '.join(problems)}")
        return hyperparams, saved_hyperparams

    manager_class._preprocess_hyperparams = _preprocess_hyperparams
    manager_class.read_hyperparameters = read_hyperparameters


def _patch_checkpoints_and_resume(manager_class: Any) -> None:
    """``--save-freq``: atomic checkpoints with VecNormalize statistics; ``-i <checkpoint>``: resume from them."""
    original_create_callbacks = manager_class.create_callbacks
    original_maybe_normalize = manager_class._maybe_normalize
    original_load_pretrained = manager_class._load_pretrained_agent
    original_learn = manager_class.learn

    @functools.wraps(original_create_callbacks)
    def create_callbacks(self):
        original_create_callbacks(self)
        if is_ours(self.algo):
            self.callbacks = [_atomic_checkpoints(callback) for callback in self.callbacks]

    @functools.wraps(original_maybe_normalize)
    def _maybe_normalize(self, env, eval_env):
        stats = _checkpoint_vec_normalize(self.trained_agent) if is_ours(self.algo) else None
        if stats is None:
            return original_maybe_normalize(self, env, eval_env)
        from stable_baselines3.common.vec_env import VecNormalize

        print(f"Loading the checkpoint's VecNormalize stats {stats}")
        env = VecNormalize.load(stats, env)
        if eval_env:
            env.training, env.norm_reward = False, False
        return env

    @functools.wraps(original_load_pretrained)
    def _load_pretrained_agent(self, hyperparams, env):
        if is_ours(self.algo) and any(type(c).__name__ == "KLAdaptiveLR" for c in self.callbacks):
            # The rate is state, like beta: KLAdaptiveLR adapted it and the checkpoint holds it.
            hyperparams = {k: v for k, v in hyperparams.items() if k != "learning_rate"}
        return original_load_pretrained(self, hyperparams, env)

    @functools.wraps(original_learn)
    def learn(self, model):
        if not is_ours(self.algo) or not self.continue_training:
            return original_learn(self, model)
        # -i continues the run: the timestep count (and the checkpoint names) go on from the checkpoint's.
        return original_learn(self, _ContinuingModel(model))

    manager_class.create_callbacks = create_callbacks
    manager_class._maybe_normalize = _maybe_normalize
    manager_class._load_pretrained_agent = _load_pretrained_agent
    manager_class.learn = learn


class _ContinuingModel:
    """The model as rl-zoo3's ``learn`` sees it on ``-i``: ``learn`` keeps the step count (nothing is set on the model)."""

    def __init__(self, model: Any):
        self._model = model

    def learn(self, *args: Any, **kwargs: Any) -> Any:
        return self._model.learn(*args, reset_num_timesteps=False, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _atomic_checkpoints(callback: Any) -> Any:
    """rl-zoo3's ``CheckpointCallback`` (``--save-freq``) as an :class:`AtomicCheckpointCallback` saving VecNormalize too."""
    from stable_baselines3.common.callbacks import CheckpointCallback

    from sb3_ppo_ext.reliability import AtomicCheckpointCallback

    if type(callback) is not CheckpointCallback:
        return callback
    return AtomicCheckpointCallback(
        callback.save_freq,
        callback.save_path,
        name_prefix=callback.name_prefix,
        save_vecnormalize=True,
        verbose=callback.verbose,
    )


def _checkpoint_vec_normalize(trained_agent: str) -> str | None:
    """The ``VecNormalize`` statistics saved with the checkpoint ``<prefix>_<N>_steps.zip``, if any."""
    import re

    match = re.fullmatch(r"(.*)_(\d+)_steps\.zip", os.path.basename(trained_agent or ""))
    if match is None:
        return None
    stats = os.path.join(os.path.dirname(trained_agent), f"{match.group(1)}_vecnormalize_{match.group(2)}_steps.pkl")
    return stats if os.path.isfile(stats) else None


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


def _remove_empty_folder(path: str) -> None:
    """Remove the folder ``path`` if it exists and is empty."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_run_without_model(save_path: str) -> None:
    """Remove a run folder if no model (``*.zip``) was saved in it."""
    if os.path.isdir(save_path) and not any(name.endswith(".zip") for _, _, files in os.walk(save_path) for name in files):
        shutil.rmtree(save_path, ignore_errors=True)


_REGISTRARS = {
    "rl_zoo3.utils": _register_algo,
    "rl_zoo3.hyperparams_opt": _register_sampler,
    "rl_zoo3.exp_manager": _patch_experiment_manager,
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
