"""rl-zoo3 commands with ``--algo ppo_ext`` in a fresh virtual environment where the package is installed as users do it.

Every command runs in a subprocess, in a folder outside the repository, with the venv's own
interpreter and console scripts (see ``installed_venv`` in conftest.py: ``pip install .``, not
editable). Budgets are tiny: these tests check the plumbing, not learning.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import Venv, build_venv
from helpers import REPO_ROOT

# This module: one fresh venv per test run (conftest.py's installed_venv), rl-zoo3 in subprocesses.

# Small and fast: one env, 256-step rollouts, no periodic evaluation, one torch thread.
TINY = "-n 256 --eval-freq -1 --num-threads 1 --seed 0 -params n_envs:1 n_steps:256"
TIMEOUT = 300


def run(venv: Venv, command: str | list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """Run ``command`` (a shell-like string or a list; ``python`` / a console script resolve in the venv) in ``cwd``."""
    args = shlex.split(command) if isinstance(command, str) else command
    args = [str(venv.python) if args[0] == "python" else str(venv.bin / args[0]), *args[1:]]
    return subprocess.run(
        args, cwd=cwd, env=venv.env(OMP_NUM_THREADS="1", **env), capture_output=True, text=True, timeout=TIMEOUT
    )


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
    )
    return result


def run_folders(cwd: Path, env_id: str = "Pendulum-v1") -> list[str]:
    folder = cwd / "logs" / "ppo_ext"
    return sorted(p.name for p in folder.glob(f"{env_id}_*")) if folder.is_dir() else []


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A working folder outside the repository."""
    assert not tmp_path.resolve().is_relative_to(REPO_ROOT)
    return tmp_path


def test_installed_not_editable(installed_venv: Venv, workdir: Path):
    result = check(run(installed_venv, "python -c 'import sb3_ppo_ext; print(sb3_ppo_ext.__file__)'", workdir))
    assert Path(result.stdout.strip()).is_relative_to(installed_venv.site_packages)
    assert (installed_venv.site_packages / "sb3_ppo_ext_zoo_hook.pth").is_file()
    assert (installed_venv.site_packages / "sb3_ppo_ext" / "hyperparams" / "ppo_ext.yml").is_file()


def test_train_enjoy_continue_record_video(installed_venv: Venv, workdir: Path):
    """python -m rl_zoo3.train with a PPOExt -params override; enjoy loads it; -i continues it; record_video films it."""
    train = f"python -m rl_zoo3.train --algo ppo_ext --env Pendulum-v1 {TINY}"
    result = check(run(installed_venv, f"{train} kl_coef:1.0 kl_target:0.01", workdir))
    assert "ppo_ext.yml" in result.stdout  # the shipped default hyperparameter file
    assert run_folders(workdir) == ["Pendulum-v1_1"]
    run_dir = workdir / "logs" / "ppo_ext" / "Pendulum-v1_1"
    model = run_dir / "Pendulum-v1.zip"
    assert model.is_file()
    config = yaml.load((run_dir / "Pendulum-v1" / "config.yml").read_text(), Loader=yaml.UnsafeLoader)
    assert dict(config)["kl_target"] == 0.01

    enjoy = "python -m rl_zoo3.enjoy --algo ppo_ext --env Pendulum-v1 -f logs -n 210 --no-render"
    assert "Mean reward" in check(run(installed_venv, enjoy, workdir)).stdout

    check(run(installed_venv, f"{train} -i {model}", workdir))
    assert (workdir / "logs" / "ppo_ext" / "Pendulum-v1_2" / "Pendulum-v1.zip").is_file()

    if run(installed_venv, "python -c 'import pygame, moviepy'", workdir).returncode != 0:
        pytest.skip("no renderer (pygame / moviepy) in the venv for record_video")
    video = "python -m rl_zoo3.record_video --algo ppo_ext --env Pendulum-v1 -f logs --exp-id 1 -n 20 -o videos"
    check(run(installed_venv, video, workdir))
    assert list((workdir / "videos").glob("*.mp4"))


