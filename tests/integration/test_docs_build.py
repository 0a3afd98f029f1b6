"""The documentation site builds with warnings as errors, and scripts/check_fast_tier.py judges coverage right."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import check_fast_tier  # scripts/check_fast_tier.py (scripts/ is on the tests' sys.path)
from helpers import REPO_ROOT


# Sphinx in a subprocess: every page and the API reference of every module
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
    modules = [module for _, module in check_fast_tier.package_sources() if module.split(".")[0] == "sb3_ppo_ext"]
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


# runs the whole fast tier again, under coverage, in a subprocess
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
