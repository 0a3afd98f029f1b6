"""rl-zoo3's ``ExperimentManager`` for our algorithms; each override calls rl-zoo3's through ``super()``."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.trial import TrialState
from rl_zoo3 import exp_manager as _exp_manager
from rl_zoo3.callbacks import TrialEvalCallback
from rl_zoo3.exp_manager import ExperimentManager as UPSTREAM  # rl-zoo3's class (imported before ours is bound)
from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecFrameStack, VecNormalize

from sb3_ppo_ext import settings
from sb3_ppo_ext import zoo_support as support
from sb3_ppo_ext.callbacks import KLAdaptiveLR
from sb3_ppo_ext.envpool import EnvPoolVecEnv, require_envpool, task_kwargs
from sb3_ppo_ext.reliability import AtomicCheckpointCallback
from sb3_ppo_ext.storage import HEARTBEAT_INTERVAL, StorageError, _url_secrets, make_storage

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm


class PPOExtExperimentManager(UPSTREAM):
    """rl-zoo3's ``ExperimentManager`` that knows this package's algorithms (see the guide's rl-zoo3 page)."""

    _sb3_ppo_ext_patched = True  # marks the installed class
    _storage: ZooStorage | None = None  # -optimize's, opened by setup_experiment
    _env_backend = "gymnasium"
    _cpu_budget: float | None = None  # the entry's optimize_cpu_budget

    def __init__(self, *args: Any, **kwargs: Any):
        """rl-zoo3's ``__init__``; the default ``--conf-file`` of our algorithms is the yml shipped in this package."""
        super().__init__(*args, **kwargs)
        spec = settings.ALGORITHMS.get(self.algo)
        if kwargs.get("config") is None and spec is not None and spec.hyperparams is not None:
            self.config = str(spec.hyperparams)

    def read_hyperparameters(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """rl-zoo3's settings; for ours the yml entry and ``-params`` checked key by key first, then the merge."""
        if not support.is_ours(self.algo):
            return super().read_hyperparameters()
        algo, source = self.algo, str(self.config)
        yml = source.endswith((".yml", ".yaml"))
        if yml:
            entries = settings.read_entries(source)
            name = settings.select_entry(entries, self.env_name.gym_id, atari=bool(self._is_atari))
            if name is not None:
                source = f"{source} (entry {name!r})"
                support.raise_problems(settings.entry_problems(entries[name], algo, whole=False), algo, f"in {source}")
        if self.custom_hyperparams:
            support.raise_problems(settings.entry_problems(self.custom_hyperparams, algo, whole=False), algo, "in -params")
            source += " with -params"
        hyperparams, saved_hyperparams = super().read_hyperparameters()
        if not isinstance(hyperparams, dict):  # an entry of a .py conf file
            raise support.ZooConfigError(f"invalid {algo} hyperparameters in {source}: expected a mapping of settings")
        # A yml entry and -params were checked key by key: the merge needs only the rules across keys.
        problems = settings.whole_entry_problems(hyperparams, algo) if yml else settings.entry_problems(hyperparams, algo)
        if "n_timesteps" not in hyperparams:
            if self.n_timesteps <= 0:  # rl-zoo3 would end in KeyError: 'n_timesteps'
                problems.append("'n_timesteps' is missing: give the entry a training budget (n_timesteps: 1.0e5) or pass -n")
            else:  # -n gives the budget; rl-zoo3 still reads (and deletes) the key
                hyperparams = {**hyperparams, "n_timesteps": self.n_timesteps}
        support.raise_problems(problems, algo, f"in {source}")
        return hyperparams, saved_hyperparams

    def _preprocess_hyperparams(self, hyperparams: dict[str, Any]) -> Any:
        """rl-zoo3's preprocessing; for ours also ``env_backend``, ``clip_range: null`` and evaluated ``policy_kwargs``."""
        if not support.is_ours(self.algo):
            return super()._preprocess_hyperparams(hyperparams)
        hyperparams = dict(hyperparams)
        self._env_backend = _checked_env_backend(self, hyperparams.pop("env_backend", "gymnasium"), hyperparams)
        self._cpu_budget = hyperparams.pop("optimize_cpu_budget", None)
        if self._cpu_budget is not None and not self.optimize_hyperparameters:
            raise support.ZooConfigError(f"optimize_cpu_budget={self._cpu_budget!r} applies to -optimize trials only")
        off: dict[str, Any] = {
            key: None for key in ("clip_range", "clip_range_vf") if key in hyperparams and hyperparams[key] is None
        }
        policy, policy_kwargs = hyperparams.get("policy"), hyperparams.get("policy_kwargs")
        unchecked = isinstance(policy_kwargs, str) or (isinstance(policy, str) and "." in policy)
        processed, *rest = super()._preprocess_hyperparams({k: v for k, v in hyperparams.items() if k not in off})
        if unchecked and processed.get("policy_kwargs") is not None:
            part = {key: processed[key] for key in ("policy", "policy_kwargs") if key in processed}
            where = f"in {self.config} (env {self.env_name.gym_id}), policy_kwargs"
            support.raise_problems(settings.entry_problems(part, self.algo, whole=False), self.algo, where)
        return (support.resolve_activation({**processed, **off}), *rest)

    def setup_experiment(self) -> tuple[BaseAlgorithm, dict[str, Any]] | None:
        """rl-zoo3's ``setup_experiment``; for ours a settings error ends the command, its run folder removed."""
        if not support.is_ours(self.algo):
            return super().setup_experiment()
        log_existed, existed = os.path.exists(self.log_path), os.path.exists(self.save_path)
        try:
            with support.settings_errors_end_the_command():
                if self.optimize_hyperparameters:
                    self._storage = check_storage(self.storage)
                return super().setup_experiment()
        except BaseException:
            if not existed:
                shutil.rmtree(self.save_path, ignore_errors=True)
            if not log_existed:
                with contextlib.suppress(OSError):
                    os.rmdir(self.log_path)  # only if empty
            raise

    def load_trial(self, storage: str, study_name: str, trial_id: int | None = None, convert: bool = True) -> dict[str, Any]:
        """rl-zoo3's ``load_trial`` (``--trial-id``); for our algorithms an unreachable database is a clear error first."""
        if support.is_ours(self.algo):
            check_storage(storage)
        return super().load_trial(storage, study_name, trial_id, convert)

    def hyperparameters_optimization(self) -> None:
        """rl-zoo3's ``-optimize``; for ours on :func:`check_storage`'s storage, trials on the entry's
        ``optimize_cpu_budget`` (:class:`CPUBudgetTrialEvalCallback`), and no model-less run folder left."""
        if not support.is_ours(self.algo):
            super().hyperparameters_optimization()
            return
        url, names = self.storage, dict[str, Any]()
        try:
            storage = self._storage or check_storage(url)
            if storage is not None:
                interval = storage.get_heartbeat_interval()
                if interval and self.max_total_trials is not None:
                    settle_trial_budget(storage, self.study_name, self.max_total_trials)
                    names["MaxTrialsCallback"] = functools.partial(TrialBudgetCallback, interval)
                self.storage = storage  # type: ignore[assignment]
            if self._cpu_budget is not None:
                budget = MaskableCPUBudgetTrialEvalCallback if support.is_masked(self.algo) else CPUBudgetTrialEvalCallback
                names["TrialEvalCallback"] = functools.partial(
                    budget, cpu_budget=self._cpu_budget, n_evaluations=self.n_evaluations
                )
            with _rl_zoo3_classes(self.algo, **names):
                super().hyperparameters_optimization()
        finally:
            self.storage = url
            if not any(name.endswith(".zip") for *_, files in os.walk(self.save_path) for name in files):
                shutil.rmtree(self.save_path, ignore_errors=True)

    def create_envs(self, n_envs: int, eval_env: bool = False, no_log: bool = False) -> VecEnv:
        """rl-zoo3's envs; training envs from EnvPool with ``env_backend: envpool``; checked for masks if masked."""
        if not eval_env and self._env_backend == "envpool":
            env = _envpool_env(self, n_envs)
        else:
            if eval_env and self._env_backend == "envpool" and getattr(self, "_eval_env_kwargs_args", None) is None:
                self.eval_env_kwargs = task_kwargs(self.eval_env_kwargs)  # --env-kwargs' EnvPool options: training only
            env = super().create_envs(n_envs, eval_env=eval_env, no_log=no_log)
        if support.is_masked(self.algo):
            env = support.masked_env(env, self.algo, self.env_name.gym_id, carry_masks=False)
        return env

    def create_callbacks(self) -> None:
        """rl-zoo3's callbacks; for ours ``--save-freq`` checkpoints are atomic with VecNormalize, evaluation masked."""
        with _rl_zoo3_classes(self.algo):
            super().create_callbacks()
        if support.is_ours(self.algo):
            self.callbacks = [_atomic_checkpoints(callback) for callback in self.callbacks]

    def _maybe_normalize(self, env: VecEnv, eval_env: bool) -> VecEnv:
        """rl-zoo3's VecNormalize; for ``-i <checkpoint>`` of our algorithms, the statistics saved with the checkpoint."""
        stats = _checkpoint_vec_normalize(self.trained_agent) if support.is_ours(self.algo) else None
        if stats is None:
            return super()._maybe_normalize(env, eval_env)
        print(f"Loading the checkpoint's VecNormalize stats {stats}")
        normalized = VecNormalize.load(stats, env)
        if eval_env:
            normalized.training, normalized.norm_reward = False, False
        return normalized

    def _load_pretrained_agent(self, hyperparams: dict[str, Any], env: VecEnv) -> BaseAlgorithm:
        """rl-zoo3's ``-i``; with a :class:`~sb3_ppo_ext.callbacks.KLAdaptiveLR`, the learning rate is the checkpoint's."""
        if support.is_ours(self.algo) and any(isinstance(callback, KLAdaptiveLR) for callback in self.callbacks):
            hyperparams = {k: v for k, v in hyperparams.items() if k != "learning_rate"}  # adapted state, like beta
        return super()._load_pretrained_agent(hyperparams, env)

    def learn(self, model: BaseAlgorithm) -> None:
        """rl-zoo3's ``learn``; ``-i`` of our algorithms continues the timestep count (and the checkpoint names)."""
        if support.is_ours(self.algo) and self.continue_training:
            model = cast("BaseAlgorithm", _ContinuingModel(model))
        super().learn(model)


def check_storage(storage: str | None) -> ZooStorage | None:
    """The database ``storage`` opened with Optuna's heartbeat, or a ``ZooConfigError``; None for none or a journal file."""
    if storage is None or storage.endswith(".log"):
        return None
    try:
        interval = int(os.environ.get("SB3_PPO_EXT_HEARTBEAT_INTERVAL", HEARTBEAT_INTERVAL))
        grace = os.environ.get("SB3_PPO_EXT_GRACE_PERIOD")
        grace_period = None if grace is None else int(grace)
        opened = make_storage(storage, heartbeat_interval=interval, grace_period=grace_period, rdb_class=ZooStorage)
        return cast(ZooStorage, opened)  # a database URL (not a journal file) opens an RDBStorage
    except (StorageError, ValueError) as error:
        raise support.ZooConfigError(str(error)) from None


class TrialBudgetCallback:
    """
    rl-zoo3's ``MaxTrialsCallback`` for a storage with heartbeats: stops the study once :meth:`count` reaches ``n_trials``.

    :param poll_seconds: seconds between two checks while other trials run (the heartbeat interval)
    :param n_trials: the budget
    :param states: the trial states that count against it
    """

    def __init__(self, poll_seconds: float, n_trials: int, states: Sequence[TrialState] = (TrialState.COMPLETE,)):
        self.poll_seconds, self.n_trials, self.states = poll_seconds, n_trials, tuple(states)

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if self.count(study) >= self.n_trials:
            study.stop()

    def count(self, study: optuna.Study) -> int:
        """The trials of ``study`` in ``states``, stale ones failed first, waiting while RUNNING ones complete the count."""
        announced = False
        while True:
            with warnings.catch_warnings():  # fail_stale_trials is marked experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)
            counted = study.get_trials(deepcopy=False, states=self.states)
            running = [trial.number for trial in counted if trial.state == TrialState.RUNNING]
            if len(counted) < self.n_trials or not running:
                return len(counted)
            if not announced:
                waiting = (
                    f"waiting for the running trial(s) {running} to finish, or to be failed and retried if their worker died"
                )
                print(f"{len(counted) - len(running)} of {self.n_trials} trials finished: {waiting}")
                announced = True
            time.sleep(self.poll_seconds)


def settle_trial_budget(storage: optuna.storages.RDBStorage, study_name: str | None, n_trials: int) -> None:
    """Before rl-zoo3's first ``--max-total-trials`` count: fail dead workers' trials, wait for running ones."""
    interval = storage.get_heartbeat_interval()
    if study_name is None or not interval:
        return
    study = optuna.create_study(storage=storage, study_name=study_name, load_if_exists=True, direction="maximize")
    with contextlib.suppress(KeyboardInterrupt):
        TrialBudgetCallback(interval, n_trials, (TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED)).count(study)


class MaskableTrialEvalCallback(TrialEvalCallback, MaskableEvalCallback):
    """rl-zoo3's ``TrialEvalCallback`` (an ``-optimize`` trial's evaluations) evaluating with the eval env's masks."""


class CPUBudgetTrialEvalCallback(TrialEvalCallback):
    """
    rl-zoo3's ``TrialEvalCallback`` on a budget of training CPU time (process CPU time, all threads, evaluations excluded):
    it evaluates after each ``cpu_budget / n_evaluations`` CPU-seconds and ends the trial at the budget (or, first at
    rl-zoo3's ``-n``, evaluates once more at the end), so the trial's score is the return reached in ``cpu_budget``.

    :param cpu_budget: training CPU-seconds of one trial
    :param n_evaluations: evaluations per trial (rl-zoo3's ``--n-evaluations``)
    """

    def __init__(self, *args: Any, cpu_budget: float, n_evaluations: int, **kwargs: Any):
        super().__init__(*args, **{**kwargs, "eval_freq": 1})  # evaluations follow the clock, not the steps
        self.cpu_budget, self.n_evaluations = float(cpu_budget), int(n_evaluations)
        self.start = self.evaluation_cpu = 0.0

    def training_cpu(self) -> float:
        """CPU-seconds of training so far."""
        return time.process_time() - self.start - self.evaluation_cpu

    def _on_training_start(self) -> None:
        self.start = time.process_time()

    def _on_step(self) -> bool:
        if self.training_cpu() < self.cpu_budget * (self.eval_idx + 1) / self.n_evaluations:
            return True
        return self._evaluate() and self.eval_idx < self.n_evaluations

    def _evaluate(self) -> bool:
        """rl-zoo3's evaluation, report and pruning decision (whether the trial goes on), its CPU time set apart."""
        begin = time.process_time()
        try:
            return super()._on_step()
        finally:
            self.evaluation_cpu += time.process_time() - begin

    def _on_training_end(self) -> None:
        if self.eval_idx < self.n_evaluations and not self.is_pruned:
            self._evaluate()


class MaskableCPUBudgetTrialEvalCallback(CPUBudgetTrialEvalCallback, MaskableTrialEvalCallback):
    """:class:`CPUBudgetTrialEvalCallback` evaluating with the eval env's masks."""


class ZooStorage(optuna.storages.RDBStorage):
    """An ``RDBStorage`` that also reads as its URL (password masked), where rl-zoo3 handles ``--storage`` as a string."""

    def endswith(self, suffix: str) -> bool:
        return self.url.endswith(suffix)

    def __str__(self) -> str:
        return _url_secrets(self.url)[0]


@contextlib.contextmanager
def _rl_zoo3_classes(algo: str, **names: Any) -> Iterator[None]:
    """``rl_zoo3.exp_manager``'s classes ``names`` (masked evaluation for a masked algorithm) replaced during one call."""
    if support.is_masked(algo):
        names = {"EvalCallback": MaskableEvalCallback, "TrialEvalCallback": MaskableTrialEvalCallback, **names}
    originals = {name: getattr(_exp_manager, name) for name in names}
    vars(_exp_manager).update(names)
    try:
        yield
    finally:
        vars(_exp_manager).update(originals)


class _ContinuingModel:
    """The model as rl-zoo3's ``learn`` sees it on ``-i``: ``learn`` keeps the step count (nothing is set on the model)."""

    def __init__(self, model: BaseAlgorithm):
        self._model = model

    def learn(self, *args: Any, **kwargs: Any) -> BaseAlgorithm:
        return self._model.learn(*args, **{**kwargs, "reset_num_timesteps": False})

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _checked_env_backend(manager: UPSTREAM, backend: str, hyperparams: dict[str, Any]) -> str:
    """The entry's ``env_backend``; for ``envpool``, an error before any folder when EnvPool cannot run the entry."""
    if backend != "envpool":
        return backend
    instead = "-params env_backend:gymnasium"
    try:
        require_envpool()
    except ImportError as error:
        entry = f"the {manager.env_name.gym_id} entry has env_backend: envpool"
        raise support.ZooConfigError(f"{error} ({entry}; {instead} trains on gymnasium's envs instead)") from None
    if manager.vec_env_class is not DummyVecEnv:
        raise support.ZooConfigError(
            f"--vec-env {manager.vec_env_class.__name__} does not apply to env_backend: envpool (EnvPool steps its envs "
            f"on its own threads); leave --vec-env out, or pass {instead}"
        )
    if hyperparams.get("env_wrapper") is not None:
        what = "env_wrapper does not apply to env_backend: envpool (gymnasium wrappers cannot wrap EnvPool's envs)"
        raise support.ZooConfigError(f"{what}; use a vec_env_wrapper, or pass {instead}")
    return backend


def _envpool_env(manager: UPSTREAM, n_envs: int) -> VecEnv:
    """``env_backend: envpool``'s training env with rl-zoo3's wrappers (no ``VecMonitor``: it breaks normalization sync)."""
    env: VecEnv = EnvPoolVecEnv(manager.env_name.gym_id, n_envs, seed=manager.seed, **manager.env_kwargs)
    if manager.vec_env_wrapper is not None:
        env = manager.vec_env_wrapper(env)
    env = manager._maybe_normalize(env, eval_env=False)
    return env if manager.frame_stack is None else VecFrameStack(env, manager.frame_stack)


def _atomic_checkpoints(cb: BaseCallback) -> BaseCallback:
    """rl-zoo3's ``CheckpointCallback`` (SB3's own class only, not a subclass) as an atomic one saving VecNormalize too."""
    if type(cb) is not CheckpointCallback:
        return cb
    return AtomicCheckpointCallback(
        cb.save_freq, cb.save_path, name_prefix=cb.name_prefix, save_vecnormalize=True, verbose=cb.verbose
    )


def _checkpoint_vec_normalize(trained_agent: str) -> str | None:
    """The ``VecNormalize`` statistics saved with the checkpoint ``<prefix>_<N>_steps.zip``, if any."""
    match = re.fullmatch(r"(.*)_(\d+)_steps\.zip", os.path.basename(trained_agent or ""))
    if match is None:
        return None
    stats = os.path.join(os.path.dirname(trained_agent), f"{match.group(1)}_vecnormalize_{match.group(2)}_steps.pkl")
    return stats if os.path.isfile(stats) else None
