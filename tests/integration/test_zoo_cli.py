"""rl-zoo3's command lines in subprocesses with this package's algorithms.

Settings errors, the beta rule with -i, the seams against rl-zoo3's own behaviour, the suite's callbacks from a yml.
"""

from __future__ import annotations

import functools
import io
import os
import re
import shlex
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import run_with_hook

from sb3_ppo_ext import PPOExt

ZOO_CASES = {
    "schedule": ("--env Pendulum-v1 --conf-file conf.yml", "conf.yml (entry 'Pendulum-v1'): learning_rate='abc' is invalid"),
    "not a mapping": ("--env CartPole-v1 --conf-file conf.yml", "conf.yml (entry 'CartPole-v1'): expected a mapping"),
    "-params typo": ("--env Pendulum-v1 -params n_epoch:2", "in -params: unknown key 'n_epoch' (did you mean 'n_epochs'?)"),
    "-params float int": ("--env Pendulum-v1 -params n_epochs:2.0", "in -params: n_epochs=2.0 is invalid: expected an int"),
    "-params zero": ("--env Pendulum-v1 -params n_envs:0", "in -params: n_envs=0 is invalid"),
    "-params string bool": (
        "--env Pendulum-v1 -params policy_kwargs:\"dict(squash_output='false')\"",
        "in -params: policy_kwargs.squash_output='false' is invalid",
    ),
    "unreachable storage": (
        "--env Pendulum-v1 -optimize --n-trials 1 --storage postgresql://nobody@127.0.0.1:1/x --study-name s",
        "cannot open Optuna storage postgresql://nobody@127.0.0.1:1/x",
    ),
}


@pytest.fixture(scope="module")
def hook_states(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, str]:
    """What rl-zoo3 looks like in each mode (so that the comparisons below compare something)."""
    probe = (
        "import rl_zoo3.exp_manager as m, rl_zoo3.utils as u; "
        "print('ppo_ext' in u.ALGOS, getattr(m.ExperimentManager, '_sb3_ppo_ext_patched', False))"
    )
    cwd = tmp_path_factory.mktemp("probe")
    return {hook: run_with_hook([sys.executable, "-c", probe], cwd, hook).stdout.strip() for hook in (True, False)}


@pytest.mark.parametrize("case", sorted(ZOO_CASES))
def test_zoo_route_reports_bad_settings_without_traceback_or_folder(tmp_path: Path, case: str):
    extra, message = ZOO_CASES[case]
    (tmp_path / "conf.yml").write_text(
        yaml.safe_dump({"Pendulum-v1": {"n_timesteps": 64, "policy": "MlpPolicy", "learning_rate": "abc"}, "CartPole-v1": 5})
    )
    result = _zoo(tmp_path, *shlex.split(extra))
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert not (tmp_path / "logs").exists(), sorted(str(p) for p in (tmp_path / "logs").rglob("*"))


