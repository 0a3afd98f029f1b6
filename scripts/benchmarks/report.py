"""The report: docs/BENCHMARKS.md (and its figures) from each suite's finished runs, and the copy of its inputs.

``build_report`` writes the markdown and, unless told not to, the figures; the markdown does not
depend on the figures (it names their paths), so a report can be rebuilt without drawing them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

from . import stats
from .entries import changed_settings
from .plots import plot_env, plot_improvements, plot_iqm, plot_profiles
from .records import Run, RunSpec, all_runs, git_output, machine_labels, run_segments
from .sections import (
    budget_complete,
    coverage_section,
    earlier_settings_section,
    env_table,
    identical_to_stock,
    improvement_table,
    throughput_table,
    tuning_section,
)
from .stats import Improvements, Summary, improvements, summarize
from .suites import (
    ALGOS,
    CANDIDATE,
    FAST_SUITES,
    HEADS_SUITES,
    MASKED_SUITES,
    REPO,
    SUITE_CANDIDATES,
    SUITE_PAIRS,
    SUITES,
    THRESHOLDS,
    VALIDATION_SUITES,
)
from .targets import fast_section, heads_section, masked_section, validation_section
from .time_to_score import TIME_SUITES, merged_runs, time_to_score_section


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
            "",  # a spec's folder plays no part in its settings
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
        "Machines (column *machine* of the tables): "
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
            f"Evaluation: {marker['budget']['eval_episodes']} episodes. Each run's settings (entry, overrides, "
            "hyperparameters) and segments (steps, machine, commit, times) are in its line of the record.",
            "",
        ]
    lines += [*coverage_section(suite), ""]
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
            f"Budget {budget['steps']} env steps, evaluation every {budget['eval_freq']} steps; then the probability of "
            "improvement of the final returns.",
            "",
            *env_table(env_summaries, threshold, by_algo, env_identical, labels if len(labels) > 1 else None),
            "",
            *improvement_table(env_summaries, found[env]),
            "",
            " ".join([f"![{env} learning curves ({suite.name})]({_relative(curves, out_md.parent)})", *rliable_figures]),
            "",
        ]
    return lines, summaries, found


def _reproduce_section() -> list[str]:
    return [
        "## Reproduce",
        "",
        "```bash",
        'pip install -e ".[bench]"',
        "# each suite into logs/benchmark/SUITE (resumable: finished runs are skipped; --stop-after MINUTES and",
        "# --machine LABEL cut a run into segments, on one machine or several):",
        "python scripts/benchmark.py --suite 300k --out logs/benchmark/300k --workers $(nproc)",
        "# likewise mujoco-1m, tuned-1m (the candidate: docs/benchmarks/study/candidates.yml), masked, heads, fast, fast-lstm",
        "# throughput with rl-zoo3's settings, appended to the record (the report shows the newest of each):",
        "python scripts/throughput.py --workload hopper --steps 4096 --repeats 15 \\",
        '    --variants "PPOExt, squash off" "PPOExt, squash on" "PPOExt, fast" --json docs/benchmarks/throughput.jsonl',
        "# the report from new runs of a suite (their records replace the suite's record file):",
        "python scripts/benchmark_report.py --results 300k=logs/benchmark/300k",
        "# or this report from the committed records alone:",
        "python scripts/benchmark_report.py",
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
        if suite.name in TIME_SUITES:  # one section for both below
            summaries[suite.name], found[suite.name] = {}, {}
            continue
        section, summaries[suite.name], found[suite.name] = suite_section(suite, out_md, figures, labels, draw)
        lines += section
    timed = merged_runs({suite.name: suite.runs for suite in suites})
    if timed:
        lines += time_to_score_section(timed, figures, out_md, draw)
    lines += ["## Throughput", "", *throughput_table(throughput or []), "", "## Comparisons", ""]
    for suite in suites:
        complete = {b.env: budget_complete(b, suite.runs.get(b.env, {}), suite.uncounted) for b in SUITES[suite.name]}
        if suite.name in VALIDATION_SUITES:
            table = validation_section(suite.name, summaries[suite.name], found[suite.name], complete)
        elif suite.name in MASKED_SUITES:
            table = masked_section(suite.name, summaries[suite.name], found[suite.name], complete)
        elif suite.name in HEADS_SUITES:
            table = heads_section(suite.name, summaries[suite.name], found[suite.name], complete)
        elif suite.name in FAST_SUITES:
            table = fast_section(suite, summaries[suite.name], found[suite.name], complete)
        else:
            continue  # the other suites compare with stock PPO and TRPO in their own sections
        lines += [f"### Suite `{suite.name}`", "", *table, ""]
    if yml is not None:
        # The ppo_ext.yml entries of the suites that train PPOExt (ppo_mask_ext.yml states its entries' sources).
        ppo_ext_suites = [suite.name for suite in suites if suite.name not in (*MASKED_SUITES, *HEADS_SUITES, *FAST_SUITES)]
        lines += ["## Tuning", "", *tuning_section(ppo_ext_suites, yml, studies), ""]
    gpu_note = gpu_note.strip() or "Not run: no CUDA machine was available when this report was built."
    lines += ["## GPU check", "", gpu_note, ""]
    if notes:
        lines += ["## Findings", "", notes.strip(), ""]
    lines += _reproduce_section()
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines))
    return summaries
