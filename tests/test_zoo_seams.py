"""rl-zoo3's own algorithms behave exactly as without this package: every seam acts only for ours.

Each scenario runs ``python -m rl_zoo3.train --algo ppo`` twice in subprocesses, in two fresh
folders: once with the startup hook on (this package registered at every seam, as after
``pip install``) and once with ``SB3_PPO_EXT_NO_ZOO_HOOK=1`` (rl-zoo3 alone). Both runs must give
the same exit status, the same set of saved files, the same evaluations, the same monitor rows
and the same weights (same seed, one torch thread). The tests at the end check the same seams in
this process (fast tier).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# --- the same seams in this process (fast tier) --------------------------------------------------


def test_our_algorithms_and_nothing_else():
    from sb3_ppo_ext import zoo_support

    assert "ppo_ext" in zoo_support.OUR_ALGOS and zoo_support.is_ours("ppo_ext")
    assert not any(zoo_support.is_ours(name) for name in ("ppo", "a2c", "sac", "ppo_lstm", "trpo", None))


@pytest.mark.parametrize("algo", ["ppo", "ppo_ext"])
@pytest.mark.parametrize("algo_first", [True, False])
def test_store_dict_error_is_ours_only(algo: str, algo_first: bool, monkeypatch: pytest.MonkeyPatch, capsys):
    """rl-zoo3's StoreDict with the seam: a malformed value raises as in rl-zoo3, except for our algorithms."""
    import argparse

    from rl_zoo3.utils import StoreDict

    from sb3_ppo_ext import zoo

    zoo.register()
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("-params", nargs="+", action=StoreDict, default={})
    argv = ["--algo", algo, "-params", "n_steps:("] if algo_first else ["-params", "n_steps:(", "--algo", algo]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    assert parser.parse_args(["-params", "n_steps:8", "--algo", algo]).params == {"n_steps": 8}
    if algo == "ppo_ext":
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2 and "cannot parse 'n_steps:('" in capsys.readouterr().err
    else:
        with pytest.raises(SyntaxError):
            parser.parse_args(argv)


def test_registered_sampler_is_called_as_rl_zoo3_calls_it():
    import optuna
    from rl_zoo3.hyperparams_opt import HYPERPARAMS_CONVERTER, HYPERPARAMS_SAMPLER

    from sb3_ppo_ext import zoo

    zoo.register()
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    sampled = HYPERPARAMS_SAMPLER["ppo_ext"](trial, 1, 1, {})  # (trial, n_actions, n_envs, additional_args)
    assert {"n_steps", "batch_size", "learning_rate"} <= set(sampled)
    assert HYPERPARAMS_CONVERTER["ppo_ext"](trial.params)
    assert "ppo" in HYPERPARAMS_SAMPLER and HYPERPARAMS_SAMPLER["ppo"].__module__ == "rl_zoo3.hyperparams_opt"


def test_no_hook_route_usage(capsys):
    from sb3_ppo_ext import zoo

    assert zoo.main(["--help"]) == 0 and "python -m sb3_ppo_ext.zoo" in capsys.readouterr().out
    assert zoo.main([]) == 2
    assert zoo.main(["bogus"]) == 2 and "unknown command 'bogus'" in capsys.readouterr().err


def test_startup_hook_install_is_idempotent_and_switchable(monkeypatch: pytest.MonkeyPatch):
    import sb3_ppo_ext_zoo_hook as hook

    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, hook.ZooImportHook)])
    monkeypatch.setenv(hook.DISABLE_ENV_VAR, "1")
    hook.install()
    assert not any(isinstance(f, hook.ZooImportHook) for f in sys.meta_path)
    monkeypatch.setenv(hook.DISABLE_ENV_VAR, "0")
    hook.install()
    hook.install()
    assert sum(isinstance(f, hook.ZooImportHook) for f in sys.meta_path) == 1
    assert isinstance(sys.meta_path[0], hook.ZooImportHook)


# --- the ExperimentManager subclass (fast tier) ----------------------------------------------------


def _manager(algo: str, env_id: str, folder: Path, **kwargs):
    """rl-zoo3's ExperimentManager as train builds it (after registration: the package's subclass)."""
    import argparse

    import rl_zoo3.exp_manager

    from sb3_ppo_ext import zoo

    zoo.register()
    return rl_zoo3.exp_manager.ExperimentManager(argparse.Namespace(), algo, env_id, str(folder), **kwargs)


