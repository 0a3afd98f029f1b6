"""rl-zoo3's own algorithms behave exactly as without this package: every seam acts only for ours.

Each scenario runs ``python -m rl_zoo3.train --algo ppo`` twice in subprocesses, in two fresh
folders: once with the startup hook on (this package registered at every seam, as after
``pip install``) and once with ``SB3_PPO_EXT_NO_ZOO_HOOK=1`` (rl-zoo3 alone). Both runs must give
the same exit status, the same set of saved files, the same evaluations, the same monitor rows
and the same weights (same seed, one torch thread). The tests at the end check the same seams in
this process (fast tier).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

HOOK_SWITCH = "SB3_PPO_EXT_NO_ZOO_HOOK"
TRAIN = [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo", "--seed", "0", "--num-threads", "1", "-f", "logs"]
CARTPOLE = ["--env", "CartPole-v1", "--eval-episodes", "2", "-params", "n_envs:1", "n_steps:128", "batch_size:64"]


def _env(hook: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {HOOK_SWITCH, "PYTHONPATH"}}
    env["OMP_NUM_THREADS"] = "1"
    if not hook:
        env[HOOK_SWITCH] = "1"
    return env


def _run(command: list[str], cwd: Path, hook: bool) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=_env(hook), capture_output=True, text=True, timeout=600)


def _files(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def _weights(model_zip: Path) -> dict:
    import torch

    with zipfile.ZipFile(model_zip) as archive:
        return torch.load(io.BytesIO(archive.read("policy.pth")), map_location="cpu", weights_only=True)


def _eval_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("Eval num_timesteps", "Episode length"))]


def _assert_same_run(with_hook: Path, without_hook: Path) -> None:
    """Same files; same evaluations, monitor rows (wall-clock column aside) and weights in every model saved."""
    files = _files(with_hook / "logs")
    assert files == _files(without_hook / "logs")
    assert any(name.endswith(".zip") for name in files)
    for name in sorted(files):
        ours, theirs = with_hook / "logs" / name, without_hook / "logs" / name
        if name.endswith(".npz"):
            a, b = np.load(ours), np.load(theirs)
            assert set(a.files) == set(b.files)
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}: {key}")
        elif name.endswith(".zip"):
            a, b = _weights(ours), _weights(theirs)
            assert a.keys() == b.keys()
            for key in a:
                assert np.array_equal(a[key].numpy(), b[key].numpy()), f"{name}: {key}"
        elif name.endswith("monitor.csv"):
            rows = [[line.split(",")[:2] for line in path.read_text().splitlines()[2:]] for path in (ours, theirs)]
            assert rows[0] == rows[1], name
        elif name.endswith((".yml", ".txt")):
            assert ours.read_text() == theirs.read_text(), name


@pytest.fixture(scope="module")
def hook_states(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, str]:
    """What rl-zoo3 looks like in each mode (so that the comparisons below compare something)."""
    probe = (
        "import rl_zoo3.exp_manager as m, rl_zoo3.utils as u; "
        "print('ppo_ext' in u.ALGOS, getattr(m.ExperimentManager, '_sb3_ppo_ext_patched', False))"
    )
    cwd = tmp_path_factory.mktemp("probe")
    return {hook: _run([sys.executable, "-c", probe], cwd, hook).stdout.strip() for hook in (True, False)}


@pytest.mark.integration  # rl-zoo3 in subprocesses
def test_the_hook_switch_toggles_every_seam(hook_states: dict[bool, str]):
    assert hook_states == {True: "True True", False: "False False"}


def _both(tmp_path: Path, command: list[str], prepare=None) -> tuple[Path, Path, dict[bool, subprocess.CompletedProcess]]:
    folders = {hook: tmp_path / ("with_hook" if hook else "without_hook") for hook in (True, False)}
    results = {}
    for hook, folder in folders.items():
        folder.mkdir()
        if prepare is not None:
            prepare(folder)
        results[hook] = _run(command, folder, hook)
    return folders[True], folders[False], results


@pytest.mark.integration  # rl-zoo3 in subprocesses
def test_train_with_params_save_freq_and_continue_with_i(tmp_path: Path, hook_states: dict[bool, str]):
    """``-params``, ``--save-freq``, evaluations, then ``-i <checkpoint>``: identical with and without the package."""
    train = [*TRAIN, *CARTPOLE, "-n", "512", "--save-freq", "256", "--eval-freq", "256"]
    with_hook, without_hook, results = _both(tmp_path, train)
    assert results[True].returncode == results[False].returncode == 0, results[True].stderr[-3000:]
    assert _eval_lines(results[True].stdout) == _eval_lines(results[False].stdout) != []
    _assert_same_run(with_hook, without_hook)
    assert (with_hook / "logs/ppo/CartPole-v1_1/rl_model_256_steps.zip").is_file()

    resume = [*TRAIN, *CARTPOLE, "-n", "256", "--eval-freq", "128", "-i", "logs/ppo/CartPole-v1_1/rl_model_256_steps.zip"]
    results = {hook: _run(resume, folder, hook) for hook, folder in ((True, with_hook), (False, without_hook))}
    assert results[True].returncode == results[False].returncode == 0, results[True].stderr[-3000:]
    assert _eval_lines(results[True].stdout) == _eval_lines(results[False].stdout) != []
    _assert_same_run(with_hook, without_hook)
    assert (with_hook / "logs/ppo/CartPole-v1_2/CartPole-v1.zip").is_file()


@pytest.mark.integration  # rl-zoo3 in subprocesses
def test_malformed_params_fail_as_in_rl_zoo3(tmp_path: Path, hook_states: dict[bool, str]):
    """For ``--algo ppo`` a malformed ``-params`` value is rl-zoo3's own error (our argparse message is for ours only)."""
    for order in (
        [*TRAIN, "-params", "n_steps:("],
        [sys.executable, "-m", "rl_zoo3.train", "-params", "n_steps:(", "--algo", "ppo"],
    ):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        results = {hook: _run(order, folder, hook) for hook in (True, False)}
        assert results[True].returncode == results[False].returncode == 1
        assert results[True].stderr.splitlines()[-1] == results[False].stderr.splitlines()[-1]
        assert "SyntaxError" in results[True].stderr and "cannot parse" not in results[True].stderr
    # ... and for ppo_ext it is an argparse error naming the value, wherever --algo stands.
    command = [sys.executable, "-m", "rl_zoo3.train", "-params", "n_steps:(", "--algo", "ppo_ext"]
    result = _run(command, tmp_path, hook=True)
    assert result.returncode == 2 and "cannot parse 'n_steps:('" in result.stderr


