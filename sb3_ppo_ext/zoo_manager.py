"""rl-zoo3's ``ExperimentManager`` for this package's algorithms: :class:`PPOExtExperimentManager`.

Why a module of its own: rl-zoo3 is an optional extra (``pip install ".[zoo]"``) and a subclass
needs its base class when it is defined, so this module imports ``rl_zoo3.exp_manager`` at its
top and nothing of the package imports it before rl-zoo3 has been imported.
:func:`sb3_ppo_ext.zoo.on_zoo_module_imported` imports it right after ``rl_zoo3.exp_manager``
has executed (the startup hook calls it at that moment; :func:`sb3_ppo_ext.zoo.register` does the
same for the route without the hook) and sets ``rl_zoo3.exp_manager.ExperimentManager =
PPOExtExperimentManager`` once. That is before ``rl_zoo3.train`` (or ``enjoy``, ``record_video``)
runs ``from rl_zoo3.exp_manager import ExperimentManager``, so those bind the subclass. rl-zoo3's
own class stays as it was (nothing is patched onto it); it is :data:`UPSTREAM`, the only base.

Every override calls rl-zoo3's method through ``super()``; for an algorithm that is not one of
this package's (:func:`sb3_ppo_ext.zoo_support.is_ours` is false: ``ppo``, ``a2c``, ``sac``, ...) it does
nothing else and passes the arguments on as given, so rl-zoo3's own algorithms run exactly as
without this package. The one exception is :meth:`PPOExtExperimentManager.read_hyperparameters`
for our algorithms with a yml ``--conf-file``: the settings owner reads the file once
(``yaml.safe_load``) and checks it, and the entry rl-zoo3 would select is merged from those
entries by :meth:`PPOExtExperimentManager._merge_settings`, rl-zoo3's own merge written out (a
test compares the two on the same manager), because rl-zoo3's ``read_hyperparameters`` would open
and parse the file a second time and offers no way to hand it the entries. The reasons for each
override are in :mod:`sb3_ppo_ext.zoo`'s docstring and in each method's.

Installing twice changes nothing (the class carries the ``_sb3_ppo_ext_patched`` marker, and
:data:`UPSTREAM` skips classes that carry it, so reloading this module cannot stack a subclass
on a subclass); when ``rl_zoo3.exp_manager`` itself runs again (``importlib.reload``), the
installer reloads this module so that the new subclass derives from rl-zoo3's new class.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
from collections import OrderedDict
from collections.abc import Iterator
from pprint import pprint
from typing import TYPE_CHECKING, Any, cast

from rl_zoo3 import exp_manager as _exp_manager
from rl_zoo3.callbacks import TrialEvalCallback
from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

from sb3_ppo_ext import settings, zoo_support

if TYPE_CHECKING:
    from rl_zoo3.exp_manager import ExperimentManager as UPSTREAM
    from stable_baselines3.common.base_class import BaseAlgorithm
    from stable_baselines3.common.vec_env import VecEnv


def _upstream(manager_class: type) -> type:
    """rl-zoo3's own class under ``manager_class``: the first base that is not one of ours."""
    while manager_class.__dict__.get(zoo_support._PATCHED, False):
        manager_class = manager_class.__bases__[0]
    return manager_class


if not TYPE_CHECKING:
    # rl-zoo3's ExperimentManager, the one base of PPOExtExperimentManager.
    UPSTREAM = _upstream(_exp_manager.ExperimentManager)
_INIT_SIGNATURE = inspect.signature(UPSTREAM.__init__)


