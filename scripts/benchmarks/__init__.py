"""The benchmarks of sb3_ppo_ext (not shipped in the wheel): suites, run records, runner, statistics, plots, report.

``scripts/benchmark.py`` (the runner's command line) and ``scripts/benchmark_report.py`` (the
report's) import this package from their own folder, ``scripts/``, which Python puts on ``sys.path``
when it runs them; the tests get it from pytest's ``pythonpath`` setting.

- :mod:`benchmarks.suites`: algorithms, suites and what they compare, as data
- :mod:`benchmarks.entries`: the settings a run trains with (yml entries, candidates, overrides)
- :mod:`benchmarks.records`: a run's files (CSV, done marker) and a suite's record file, written and read back
- :mod:`benchmarks.checkpoints`: a run's checkpoint, to resume it
- :mod:`benchmarks.runner`: one run under its lock, and the matrix of runs in worker processes
- :mod:`benchmarks.stats`: rliable's statistics, summaries, learning-curve bands
- :mod:`benchmarks.plots`: the figures
- :mod:`benchmarks.sections`: the report's tables
- :mod:`benchmarks.targets`: the comparisons each suite was run for
- :mod:`benchmarks.report`: docs/BENCHMARKS.md from the suites' runs
"""