def test_console_script_conf_file_subproc(installed_venv: Venv, workdir: Path):
    """The `rl_zoo3 train` console script; --conf-file with a YAML policy_kwargs mapping; --vec-env subproc; discrete env."""
    conf = workdir / "my_ppo_ext.yml"
    entry = {
        "n_envs": 2,
        "n_timesteps": 256,
        "policy": "MlpPolicy",
        "n_steps": 64,
        "batch_size": 32,
        "clip_range": None,  # the KL-penalty-only objective
        "kl_coef": 0.5,
        "policy_kwargs": {"net_arch": [16], "activation_fn": "relu"},
    }
    conf.write_text(yaml.safe_dump({"CartPole-v1": entry}))
    command = (
        f"rl_zoo3 train --algo ppo_ext --env CartPole-v1 --conf-file {conf} --vec-env subproc --eval-freq -1 --num-threads 1"
    )
    result = check(run(installed_venv, command, workdir))
    assert str(conf) in result.stdout
    assert (workdir / "logs" / "ppo_ext" / "CartPole-v1_1" / "CartPole-v1.zip").is_file()


def test_optimize(installed_venv: Venv, workdir: Path):
    """-optimize with the ppo_ext sampler on a journal-file storage: report written, no empty run folder left."""
    command = (
        "python -m rl_zoo3.train --algo ppo_ext --env Pendulum-v1 -optimize -n 256 --n-trials 2 --n-startup-trials 1 "
        "--n-evaluations 1 --eval-episodes 1 --no-optim-plots --num-threads 1 --storage study.log --study-name zoo "
        "--seed 0 -params n_envs:1"
    )
    result = check(run(installed_venv, command, workdir))
    assert "objective:" in result.stdout and "User Attributes" in result.stdout
    assert list((workdir / "logs" / "ppo_ext").glob("report_Pendulum-v1_2-trials-*.csv"))
    assert run_folders(workdir) == []


@pytest.mark.parametrize("route", ["no-hook-env-var", "python-S"])
def test_route_without_startup_hook(installed_venv: Venv, workdir: Path, route: str):
    """python -m sb3_ppo_ext.zoo train ... works where the hook is off or .pth files are not read."""
    command = f"python -m sb3_ppo_ext.zoo train --algo ppo_ext --env Pendulum-v1 {TINY}"
    if route == "python-S":
        result = check(
            run(
                installed_venv,
                command.replace("python", "python -S", 1),
                workdir,
                PYTHONPATH=str(installed_venv.site_packages),
            )
        )
    else:
        result = check(run(installed_venv, command, workdir, SB3_PPO_EXT_NO_ZOO_HOOK="1"))
    assert "Saving to" in result.stdout
    # With the hook switched off, plain rl-zoo3 does not know ppo_ext.
    plain = run(installed_venv, "python -m rl_zoo3.train --algo ppo_ext", workdir, SB3_PPO_EXT_NO_ZOO_HOOK="1")
    assert plain.returncode == 2 and "invalid choice: 'ppo_ext'" in plain.stderr