@pytest.mark.integration  # rl-zoo3 in subprocesses
def test_optimize(tmp_path: Path, hook_states: dict[bool, str]):
    """``-optimize`` for two trials (rl-zoo3's own ppo sampler): the same trials, parameters and values."""
    command = [
        *TRAIN, "--env", "Pendulum-v1", "-optimize", "--n-trials", "2", "--n-jobs", "1", "-n", "512",
        "--sampler", "random", "--pruner", "none", "--n-evaluations", "1", "--eval-episodes", "1",
        "--no-optim-plots", "-params", "n_envs:1",
    ]  # fmt: skip
    with_hook, without_hook, results = _both(tmp_path, command)
    assert results[True].returncode == results[False].returncode == 0, results[True].stderr[-3000:]
    reports = {}
    for hook, folder in ((True, with_hook), (False, without_hook)):
        (report,) = (folder / "logs" / "ppo").glob("report_Pendulum-v1_2-trials-512-random-none_*.csv")
        frame = pd.read_csv(report)
        reports[hook] = frame.drop(columns=[c for c in frame.columns if c.startswith(("datetime", "duration"))])
    assert len(reports[True]) == 2
    pd.testing.assert_frame_equal(reports[True], reports[False])
    strip_time = {name.rsplit("_", 1)[0] for name in _files(with_hook / "logs")}
    assert strip_time == {name.rsplit("_", 1)[0] for name in _files(without_hook / "logs")}


