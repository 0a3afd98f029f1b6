"""Build docs/BENCHMARKS.md and its figures from the runs of scripts/benchmark.py, one section per suite.

The report per suite and env: rliable's IQM with its 95 % CI, probability of improvement and performance
profiles (``benchmarks.stats``, where the statistics are described), mean ± std, steps to a threshold,
wall-clock and env-steps/s (within one machine), learning curves, and rliable's plots; then the current
throughput measurements of ``scripts/throughput.py --json``, the comparisons the masked, heads, fast and
candidate suites were run for, the tuned entries, the GPU check and the notes.

Only finished runs (CSV and done marker) count; a suite without any is reported as not run yet. The
figures go to ``docs/benchmarks/figures/<suite>/``: ``<env>.png`` (learning curves), ``<env>-iqm.png``,
``<env>-profile.png`` and ``<env>-improvement.png``. Each suite's runs are kept in one record file,
``docs/benchmarks/records/<suite>.jsonl`` (``--keep-data``: one line per run, its done marker and its
evaluations), so the committed report is rebuilt from the committed records by one command:

    python scripts/benchmark_report.py                                     # the committed report, from the records
    python scripts/benchmark_report.py --results 300k=logs/benchmark/300k  # new runs of a suite (rewrites its record)

Without ``--results`` the report reads every suite's record, ``docs/benchmarks/throughput.jsonl``,
``docs/benchmarks/notes.md`` and the committed tuning study; with ``--results``, only what is given.

This is the command line of the ``benchmarks`` package (``scripts/benchmarks/``): the statistics are
``benchmarks.stats``', the figures ``benchmarks.plots``', the sections ``benchmarks.sections``',
``benchmarks.targets``' and ``benchmarks.report``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.records import BadRunError, load_runs, write_record
from benchmarks.report import SuiteResults, build_report
from benchmarks.suites import STUDIES, SUITES, record_path

from sb3_ppo_ext.hyperparams import PPO_EXT_YML

GPU_NOTE = Path("docs/benchmarks/gpu/note.md")  # what scripts/gpu_check.py --device cuda found, written by hand
THROUGHPUT = Path("docs/benchmarks/throughput.jsonl")  # scripts/throughput.py --json appends one measurement a line
NOTES = Path("docs/benchmarks/notes.md")


def _suite_and_folder(value: str, default_suite: str) -> tuple[str, str]:
    """``SUITE=FOLDER`` or a bare ``FOLDER`` (of ``default_suite``)."""
    suite, separator, folder = value.partition("=")
    if not separator:
        return default_suite, value
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} in {value!r} (suites: {', '.join(sorted(SUITES))})")
    return suite, folder


def parse_results(values: list[str] | None, default_suite: str) -> list[tuple[str, Path]]:
    """
    The ``--results`` values as (suite, folder or record) pairs, in the order given; one per suite. Without
    any: every suite's committed record that exists.
    """
    if values is None:
        return [(suite, record_path(suite)) for suite in SUITES if record_path(suite).is_file()]
    pairs = [_suite_and_folder(value, default_suite) for value in values]
    suites = [suite for suite, _ in pairs]
    if len(set(suites)) != len(suites):
        raise ValueError(f"a suite is given more than one results folder: {', '.join(suites)}")
    return [(suite, Path(folder)) for suite, folder in pairs]


def parse_keep_data(values: list[str] | None, suites: list[str]) -> dict[str, Path]:
    """
    Where each suite's runs are recorded: by default its :func:`record_path`; ``''`` records nothing; a bare
    file is only for a report of one suite; ``SUITE=FILE`` names the suite.
    """
    if values is None:
        return {suite: record_path(suite) for suite in suites}
    folders: dict[str, Path] = {}
    for value in values:
        if not value:
            continue
        if "=" not in value:
            if len(suites) != 1:
                raise ValueError(f"--keep-data {value}: with several suites, give SUITE=FILE for each")
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
        metavar="[SUITE=]PATH",
        help="a scripts/benchmark.py results folder or a suite's record file, as SUITE=PATH (repeat it for several "
        "suites) or PATH alone for the suite of --suite (default: every suite's record, docs/benchmarks/records/SUITE.jsonl, "
        "with the throughput record, the notes and the committed study)",
    )
    parser.add_argument("--out", default="docs/BENCHMARKS.md")
    parser.add_argument("--figures", default="docs/benchmarks/figures", help="folder for the PNGs (one folder per suite)")
    parser.add_argument(
        "--keep-data",
        action="append",
        metavar="[SUITE=]FILE",
        help="record each suite's runs in this JSON-lines file ('' to skip; FILE alone with one suite; default: "
        "docs/benchmarks/records/SUITE.jsonl)",
    )
    parser.add_argument(
        "--throughput",
        nargs="+",
        help=f"files of scripts/throughput.py --json, one measurement a line (default without --results: {THROUGHPUT})",
    )
    parser.add_argument("--suite", choices=sorted(SUITES), default="300k", help="the suite of a --results PATH alone")
    parser.add_argument(
        "--gpu-note",
        default=str(GPU_NOTE),
        help=f"markdown file: what the GPU check found (default {GPU_NOTE}; missing or '': not run, no CUDA machine)",
    )
    parser.add_argument(
        "--notes", help=f"markdown file with findings, included as they are (default without --results: {NOTES})"
    )
    parser.add_argument("--yml", default=str(PPO_EXT_YML), help="the shipped ppo_ext.yml (its # Tuned entries are listed)")
    parser.add_argument(
        "--study",
        nargs=2,
        action="append",
        metavar=("STORAGE", "NAME"),
        help="an Optuna study (storage URL or journal file, study name) whose progress the tuning section lists "
        f"(default without --results: {', '.join(' '.join(study) for study in STUDIES)})",
    )
    parser.add_argument(
        "--no-figures",
        action="store_true",
        help="write the markdown only, without drawing the figures (it names them all the same)",
    )
    args = parser.parse_args(argv)
    if args.results is None:  # the committed report
        args.throughput = [str(THROUGHPUT)] if args.throughput is None else args.throughput
        args.notes = str(NOTES) if args.notes is None else args.notes
        args.study = [list(study) for study in STUDIES] if args.study is None else args.study
    try:
        sources = parse_results(args.results, args.suite)
        keep = parse_keep_data(args.keep_data, [suite for suite, _ in sources])
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    try:
        suites = [SuiteResults(suite, folder, load_runs(folder)) for suite, folder in sources]
    except BadRunError as error:
        print(f"{error}\nDelete the run (its .done.json marker or record line) and rerun it.", file=sys.stderr)
        return 1
    if not any(suite.runs for suite in suites):
        print(f"no finished runs under {', '.join(str(folder) for _, folder in sources)}", file=sys.stderr)
        return 1
    throughput = [json.loads(line) for path in args.throughput or [] for line in Path(path).read_text().splitlines() if line]
    notes = Path(args.notes).read_text() if args.notes else ""
    gpu_note = Path(args.gpu_note).read_text() if args.gpu_note and Path(args.gpu_note).is_file() else ""
    for suite in suites:
        if suite.name in keep and suite.folder.resolve() != keep[suite.name].resolve():
            write_record(suite.runs, keep[suite.name])
    summaries = build_report(
        suites,
        Path(args.out),
        Path(args.figures),
        throughput,
        gpu_note,
        notes,
        Path(args.yml) if args.yml else None,
        [tuple(study) for study in args.study or []],
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