class PPOExtExperimentManager(UPSTREAM):
    """
    rl-zoo3's ``ExperimentManager`` that knows this package's algorithms (``--algo ppo_ext``,
    ``ppo_lstm_ext``, ``ppo_mask_ext``); for every other algorithm each method is rl-zoo3's.

    Installed as ``rl_zoo3.exp_manager.ExperimentManager`` (see the module docstring); the
    arguments are rl-zoo3's.
    """

    # Marks the installed class: installing again, or reloading this module, stacks nothing.
    _sb3_ppo_ext_patched = True

    def __init__(self, *args: Any, **kwargs: Any):
        """rl-zoo3's ``__init__``; the default ``--conf-file`` of our algorithms is the yml shipped in this package."""
        bound = _INIT_SIGNATURE.bind(self, *args, **kwargs)
        spec = settings.ALGORITHMS.get(bound.arguments.get("algo"))  # type: ignore[arg-type]
        if spec is not None and bound.arguments.get("config") is None and spec.hyperparams is not None:
            # rl-zoo3 looks for <rl_zoo3 package>/hyperparams/<algo>.yml; ours ship in sb3_ppo_ext.
            bound.arguments["config"] = str(spec.hyperparams)
            args, kwargs = bound.args[1:], bound.kwargs
        super().__init__(*args, **kwargs)

    # --- settings: read once, each entry checked once ----------------------------------------

    def read_hyperparameters(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """
        The settings, each source checked once before rl-zoo3 parses schedules or evaluates strings:
        the yml entry and the ``-params`` values key by key (a mistake is blamed on its own source),
        then the merged settings (file, trial, ``-params``) as a whole, for the rules that tie
        parameters together. A yml file is read once (:func:`sb3_ppo_ext.settings.read_entries`);
        a ``.py`` file or a module is rl-zoo3's to execute (``super()``).
        """
        if not zoo_support.is_ours(self.algo):
            return super().read_hyperparameters()
        algo, config = self.algo, str(self.config)
        entries, source = None, config
        if config.endswith((".yml", ".yaml")):
            entries = settings.read_entries(config)
            name = settings.select_entry(entries, self.env_name.gym_id, atari=bool(self._is_atari))
            if name is not None:
                source = f"{config} (entry {name!r})"
                zoo_support.raise_problems(settings.entry_problems(entries[name], algo, whole=False), algo, f"in {source}")
        if self.custom_hyperparams:
            zoo_support.raise_problems(settings.entry_problems(self.custom_hyperparams, algo, whole=False), algo, "in -params")
            source += " with -params"
        hyperparams, saved_hyperparams = super().read_hyperparameters() if entries is None else self._merge_settings(entries)
        if not isinstance(hyperparams, dict):  # an entry of a .py conf file
            raise zoo_support.ZooConfigError(f"invalid {algo} hyperparameters in {source}: expected a mapping of settings")
        # A yml entry and -params were checked key by key above: the merge needs only the rules across keys.
        problems = (
            settings.entry_problems(hyperparams, algo) if entries is None else settings.whole_entry_problems(hyperparams, algo)
        )
        if "n_timesteps" not in hyperparams:
            if self.n_timesteps <= 0:  # rl-zoo3 would end in KeyError: 'n_timesteps'
                problems.append("'n_timesteps' is missing: give the entry a training budget (n_timesteps: 1.0e5) or pass -n")
            else:  # -n gives the budget; rl-zoo3 still reads (and deletes) the key
                hyperparams = {**hyperparams, "n_timesteps": self.n_timesteps}
        zoo_support.raise_problems(problems, algo, f"in {source}")
        return hyperparams, saved_hyperparams

    def _merge_settings(self, entries: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """
        rl-zoo3's ``read_hyperparameters`` (2.9) after its ``yaml.safe_load``, on ``entries``: the
        entry for the env (its id, ``atari`` for an Atari env, else ``default``), the ``--trial-id``
        trial's and the ``-params`` values over it, ``--env-kwargs`` over its ``env_kwargs``; the
        same lines printed. ``tests/test_zoo_seams.py`` checks it against rl-zoo3's method.
        """
        print(f"Loading hyperparameters from: {self.config}")
        gym_id = self.env_name.gym_id
        if gym_id in entries:
            hyperparams = entries[gym_id]
        elif self._is_atari:
            hyperparams = entries["atari"]
        elif "default" in entries:
            print("Using 'default' hyperparameters")
            hyperparams = entries["default"]
        else:
            raise ValueError(f"Hyperparameters not found for {self.algo}-{gym_id} in {self.config}")
        if self.storage and self.study_name and self.trial_id:
            print("Loading from Optuna study...")
            hyperparams.update(self.load_trial(self.storage, self.study_name, self.trial_id))
        if self.custom_hyperparams is not None:
            hyperparams.update(self.custom_hyperparams)
        if "env_kwargs" in hyperparams and self.env_kwargs:
            hyperparams.update({"env_kwargs": self.env_kwargs})
            if self._eval_env_kwargs_args is None:
                self.eval_env_kwargs = hyperparams["env_kwargs"]
        saved_hyperparams = OrderedDict([(key, hyperparams[key]) for key in sorted(hyperparams.keys())])
        print("Default hyperparameters for environment (ones being tuned will be overridden):")
        pprint(saved_hyperparams)
        return hyperparams, saved_hyperparams

    def _preprocess_hyperparams(self, hyperparams: dict[str, Any]) -> Any:
        """
        rl-zoo3's preprocessing; for our algorithms ``clip_range: null`` / ``clip_range_vf: null``
        pass through, activation names become torch classes, and what rl-zoo3 only now made
        checkable (a ``policy_kwargs`` string it evaluated, a policy class it imported by name) is checked.
        """
        if not zoo_support.is_ours(self.algo):
            return super()._preprocess_hyperparams(hyperparams)
        hyperparams = dict(hyperparams)
        self._sb3_ppo_ext_env_backend = _checked_env_backend(self, hyperparams.pop("env_backend", "gymnasium"), hyperparams)
        # rl-zoo3 turns clip_range / clip_range_vf into schedules and rejects None, which for
        # PPOExt means "off" (clip_range: null is the KL-penalty-only objective): keep them aside.
        switched_off: dict[str, Any] = {
            key: None for key in ("clip_range", "clip_range_vf") if key in hyperparams and hyperparams[key] is None
        }
        policy, policy_kwargs = hyperparams.get("policy"), hyperparams.get("policy_kwargs")
        unchecked = isinstance(policy_kwargs, str) or (isinstance(policy, str) and "." in policy)
        processed, *rest = super()._preprocess_hyperparams({k: v for k, v in hyperparams.items() if k not in switched_off})
        if unchecked and processed.get("policy_kwargs") is not None:
            source = f"{self.config} (env {self.env_name.gym_id})"
            part = {key: processed[key] for key in ("policy", "policy_kwargs") if key in processed}
            problems = settings.entry_problems(part, self.algo, whole=False)
            zoo_support.raise_problems(problems, self.algo, f"in {source}, policy_kwargs")
        return (zoo_support.resolve_activation({**processed, **switched_off}), *rest)

    # --- the run folder and the Optuna storage ----------------------------------------------

    def setup_experiment(self) -> Any:
        """
        rl-zoo3's ``setup_experiment``; for our algorithms with ``-optimize`` the Optuna storage is
        opened first (an unreachable database leaves no folder), and a run folder created by a
        failed run is removed (it would become the "latest" run that ``enjoy`` loads), as is an
        empty ``<log-folder>/<algo>``.
        """
        if not zoo_support.is_ours(self.algo):
            return super().setup_experiment()
        log_existed, existed = os.path.exists(self.log_path), os.path.exists(self.save_path)
        try:
            if self.optimize_hyperparameters:
                # Opens the database (and creates Optuna's tables) before any folder is made.
                self._sb3_ppo_ext_storage = zoo_support._check_storage(self.storage)
            return super().setup_experiment()
        except BaseException:
            if not existed:
                shutil.rmtree(self.save_path, ignore_errors=True)
            if not log_existed:
                _remove_empty_folder(self.log_path)
            raise

    def load_trial(self, storage: str, study_name: str, trial_id: int | None = None, convert: bool = True) -> dict[str, Any]:
        """rl-zoo3's ``load_trial`` (``--trial-id``); for our algorithms an unreachable database is a clear error first."""
        if zoo_support.is_ours(self.algo):
            zoo_support._check_storage(storage)
        return super().load_trial(storage, study_name, trial_id, convert)

    def hyperparameters_optimization(self) -> None:
        """
        rl-zoo3's ``-optimize``; for our algorithms on the storage from
        :func:`sb3_ppo_ext.zoo_support._check_storage` (Optuna's heartbeat), with ``--max-total-trials``
        counted by :class:`~sb3_ppo_ext.zoo_support.TrialBudgetCallback`, and for a masked algorithm each
        trial evaluated with masks (:func:`_masked_evaluation`); a run folder without a model is removed afterwards.
        """
        if not zoo_support.is_ours(self.algo):
            super().hyperparameters_optimization()
            return
        try:
            # Opened by setup_experiment (a direct call opens it here) before any trial runs.
            storage = getattr(self, "_sb3_ppo_ext_storage", None) or zoo_support._check_storage(self.storage)
        except zoo_support.ZooConfigError:
            _remove_run_without_model(self.save_path)
            raise
        try:
            with (
                zoo_support._study_storage(self.storage, storage, _exp_manager, self.max_total_trials),
                _masked_evaluation(zoo_support.is_masked(self.algo)),
            ):
                super().hyperparameters_optimization()
        finally:
            # setup_experiment made a run folder (monitor files only) that holds no model: left
            # behind, it would become the "latest" run that enjoy tries to load.
            _remove_run_without_model(self.save_path)

    # --- envs, checkpoints and resuming -----------------------------------------------------

    def create_envs(self, n_envs: int, eval_env: bool = False, no_log: bool = False) -> VecEnv:
        """
        rl-zoo3's envs; with ``env_backend: envpool``, training envs from EnvPool (:func:`_envpool_env`); for a
        masked algorithm checked for ``action_masks()`` (and left unwrapped).
        """
        if not eval_env and getattr(self, "_sb3_ppo_ext_env_backend", None) == "envpool":
            env = _envpool_env(self, n_envs)
        else:
            env = super().create_envs(n_envs, eval_env=eval_env, no_log=no_log)
        if not zoo_support.is_masked(self.algo):
            return env
        return zoo_support.masked_env(env, self.algo, self.env_name.gym_id, carry_masks=False)

    def create_callbacks(self) -> None:
        """
        rl-zoo3's callbacks; for our algorithms its ``--save-freq`` checkpoints are atomic and save
        VecNormalize too, and for a masked algorithm ``--eval-freq`` evaluates with masks (:func:`_masked_evaluation`).
        """
        with _masked_evaluation(zoo_support.is_masked(self.algo)):
            super().create_callbacks()
        if zoo_support.is_ours(self.algo):
            self.callbacks = [_atomic_checkpoints(callback) for callback in self.callbacks]

    def _maybe_normalize(self, env: VecEnv, eval_env: bool) -> VecEnv:
        """rl-zoo3's VecNormalize; for ``-i <checkpoint>`` of our algorithms, the statistics saved with the checkpoint."""
        stats = _checkpoint_vec_normalize(self.trained_agent) if zoo_support.is_ours(self.algo) else None
        if stats is None:
            return super()._maybe_normalize(env, eval_env)
        from stable_baselines3.common.vec_env import VecNormalize

        print(f"Loading the checkpoint's VecNormalize stats {stats}")
        normalized = VecNormalize.load(stats, env)
        if eval_env:
            normalized.training, normalized.norm_reward = False, False
        return normalized

    def _load_pretrained_agent(self, hyperparams: dict[str, Any], env: VecEnv) -> BaseAlgorithm:
        """rl-zoo3's ``-i``; with a :class:`~sb3_ppo_ext.callbacks.KLAdaptiveLR`, the learning rate is the checkpoint's."""
        if zoo_support.is_ours(self.algo):
            from sb3_ppo_ext.callbacks import KLAdaptiveLR

            if any(isinstance(callback, KLAdaptiveLR) for callback in self.callbacks):
                # The rate is state, like beta: KLAdaptiveLR adapted it and the checkpoint holds it.
                hyperparams = {k: v for k, v in hyperparams.items() if k != "learning_rate"}
        return super()._load_pretrained_agent(hyperparams, env)

    def learn(self, model: BaseAlgorithm) -> None:
        """rl-zoo3's ``learn``; ``-i`` of our algorithms continues the timestep count (and the checkpoint names)."""
        if zoo_support.is_ours(self.algo) and self.continue_training:
            model = cast("BaseAlgorithm", _ContinuingModel(model))
        super().learn(model)


class MaskableTrialEvalCallback(TrialEvalCallback, MaskableEvalCallback):
    """
    rl-zoo3's ``TrialEvalCallback`` (an ``-optimize`` trial's evaluations, reported to Optuna for pruning)
    whose every evaluation is sb3-contrib's ``MaskableEvalCallback``'s: with the masks read from the eval env.
    """


@contextlib.contextmanager
def _masked_evaluation(masked: bool) -> Iterator[None]:
    """
    While rl-zoo3 builds its evaluation callbacks for a masked algorithm (``create_callbacks``, each
    ``-optimize`` trial's ``objective``), its ``EvalCallback`` and ``TrialEvalCallback`` are sb3-contrib's
    ``MaskableEvalCallback`` and :class:`MaskableTrialEvalCallback`, which read the masks from the eval env
    at each step (``get_action_masks``) and pass them to ``predict``.

    rl-zoo3 builds both callbacks inside those methods from the names in ``rl_zoo3.exp_manager``, with no
    argument or attribute to choose the class: the names are set for the duration of the call and put
    back after it. The eval env stays as rl-zoo3 builds it, so ``VecNormalize`` statistics sync with the
    training env's and SB3's check that both envs are of one type holds.
    """
    if not masked:
        yield
        return
    originals = _exp_manager.EvalCallback, _exp_manager.TrialEvalCallback
    _exp_manager.EvalCallback, _exp_manager.TrialEvalCallback = MaskableEvalCallback, MaskableTrialEvalCallback  # type: ignore[misc]
    try:
        yield
    finally:
        _exp_manager.EvalCallback, _exp_manager.TrialEvalCallback = originals  # type: ignore[misc]


class _ContinuingModel:
    """The model as rl-zoo3's ``learn`` sees it on ``-i``: ``learn`` keeps the step count (nothing is set on the model)."""

    def __init__(self, model: Any):
        self._model = model

    def learn(self, *args: Any, **kwargs: Any) -> Any:
        return self._model.learn(*args, reset_num_timesteps=False, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _checked_env_backend(manager: UPSTREAM, backend: str, hyperparams: dict[str, Any]) -> str:
    """
    The entry's ``env_backend``; for ``envpool``, a :class:`~sb3_ppo_ext.zoo_support.ZooConfigError` before any
    folder is made when EnvPool is missing or the run asks for what EnvPool's envs cannot take (an ``env_wrapper``
    in the settings ``hyperparams``: gymnasium wrappers; rl-zoo3's ``--vec-env subproc``).
    """
    if backend != "envpool":
        return backend
    from stable_baselines3.common.vec_env import DummyVecEnv

    from sb3_ppo_ext.envpool import require_envpool

    try:
        require_envpool()
    except ImportError as error:
        entry = f"the {manager.env_name.gym_id} entry has env_backend: envpool"
        hint = "-params env_backend:gymnasium trains on gymnasium's envs instead"
        raise zoo_support.ZooConfigError(f"{error} ({entry}; {hint})") from None
    if manager.vec_env_class is not DummyVecEnv:
        raise zoo_support.ZooConfigError(
            f"--vec-env {manager.vec_env_class.__name__} does not apply to env_backend: envpool (EnvPool steps its envs "
            "on its own threads); leave --vec-env out, or pass -params env_backend:gymnasium"
        )
    if hyperparams.get("env_wrapper") is not None:
        raise zoo_support.ZooConfigError(
            "env_wrapper does not apply to env_backend: envpool (gymnasium wrappers cannot wrap EnvPool's envs); "
            "use a vec_env_wrapper, or pass -params env_backend:gymnasium"
        )
    return backend


def _envpool_env(manager: UPSTREAM, n_envs: int) -> VecEnv:
    """
    The training env of an entry with ``env_backend: envpool``: ``n_envs`` envs of EnvPool's task of the same id
    (:class:`~sb3_ppo_ext.envpool.EnvPoolVecEnv`, seeded with ``--seed``, the entry's ``env_kwargs`` passed to
    EnvPool), then rl-zoo3's own ``vec_env_wrapper``, ``VecNormalize``
    (:meth:`~PPOExtExperimentManager._maybe_normalize`) and ``frame_stack`` as its ``create_envs`` applies them.
    Evaluation envs stay rl-zoo3's: gymnasium's own envs. No monitor file is written: the episode statistics come
    from the env itself (a ``VecMonitor`` here would break ``sync_envs_normalization``, which walks the training
    and evaluation wrappers in step).
    """
    from stable_baselines3.common.vec_env import VecFrameStack

    from sb3_ppo_ext.envpool import EnvPoolVecEnv

    env: VecEnv = EnvPoolVecEnv(manager.env_name.gym_id, n_envs, seed=manager.seed, **manager.env_kwargs)
    if manager.vec_env_wrapper is not None:
        env = manager.vec_env_wrapper(env)
    env = manager._maybe_normalize(env, eval_env=False)
    return env if manager.frame_stack is None else VecFrameStack(env, manager.frame_stack)


def _atomic_checkpoints(callback: Any) -> Any:
    """
    rl-zoo3's ``CheckpointCallback`` (``--save-freq``) as an :class:`AtomicCheckpointCallback` saving VecNormalize too.

    Only SB3's own class is replaced (``type(...) is``, not ``isinstance``): a subclass, from an
    entry's ``callback``, has behaviour of its own that the replacement would drop.
    """
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
    match = re.fullmatch(r"(.*)_(\d+)_steps\.zip", os.path.basename(trained_agent or ""))
    if match is None:
        return None
    stats = os.path.join(os.path.dirname(trained_agent), f"{match.group(1)}_vecnormalize_{match.group(2)}_steps.pkl")
    return stats if os.path.isfile(stats) else None


def _remove_empty_folder(path: str) -> None:
    """Remove the folder ``path`` if it exists and is empty."""
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _remove_run_without_model(save_path: str) -> None:
    """Remove a run folder if no model (``*.zip``) was saved in it."""
    if os.path.isdir(save_path) and not any(name.endswith(".zip") for _, _, files in os.walk(save_path) for name in files):
        shutil.rmtree(save_path, ignore_errors=True)