@pytest.mark.integration  # rl-zoo3 in subprocesses
@pytest.mark.parametrize(("algo", "env_id"), [("ppo_lstm", "CartPoleNoVel-v1"), ("trpo", "CartPole-v1")])
def test_other_zoo_algorithms_train_and_enjoy_as_without_the_package(
    algo: str, env_id: str, tmp_path: Path, hook_states: dict[bool, str]
):
    """rl-zoo3's ``ppo_lstm`` and ``trpo``: train (with evaluations) and ``enjoy``, identical with and without the package."""
    train = [sys.executable, "-m", "rl_zoo3.train", "--algo", algo, "--seed", "0", "--num-threads", "1", "-f", "logs"]
    train += ["--env", env_id, "--eval-episodes", "2", "-n", "256", "--eval-freq", "128", "-params", "n_envs:1", "n_steps:128"]
    with_hook, without_hook, results = _both(tmp_path, train)
    assert results[True].returncode == results[False].returncode == 0, results[True].stderr[-3000:]
    assert _eval_lines(results[True].stdout) == _eval_lines(results[False].stdout) != []
    _assert_same_run(with_hook, without_hook)
    enjoy = [sys.executable, "-m", "rl_zoo3.enjoy", "--algo", algo, "--env", env_id, "-f", "logs", "-n", "300"]
    enjoy += ["--no-render", "--seed", "0"]
    replays = {hook: _run(enjoy, folder, hook) for hook, folder in ((True, with_hook), (False, without_hook))}
    assert replays[True].returncode == replays[False].returncode == 0, replays[True].stderr[-3000:]
    assert "Mean reward" in replays[True].stdout
    assert replays[True].stdout == replays[False].stdout


# --- the same seams in this process (fast tier) --------------------------------------------------


def test_our_algorithms_and_nothing_else():
    from sb3_ppo_ext import zoo

    assert "ppo_ext" in zoo.OUR_ALGOS and zoo.is_ours("ppo_ext")
    assert not any(zoo.is_ours(name) for name in ("ppo", "a2c", "sac", "ppo_lstm", "trpo", None))
    assert "kl_coef" in zoo.ppo_ext_parameters() and "env" not in zoo.ppo_ext_parameters()


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
    if zoo.is_ours(algo):
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


@pytest.fixture
def restored_modules():
    """Put the module dicts of rl_zoo3.exp_manager and sb3_ppo_ext.zoo_manager back after a test reloads them."""
    import rl_zoo3.exp_manager

    from sb3_ppo_ext import zoo_manager

    saved = {module: dict(vars(module)) for module in (rl_zoo3.exp_manager, zoo_manager)}
    yield
    for module, names in saved.items():
        vars(module).clear()
        vars(module).update(names)


def test_installing_again_or_after_a_reload_stacks_no_subclass(restored_modules):
    import importlib

    import rl_zoo3.exp_manager

    from sb3_ppo_ext import zoo, zoo_manager

    def ours_in_mro(manager_class: type) -> list[type]:
        return [c for c in manager_class.__mro__ if vars(c).get(zoo._PATCHED)]

    zoo.register()
    installed = rl_zoo3.exp_manager.ExperimentManager
    zoo.register()
    zoo.on_zoo_module_imported("rl_zoo3.exp_manager", rl_zoo3.exp_manager)
    assert rl_zoo3.exp_manager.ExperimentManager is installed and ours_in_mro(installed) == [installed]

    # rl_zoo3.exp_manager runs again: the hook (or register) subclasses its new class, once.
    importlib.reload(rl_zoo3.exp_manager)
    zoo.on_zoo_module_imported("rl_zoo3.exp_manager", rl_zoo3.exp_manager)
    reloaded = rl_zoo3.exp_manager.ExperimentManager
    assert reloaded is not installed and ours_in_mro(reloaded) == [reloaded]
    assert reloaded.__bases__ == (zoo_manager.UPSTREAM,) and zoo._PATCHED not in vars(zoo_manager.UPSTREAM)
    assert zoo_manager.UPSTREAM is not installed.__bases__[0]  # rl-zoo3's new class, not the old one

    # Reloading the subclass's module while it is installed derives from rl-zoo3's class again, not from ours.
    importlib.reload(zoo_manager)
    assert zoo_manager.PPOExtExperimentManager.__bases__ == (reloaded.__bases__[0],)