def test_zoo_entry_without_n_timesteps_is_a_settings_error_unless_n_is_given(tmp_path: Path):
    """rl-zoo3 itself ends in KeyError: 'n_timesteps' (even with -n, when it deletes the key)."""
    (tmp_path / "conf.yml").write_text(
        yaml.safe_dump({"Pendulum-v1": {"policy": "MlpPolicy", "n_envs": 1, "n_steps": 32, "batch_size": 32, "n_epochs": 1}})
    )
    command = [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo_ext", "--env", "Pendulum-v1", "--eval-freq", "-1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = functools.partial(subprocess.run, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    result = run([*command, "--conf-file", "conf.yml"])
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: invalid ppo_ext hyperparameters in conf.yml (entry 'Pendulum-v1'): 'n_timesteps' is missing: "
        "give the entry a training budget (n_timesteps: 1.0e5) or pass -n"
    )
    assert not (tmp_path / "logs").exists()
    result = run([*command, "--conf-file", "conf.yml", "-n", "32"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "logs" / "ppo_ext" / "Pendulum-v1_1" / "Pendulum-v1.zip").is_file()


@pytest.mark.parametrize(
    "saved, params, beta",
    [
        ({}, "kl_coef:0.5", 0.5),  # the penalty switched on by -params
        (dict(kl_coef=1.0), "kl_coef:0.1", 0.1),  # a fixed beta is kl_coef
        (dict(kl_coef=1.0, kl_target=10.0), "kl_coef:1.0 kl_target:10.0", 0.25),  # adapted 0.5 carried on, halved again
        (dict(kl_coef=1.0, kl_target=10.0), "kl_coef:0.8 kl_target:10.0", 0.4),  # a new kl_coef restarts beta
    ],
)
def test_zoo_continue_with_i_uses_the_beta_rule(tmp_path: Path, saved: dict, params: str, beta: float):
    """rl-zoo3's -i passes every setting (kl_coef included) to load: the beta that trains follows the one beta rule."""
    from sb3_ppo_ext import PPOExt

    model = PPOExt("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, n_epochs=1, device="cpu", seed=0, **saved)
    if "kl_target" in saved:
        model.learn(32)
        assert model.current_kl_coef == 0.5
    model.save(tmp_path / "start.zip")
    entry = {"policy": "MlpPolicy", "n_timesteps": 32, "n_envs": 1, "n_steps": 32, "batch_size": 32}
    (tmp_path / "conf.yml").write_text(yaml.safe_dump({"Pendulum-v1": entry}))
    options = ["--env", "Pendulum-v1", "--conf-file", "conf.yml", "-n", "32", "-i", "start.zip", "-params", *params.split()]
    result = _zoo(tmp_path, *options)
    assert result.returncode == 0, result.stderr[-3000:]
    continued = PPOExt.load(tmp_path / "logs" / "ppo_ext" / "Pendulum-v1_1" / "Pendulum-v1.zip", device="cpu")
    assert continued.current_kl_coef == beta


# rl-zoo3 in subprocesses
def test_the_hook_switch_toggles_every_seam(hook_states: dict[bool, str]):
    assert hook_states == {True: "True True", False: "False False"}


# rl-zoo3 in subprocesses
def test_train_with_params_save_freq_and_continue_with_i(tmp_path: Path, hook_states: dict[bool, str]):
    """``-params``, ``--save-freq``, evaluations, then ``-i <checkpoint>``: identical with and without the package."""
    train = [*TRAIN, *CARTPOLE, "-n", "512", "--save-freq", "256", "--eval-freq", "256"]
    with_hook, without_hook, results = _both(tmp_path, train)
    assert results[True].returncode == results[False].returncode == 0, results[True].stderr[-3000:]
    assert _eval_lines(results[True].stdout) == _eval_lines(results[False].stdout) != []
    _assert_same_run(with_hook, without_hook)
    assert (with_hook / "logs/ppo/CartPole-v1_1/rl_model_256_steps.zip").is_file()

    resume = [*TRAIN, *CARTPOLE, "-n", "256", "--eval-freq", "128", "-i", "logs/ppo/CartPole-v1_1/rl_model_256_steps.zip"]
    results = {hook: run_with_hook(resume, folder, hook) for hook, folder in ((True, with_hook), (False, without_hook))}
    assert results[True].returncode == results[False].returncode == 0, results[True].stderr[-3000:]
    assert _eval_lines(results[True].stdout) == _eval_lines(results[False].stdout) != []
    _assert_same_run(with_hook, without_hook)
    assert (with_hook / "logs/ppo/CartPole-v1_2/CartPole-v1.zip").is_file()


# rl-zoo3 in subprocesses
def test_malformed_params_fail_as_in_rl_zoo3(tmp_path: Path, hook_states: dict[bool, str]):
    """For ``--algo ppo`` a malformed ``-params`` value is rl-zoo3's own error (our argparse message is for ours only)."""
    for order in (
        [*TRAIN, "-params", "n_steps:("],
        [sys.executable, "-m", "rl_zoo3.train", "-params", "n_steps:(", "--algo", "ppo"],
    ):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        results = {hook: run_with_hook(order, folder, hook) for hook in (True, False)}
        assert results[True].returncode == results[False].returncode == 1
        assert results[True].stderr.splitlines()[-1] == results[False].stderr.splitlines()[-1]
        assert "SyntaxError" in results[True].stderr and "cannot parse" not in results[True].stderr
    # ... and for ppo_ext it is an argparse error naming the value, wherever --algo stands.
    command = [sys.executable, "-m", "rl_zoo3.train", "-params", "n_steps:(", "--algo", "ppo_ext"]
    result = run_with_hook(command, tmp_path, hook=True)
    assert result.returncode == 2 and "cannot parse 'n_steps:('" in result.stderr


# rl-zoo3 in subprocesses
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


# rl-zoo3 in subprocesses
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
    replays = {hook: run_with_hook(enjoy, folder, hook) for hook, folder in ((True, with_hook), (False, without_hook))}
    assert replays[True].returncode == replays[False].returncode == 0, replays[True].stderr[-3000:]
    assert "Mean reward" in replays[True].stdout
    assert replays[True].stdout == replays[False].stdout


# a fresh interpreter with the startup hook
def test_the_hook_installs_the_subclass_before_train_binds_it(tmp_path: Path):
    probe = (
        "import rl_zoo3.train as t, rl_zoo3.exp_manager as m; from sb3_ppo_ext import zoo_manager as z; "
        "print(t.ExperimentManager is m.ExperimentManager is z.PPOExtExperimentManager, z.UPSTREAM.__module__, "
        "z.PPOExtExperimentManager.__bases__ == (z.UPSTREAM,))"
    )
    assert run_with_hook([sys.executable, "-c", probe], tmp_path, hook=True).stdout.strip() == "True rl_zoo3.exp_manager True"
    plain = "import rl_zoo3.train as t, sys; print(t.ExperimentManager.__module__, 'sb3_ppo_ext.zoo_manager' in sys.modules)"
    assert run_with_hook([sys.executable, "-c", plain], tmp_path, hook=False).stdout.strip() == "rl_zoo3.exp_manager False"


# rl-zoo3 in a subprocess
def test_zoo_yml_callbacks_are_used(tmp_path):
    command = zoo_train_command()
    conf = tmp_path / "ppo_ext.yml"
    conf.write_text(ZOO_YML)
    command += ["--algo", "ppo_ext", "--env", "Pendulum-v1", "--conf-file", str(conf), "-f", str(tmp_path / "logs")]
    command += ["--seed", "0", "--verbose", "1", "--eval-freq", "-1"]
    env = {key: value for key, value in os.environ.items() if key != "SB3_PPO_EXT_NO_ZOO_HOOK"}
    env["OMP_NUM_THREADS"] = "1"
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, check=False, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    changes = re.findall(r"KLAdaptiveLR: train/kl=\S+, learning rate \S+ -> (\S+)", output)
    assert len(changes) == 4, output[-3000:]  # one per update: every KL is above 2 x 1e-10
    # SB3's stdout table shows schedule/ent_coef as a "schedule/" section with an "ent_coef" row.
    assert "| schedule/" in output and re.search(r"\|\s+ent_coef\s+\|", output), output[-3000:]
    saved = list((tmp_path / "logs").rglob("Pendulum-v1.zip"))
    assert len(saved) == 1
    # The rate adapted after the last update is the one saved with the model.
    learning_rate = PPOExt.load(saved[0]).learning_rate
    assert learning_rate == pytest.approx(float(changes[-1]), rel=1e-2) and learning_rate < 3e-4


TRAIN = [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo", "--seed", "0", "--num-threads", "1", "-f", "logs"]


CARTPOLE = ["--env", "CartPole-v1", "--eval-episodes", "2", "-params", "n_envs:1", "n_steps:128", "batch_size:64"]


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


def _both(tmp_path: Path, command: list[str], prepare=None) -> tuple[Path, Path, dict[bool, subprocess.CompletedProcess]]:
    folders = {hook: tmp_path / ("with_hook" if hook else "without_hook") for hook in (True, False)}
    results = {}
    for hook, folder in folders.items():
        folder.mkdir()
        if prepare is not None:
            prepare(folder)
        results[hook] = run_with_hook(command, folder, hook)
    return folders[True], folders[False], results


def _zoo(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rl_zoo3.train", "--algo", "ppo_ext", "-n", "64", "--eval-freq", "-1", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


ZOO_YML = """
Pendulum-v1:
  n_timesteps: 128
  policy: MlpPolicy
  n_steps: 32
  batch_size: 32
  n_epochs: 1
  policy_kwargs: "dict(net_arch=[16])"
  callback:
    - sb3_ppo_ext.callbacks.KLAdaptiveLR: {target_kl: 1.0e-10, lr_factor: 2.0, verbose: 1}
    - sb3_ppo_ext.callbacks.ParameterScheduler:
        schedules:
          ent_coef: {kind: linear, start: 0.01, end: 0.0}
"""


def zoo_train_command():
    """
    ``python -m rl_zoo3.train`` where the startup hook that registers ``--algo ppo_ext`` is installed
    (any ``pip install`` of the package); else the package's no-hook route, which runs the same
    ``rl_zoo3.train`` module after registering (an editable install made before the hook existed
    lacks the ``.pth`` file).
    """
    if any(os.path.exists(os.path.join(folder, "sb3_ppo_ext_zoo_hook.pth")) for folder in site.getsitepackages()):
        return [sys.executable, "-m", "rl_zoo3.train"]
    return [sys.executable, "-m", "sb3_ppo_ext.zoo", "train"]


def _files(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


def _weights(model_zip: Path) -> dict:
    import torch

    with zipfile.ZipFile(model_zip) as archive:
        return torch.load(io.BytesIO(archive.read("policy.pth")), map_location="cpu", weights_only=True)
