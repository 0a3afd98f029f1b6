"""The scripts that take minutes.

The torch.compile probe and SB3's and sb3-contrib's own test suites run against the Ext classes.
"""

import runpy

from helpers import SCRIPTS


# torch.compile builds C++ kernels: tens of seconds
def test_compile_probe_reports_compile_time_and_the_payback(capsys):
    probe = runpy.run_path(str(SCRIPTS / "compile_probe.py"))
    probe["main"](["--obs", "3", "--actions", "1", "--net", "8", "--batch", "8", "--steps", "20"])
    out = capsys.readouterr().out
    assert "network 3-8-8-1" in out and "compile time (first call, wall clock): " in out
    assert "ms per minibatch step, compiled: " in out
    assert "paid back after" in out or "never paid back" in out
