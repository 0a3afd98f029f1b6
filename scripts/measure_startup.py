"""Measure what the rl-zoo3 startup hook costs at interpreter start.

Compares ``python -c pass`` (N runs each, interleaved) of an interpreter whose
environment has sb3-ppo-ext installed with that of a virtual environment without the package
(by default a fresh, empty one created from the same base Python), and checks that the hook
imported nothing heavy at start. The verdict uses the mean CPU time of the children (user +
system, from ``os.wait4``): unlike wall time, it does not grow while a child waits for a busy CPU,
so the check holds on a loaded machine. The kernel accounts CPU time in scheduler ticks (a few
ms), so one run's figure is coarse; the mean over many runs is not. Wall-clock medians are
printed beside it.

Usage::

    python scripts/measure_startup.py [--python PATH] [--baseline PATH] [--runs 40] [--max-delta-ms 5]

Exit status 1 if the mean CPU-time difference exceeds ``--max-delta-ms`` or a heavy module was imported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

# Modules that must not be imported by the hook at interpreter start.
HEAVY = ("sb3_ppo_ext", "rl_zoo3", "optuna", "torch", "stable_baselines3", "gymnasium", "numpy", "importlib.util")


def _time_once(python: str, env: dict[str, str]) -> tuple[float, float]:
    """``(wall seconds, CPU seconds)`` of one ``python -c pass``."""
    start = time.perf_counter()
    child = subprocess.Popen([python, "-c", "pass"], env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if child.returncode != 0:
        raise subprocess.CalledProcessError(child.returncode, child.args)
    return wall, usage.ru_utime + usage.ru_stime


def measure(python: str, baseline: str, runs: int) -> dict[str, tuple[float, float]]:
    """
    ``python -c pass`` for ``python`` and ``baseline`` (runs interleaved), in seconds.

    :return: ``{"cpu": (mean with, mean without), "wall": (median with, median without)}``
    """
    env = {key: value for key, value in os.environ.items() if key not in {"SB3_PPO_EXT_NO_ZOO_HOOK", "PYTHONPATH"}}
    for _ in range(3):  # warm the file cache and the .pyc files
        _time_once(python, env)
        _time_once(baseline, env)
    with_package, without_package = [], []
    for _ in range(runs):
        with_package.append(_time_once(python, env))
        without_package.append(_time_once(baseline, env))
    return {
        kind: (statistic(sample[index] for sample in with_package), statistic(sample[index] for sample in without_package))
        for index, kind, statistic in ((0, "wall", statistics.median), (1, "cpu", statistics.fmean))
    }


def heavy_modules_at_start(python: str) -> list[str]:
    """Heavy modules present in ``sys.modules`` right after start, and whether the hook is installed."""
    code = (
        f"import sys; heavy = {HEAVY!r}; "
        "print(','.join(m for m in heavy if m in sys.modules)); "
        "print(any(type(f).__name__ == 'ZooImportHook' for f in sys.meta_path))"
    )
    out = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True).stdout.splitlines()
    loaded = [name for name in out[0].split(",") if name]
    if out[1] != "True":
        loaded.append("(hook not installed: is sb3-ppo-ext installed in this environment?)")
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter of the environment with the package")
    parser.add_argument("--baseline", default=None, help="interpreter of an environment without it (default: new empty venv)")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--max-delta-ms", type=float, default=5.0)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        baseline = args.baseline
        if baseline is None:
            base_python = subprocess.run(
                [args.python, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            subprocess.run([base_python, "-m", "venv", "--without-pip", os.path.join(tmp, "empty")], check=True)
            baseline = os.path.join(tmp, "empty", "bin", "python")
        timings = measure(args.python, baseline, args.runs)
    with_package, without_package = timings["cpu"]
    delta_ms = (with_package - without_package) * 1000
    heavy = heavy_modules_at_start(args.python)
    wall_with, wall_without = timings["wall"]
    wall_delta_ms = (wall_with - wall_without) * 1000
    print(
        f"python -c pass, mean CPU time of {args.runs} runs: {with_package * 1000:.1f} ms with sb3-ppo-ext, "
        f"{without_package * 1000:.1f} ms without; delta {delta_ms:+.1f} ms (limit {args.max_delta_ms:.1f} ms); "
        f"median wall clock {wall_with * 1000:.1f} ms vs {wall_without * 1000:.1f} ms ({wall_delta_ms:+.1f} ms)"
    )
    print(f"heavy modules imported at start: {', '.join(heavy) if heavy else 'none'}")
    return 0 if delta_ms <= args.max_delta_ms and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