@pytest.mark.parametrize(
    ("env_id", "options"),
    [
        ("Pendulum-v1", {}),
        ("Pendulum-v1", {"hyperparams": {"n_steps": 64, "kl_coef": 0.5}, "env_kwargs": {"g": 9.0}}),
        ("Acrobot-v1", {"hyperparams": {"batch_size": 16}}),  # the 'default' entry
        ("CartPole-v1", {}),  # no entry, no default
    ],
)
def test_merge_of_the_entries_read_once_is_rl_zoo3s_read(env_id: str, options: dict, tmp_path: Path, capsys):
    """The subclass merges the entries it read as rl-zoo3's read_hyperparameters does: same settings, prints, errors."""
    import yaml

    from sb3_ppo_ext import settings, zoo_manager

    conf = tmp_path / "conf.yml"
    entries = {
        "Pendulum-v1": {"n_timesteps": 256, "policy": "MlpPolicy", "n_steps": 32, "env_kwargs": {"g": 10.0}},
        "default": {"n_timesteps": 128, "policy": "MlpPolicy", "batch_size": 8},
    }
    conf.write_text(yaml.safe_dump(entries if env_id != "CartPole-v1" else {"Pendulum-v1": entries["Pendulum-v1"]}))
    ours = _manager("ppo_ext", env_id, tmp_path, config=str(conf), **options)
    theirs = _manager("ppo_ext", env_id, tmp_path, config=str(conf), **options)
    capsys.readouterr()
    results = []
    merges = (
        lambda: ours._merge_settings(settings.read_entries(conf)),
        lambda: zoo_manager.UPSTREAM.read_hyperparameters(theirs),
    )
    for merge in merges:
        try:
            results.append((merge(), None))
        except ValueError as error:
            results.append((None, str(error)))
        results[-1] += (capsys.readouterr().out,)
    assert results[0] == results[1]
    assert ours.eval_env_kwargs == theirs.eval_env_kwargs
    if env_id == "CartPole-v1":
        assert "Hyperparameters not found for ppo_ext-CartPole-v1" in results[0][1]
    else:
        hyperparams, saved = results[0][0]
        assert list(saved) == sorted(hyperparams)
        params = options.get("hyperparams", {})
        assert {key: hyperparams[key] for key in params} == params  # -params win over the entry
        if "env_kwargs" in options:
            assert hyperparams["env_kwargs"] == ours.eval_env_kwargs == {"g": 9.0}