def test_rl_zoo3_binds_the_packages_one_subclass():
    """``rl_zoo3.exp_manager.ExperimentManager`` and the name train imported are our subclass of rl-zoo3's untouched class."""
    import rl_zoo3.exp_manager
    import rl_zoo3.train

    from sb3_ppo_ext import zoo, zoo_manager

    zoo.register()
    original = zoo_manager.UPSTREAM
    assert rl_zoo3.exp_manager.ExperimentManager is zoo_manager.PPOExtExperimentManager
    assert rl_zoo3.train.ExperimentManager is zoo_manager.PPOExtExperimentManager
    assert issubclass(rl_zoo3.train.ExperimentManager, original)
    assert zoo_manager.PPOExtExperimentManager.__bases__ == (original,)
    assert original.__module__ == "rl_zoo3.exp_manager" and original.__name__ == "ExperimentManager"
    # Nothing is patched onto rl-zoo3's class: every method there is rl-zoo3's own.
    assert zoo._PATCHED not in vars(original)
    for name in ("__init__", "read_hyperparameters", "_preprocess_hyperparams", "setup_experiment", "learn", "load_trial"):
        assert getattr(original, name).__module__ == "rl_zoo3.exp_manager", name
        assert getattr(original, name).__qualname__ == f"ExperimentManager.{name}", name


def test_registering_again_stacks_no_subclass():
    import rl_zoo3.exp_manager
    import rl_zoo3.utils

    from sb3_ppo_ext import zoo

    zoo.register()
    installed, store_dict, create_test_env = (
        rl_zoo3.exp_manager.ExperimentManager, rl_zoo3.utils.StoreDict, rl_zoo3.utils.create_test_env
    )  # fmt: skip
    zoo.register()
    zoo.on_zoo_module_imported("rl_zoo3.exp_manager", rl_zoo3.exp_manager)
    zoo.on_zoo_module_imported("rl_zoo3.utils", rl_zoo3.utils)
    assert rl_zoo3.exp_manager.ExperimentManager is installed and installed.__bases__[0].__module__ == "rl_zoo3.exp_manager"
    assert rl_zoo3.utils.StoreDict is store_dict and rl_zoo3.utils.create_test_env is create_test_env
    assert [c.__module__ for c in store_dict.__mro__[:3]] == ["sb3_ppo_ext.zoo", "sb3_ppo_ext.zoo", "rl_zoo3.utils"]
    assert vars(store_dict.__mro__[2])["__call__"].__module__ == "rl_zoo3.utils"  # rl-zoo3's class is untouched


def test_each_settings_entry_is_checked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """
    A run of ``--algo ppo_ext`` with ``-params``: the settings owner checks the yml entry once and the -params once
    (key by key), then the merged settings once as a whole.
    """
    from sb3_ppo_ext import settings

    calls: list[tuple[str, bool]] = []
    whole_checks: list[dict] = []
    entry_problems, whole_entry_problems = settings.entry_problems, settings.whole_entry_problems

    def spy_entry_problems(entry, algo="ppo_ext", whole=True):
        calls.append(("-params" if set(entry) == {"n_envs", "n_steps", "batch_size"} else "entry", whole))
        return entry_problems(entry, algo, whole)

    def spy_whole(entry, algo="ppo_ext"):
        whole_checks.append(dict(entry))
        return whole_entry_problems(entry, algo)

    manager = _manager(
        "ppo_ext", "Pendulum-v1", tmp_path, n_timesteps=64, eval_freq=-1, verbose=0, log_interval=-1,
        hyperparams={"n_envs": 1, "n_steps": 64, "batch_size": 32},
    )  # fmt: skip
    monkeypatch.setattr(settings, "entry_problems", spy_entry_problems)
    monkeypatch.setattr(settings, "whole_entry_problems", spy_whole)
    model, _ = manager.setup_experiment()
    monkeypatch.undo()
    assert calls == [("entry", False), ("-params", False)]  # then only the rules across keys, on the merge
    assert len(whole_checks) == 1 and whole_checks[0]["n_steps"] == 64 and whole_checks[0]["gamma"] == 0.9
    assert (model.n_steps, model.batch_size, model.gamma) == (64, 32, 0.9)
    manager.learn(model)
    assert model.num_timesteps == 64


