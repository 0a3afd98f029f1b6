"""The report: docs/BENCHMARKS.md (and its figures) from each suite's finished runs, and the copy of its inputs.

``build_report`` writes the markdown and, unless told not to, the figures; the markdown does not
depend on the figures (it names their paths), so a report can be rebuilt without drawing them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from pathlib import Path
from typing import Any

from . import stats
from .entries import changed_settings
from .plots import plot_env, plot_improvements, plot_iqm, plot_profiles
from .records import Run, RunSpec, all_runs, git_output, machine_labels, marker_path_of, run_segments
from .sections import (
    budget_complete,
    coverage_section,
    earlier_settings_section,
    env_table,
    identical_to_stock,
    improvement_table,
    segments_section,
    setup_section,
    throughput_sections,
    tuning_section,
)
from .stats import Improvements, Summary, improvements, summarize
from .suites import (
    ALGOS,
    CANDIDATE,
    FAST_SUITES,
    GOAL_1M_SUITES,
    HEADS_SUITES,
    MASKED_SUITES,
    REPO,
    SUITE_CANDIDATES,
    SUITE_PAIRS,
    SUITES,
    THRESHOLDS,
    VALIDATION_SUITES,
)
from .targets import (
    fast_section,
    heads_section,
    masked_targets_section,
    speed_bars_section,
    targets_1m_section,
    targets_section,
    validation_section,
)


@dataclasses.dataclass
class SuiteResults:
    """The finished runs of one suite, read from one results folder."""

    name: str
    folder: Path
    runs: dict[str, dict[str, list[Run]]]

    @functools.cached_property
    def earlier(self) -> dict[tuple[str, str, int], list[str]]:
        """:func:`earlier_settings` of these runs, worked out once for the sections that read it."""
        return earlier_settings(self.name, self.runs)

    @property
    def uncounted(self) -> dict[tuple[str, str, int], list[str]]:
        """
        The runs that do not count toward a complete budget: the :attr:`earlier` ones, except in a validation
        suite, whose shipped-entry runs are by design the entry shipped when the candidate was judged.
        """
        return {} if self.name in VALIDATION_SUITES else self.earlier


def earlier_settings(suite: str, runs: dict[str, dict[str, list[Run]]]) -> dict[tuple[str, str, int], list[str]]:
    """
    The runs recorded with other settings than the ones ``scripts/benchmark.py`` would train them
    with now (a yml entry, a variant or the suite's candidate changed after they ran), by
    ``(env, algo, seed)``, with the settings that differ.
    """
    candidate = SUITE_CANDIDATES.get(suite)
    found: dict[tuple[str, str, int], list[str]] = {}
    for run in all_runs(runs):
        if run.algo not in ALGOS:
            continue
        budget = run.marker["budget"]
        spec = RunSpec(
            run.env,
            run.algo,
            run.seed,
            budget["steps"],
            budget["eval_freq"],
            budget["eval_episodes"],
            str(run.csv_path.parents[2]),
            candidate=str(REPO / candidate) if run.algo == CANDIDATE and candidate else None,
        )
        try:
            changed = changed_settings(spec, run.marker.get("hyperparams") or {})
        except ValueError:  # no candidate file to compare with
            continue
        if changed:
            found[run.env, run.algo, run.seed] = changed
    return found


def _machines_paragraph(labels: dict[str, str]) -> list[str]:
    if len(labels) == 1:
        return [f"Machine: {next(iter(labels))}.", ""]
    return [
        "Machines (column *machine* of the tables, and the segments of each run below): "
        + "; ".join(f"**{label}**: {name}" for name, label in labels.items())
        + ". Wall-clock and env-steps/s depend on the machine: the ratio to stock PPO is only given within one, "
        "and a run whose segments ran on different machines is left out of the timings.",
        "",
    ]


def _method_paragraph() -> str:
    return (
        "Every algorithm is trained through rl-zoo3's `ExperimentManager` with the same seeds and the same env-step "
        "budget, and evaluated deterministically on a separate env (VecNormalize statistics synced when `normalize` is "
        "on) at step 0, every `eval_freq` steps and after the last update. **Final return** is that last evaluation "
        "(SB3 finishes the last rollout, so the final step count can exceed the budget by up to one rollout; it is the "
        "same for all algorithms with the same `n_steps x n_envs`); it is each run's score. Across seeds: mean ± std "
        "(ddof 1); the rest is [rliable](https://github.com/google-research/rliable)'s, each env one task (scores of "
        "shape runs x 1): **IQM** = `rliable.metrics.aggregate_iqm`, the mean of the middle 50 % of the runs "
        "(`trim_mean(x, 0.25)`: with 3 seeds it trims nothing and equals the mean, with 5 it is the mean of the middle "
        "3, with 16 of the middle 8); **95 % CI** = rliable's stratified bootstrap (`library.get_interval_estimates`, "
        f"percentile, {stats.IQM_REPS} resamples of the runs); **probability of improvement** P(X > Y) of each PPOExt "
        "variant X over stock PPO and over TRPO (where it ran) = `metrics.probability_of_improvement`, the "
        "Mann-Whitney U statistic over n_X n_Y (the chance that a random run of X ends above a random run of Y, ties "
        "counting one half), with a 95 % CI from rliable's independent stratified bootstrap (each algorithm's runs "
        f"resampled with its own run count, so unequal seed counts are fine; {stats.IMPROVEMENT_REPS} resamples); "
        "**performance profile** = the fraction of runs whose final return is above τ, with 95 % CIs "
        f"(`library.create_performance_profile`, {stats.PROFILE_REPS} resamples). The figures beside each env's learning "
        "curves are rliable's `plot_utils` plots of these three. rliable draws its resamples from NumPy's global "
        "generator, which the report seeds (0) for each estimate, so the intervals are reproducible. "
        "**Learning curves**: mean across seeds with a 95 % percentile bootstrap band (`scipy.stats.bootstrap`, "
        f"{stats.N_RESAMPLES} resamples). **Steps to threshold**: per seed, the first evaluation at or above the threshold; "
        "the median over seeds, with seeds that never reach it counted as infinite "
        '("never" when half or more never do). **Wall-clock** is per run (setup, training, evaluations); '
        "**env-steps/s** counts training time only (evaluations excluded). Thresholds: "
        + ", ".join(f"{env} {value:g}" for env, value in THRESHOLDS.items())
        + " (Pendulum has no official threshold, -200 is a common choice; LunarLander's is its official one; "
        "Hopper's 1000 is about the alive bonus of a full 1000-step episode, which a policy reaches by staying up "
        'without moving forward (so it reads "stays up", not "hops"); HalfCheetah\'s is a provisional choice).'
    )


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def package_code_note(revisions: list[str], repo: Path = REPO) -> str:
    """
    Whether the runs' commits share the package's code: the git tree of ``sb3_ppo_ext/`` at each
    commit (a commit records the whole checkout, so later data-only commits still name the same code).

    :return: a sentence to append (leading space), or "" where git or a commit is not available
    """
    import subprocess

    trees = set()
    for revision in revisions:
        commit = revision.split("+")[0]
        if revision.endswith("+dirty"):
            return f" Commit {commit} had uncommitted changes in `sb3_ppo_ext/`."
        try:
            trees.add(git_output(repo, "rev-parse", "--short", f"{commit}:sb3_ppo_ext"))
        except (OSError, subprocess.SubprocessError):
            return ""
    if len(trees) == 1:
        return f" The package's code (`sb3_ppo_ext/`, git tree {trees.pop()}) is the same at all of them."
    return f" The package's code differs between them ({len(trees)} distinct `sb3_ppo_ext/` trees)."


def suite_section(
    suite: SuiteResults, out_md: Path, figures: Path, labels: dict[str, str], draw: bool = True
) -> tuple[list[str], dict[str, list[Summary]], dict[str, Improvements]]:
    """
    The suite's coverage and, per env, tables and figures; its summaries and probabilities of improvement by env.

    :param draw: draw the figures (else only name them: the markdown is the same)
    """
    summaries: dict[str, list[Summary]] = {}
    found: dict[str, Improvements] = {}
    identical = identical_to_stock(suite.runs)
    lines = [f"## Suite `{suite.name}`", ""]
    if suite.runs:
        segments = [segment for run in all_runs(suite.runs) for segment in run_segments(run.marker)]
        revisions = sorted({str(segment.revision) for segment in segments})
        marker = next(all_runs(suite.runs)).marker
        unrecorded = " (None: recorded before commits were)" if "None" in revisions else ""
        lines += [
            f"Results: `{suite.folder}`. One torch thread per run, device {marker['budget']['device']}; sb3_ppo_ext "
            f"commits of the runs: {', '.join(revisions)}{unrecorded}.{package_code_note(revisions)} "
            f"Evaluation: {marker['budget']['eval_episodes']} episodes.",
            "",
        ]
    lines += [f"### What was run (`{suite.name}`)", "", *coverage_section(suite), ""]
    earlier = earlier_settings_section(suite)
    lines += [*earlier, ""] if earlier else []
    title = f" ({suite.name})"
    for env, by_algo in suite.runs.items():
        threshold = THRESHOLDS.get(env)
        env_summaries = [summarize(algo, algo_runs, threshold) for algo, algo_runs in by_algo.items()]
        env_identical = frozenset(algo for identical_env, algo in identical if identical_env == env)
        summaries[env] = env_summaries
        found[env] = improvements(env_summaries, SUITE_PAIRS.get(suite.name, ()))
        folder = figures / suite.name
        curves = folder / f"{env}.png"
        iqm_png, profile_png = (folder / f"{env}-{kind}.png" for kind in ("iqm", "profile"))
        if draw:
            plot_env(env, by_algo, curves, threshold, title)
            plot_iqm(env, env_summaries, iqm_png, title)
            plot_profiles(env, env_summaries, profile_png, title)
        rliable_figures = [f"![{env} IQM, 95 % CIs ({suite.name})]({_relative(iqm_png, out_md.parent)})"]
        rliable_figures.append(f"![{env} performance profiles ({suite.name})]({_relative(profile_png, out_md.parent)})")
        if found[env]:
            improvement_png = folder / f"{env}-improvement.png"
            if draw:
                plot_improvements(env, found[env], improvement_png, title)
            rliable_figures.append(
                f"![{env} probability of improvement ({suite.name})]({_relative(improvement_png, out_md.parent)})"
            )
        budget = by_algo[next(iter(by_algo))][0].marker["budget"]
        lines += [
            f"### {env}, suite `{suite.name}`",
            "",
            f"Budget {budget['steps']} env steps, evaluation every {budget['eval_freq']} steps.",
            "",
            *env_table(env_summaries, threshold, by_algo, env_identical, labels if len(labels) > 1 else None),
            "",
            "Probability of improvement (final return):",
            "",
            *improvement_table(env_summaries, found[env]),
            "",
            f"![{env} learning curves ({suite.name})]({_relative(curves, out_md.parent)})",
            "",
            " ".join(rliable_figures),
            "",
        ]
    return lines, summaries, found


def _reproduce_section() -> list[str]:
    return [
        "## Reproduce",
        "",
        "```bash",
        'pip install -e ".[bench]"',
        "python scripts/benchmark.py --suite issue --workers $(nproc)   # resumable: finished runs are skipped",
        "# resumable in segments, on one machine or several (--stop-after MINUTES, --machine LABEL):",
        "python scripts/benchmark.py --suite mujoco-1m --out docs/benchmarks/data-1m --workers $(nproc)",
        "# a tuned entry on fresh seeds, beside the shipped one (the candidate: docs/benchmarks/study/candidates.yml):",
        "python scripts/benchmark.py --suite tuned-1m --out docs/benchmarks/data-tuned-1m --workers $(nproc)",
        "# masked tasks through the zoo (--algo ppo_mask_ext against stock PPO without masks):",
        "python scripts/benchmark.py --suite masked --out docs/benchmarks/data-masked --workers $(nproc)",
        "# the heads (clipped Gaussian, squashed Gaussian, Beta) at the shipped settings:",
        "python scripts/benchmark.py --suite heads --out docs/benchmarks/data-heads --workers $(nproc)",
        "# fast mode (policy_kwargs.fast: True) beside the shipped entry, 10 seeds on two tasks:",
        "python scripts/benchmark.py --suite fast --out docs/benchmarks/data-fast --workers $(nproc)",
        "python scripts/benchmark.py --suite fast-lstm --out docs/benchmarks/data-fast-lstm --workers $(nproc)",
        "# throughput with rl-zoo3's settings (issue 22's workloads), 9 paired repeats each:",
        "python scripts/throughput.py --workload cartpole --steps 8192 --repeats 9 \\",
        '    --variants "PPOExt, squash off" "PPOExt, squash on" --json docs/benchmarks/throughput-cartpole.json',
        "# likewise pendulum (--steps 8192), hopper, halfcheetah, mountaincar (4096) and lunarlander (16384)",
        "python scripts/throughput.py --workload masked --steps 8192 --repeats 9 \\",
        "    --json docs/benchmarks/throughput-maskable.json",
        "python scripts/throughput.py --workload recurrent --steps 4096 --repeats 9 \\",
        '    --variants "RecurrentPPOExt, squash off" "RecurrentPPOExt, fast" \\',
        "    --json docs/benchmarks/throughput-recurrent.json",
        'python scripts/throughput.py --workload hopper --steps 4096 --repeats 9 --variants "PPOExt, fast" \\',
        "    --json docs/benchmarks/throughput-hopper-fast.json   # likewise halfcheetah",
        "# the report (the GPU check's text: docs/benchmarks/gpu/note.md); copies the issue suite's inputs",
        "# to docs/benchmarks/data:",
        "python scripts/benchmark_report.py --results issue=logs/benchmark --results mujoco-1m=docs/benchmarks/data-1m \\",
        "    --results tuned-1m=docs/benchmarks/data-tuned-1m --results masked=docs/benchmarks/data-masked \\",
        "    --results heads=docs/benchmarks/data-heads --results fast=docs/benchmarks/data-fast \\",
        "    --results fast-lstm=docs/benchmarks/data-fast-lstm \\",
        "    --throughput docs/benchmarks/throughput*.json --notes docs/benchmarks/notes.md",
        "# or rebuild this report from the committed inputs alone:",
        "python scripts/benchmark_report.py --results issue=docs/benchmarks/data \\",
        "    --results mujoco-1m=docs/benchmarks/data-1m --results tuned-1m=docs/benchmarks/data-tuned-1m \\",
        "    --results masked=docs/benchmarks/data-masked --results heads=docs/benchmarks/data-heads \\",
        "    --results fast=docs/benchmarks/data-fast --results fast-lstm=docs/benchmarks/data-fast-lstm \\",
        "    --keep-data '' \\",
        "    --throughput docs/benchmarks/throughput*.json --notes docs/benchmarks/notes.md \\",
        "    --study sqlite:///docs/benchmarks/study/hopper-v5.db ppo_ext-hopper-500k",
        "```",
        "",
    ]


def build_report(
    suites: list[SuiteResults],
    out_md: Path,
    figures: Path,
    throughput: list[dict[str, Any]] | None = None,
    gpu_note: str = "",
    notes: str = "",
    yml: Path | None = None,
    studies: list[tuple[str, str]] = (),
    draw: bool = True,
) -> dict[str, dict[str, list[Summary]]]:
    """
    Write the markdown report and the PNGs; return the summaries by suite and env.

    :param studies: (storage, study name) of Optuna studies whose progress the tuning section lists
    :param draw: draw the figures; without them the markdown is the same (it names the figures' paths)
    """
    labels = machine_labels([suite.runs for suite in suites])
    lines = [
        "# Benchmarks: PPOExt against stock SB3 PPO and TRPO",
        "",
        "<!-- Generated by scripts/benchmark_report.py from the CSVs of scripts/benchmark.py: do not edit by hand. -->",
        "",
        _method_paragraph(),
        "",
        "Suites: "
        + "; ".join(
            f"`{suite.name}` ({sum(1 for _ in all_runs(suite.runs))} finished runs in `{suite.folder}`)"
            if suite.runs
            else f"`{suite.name}` (not run yet)"
            for suite in suites
        )
        + ". Each has its own sections: what was run, and per env the tables and figures (file names and headings "
        "name the suite).",
        "",
        *(_machines_paragraph(labels) if labels else []),
    ]
    summaries: dict[str, dict[str, list[Summary]]] = {}
    found: dict[str, dict[str, Improvements]] = {}
    for suite in suites:
        section, summaries[suite.name], found[suite.name] = suite_section(suite, out_md, figures, labels, draw)
        lines += section
    throughput_lines, ratios = throughput_sections(throughput)
    lines += [
        "## Throughput: each Ext algorithm ÷ its upstream algorithm, identical hyperparameters",
        "",
        *throughput_lines,
        "",
        "### Speed bars (issue 22)",
        "",
        *speed_bars_section(throughput or []),
        "",
        "## Targets",
        "",
    ]
    for suite in suites:
        complete = {b.env: budget_complete(b, suite.runs.get(b.env, {}), suite.uncounted) for b in SUITES[suite.name]}
        if suite.name in GOAL_1M_SUITES:
            table = targets_1m_section(suite.name, summaries[suite.name], found[suite.name], complete)
        elif suite.name in VALIDATION_SUITES:
            table = validation_section(suite.name, summaries[suite.name], found[suite.name], complete)
        elif suite.name in MASKED_SUITES:
            table = masked_targets_section(suite.name, summaries[suite.name], found[suite.name], complete)
        elif suite.name in HEADS_SUITES:
            table = heads_section(suite.name, summaries[suite.name], found[suite.name], complete)
        elif suite.name in FAST_SUITES:
            table = fast_section(suite, summaries[suite.name], found[suite.name], complete)
        else:
            table = targets_section(suite.name, summaries[suite.name], ratios, identical_to_stock(suite.runs))
        lines += [f"### Suite `{suite.name}`", "", *table, ""]
    if yml is not None:
        # The ppo_ext.yml entries of the suites that train PPOExt (ppo_mask_ext.yml states its entries' sources).
        ppo_ext_suites = [suite.name for suite in suites if suite.name not in (*MASKED_SUITES, *HEADS_SUITES, *FAST_SUITES)]
        lines += ["## Tuning", "", *tuning_section(ppo_ext_suites, yml, studies), ""]
    gpu_note = gpu_note.strip() or "Not run: no CUDA machine was available when this report was built."
    lines += ["## GPU check", "", gpu_note, ""]
    if notes:
        lines += ["## Findings", "", notes.strip(), ""]
    lines += ["## Runs, segments, machines and commits", ""]
    for suite in suites:
        lines += [*segments_section(suite, labels), ""]
    lines += ["## Settings of each run", ""]
    for suite in suites:
        if suite.runs:
            lines += [f"### Suite `{suite.name}`", "", *setup_section(suite.runs), ""]
    lines += _reproduce_section()
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines))
    return summaries


def keep_data(runs: dict[str, dict[str, list[Run]]], folder: Path) -> None:
    """Copy each run's CSV and done marker to ``folder/<env>/<algo>/`` (the report's committed evidence)."""
    for run in all_runs(runs):
        target = folder / run.env / run.algo
        target.mkdir(parents=True, exist_ok=True)
        marker = marker_path_of(run.csv_path)
        for source in (run.csv_path, marker):
            if source.resolve() != (target / source.name).resolve():
                shutil.copyfile(source, target / source.name)