def test_each_settings_entry_is_read_and_checked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """
    A run of ``--algo ppo_ext`` with ``-params``: the yml file is opened once; the settings owner checks
    the yml entry once and the -params once (key by key), then the merged settings once as a whole.
    """
    import builtins

    from sb3_ppo_ext import settings

    calls: list[tuple[str, bool]] = []
    whole_checks: list[dict] = []
    opened: list[str] = []
    entry_problems, whole_entry_problems, open_file = settings.entry_problems, settings._whole_entry_problems, builtins.open

    def spy_entry_problems(entry, algo="ppo_ext", whole=True):
        calls.append(("-params" if set(entry) == {"n_envs", "n_steps", "batch_size"} else "entry", whole))
        return entry_problems(entry, algo, whole)

    def spy_whole(spec, parameters, entry):
        whole_checks.append(dict(entry))
        return whole_entry_problems(spec, parameters, entry)

    def spy_open(file, *args, **kwargs):
        if str(file).endswith(".yml") and "hyperparams" in str(file):
            opened.append(str(file))
        return open_file(file, *args, **kwargs)

    manager = _manager(
        "ppo_ext", "Pendulum-v1", tmp_path, n_timesteps=64, eval_freq=-1, verbose=0, log_interval=-1,
        hyperparams={"n_envs": 1, "n_steps": 64, "batch_size": 32},
    )  # fmt: skip
    monkeypatch.setattr(settings, "entry_problems", spy_entry_problems)
    monkeypatch.setattr(settings, "_whole_entry_problems", spy_whole)
    monkeypatch.setattr(builtins, "open", spy_open)
    model, _ = manager.setup_experiment()
    monkeypatch.undo()
    assert opened == [str(settings.PPO_EXT_YML)]
    assert calls == [("entry", False), ("-params", False), ("entry", True)]
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
    """``-optimize`` / ``--trial-id`` of ppo_ext on an unreachable database: a ZooConfigError, and no run folder."""
    from sb3_ppo_ext import zoo

    url = f"sqlite:///{tmp_path / 'missing' / 'study.db'}"
    manager = _manager("ppo_ext", "Pendulum-v1", tmp_path / "logs", optimize_hyperparameters=True, storage=url, study_name="s")
    for call in (manager.setup_experiment, manager.hyperparameters_optimization, lambda: manager.load_trial(url, "s", 1)):
        with pytest.raises(zoo.ZooConfigError, match=r"cannot open Optuna storage sqlite:///.*unable to open database file"):
            call()
    assert not (tmp_path / "logs").exists() and not (tmp_path / "missing").exists()


@pytest.mark.integration  # a fresh interpreter with the startup hook
def test_the_hook_installs_the_subclass_before_train_binds_it(tmp_path: Path):
    probe = (
        "import rl_zoo3.train as t, rl_zoo3.exp_manager as m; from sb3_ppo_ext import zoo_manager as z; "
        "print(t.ExperimentManager is m.ExperimentManager is z.PPOExtExperimentManager, z.UPSTREAM.__module__, "
        "z.PPOExtExperimentManager.__bases__ == (z.UPSTREAM,))"
    )
    assert _run([sys.executable, "-c", probe], tmp_path, hook=True).stdout.strip() == "True rl_zoo3.exp_manager True"
    plain = "import rl_zoo3.train as t, sys; print(t.ExperimentManager.__module__, 'sb3_ppo_ext.zoo_manager' in sys.modules)"
    assert _run([sys.executable, "-c", plain], tmp_path, hook=False).stdout.strip() == "rl_zoo3.exp_manager False"


def test_policy_kwargs_of_a_policy_named_by_path_are_checked_once_rl_zoo3_imported_it(tmp_path: Path):
    """A dotted ``policy`` is a class only after rl-zoo3's preprocessing: its ``policy_kwargs`` are checked then."""
    import yaml
    from torch import nn

    from sb3_ppo_ext import zoo

    policy = "sb3_ppo_ext.policies.PPOExtActorCriticPolicy"
    conf = tmp_path / "conf.yml"
    entry = {"n_timesteps": 64, "policy": policy, "n_steps": 64, "batch_size": 32, "policy_kwargs": {"net_arc": [8]}}
    conf.write_text(yaml.safe_dump({"Pendulum-v1": entry}))
    manager = _manager("ppo_ext", "Pendulum-v1", tmp_path / "logs", config=str(conf), verbose=0)
    hyperparams, _ = manager.read_hyperparameters()  # the names of a class given by path are unknown here
    with pytest.raises(zoo.ZooConfigError, match=r"conf\.yml \(env Pendulum-v1\), policy_kwargs: unknown key 'net_arc'"):
        manager._preprocess_hyperparams(hyperparams)
    entry["policy_kwargs"] = {"net_arch": [8], "activation_fn": "tanh"}
    conf.write_text(yaml.safe_dump({"Pendulum-v1": entry}))
    hyperparams, _ = _manager("ppo_ext", "Pendulum-v1", tmp_path / "logs", config=str(conf), verbose=0).read_hyperparameters()
    processed, *_ = manager._preprocess_hyperparams(hyperparams)
    assert processed["policy"].__name__ == "PPOExtActorCriticPolicy"
    assert processed["policy_kwargs"]["activation_fn"] is nn.Tanh
