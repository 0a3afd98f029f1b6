"""The documentation site builds with warnings as errors, and scripts/check_fast_tier.py judges coverage right."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
check_fast_tier = runpy.run_path(str(REPO_ROOT / "scripts" / "check_fast_tier.py"))


@pytest.mark.integration  # Sphinx in a subprocess: every page and the API reference of every module
def test_sphinx_build_without_warnings(tmp_path: Path):
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-d", str(tmp_path / "doctrees")]
    result = subprocess.run(
        [*command, "docs", str(tmp_path / "html")], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    html = tmp_path / "html"
    for page in ("index", "BENCHMARKS", "RELIABILITY", "guide/callbacks", "algorithms/ppo_ext", "api/sb3_ppo_ext.ppo_ext"):
        assert (html / f"{page}.html").is_file(), page
    # The API reference is generated from the docstrings: PPOExt's parameters are on its page.
    assert "kl_target" in (html / "api" / "sb3_ppo_ext.ppo_ext.html").read_text()
    assert (html / "_images" / "Pendulum-v1.png").is_file()  # the report's figures are copied
    # autosummary walks the package: every module gets its page (new ones without editing the site).
    modules = [module for _, module in check_fast_tier["package_sources"]() if module.split(".")[0] == "sb3_ppo_ext"]
    assert "sb3_ppo_ext.zoo" in modules
    for module in modules:
        if not module.endswith("__main__"):
            assert (html / "api" / f"{module}.html").is_file(), module
    # Each object once, on its defining module's page: the package page does not document PPOExt again.
    assert 'id="sb3_ppo_ext.PPOExt"' not in (html / "api" / "sb3_ppo_ext.html").read_text()
    assert 'id="sb3_ppo_ext.ppo_ext.PPOExt"' in (html / "api" / "sb3_ppo_ext.ppo_ext.html").read_text()
    assert "api/sb3_ppo_ext.ppo_ext.html#sb3_ppo_ext.ppo_ext.PPOExt" in (html / "api.html").read_text()  # landing page
    # Every "[docs]" link of the source pages (viewcode) lands on an anchor that exists.
    anchors: dict[Path, set[str]] = {}
    links = 0
    for page in (html / "_modules").rglob("*.html"):
        for href in re.findall(r'class="viewcode-back" href="([^"]+)"', page.read_text()):
            path, _, anchor = href.partition("#")
            target = (page.parent / path).resolve()
            if target not in anchors:
                anchors[target] = set(re.findall(r'id="([^"]+)"', target.read_text())) if target.is_file() else set()
            assert urllib.parse.unquote(anchor) in anchors[target], f"{page.relative_to(html)}: broken link {href}"
            links += 1
    assert links > 100  # the package's classes and functions


SOURCE = '''
def used(x):
    """Docstring."""
    return x


def unused(x):
    return x


class Thing:
    def __init__(self):
        self.x = 1

    def method(self):
        return 2

    def _private(self):
        return 3


class Error(ValueError):
    """No code of its own."""


def _helper():
    return 4
'''


def test_check_fast_tier_judges_bodies_not_def_lines(tmp_path: Path):
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    def_lines = {2, 7, 11, 12, 15, 18, 22, 26}  # what an import runs
    missing, without_code, judged = check_fast_tier["not_run"]({str(path.resolve()): def_lines}, [(path, "mod")])
    assert missing == ["mod.used", "mod.unused", "mod.Thing", "mod.Thing.__init__", "mod.Thing.method"]
    assert without_code == ["mod.Error"] and judged == 5
    ran = def_lines | {4, 13}  # used() and Thing() ran
    missing, _, _ = check_fast_tier["not_run"]({str(path.resolve()): ran}, [(path, "mod")])
    assert missing == ["mod.unused", "mod.Thing.method"]


def test_check_fast_tier_counts_an_installed_copy_of_a_repository_file():
    """CI installs the package (not editable): the startup hook runs from site-packages, and counts there."""
    hook = REPO_ROOT / "sb3_ppo_ext_zoo_hook.py"
    installed = "/venv/lib/python3.11/site-packages/sb3_ppo_ext_zoo_hook.py"
    none_ran, _, judged = check_fast_tier["not_run"]({}, [(hook, "sb3_ppo_ext_zoo_hook")])
    assert judged > 0 and len(none_ran) == judged
    all_lines = set(range(1, len(hook.read_text().splitlines()) + 1))
    missing, _, _ = check_fast_tier["not_run"]({installed: all_lines}, [(hook, "sb3_ppo_ext_zoo_hook")])
    assert missing == []


@pytest.mark.integration  # runs the whole fast tier again, under coverage, in a subprocess
def test_fast_tier_runs_every_public_function():
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "check_fast_tier.py"), "--workers", "2"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    report = result.stdout[-5000:]
    assert "public functions, classes and methods judged" in report, result.stderr[-3000:]
    assert result.returncode == 0, report
