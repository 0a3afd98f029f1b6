"""Run SB3's and sb3-contrib's own test suites with the Ext classes in place of PPO, MaskablePPO and RecurrentPPO.

Downloads the source distributions of the installed ``stable-baselines3`` and ``sb3-contrib``
from PyPI (``pip download --no-binary :all: --no-deps``; nothing of theirs is kept in this
repository), writes a ``conftest.py`` into each ``tests/`` folder that replaces the upstream
class by its Ext class wherever the tests import it from (``stable_baselines3.PPO``,
``sb3_contrib.MaskablePPO``, ...), and runs, whole, every test file that names a replaced class
(SB3: ``PPO``; sb3-contrib: ``MaskablePPO`` or ``RecurrentPPO``), so the other algorithms' tests in
those files run too. The Ext classes run with their defaults (the squashed head on for Box actions,
as a user gets it).

    python scripts/upstream_tests.py                 # both suites, 2 pytest workers
    python scripts/upstream_tests.py --suite sb3-contrib --workers 1

Known differences, by design and not failures of the drop-in, are listed in ``EXPECTED_DIFFERENCES``
with their reasons: they are deselected and reported apart. Tests that need a package this project
does not install (``NEEDS_PACKAGE``: Atari's ``ale_py``, ``pygame`` for rendering) run when it is
importable and are left out, and reported, when it is not.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# suite -> (PyPI distribution, conftest text, pattern naming a replaced class in a test file)
SUITES = {
    "sb3": (
        "stable-baselines3",
        "import stable_baselines3\nimport stable_baselines3.ppo\nfrom sb3_ppo_ext import PPOExt\n\n"
        "stable_baselines3.PPO = PPOExt\nstable_baselines3.ppo.PPO = PPOExt\n",
        r"\bPPO\b",
    ),
    "sb3-contrib": (
        "sb3-contrib",
        "import sb3_contrib\nimport sb3_contrib.ppo_mask\nimport sb3_contrib.ppo_recurrent\n"
        "from sb3_ppo_ext import MaskablePPOExt, RecurrentPPOExt\n\n"
        "for module in (sb3_contrib, sb3_contrib.ppo_mask, sb3_contrib.ppo_recurrent):\n"
        "    module.MaskablePPO = MaskablePPOExt\n    module.RecurrentPPO = RecurrentPPOExt\n",
        r"\b(MaskablePPO|RecurrentPPO)\b",
    ),
}
# Upstream tests the Ext classes fail by design: test id -> the reason (each is deselected and reported apart).
EXPECTED_DIFFERENCES: dict[str, dict[str, str]] = {
    "sb3": {
        "tests/test_run.py::test_ppo_warnings": "expects the GPU warning to name `PPO`; it names the class, `PPOExt`",
        "tests/test_tensorboard.py::test_tensorboard[ppo]": (
            "expects the default TensorBoard run folder `PPO_1`; it is `PPOExt_1` (as MaskablePPO's is `MaskablePPO_1`)"
        ),
        "tests/test_sde.py::test_only_sde_squashed": (
            "expects `squash_output=True` without `use_sde` to be refused; PPOExt's squashed head is exactly that "
            "(on by default for Box actions)"
        ),
    },
    "sb3-contrib": {},
}
# Test files (whole) or tests (``file::name``) that need a package this project does not install: run when it is
# importable, left out (and reported) when it is not.
NEEDS_PACKAGE: dict[str, dict[str, str]] = {
    "sb3": {
        "tests/test_utils.py": "ale_py",  # Atari
        "tests/test_vec_envs.py::test_video_recorder": "pygame",  # renders CartPole-v1 (gymnasium[classic-control])
    },
    "sb3-contrib": {},
}


def missing_packages(suite: str) -> dict[str, str]:
    """The entries of ``NEEDS_PACKAGE[suite]`` whose package is not importable here: test or file -> package."""
    return {test: package for test, package in NEEDS_PACKAGE[suite].items() if importlib.util.find_spec(package) is None}


def unpack_sdist(distribution: str, folder: Path) -> Path:
    """Download and unpack the sdist of the installed version of ``distribution``; return its root."""
    version = importlib.metadata.version(distribution)
    command = [sys.executable, "-m", "pip", "download", f"{distribution}=={version}", "--no-binary", ":all:"]
    subprocess.run([*command, "--no-deps", "--quiet", "-d", str(folder)], check=True)
    archive = next(folder.glob("*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return next(path for path in folder.iterdir() if path.is_dir())


def selected_files(suite: str, root: Path) -> list[str]:
    """The test files of ``suite`` (relative to ``root``, sorted) that name a replaced class, less the ignored ones."""
    pattern = re.compile(SUITES[suite][2])
    files = sorted(path.relative_to(root).as_posix() for path in (root / "tests").glob("test_*.py"))
    return [name for name in files if name not in missing_packages(suite) and pattern.search((root / name).read_text())]


def pytest_command(suite: str, root: Path, workers: int) -> list[str]:
    """The pytest command that runs ``suite``'s files naming a replaced class, whole, the known differences deselected."""
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *selected_files(suite, root)]
    left_out = [test for test in missing_packages(suite) if "::" in test]
    command += [f"--deselect={test}" for test in [*EXPECTED_DIFFERENCES[suite], *left_out]]
    return [*command, "-n", str(workers)] if workers > 1 else command


def run_suite(suite: str, workers: int) -> int:
    """Download ``suite``, substitute the Ext classes, run its tests; return pytest's exit status."""
    distribution, conftest, _ = SUITES[suite]
    with tempfile.TemporaryDirectory(prefix="upstream_tests_") as folder:
        root = unpack_sdist(distribution, Path(folder))
        # The tests must import the installed package, not the sdist's copy next to them.
        package = root / distribution.replace("-", "_")
        if package.is_dir():
            os.rename(package, root / f"{package.name}_sdist")
        (root / "tests" / "conftest.py").write_text(conftest)
        command = pytest_command(suite, root, workers)
        print(f"{distribution} {importlib.metadata.version(distribution)}: {' '.join(command)}", flush=True)
        status = subprocess.run(command, cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1"})
        for test, reason in EXPECTED_DIFFERENCES[suite].items():
            print(f"deselected (intended difference): {test}: {reason}")
        for test, package in missing_packages(suite).items():
            print(f"left out (needs {package}, not installed): {test}")
        return status.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (1: no xdist)")
    args = parser.parse_args(argv)
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    statuses = {suite: run_suite(suite, args.workers) for suite in suites}
    for suite, status in statuses.items():
        print(f"{suite}: {'passed' if status == 0 else f'FAILED (pytest exit {status})'}")
    return max(statuses.values())


if __name__ == "__main__":
    sys.exit(main())
