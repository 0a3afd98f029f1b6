"""Build docs/BENCHMARKS.md and its figures from the CSVs of scripts/benchmark.py, one section per suite.

The report per suite and env: rliable's IQM with its 95 % CI, probability of improvement and performance
profiles (``benchmarks.stats``, where the statistics are described), mean ± std, steps to a threshold,
wall-clock and env-steps/s (within one machine), learning curves, and rliable's plots; then the throughput
table of ``scripts/throughput.py --json``, each suite's coverage and targets (met, missed or not measured
yet), and every run's segments, machines and commits.

Only finished runs (CSV and done marker) count; a suite without any is reported as not run yet. The
figures go to ``docs/benchmarks/figures/<suite>/``: ``<env>.png`` (learning curves), ``<env>-iqm.png``,
``<env>-profile.png`` and ``<env>-improvement.png``. Each suite's inputs are copied to its data folder
(``--keep-data``; ``docs/benchmarks/data`` for ``issue``, ``docs/benchmarks/data-1m`` for ``mujoco-1m``,
where ``scripts/benchmark.py --suite mujoco-1m --out docs/benchmarks/data-1m`` writes them in the first
place; ``docs/benchmarks/data-<suite>`` for the others, such as ``tuned-1m``, the validation of a tuned
entry), so the committed report can be rebuilt from the committed evidence:

    python scripts/benchmark_report.py --results issue=logs/benchmark --results mujoco-1m=docs/benchmarks/data-1m
    python scripts/benchmark_report.py --results issue=docs/benchmarks/data \\
        --results mujoco-1m=docs/benchmarks/data-1m --results tuned-1m=docs/benchmarks/data-tuned-1m \\
        --results masked=docs/benchmarks/data-masked --keep-data ""

(``--results FOLDER`` alone is the suite of ``--suite``, ``issue`` by default; the report's own
Reproduce section gives the full command, with the throughput files, notes and GPU note.)

This is the command line of the ``benchmarks`` package (``scripts/benchmarks/``): the statistics are
``benchmarks.stats``', the figures ``benchmarks.plots``', the sections ``benchmarks.sections``',
``benchmarks.targets``' and ``benchmarks.report``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.records import BadRunError, load_runs
from benchmarks.report import SuiteResults, build_report, keep_data
from benchmarks.suites import DATA_FOLDERS, SUITES

from sb3_ppo_ext.hyperparams import PPO_EXT_YML

GPU_NOTE = Path("docs/benchmarks/gpu/note.md")  # what scripts/gpu_check.py --device cuda found, written by hand


def _suite_and_folder(value: str, default_suite: str) -> tuple[str, str]:
    """``SUITE=FOLDER`` or a bare ``FOLDER`` (of ``default_suite``)."""
    suite, separator, folder = value.partition("=")
    if not separator:
        return default_suite, value
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} in {value!r} (suites: {', '.join(sorted(SUITES))})")
    return suite, folder


def parse_results(values: list[str] | None, default_suite: str) -> list[tuple[str, Path]]:
    """The ``--results`` values as (suite, folder) pairs, in the order given; one folder per suite."""
    pairs = [_suite_and_folder(value, default_suite) for value in values or ["logs/benchmark"]]
    suites = [suite for suite, _ in pairs]
    if len(set(suites)) != len(suites):
        raise ValueError(f"a suite is given more than one results folder: {', '.join(suites)}")
    return [(suite, Path(folder)) for suite, folder in pairs]


def parse_keep_data(values: list[str] | None, suites: list[str]) -> dict[str, Path]:
    """
    Where each suite's inputs are copied: by default its :data:`DATA_FOLDERS` entry; ``''`` copies
    nothing; a bare folder is only for a report of one suite; ``SUITE=FOLDER`` names the suite.
    """
    if values is None:
        return {suite: Path(DATA_FOLDERS.get(suite, f"docs/benchmarks/data-{suite}")) for suite in suites}
    folders: dict[str, Path] = {}
    for value in values:
        if not value:
            continue
        if "=" not in value:
            if len(suites) != 1:
                raise ValueError(f"--keep-data {value}: with several suites, give SUITE=FOLDER for each")
            folders[suites[0]] = Path(value)
            continue
        suite, folder = _suite_and_folder(value, "")
        folders[suite] = Path(folder)
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results",
        action="append",
        metavar="[SUITE=]FOLDER",
        help="folder of scripts/benchmark.py results, as SUITE=FOLDER (repeat it for several suites) or FOLDER "
        "alone for the suite of --suite (default: logs/benchmark)",
    )
    parser.add_argument("--out", default="docs/BENCHMARKS.md")
    parser.add_argument("--figures", default="docs/benchmarks/figures", help="folder for the PNGs (one folder per suite)")
    parser.add_argument(
        "--keep-data",
        action="append",
        metavar="[SUITE=]FOLDER",
        help="copy each suite's inputs here ('' to skip; FOLDER alone with one suite; default: "
        + ", ".join(f"{suite}: {folder}" for suite, folder in DATA_FOLDERS.items())
        + ", other suites docs/benchmarks/data-SUITE)",
    )
    parser.add_argument(
        "--throughput", nargs="+", default=[], help="JSON files written by scripts/throughput.py --json (one per measurement)"
    )
    parser.add_argument("--suite", choices=sorted(SUITES), default="issue", help="the suite of a --results FOLDER alone")
    parser.add_argument(
        "--gpu-note",
        default=str(GPU_NOTE),
        help=f"markdown file: what the GPU check found (default {GPU_NOTE}; missing or '': not run, no CUDA machine)",
    )
    parser.add_argument("--notes", help="markdown file with findings, included as they are")
    parser.add_argument("--yml", default=str(PPO_EXT_YML), help="the shipped ppo_ext.yml (its # Tuned entries are listed)")
    parser.add_argument(
        "--study",
        nargs=2,
        action="append",
        default=[],
        metavar=("STORAGE", "NAME"),
        help="an Optuna study (storage URL or journal file, study name) whose progress the tuning section lists",
    )
    parser.add_argument(
        "--no-figures",
        action="store_true",
        help="write the markdown only, without drawing the figures (it names them all the same)",
    )
    args = parser.parse_args(argv)
    try:
        sources = parse_results(args.results, args.suite)
        keep = parse_keep_data(args.keep_data, [suite for suite, _ in sources])
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    try:
        suites = [SuiteResults(suite, folder, load_runs(folder)) for suite, folder in sources]
    except BadRunError as error:
        print(f"{error}\nDelete the run's .done.json marker and rerun scripts/benchmark.py to redo it.", file=sys.stderr)
        return 1
    if not any(suite.runs for suite in suites):
        print(f"no finished runs under {', '.join(str(folder) for _, folder in sources)}", file=sys.stderr)
        return 1
    throughput = [json.loads(Path(path).read_text()) for path in args.throughput]
    notes = Path(args.notes).read_text() if args.notes else ""
    gpu_note = Path(args.gpu_note).read_text() if args.gpu_note and Path(args.gpu_note).is_file() else ""
    for suite in suites:
        if suite.name in keep:
            keep_data(suite.runs, keep[suite.name])
    summaries = build_report(
        suites,
        Path(args.out),
        Path(args.figures),
        throughput,
        gpu_note,
        notes,
        Path(args.yml) if args.yml else None,
        [tuple(study) for study in args.study],
        draw=not args.no_figures,
    )
    for suite, by_env in summaries.items():
        for env, env_summaries in by_env.items():
            for s in env_summaries:
                print(f"{suite} {env} {s.algo}: IQM {s.iqm:.1f} [{s.ci[0]:.1f}, {s.ci[1]:.1f}] over {len(s.seeds)} seeds")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