def test_rl_zoo3_algorithms_get_rl_zoo3s_settings_and_envs(tmp_path: Path, capsys):
    """For ``--algo ppo`` the subclass's __init__, read_hyperparameters and create_envs give what rl-zoo3's class gives."""
    import argparse

    from sb3_ppo_ext import zoo_manager

    options = {"hyperparams": {"n_steps": 64}, "env_kwargs": {"render_mode": None}, "verbose": 0}
    ours = _manager("ppo", "CartPole-v1", tmp_path, **options)
    theirs = zoo_manager.UPSTREAM(argparse.Namespace(), "ppo", "CartPole-v1", str(tmp_path), **options)
    assert type(ours) is zoo_manager.PPOExtExperimentManager
    assert ours.config == theirs.config and Path(ours.config).parent.parent.name == "rl_zoo3"  # rl-zoo3's own ppo.yml
    capsys.readouterr()
    read = [manager.read_hyperparameters() for manager in (ours, theirs)]
    printed = capsys.readouterr().out
    assert read[0] == read[1] and printed.count("Loading hyperparameters from") == 2
    envs = [manager.create_envs(1, eval_env=True) for manager in (ours, theirs)]
    assert [type(env) for env in envs[0].envs] == [type(env) for env in envs[1].envs]
    assert type(envs[0]) is type(envs[1])


def test_unreachable_storage_fails_before_any_folder_for_ours(tmp_path: Path):
    """
    ``-optimize`` / ``--trial-id`` of ppo_ext on an unreachable database: a ZooConfigError, and no run folder; from
    ``setup_experiment`` (the command's first step) as the command's end with one ``error:`` line.
    """
    from sb3_ppo_ext import zoo_support

    url = f"sqlite:///{tmp_path / 'missing' / 'study.db'}"
    message = r"cannot open Optuna storage sqlite:///.*unable to open database file"
    manager = _manager("ppo_ext", "Pendulum-v1", tmp_path / "logs", optimize_hyperparameters=True, storage=url, study_name="s")
    with pytest.raises(SystemExit, match=f"^error: {message}") as exit_info:
        manager.setup_experiment()
    assert isinstance(exit_info.value.__cause__, zoo_support.ZooConfigError)
    for call in (manager.hyperparameters_optimization, lambda: manager.load_trial(url, "s", 1)):
        with pytest.raises(zoo_support.ZooConfigError, match=message):
            call()
    assert not (tmp_path / "logs").exists() and not (tmp_path / "missing").exists()


def test_policy_kwargs_of_a_policy_named_by_path_are_checked_once_rl_zoo3_imported_it(tmp_path: Path):
    """A dotted ``policy`` is a class only after rl-zoo3's preprocessing: its ``policy_kwargs`` are checked then."""
    import yaml
    from torch import nn

    from sb3_ppo_ext import zoo_support

    policy = "sb3_ppo_ext.policies.PPOExtActorCriticPolicy"
    conf = tmp_path / "conf.yml"
    entry = {"n_timesteps": 64, "policy": policy, "n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arc": [8]}}
    conf.write_text(yaml.safe_dump({"Pendulum-v1": entry}))
    manager = _manager("ppo_ext", "Pendulum-v1", tmp_path / "logs", config=str(conf), verbose=0)
    hyperparams, _ = manager.read_hyperparameters()  # the names of a class given by path are unknown here
    with pytest.raises(
        zoo_support.ZooConfigError, match=r"conf\.yml \(env Pendulum-v1\), policy_kwargs: unknown key 'net_arc'"
    ):
        manager._preprocess_hyperparams(hyperparams)
    entry["policy_kwargs"] = {"net_arch": [8], "activation_fn": "tanh"}
    conf.write_text(yaml.safe_dump({"Pendulum-v1": entry}))
    hyperparams, _ = _manager("ppo_ext", "Pendulum-v1", tmp_path / "logs", config=str(conf), verbose=0).read_hyperparameters()
    processed, *_ = manager._preprocess_hyperparams(hyperparams)
    assert processed["policy"].__name__ == "PPOExtActorCriticPolicy"
    assert processed["policy_kwargs"]["activation_fn"] is nn.Tanh


