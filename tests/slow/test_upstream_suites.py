"""SB3's and sb3-contrib's own test suites, run whole against the Ext classes (scripts/upstream_tests.py)."""

from __future__ import annotations

import runpy

from helpers import SCRIPTS


# downloads both sdists and runs 25 upstream files whole: 671 tests, 19 minutes here with 1 worker
def test_upstream_suites_pass_with_the_ext_classes():
    upstream = runpy.run_path(str(SCRIPTS / "upstream_tests.py"))
    assert upstream["main"](["--workers", "2"]) == 0