BAD_INPUTS = {
    "unknown env id": ("--env Pendulm-v1", "Pendulm-v1 not found in gym registry, you maybe meant Pendulum-v1"),
    "no entry, no default": ("--env Pendulum-v1 --conf-file conf.yml", "Hyperparameters not found for ppo_ext-Pendulum-v1"),
    "malformed -params": ("--env Pendulum-v1 -params kl_target:0.0.1", "argument -params: cannot parse 'kl_target:0.0.1'"),
    "unknown yml parameter": (
        "--env CartPole-v1 --conf-file conf.yml",
        "conf.yml (entry 'CartPole-v1'): unknown key 'kl_targt' (did you mean 'kl_target'?)",
    ),
    "invalid PPOExt value": ("--env Pendulum-v1 -params kl_target:0.01", "kl_target=0.01 needs kl_coef > 0"),
    "unreachable storage": (
        "--env Pendulum-v1 -optimize --storage postgresql://user:pw@127.0.0.1:9/optuna --study-name s",
        "cannot open Optuna storage postgresql://user:***@127.0.0.1:9/optuna",
    ),
    "unreachable storage, --trial-id": (
        "--env Pendulum-v1 --storage postgresql://user:pw@127.0.0.1:9/optuna --study-name s --trial-id 1",
        "cannot open Optuna storage postgresql://user:***@127.0.0.1:9/optuna",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_clearly_and_leaves_nothing(installed_venv: Venv, workdir: Path, case: str):
    extra, message = BAD_INPUTS[case]
    (workdir / "conf.yml").write_text(
        yaml.safe_dump({"CartPole-v1": {"n_timesteps": 256, "policy": "MlpPolicy", "kl_targt": 0.01}})
    )
    result = run(installed_venv, f"python -m rl_zoo3.train --algo ppo_ext -n 256 --eval-freq -1 {extra}", workdir)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr[-3000:]
    # No run folder (enjoy would take it for the latest run), no study file.
    assert run_folders(workdir) == [] and run_folders(workdir, "CartPole-v1") == []
    assert not list(workdir.glob("*.log")) and not list(workdir.glob("*.db"))
    if case not in {"unknown env id", "no entry, no default"}:  # those two are rl-zoo3's own errors (tracebacks)
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if case == "invalid PPOExt value":  # checked before rl-zoo3 made a run folder: the next run is _1
        check(run(installed_venv, f"python -m rl_zoo3.train --algo ppo_ext --env Pendulum-v1 {TINY}", workdir))
        assert run_folders(workdir) == ["Pendulum-v1_1"]


BROKEN_CASES = {
    # The hook module itself cannot be imported.
    "hook raises": {"sb3_ppo_ext_zoo_hook.py": "raise ImportError('half uninstalled')\n"},
    "hook syntax error": {"sb3_ppo_ext_zoo_hook.py": "def (:\n"},
    # The hook is fine but the package is broken: nothing happens until rl_zoo3 is imported, and then rl-zoo3 still runs.
    "package raises": {"sb3_ppo_ext/__init__.py": "raise RuntimeError('broken')\n"},
}


@pytest.mark.parametrize("case", sorted(BROKEN_CASES))
def test_broken_install_is_silent(installed_venv: Venv, workdir: Path, case: str):
    """With the package's modules made unimportable (shadowed on PYTHONPATH), the interpreter starts silently."""
    shadow = workdir / "shadow"
    for name, text in BROKEN_CASES[case].items():
        (shadow / name).parent.mkdir(parents=True, exist_ok=True)
        (shadow / name).write_text(text)
    result = run(installed_venv, ["python", "-c", "print(1)"], workdir, PYTHONPATH=str(shadow))
    assert (result.returncode, result.stdout, result.stderr) == (0, "1\n", "")
    zoo = run(
        installed_venv,
        "python -c 'import rl_zoo3.train, rl_zoo3.utils as u; print(\"ppo_ext\" in u.ALGOS)'",
        workdir,
        PYTHONPATH=str(shadow),
    )
    assert (zoo.returncode, zoo.stdout) == (0, "False\n"), zoo.stderr[-2000:]


def test_hook_switch_and_startup_cost(installed_venv: Venv, workdir: Path):
    """SB3_PPO_EXT_NO_ZOO_HOOK=1 keeps the hook out; with it, `python -c pass` costs < 5 ms more than without the package."""
    probe = "import sys; print(any(type(f).__name__ == 'ZooImportHook' for f in sys.meta_path), 'sb3_ppo_ext' in sys.modules)"
    assert check(run(installed_venv, ["python", "-c", probe], workdir)).stdout == "True False\n"
    assert check(run(installed_venv, ["python", "-c", probe], workdir, SB3_PPO_EXT_NO_ZOO_HOOK="1")).stdout == "False False\n"
    result = run(
        installed_venv, f"python {REPO_ROOT / 'scripts' / 'measure_startup.py'} --python {installed_venv.python}", workdir
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr


CORE_ONLY = """
import importlib.util, sys
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.callbacks import KLAdaptiveLR, ParameterScheduler
absent = [name for name in ("rl_zoo3", "optuna", "sqlalchemy", "psycopg") if importlib.util.find_spec(name) is not None]
assert not absent, f"installed without an extra: {absent}"
# progress_bar=True: SB3's progress bar imports tqdm and rich, which the plain install brings.
PPOExt("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64).learn(64, KLAdaptiveLR(target_kl=0.01), progress_bar=True)
MaskablePPOExt("MlpPolicy", InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1), n_steps=32, batch_size=32).learn(32)
RecurrentPPOExt("MlpLstmPolicy", "CartPole-v1", n_steps=32, batch_size=32).learn(32)
print("core ok", sorted(name for name in sys.modules if name.split(".")[0] in ("rl_zoo3", "optuna")))
"""


def test_editable_install(tmp_path_factory: pytest.TempPathFactory):
    """
    pip install -e . ships the hook too (setup.py copies the .pth into the editable wheel). Without
    extras it installs the algorithms alone (SB3, sb3-contrib, torch, gymnasium), which train with the
    callbacks; the ``zoo`` extra then adds rl-zoo3 and Optuna, and ``--algo ppo_ext`` trains.
    """
    root = tmp_path_factory.mktemp("editable") / "venv"
    venv = build_venv(root, "", editable=True)
    workdir = tmp_path_factory.mktemp("editable-run")
    location = check(run(venv, "python -c 'import sb3_ppo_ext; print(sb3_ppo_ext.__file__)'", workdir)).stdout.strip()
    assert not Path(location).is_relative_to(venv.site_packages)  # served from the source tree
    assert (venv.site_packages / "sb3_ppo_ext_zoo_hook.pth").is_file()
    assert check(run(venv, ["python", "-c", CORE_ONLY], workdir)).stdout.strip().endswith("core ok []")
    extra = f"{root.parent / f'{root.name}-src'}[zoo]"
    check(run(venv, ["python", "-m", "pip", "install", "-q", "--disable-pip-version-check", "-e", extra], workdir))
    check(run(venv, f"python -m rl_zoo3.train --algo ppo_ext --env Pendulum-v1 {TINY}", workdir))
    assert run_folders(workdir) == ["Pendulum-v1_1"]
    # The editable install is a plain path entry (no setuptools import finder): start-up stays cheap.
    # (A source checkout has no .pyc of the hook until one run may write it.)
    check(run(venv, "python -c pass", workdir, PYTHONDONTWRITEBYTECODE=""))
    measure = f"python {REPO_ROOT / 'scripts' / 'measure_startup.py'} --python {venv.python}"
    result = run(venv, measure, workdir, PYTHONDONTWRITEBYTECODE="")
    assert result.returncode == 0, result.stdout + result.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_ppo_lstm_ext_train_enjoy_continue_optimize(installed_venv: Venv, workdir: Path):
    """--algo ppo_lstm_ext (RecurrentPPOExt) through rl-zoo3 with the shipped ppo_lstm_ext.yml: train, enjoy, -i, -optimize."""
    assert (installed_venv.site_packages / "sb3_ppo_ext" / "hyperparams" / "ppo_lstm_ext.yml").is_file()
    tiny = "-n 256 --num-threads 1 --seed 0 -params n_envs:1 n_steps:64"
    result = check(
        run(
            installed_venv,
            f"python -m rl_zoo3.train --algo ppo_lstm_ext --env PendulumNoVel-v1 {tiny} --eval-freq 128",
            workdir,
        )
    )
    assert "ppo_lstm_ext.yml" in result.stdout
    run_dir = workdir / "logs" / "ppo_lstm_ext" / "PendulumNoVel-v1_1"
    assert (run_dir / "PendulumNoVel-v1.zip").is_file() and (run_dir / "evaluations.npz").is_file()
    result = check(
        run(
            installed_venv,
            "python -m rl_zoo3.enjoy --algo ppo_lstm_ext --env PendulumNoVel-v1 -f logs -n 210 --no-render",
            workdir,
        )
    )
    assert "Mean reward" in result.stdout
    trained = run_dir / "PendulumNoVel-v1.zip"
    check(
        run(installed_venv, f"python -m rl_zoo3.train --algo ppo_lstm_ext --env PendulumNoVel-v1 {tiny} -i {trained}", workdir)
    )
    assert (workdir / "logs" / "ppo_lstm_ext" / "PendulumNoVel-v1_2" / "PendulumNoVel-v1.zip").is_file()
    command = (
        "python -m rl_zoo3.train --algo ppo_lstm_ext --env CartPoleNoVel-v1 -optimize -n 256 --n-trials 2 "
        "--n-startup-trials 1 "
        "--n-evaluations 1 --eval-episodes 1 --no-optim-plots --num-threads 1 --seed 0 -params n_envs:1"
    )
    result = check(run(installed_venv, command, workdir))
    assert "lstm_hidden_size" in result.stdout and "critic_memory" in result.stdout


def _console_script_commands(venv: Venv, workdir: Path) -> None:
    """`rl_zoo3 train` (a tiny CartPole run) and `rl_zoo3 plot_train --help` exit 0 with the venv's console script."""
    train = "rl_zoo3 train --algo ppo_ext --env CartPole-v1 -n 64 --eval-freq -1 --num-threads 1 -params n_envs:1 n_steps:64"
    check(run(venv, f"{train} batch_size:32", workdir))
    assert (workdir / "logs" / "ppo_ext" / "CartPole-v1_1" / "CartPole-v1.zip").is_file()
    assert "usage" in check(run(venv, "rl_zoo3 plot_train --help", workdir)).stdout


def test_console_script_with_the_test_extra(workdir: Path):
    """The venv running these tests has the `test` extra (rliable, hence arch): its `rl_zoo3` console script works.

    rl-zoo3's plotting imports rliable, whose arch 7 failed at import under pandas 3; the extra bounds pandas.
    """
    venv = Venv.at(Path(sys.prefix))
    assert (venv.bin / "rl_zoo3").is_file(), f"run the tests in the venv of the README's test command (no {venv.bin}/rl_zoo3)"
    assert run(venv, "python -c 'import rliable'", workdir).returncode == 0, "the test extra is not installed"
    _console_script_commands(venv, workdir)


def test_console_script_with_the_bench_extra(tmp_path_factory: pytest.TempPathFactory, workdir: Path):
    """A fresh venv with `pip install ".[bench]"` (rliable, Box2D, MuJoCo): its `rl_zoo3` console script works."""
    venv = build_venv(tmp_path_factory.mktemp("bench") / "venv", "[bench]")
    _console_script_commands(venv, workdir)


@pytest.mark.parametrize("extras", ["render,test", "render,bench"])
def test_one_pygame_distribution(tmp_path_factory: pytest.TempPathFactory, extras: str):
    """
    pip's resolver, in a fresh venv, installs one pygame distribution for ``.[render,test]`` and ``.[render,bench]``
    (pygame and pygame-ce both write ``pygame/``): a dry run with ``--report``, so nothing is downloaded but metadata.
    """
    from conftest import TORCH_REQUIREMENT, copy_repo

    root = tmp_path_factory.mktemp("pygame")
    source = copy_repo(root / "src")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    report = root / "report.json"
    pip = [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    result = subprocess.run(
        [*pip, "--dry-run", "--report", str(report), TORCH_REQUIREMENT, f"{source}[{extras}]"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    names = [item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]]
    assert [name for name in names if name.startswith("pygame")] == ["pygame-ce"], names


def test_masked_algorithm_on_taxi_train_enjoy_continue_optimize(installed_venv: Venv, workdir: Path):
    """--algo ppo_mask_ext on Taxi-v4 after `pip install .`: train, enjoy (both modes), -i and -optimize each exit 0."""
    tiny = "-n 256 --num-threads 1 --seed 0 -params n_envs:1 n_steps:128 batch_size:64"
    train = f"python -m rl_zoo3.train --algo ppo_mask_ext --env Taxi-v4 {tiny}"
    result = check(run(installed_venv, f"{train} --eval-freq 128 --eval-episodes 2", workdir))
    assert "ppo_mask_ext.yml" in result.stdout and "Eval num_timesteps=256" in result.stdout
    model = workdir / "logs" / "ppo_mask_ext" / "Taxi-v4_1" / "Taxi-v4.zip"
    assert model.is_file()
    for mode in ("", "--stochastic"):
        enjoy = f"python -m rl_zoo3.enjoy --algo ppo_mask_ext --env Taxi-v4 -f logs -n 250 --no-render {mode}"
        assert "Mean reward" in check(run(installed_venv, enjoy, workdir)).stdout
    check(run(installed_venv, f"{train} --eval-freq -1 -i {model}", workdir))
    optimize = f"{train} -optimize --n-trials 2 --n-evaluations 1 --eval-episodes 2 --storage study.log --study-name taxi"
    check(run(installed_venv, optimize, workdir))
    assert (workdir / "study.log").is_file()