def test_optimize_of_ours_runs_rl_zoo3s_study_on_the_storage_with_heartbeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """
    ``-optimize --max-total-trials`` on a database URL: rl-zoo3 creates its study on the storage the manager opened
    (heartbeats recorded), its budget is counted by TrialBudgetCallback (before the study and after the trial), and
    rl-zoo3's names and the manager's ``storage`` are as before afterwards; optuna itself is never changed.
    """
    import sqlite3

    import optuna
    import rl_zoo3.exp_manager

    from sb3_ppo_ext import zoo_manager

    create_study, max_trials_callback = optuna.create_study, rl_zoo3.exp_manager.MaxTrialsCallback
    counted: list[tuple] = []
    count = zoo_manager.TrialBudgetCallback.count
    monkeypatch.setattr(
        zoo_manager.TrialBudgetCallback, "count", lambda self, study: counted.append(self.states) or count(self, study)
    )
    monkeypatch.setenv("SB3_PPO_EXT_HEARTBEAT_INTERVAL", "1")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    manager = _manager(
        "ppo_ext", "Pendulum-v1", tmp_path / "logs", optimize_hyperparameters=True, storage=url, study_name="s",
        n_trials=3, max_total_trials=1, n_timesteps=64, n_evaluations=1, n_eval_episodes=1, sampler="random",
        pruner="none", no_optim_plots=True, verbose=0, hyperparams={"n_envs": 1},
    )  # fmt: skip
    assert manager.setup_experiment() is None
    manager.hyperparameters_optimization()
    study = optuna.load_study(study_name="s", storage=url)
    assert [trial.state for trial in study.trials] == [optuna.trial.TrialState.COMPLETE]
    with sqlite3.connect(tmp_path / "study.db") as db:
        assert db.execute("SELECT COUNT(*) FROM trial_heartbeats").fetchone()[0] == 1
    assert len(counted) == 2 and all(optuna.trial.TrialState.RUNNING in states for states in counted)
    assert manager.storage == url and optuna.create_study is create_study
    assert rl_zoo3.exp_manager.MaxTrialsCallback is max_trials_callback


def test_opened_storage_is_a_public_rdb_storage_that_reads_as_its_url(tmp_path: Path):
    """What -optimize hands rl-zoo3 as ``--storage``: an ``RDBStorage`` (Optuna caches it itself) that rl-zoo3's string
    handling reads as the URL, with a password masked."""
    from types import SimpleNamespace

    import optuna

    from sb3_ppo_ext.zoo_manager import ZooStorage, check_storage

    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = check_storage(url)
    assert type(storage).__mro__[1] is optuna.storages.RDBStorage and storage.get_heartbeat_interval() > 0
    assert storage.endswith(".db") and not storage.endswith(".log") and str(storage) == url
    assert ZooStorage.__str__(SimpleNamespace(url="postgresql://user:se@cret@host/db")) == "postgresql://user:***@host/db"
    study = optuna.create_study(storage=storage, study_name="s")
    assert optuna.load_study(study_name="s", storage=url).study_name == study.study_name


def test_optimize_cpu_budget_scores_each_trial_at_its_training_cpu_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """
    An entry's ``optimize_cpu_budget``: each trial evaluates at equal shares of the budget of training CPU time (its
    evaluations not counted) and ends at the budget, long before rl-zoo3's step budget; the trial's value is the return
    of the evaluation at the budget. A bad budget is a settings error naming the key.
    """
    import optuna

    from sb3_ppo_ext import zoo_manager

    ended: list[zoo_manager.CPUBudgetTrialEvalCallback] = []
    end = zoo_manager.CPUBudgetTrialEvalCallback._on_training_end
    monkeypatch.setattr(
        zoo_manager.CPUBudgetTrialEvalCallback, "_on_training_end", lambda self: ended.append(self) or end(self)
    )
    url = f"sqlite:///{tmp_path / 'study.db'}"
    manager = _manager(
        "ppo_ext", "Pendulum-v1", tmp_path / "logs", optimize_hyperparameters=True, storage=url, study_name="s",
        n_trials=1, n_timesteps=10**7, n_evaluations=2, n_eval_episodes=1, sampler="random", pruner="none",
        no_optim_plots=True, verbose=0, hyperparams={"n_envs": 1, "optimize_cpu_budget": 0.5},
    )  # fmt: skip
    manager.setup_experiment()
    manager.hyperparameters_optimization()
    (trial,) = optuna.load_study(study_name="s", storage=url).trials
    (callback,) = ended
    assert trial.state == optuna.trial.TrialState.COMPLETE and sorted(trial.intermediate_values) == [1, 2]
    assert trial.value == trial.intermediate_values[2] == callback.last_mean_reward
    assert callback.training_cpu() >= 0.5 and callback.evaluation_cpu > 0 and callback.num_timesteps < 10**6

    bad = _manager("ppo_ext", "Pendulum-v1", tmp_path / "bad", hyperparams={"optimize_cpu_budget": -1})
    with pytest.raises(SystemExit, match=r"optimize_cpu_budget=-1 .*CPU-seconds > 0"):
        bad.setup_experiment()
    plain = _manager("ppo_ext", "Pendulum-v1", tmp_path / "plain", hyperparams={"optimize_cpu_budget": 300})
    with pytest.raises(SystemExit, match=r"optimize_cpu_budget=300 applies to -optimize trials only"):
        plain.setup_experiment()
    assert not (tmp_path / "plain").exists()
