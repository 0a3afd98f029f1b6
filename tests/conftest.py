"""Shared fixtures: a fresh virtual environment with the package installed as users install it, PostgreSQL,
and a spy on the surrogate loss's probability ratios.

``installed_venv`` builds ONE virtual environment per test session (shared by pytest-xdist
workers through a file lock): ``python -m venv``, ``pip install torch==2.13.0`` (the CPU build;
installed first so that no CUDA build is pulled), then ``pip install "<copy of the repo>[render,zoo,postgres]"``
— a regular, non-editable install from a copy of the working tree. pip's cache keeps repeat
builds fast. ``SB3_PPO_EXT_TEST_VENV=/path/to/venv`` reuses an existing environment instead
(for quick local iteration; CI always builds a fresh one).

``postgres_url`` is the URL in ``SB3_PPO_EXT_TEST_POSTGRES_URL`` (``scripts/start_postgres.sh``
prints one); without it the PostgreSQL tests are skipped, except in CI (``CI=true``), where a
missing server is a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import FAMILY, REPO_ROOT, Member

# The tiers by folder: every test under tests/integration/ is marked integration, under tests/slow/ slow
# (the default run deselects both, pyproject.toml's addopts); a tier marker anywhere else is an error.
TIER_FOLDERS = {"integration": REPO_ROOT / "tests" / "integration", "slow": REPO_ROOT / "tests" / "slow"}


@pytest.hookimpl(tryfirst=True)  # before -m selects by the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, folder in TIER_FOLDERS.items():
            if folder in Path(item.path).parents:
                item.add_marker(getattr(pytest.mark, marker))
            elif item.get_closest_marker(marker) is not None:
                raise pytest.UsageError(
                    f"{item.nodeid} is marked {marker}: move it to tests/{marker}/ (the tier is its folder)"
                )


@pytest.fixture
def rliable_stats() -> None:
    """The benchmark report's statistics are rliable's (in the test and bench extras): imported up front."""
    from benchmarks import stats  # scripts/benchmarks (scripts/ is on the tests' sys.path)

    stats.load_rliable()


@pytest.fixture(params=list(FAMILY))
def family(request: pytest.FixtureRequest) -> Member:
    """Each algorithm of the family in turn (``helpers.FAMILY``): for the behaviours every algorithm must share."""
    return FAMILY[request.param]


TORCH_REQUIREMENT = "torch==2.13.0"


@dataclasses.dataclass(frozen=True)
class Venv:
    """A virtual environment: its interpreter, scripts folder and site-packages."""

    root: Path
    python: Path
    bin: Path
    site_packages: Path

    @classmethod
    def at(cls, root: Path) -> Venv:
        python = root / "bin" / "python"
        site = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return cls(root=root, python=python, bin=root / "bin", site_packages=Path(site))

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a user who activated this venv (no PYTHONPATH, no hook switch)."""
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "SB3_PPO_EXT_NO_ZOO_HOOK", "VIRTUAL_ENV"}}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        env.update(extra)
        return env


def copy_repo(destination: Path) -> Path:
    """Copy the working tree's tracked and untracked-but-not-ignored files (what a clone plus local edits holds)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = REPO_ROOT / os.fsdecode(name)
        target = destination / os.fsdecode(name)
        if source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(source))
        elif source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def build_venv(root: Path, requirement_from_source: str, editable: bool = False) -> Venv:
    """``python -m venv root``, then torch (CPU), then the package from a copy of the repo."""
    source = copy_repo(root.parent / f"{root.name}-src")
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    subprocess.run([*pip, TORCH_REQUIREMENT], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = f"{source}{requirement_from_source}"
    result = subprocess.run([*pip, *(["-e"] if editable else []), target], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"pip install {target} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return Venv.at(root)


@pytest.fixture(scope="session")
def installed_venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv with ``pip install "<repo copy>[render,zoo,postgres]"`` (non-editable), one per session."""
    reuse = os.environ.get("SB3_PPO_EXT_TEST_VENV")
    if reuse:
        return Venv.at(Path(reuse))
    from filelock import FileLock  # installed with torch

    shared = tmp_path_factory.getbasetemp().parent  # the same folder for every xdist worker
    root, done = shared / "installed-venv", shared / "installed-venv.json"
    with FileLock(str(shared / "installed-venv.lock")):
        if not done.exists():
            build_venv(root, "[render,zoo,postgres]")
            done.write_text(json.dumps({"root": str(root)}))
    return Venv.at(Path(json.loads(done.read_text())["root"]))


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of a PostgreSQL database for Optuna (``SB3_PPO_EXT_TEST_POSTGRES_URL``)."""
    url = os.environ.get("SB3_PPO_EXT_TEST_POSTGRES_URL")
    if url:
        return url
    reason = "SB3_PPO_EXT_TEST_POSTGRES_URL is unset (export SB3_PPO_EXT_TEST_POSTGRES_URL=$(bash scripts/start_postgres.sh))"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI needs the PostgreSQL server: {reason}")
    pytest.skip(reason)


@pytest.fixture
def surrogate_ratios(monkeypatch: pytest.MonkeyPatch) -> list:
    """The ratios ``pi / pi_old`` of the valid samples of every minibatch, in order, as the surrogate loss sees them."""
    from sb3_ppo_ext import losses

    captured: list = []
    original = losses.clipped_surrogate_loss

    def spy(advantages, ratio, clip_range, valid=None):
        captured.append((ratio if valid is None else ratio[valid]).detach().clone())
        return original(advantages, ratio, clip_range, valid)

    monkeypatch.setattr(losses, "clipped_surrogate_loss", spy)
    return captured
