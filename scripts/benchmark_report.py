"""Build docs/BENCHMARKS.md and its learning-curve PNGs from the CSVs of scripts/benchmark.py.

Per env: final deterministic return across seeds (mean, std, IQM with a 95 % percentile bootstrap
confidence interval: ``scipy.stats.bootstrap`` of ``scipy.stats.trim_mean(x, 0.25)``, the IQM of
rliable), steps to a stated threshold, wall-clock and env-steps per second; a PNG of the learning
curves (mean across seeds, 95 % bootstrap band); the throughput table of ``scripts/throughput.py
--json``; the suite's coverage (what was run and what was not) and the issue's targets, each met,
missed or not measured yet.

Only finished runs (CSV and done marker) count. The inputs are copied to
``docs/benchmarks/data/`` (``--keep-data``), so the committed report can be rebuilt from the
committed evidence:

    python scripts/benchmark_report.py --results logs/benchmark
    python scripts/benchmark_report.py --results docs/benchmarks/data --keep-data ""
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import ALGOS, SUITES

from sb3_ppo_ext.hyperparams import PPO_EXT_YML

STOCK = "ppo"
CONFIDENCE = 0.95
N_RESAMPLES = 10_000
# Returns that mean "has learned the task": for Pendulum (no official threshold) a common choice,
# LunarLander's official one. Hopper's 1000 turned out to be the level of the alive bonus (about 1 per step for 1000
# steps), which a policy reaches by balancing in place: read it as "stays up", not as locomotion. HalfCheetah's is provisional.
THRESHOLDS = {
    "Pendulum-v1": -200.0,
    "LunarLanderContinuous-v3": 200.0,
    "Hopper-v5": 1000.0,
    "HalfCheetah-v5": 1000.0,
}
THROUGHPUT_TARGETS = {
    "PPOExt, squash off": 0.98,
    "PPOExt, squash on": 0.95,
    "MaskablePPOExt": 0.95,
    "RecurrentPPOExt, squash off": 0.95,
    "RecurrentPPOExt, squash on": 0.95,
}
FAMILY_TITLES = {
    "ppo": "PPOExt ÷ PPO",
    "maskable": "MaskablePPOExt ÷ MaskablePPO",
    "recurrent": "RecurrentPPOExt ÷ RecurrentPPO",
}


@dataclasses.dataclass
class Run:
    """One finished run: its evaluation rows and its done marker."""

    env: str
    algo: str
    seed: int
    timesteps: np.ndarray
    returns: np.ndarray
    marker: dict[str, Any]
    csv_path: Path


class BadRunError(ValueError):
    """A finished run's CSV cannot be a benchmark's evaluation record."""


def load_runs(results: Path) -> dict[str, dict[str, list[Run]]]:
    """
    Finished runs under ``results`` (``<env>/<algo>/seed<k>.csv`` with ``seed<k>.done.json``), by env and algo.

    :raises BadRunError: a CSV that is unreadable or whose evaluation steps do not increase (e.g.
        rows of two processes interleaved): the report is not built from it
    """
    runs: dict[str, dict[str, list[Run]]] = {}
    for marker_path in sorted(results.glob("*/*/seed*.done.json")):
        csv_path = marker_path.with_name(marker_path.name.replace(".done.json", ".csv"))
        if not csv_path.is_file():
            continue
        marker = json.loads(marker_path.read_text())
        with open(csv_path, newline="") as file:
            rows = list(csv.DictReader(file))
        try:
            timesteps = np.array([int(row["timesteps"]) for row in rows])
            returns = np.array([float(row["mean_return"]) for row in rows])
        except (KeyError, TypeError, ValueError) as error:
            raise BadRunError(f"{csv_path}: not a readable benchmark CSV ({error})") from error
        if len(timesteps) == 0 or np.any(np.diff(timesteps) <= 0):
            raise BadRunError(f"{csv_path}: evaluation steps are not increasing: {timesteps.tolist()}")
        run = Run(
            env=marker["env"],
            algo=marker["algo"],
            seed=int(marker["seed"]),
            timesteps=timesteps,
            returns=returns,
            marker=marker,
            csv_path=csv_path,
        )
        runs.setdefault(run.env, {}).setdefault(run.algo, []).append(run)
    order = [*ALGOS, *sorted({algo for by_algo in runs.values() for algo in by_algo} - set(ALGOS))]
    return {
        env: {algo: sorted(by_algo[algo], key=lambda run: run.seed) for algo in order if algo in by_algo}
        for env, by_algo in runs.items()
    }


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: the mean of the middle 50 % (``trim_mean(x, 0.25)``, as rliable's IQM)."""
    return stats.trim_mean(values, 0.25, axis=axis)


def bootstrap_ci(values: np.ndarray, statistic=iqm, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap CI of ``statistic`` over the seeds (min and max of the values if < 2 or all equal)."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2 or np.all(values == values[0]):
        return float(values.min()), float(values.max())
    result = stats.bootstrap(
        (values,),
        statistic,
        confidence_level=CONFIDENCE,
        n_resamples=N_RESAMPLES,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def steps_to_threshold(run: Run, threshold: float) -> float:
    """First evaluated timestep whose mean return is >= ``threshold`` (inf if never)."""
    reached = np.nonzero(run.returns >= threshold)[0]
    return float(run.timesteps[reached[0]]) if len(reached) else float("inf")


@dataclasses.dataclass
class Summary:
    """Across-seed statistics of one algo on one env."""

    algo: str
    seeds: list[int]
    final_steps: int
    finals: np.ndarray
    iqm: float
    ci: tuple[float, float]
    threshold_steps: list[float]
    wall_s: float
    fps: float
    machines: tuple[str, ...]

    @property
    def mean(self) -> float:
        return float(self.finals.mean())

    @property
    def std(self) -> float:
        return float(self.finals.std(ddof=1)) if len(self.finals) > 1 else 0.0

    @property
    def median_threshold_steps(self) -> float:
        """Median of the per-seed first crossings (seeds that never cross count as infinite)."""
        return float(np.median(self.threshold_steps)) if self.threshold_steps else float("nan")


def summarize(algo: str, runs: list[Run], threshold: float | None) -> Summary:
    finals = np.array([run.returns[-1] for run in runs])
    return Summary(
        algo=algo,
        seeds=[run.seed for run in runs],
        final_steps=int(min(run.timesteps[-1] for run in runs)),
        finals=finals,
        iqm=float(iqm(finals)),
        ci=bootstrap_ci(finals),
        threshold_steps=[steps_to_threshold(run, threshold) for run in runs] if threshold is not None else [],
        wall_s=float(np.mean([run.marker["total_wall_time_s"] for run in runs])),
        fps=float(np.mean([run.marker["env_steps_per_s"] for run in runs])),
        machines=tuple(sorted({machine(run.marker) for run in runs})),
    )


def machine(marker: dict[str, Any]) -> str:
    """
    Where a run ran, as far as its marker says: core count and software versions. Timings are
    only compared between runs of one machine.
    """
    versions = ", ".join(f"{key} {value}" for key, value in marker.get("versions", {}).items())
    return f"{marker.get('cpu_count')} CPU cores; {versions}"


def all_runs(runs: dict[str, dict[str, list[Run]]]) -> Iterator[Run]:
    """Every run of ``runs``, env by env and algo by algo."""
    for by_algo in runs.values():
        for algo_runs in by_algo.values():
            yield from algo_runs


def machine_labels(runs: dict[str, dict[str, list[Run]]]) -> dict[str, str]:
    """A letter per machine, in order of first appearance."""
    labels: dict[str, str] = {}
    for run in all_runs(runs):
        labels.setdefault(machine(run.marker), chr(ord("A") + len(labels)))
    return labels


def curve_band(runs: list[Run]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Timesteps, mean return across seeds and its 95 % bootstrap band, over the evaluations all seeds share."""
    length = min(len(run.returns) for run in runs)
    timesteps = np.median([run.timesteps[:length] for run in runs], axis=0)
    returns = np.array([run.returns[:length] for run in runs])  # seeds x evaluations
    mean = returns.mean(axis=0)
    if len(runs) < 2:
        return timesteps, mean, mean, mean
    result = stats.bootstrap(
        (returns,),
        np.mean,
        axis=0,
        confidence_level=CONFIDENCE,
        n_resamples=N_RESAMPLES,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(0),
    )
    low = np.where(np.isnan(result.confidence_interval.low), mean, result.confidence_interval.low)
    high = np.where(np.isnan(result.confidence_interval.high), mean, result.confidence_interval.high)
    return timesteps, mean, low, high


def plot_env(env: str, by_algo: dict[str, list[Run]], path: Path, threshold: float | None) -> None:
    """PNG of the learning curves of every algo on ``env``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Left: the whole run; right: the second half, where the final returns are decided.
    figure, (whole, late) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    for algo, runs in by_algo.items():
        timesteps, mean, low, high = curve_band(runs)
        (line,) = whole.plot(timesteps, mean, label=f"{algo} ({len(runs)} seeds)")
        whole.fill_between(timesteps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        second_half = timesteps >= timesteps[-1] / 2
        late.plot(timesteps[second_half], mean[second_half], color=line.get_color(), marker="o", markersize=3)
        late.fill_between(
            timesteps[second_half], low[second_half], high[second_half], color=line.get_color(), alpha=0.2, linewidth=0
        )
    for axes in (whole, late):
        if threshold is not None:
            axes.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        axes.set_xlabel("env steps")
        axes.grid(alpha=0.3)
    whole.set_ylabel("mean return")
    whole.set_title(f"{env}: deterministic evaluation return", fontsize=9)
    late.set_title("second half of training (mean, 95 % bootstrap CI across seeds)", fontsize=9)
    whole.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


# --- markdown -----------------------------------------------------------------------------------


def _steps(value: float) -> str:
    return "never" if value == float("inf") else f"{value / 1000:.0f}k"


def _settings_match_stock(runs: list[Run], stock_runs: list[Run]) -> bool:
    """Whether a variant ran stock PPO's settings apart from the variant's own overrides."""
    own, stock = runs[0].marker, stock_runs[0].marker
    overridden = set(own["overrides"])
    return {k: v for k, v in own["hyperparams"].items() if k not in overridden} == {
        k: v for k, v in stock["hyperparams"].items() if k not in overridden
    }


def same_as_stock(runs: list[Run], stock_runs: list[Run]) -> bool:
    """
    Whether a variant's evaluations equal stock PPO's exactly on each seed it ran (stock PPO may
    have run more seeds): the same training, bit for bit (PPOExt with the squashed head off is
    built to reproduce PPO exactly).
    """
    stock = {run.seed: run for run in stock_runs}
    return bool(runs) and all(
        run.seed in stock
        and np.array_equal(run.timesteps, stock[run.seed].timesteps)
        and np.array_equal(run.returns, stock[run.seed].returns)
        for run in runs
    )


def identical_to_stock(runs: dict[str, dict[str, list[Run]]]) -> set[tuple[str, str]]:
    """``(env, algo)`` of every variant whose evaluations equal stock PPO's on that env, seed for seed."""
    return {
        (env, algo)
        for env, by_algo in runs.items()
        if STOCK in by_algo
        for algo, algo_runs in by_algo.items()
        if algo != STOCK and same_as_stock(algo_runs, by_algo[STOCK])
    }


def env_table(
    summaries: list[Summary],
    threshold: float | None,
    by_algo: dict[str, list[Run]],
    identical: frozenset[str] = frozenset(),
    labels: dict[str, str] | None = None,
) -> list[str]:
    """
    :param labels: machine -> letter, when the report's runs come from more than one machine (a
        column then says where each row ran, and timings are compared within one machine only)
    """
    crossing_header = f"steps to {threshold:g} (median; per seed)" if threshold is not None else "steps to threshold"
    machine_header, machine_rule = (" machine |", "---|") if labels else ("", "")
    lines = [
        f"| algorithm | seeds | final steps | final return mean ± std | IQM | IQM 95 % CI | {crossing_header} | "
        f"wall-clock per run | env-steps/s | ÷ stock PPO |{machine_header}",
        f"|---|---|---|---|---|---|---|---|---|---|{machine_rule}",
    ]
    stock = next((s for s in summaries if s.algo == STOCK), None)
    for s in summaries:
        if threshold is not None:
            reached = sum(step != float("inf") for step in s.threshold_steps)
            per_seed = ", ".join(_steps(step) for step in s.threshold_steps)
            crossing = f"{_steps(s.median_threshold_steps)} ({reached}/{len(s.seeds)} seeds: {per_seed})"
        else:
            crossing = "no threshold set"
        if stock is None or s is stock:
            ratio = "—"
        elif len(s.machines) != 1 or s.machines != stock.machines:
            ratio = "— (ran on another machine than stock PPO)"
        else:
            same = _settings_match_stock(by_algo[s.algo], by_algo[STOCK])
            ratio = f"{s.fps / stock.fps:.2f} ({'same settings but the variant' if same else 'different settings'})"
        name = f"`{s.algo}`"
        if s.algo in identical:
            name += " (= stock PPO: every evaluation of each of its seeds identical)"
        lines.append(
            f"| {name} | {len(s.seeds)} | {s.final_steps} | {s.mean:.1f} ± {s.std:.1f} | {s.iqm:.1f} | "
            f"[{s.ci[0]:.1f}, {s.ci[1]:.1f}] | {crossing} | {s.wall_s:.0f} s | {s.fps:.0f} | {ratio} |"
            + (f" {'+'.join(labels[m] for m in s.machines)} |" if labels else "")
        )
    return lines


def throughput_sections(throughputs: list[dict[str, Any]]) -> tuple[list[str], dict[str, float]]:
    """:func:`throughput_section` of each measurement, one subsection each, and all their ratios."""
    if not throughputs:
        return throughput_section(None)
    lines: list[str] = []
    ratios: dict[str, float] = {}
    for throughput in throughputs:
        family = throughput.get("family", "ppo")
        section, section_ratios = throughput_section(throughput)
        lines += [f"### {FAMILY_TITLES.get(family, family)}, {throughput['env']}", "", *section, ""]
        ratios.update(section_ratios)
    return lines, ratios


def throughput_section(throughput: dict[str, Any] | None) -> tuple[list[str], dict[str, float]]:
    """
    Markdown lines for the throughput table, and the ratio of medians of each variant (keyed
    ``"<variant> @ <env>"`` for a measurement that names its family, so that one variant measured on
    two settings gives two targets).
    """
    if throughput is None:
        return ["Not measured for this report (`scripts/throughput.py --json` output not given)."], {}
    variants = throughput["variants"]
    family = throughput.get("family")
    suffix = f" @ {throughput['env']}" if family else ""
    clock = throughput.get("clock", "wall")
    how = (
        "timed by the process CPU time of one single-threaded process (`time.process_time()`: time other processes "
        "hold the CPU is not counted; wall clock in the JSON)"
        if clock == "process_time"
        else "timed by wall clock"
    )
    lines = [
        f"`python scripts/throughput.py{f' --family {family}' if family else ''} --env {throughput['env']} "
        f"--steps {throughput['steps']} --repeats "
        f"{throughput['repeats']} --n-envs {throughput['n_envs']} --json ...`, measured {throughput['measured_at']} on "
        f"{throughput['machine']['cpu_count']} CPU cores, {how}; the variants interleaved (order reversed every "
        f"other repeat); identical hyperparameters for all: `{throughput['hyperparams']}`. The Ext algorithms log "
        "all their diagnostics in every variant (they are always on); the first row is the upstream reference.",
        "",
        "| variant | settings | median env-steps/s | ÷ reference (medians) | best env-steps/s | ÷ reference (bests) "
        "| median of paired ratios |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = {}
    for name, entry in variants.items():
        ratios[name + suffix] = entry["ratio_of_medians"]
        paired = entry.get("median_of_paired_ratios")
        lines.append(
            f"| {name} | `{entry['kwargs']}` | {entry['median']:.0f} | {entry['ratio_of_medians']:.3f} | {entry['best']:.0f} "
            f"| {entry['ratio_of_bests']:.3f} | {'—' if paired is None else f'{paired:.3f}'} |"
        )
    return lines, {**ratios, **{f"{name}{suffix} (best)": entry["ratio_of_bests"] for name, entry in variants.items()}}


def targets_section(
    suite: str,
    summaries: dict[str, list[Summary]],
    ratios: dict[str, float],
    identical: set[tuple[str, str]] | None = None,
) -> list[str]:
    """
    The issue's targets, each met / missed / not measured yet, with the margin.

    :param identical: ``(env, algo)`` of variants that reproduced stock PPO exactly: a tie they
        give is said to be one, next to the best variant that trains differently
    """
    identical = identical or set()
    suite_envs = [budget.env for budget in SUITES[suite]]
    lines = ["| target | env / variant | status | measured |", "|---|---|---|---|"]
    above = []
    for env in suite_envs:
        by_algo = {s.algo: s for s in summaries.get(env, [])}
        ext = [s for algo, s in by_algo.items() if algo != STOCK]
        if STOCK not in by_algo or not ext:
            lines.append(f"| best PPOExt variant IQM ≥ stock PPO IQM | {env} | not measured yet | — |")
            continue
        stock, best = by_algo[STOCK], max(ext, key=lambda s: s.iqm)
        diff = best.iqm - stock.iqm
        status = "met" if diff >= 0 else "**missed**"
        measured = f"{best.iqm:.1f} vs {stock.iqm:.1f} ({diff:+.1f})"
        if (env, best.algo) in identical:
            status = "met (a tie: this variant is stock PPO bit for bit)"
            different = [s for s in ext if (env, s.algo) not in identical]
            if different:
                other = max(different, key=lambda s: s.iqm)
                margin = other.iqm - stock.iqm
                measured += f"; best variant that trains differently: `{other.algo}` {other.iqm:.1f} ({margin:+.1f})"
        lines.append(f"| best PPOExt variant IQM ≥ stock PPO IQM | {env} (`{best.algo}`) | {status} | {measured} |")
        # Intervals over a single seed are no intervals: at least 2 seeds on each side.
        if min(len(best.seeds), len(stock.seeds)) >= 2 and best.ci[0] > stock.ci[1]:
            above.append(env)
    measured = [env for env in suite_envs if env in summaries]
    if len(above) >= 2:
        status = "met"
    elif len(measured) < len(suite_envs):
        status = f"not measured yet ({len(measured)} of {len(suite_envs)} envs run)"
    else:
        status = "**missed**"
    lines.append(
        f"| clearly above (non-overlapping 95 % CIs) on ≥ 2 envs | {', '.join(measured) or '—'} | {status} | "
        f"{len(above)} env(s){': ' + ', '.join(above) if above else ''} |"
    )
    for name, target in THROUGHPUT_TARGETS.items():
        measured_as = [
            key for key in ratios if not key.endswith(" (best)") and (key == name or key.startswith(f"{name} @ "))
        ]
        if not measured_as:
            lines.append(f"| throughput ratio ≥ {target} | {name} | not measured yet | — |")
        for key in measured_as:
            lines.append(_throughput_target_row(key, target, ratios[key], ratios.get(f"{key} (best)", ratios[key])))
    return lines


def _throughput_target_row(name: str, target: float, ratio: float, best_ratio: float) -> str:
    """One throughput target's row of the targets table."""
    # Interference only adds time: a verdict needs the ratio of medians and the ratio of the
    # least disturbed runs to agree.
    if ratio >= target and best_ratio >= target:
        status = "met"
    elif ratio < target and best_ratio < target:
        status = "**missed**"
    else:
        status = "inconclusive (medians and best runs disagree)"
    return (
        f"| throughput ratio ≥ {target} | {name} (all diagnostics on) | {status} | "
        f"{ratio:.3f} (ratio of medians, {ratio - target:+.3f}); best runs {best_ratio:.3f} |"
    )


def coverage_section(suite: str, runs: dict[str, dict[str, list[Run]]]) -> list[str]:
    lines = ["| env | required by the issue | run for this report | status |", "|---|---|---|---|"]
    for budget in SUITES[suite]:
        by_algo = runs.get(budget.env, {})
        if not by_algo:
            lines.append(f"| {budget.env} | {budget.steps // 1000}k steps x {budget.seeds} seeds | — | **not run** |")
            continue
        done = ", ".join(f"`{algo}` {len(algo_runs)}" for algo, algo_runs in by_algo.items())
        steps = min(run.marker["budget"]["steps"] for algo_runs in by_algo.values() for run in algo_runs)
        complete = steps >= budget.steps and all(len(by_algo.get(algo, [])) >= budget.seeds for algo in (budget.algos or ALGOS))
        status = "complete" if complete else "**partial**"
        lines.append(
            f"| {budget.env} | {budget.steps // 1000}k steps x {budget.seeds} seeds | {steps // 1000}k steps; seeds per "
            f"algorithm: {done} | {status} |"
        )
    return lines


def setup_section(runs: dict[str, dict[str, list[Run]]]) -> list[str]:
    lines = [
        "| env | algorithm | description | hyperparameters from | overrides | n_envs | normalize |",
        "|---|---|---|---|---|---|---|",
    ]
    for env, by_algo in runs.items():
        for algo, algo_runs in by_algo.items():
            marker = algo_runs[0].marker
            overrides = ", ".join(f"{k}: {v}" for k, v in marker["overrides"].items()) or "—"
            lines.append(
                f"| {env} | `{algo}` | {marker['description']} | `{marker['hyperparams_source']}` | {overrides} | "
                f"{marker['n_envs']} | {marker['normalize']} |"
            )
    return lines


def tuned_comments(path: Path) -> dict[str, list[str]]:
    """
    The ``# Tuned`` comment block written above each tuned entry of a yml file (see
    ``scripts/zoo_study.py best``), by env id, without the leading ``#``.
    """
    found: dict[str, list[str]] = {}
    block: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            block.append(line.lstrip("#").strip())
            continue
        top_level_key = line[:1].strip() and line.rstrip().endswith(":")
        if top_level_key and block and block[0].startswith("Tuned"):
            found[line.rstrip()[:-1].strip("'\"")] = block
        block = []
    return found


def tuning_section(suite: str, yml: Path) -> list[str]:
    """Which suite entries of the shipped yml are tuned, and by which study."""
    tuned = tuned_comments(yml)
    lines = ["| env | shipped `ppo_ext.yml` entry |", "|---|---|"]
    for budget in SUITES[suite]:
        comment = tuned.get(budget.env)
        text = "<br>".join(comment) if comment else "not tuned: the starting point (rl-zoo3's `ppo.yml` settings)"
        lines.append(f"| {budget.env} | {text} |")
    return lines


def build_report(
    runs: dict[str, dict[str, list[Run]]],
    out_md: Path,
    figures: Path,
    suite: str = "issue",
    throughput: list[dict[str, Any]] | None = None,
    gpu_note: str = "",
    notes: str = "",
    yml: Path | None = None,
) -> dict[str, list[Summary]]:
    """Write the markdown report and the PNGs; return the summaries by env."""
    summaries: dict[str, list[Summary]] = {}
    identical = identical_to_stock(runs)
    any_marker = next((run.marker for run in all_runs(runs)), None)
    lines = [
        "# Benchmarks: PPOExt against stock SB3 PPO",
        "",
        "<!-- Generated by scripts/benchmark_report.py from the CSVs of scripts/benchmark.py: do not edit by hand. -->",
        "",
        "Every algorithm is trained through rl-zoo3's `ExperimentManager` with the same seeds and the same env-step "
        "budget, and evaluated deterministically on a separate env (VecNormalize statistics synced when `normalize` is "
        "on) at step 0, every `eval_freq` steps and after the last update. **Final return** is that last evaluation "
        "(SB3 finishes the last rollout, so the final step count can exceed the budget by up to one rollout; it is the "
        "same for all algorithms with the same `n_steps x n_envs`). Across seeds: mean ± std (ddof 1), **IQM** = "
        "`scipy.stats.trim_mean(x, 0.25)` (rliable's interquartile mean; with 3 seeds it trims nothing and equals the "
        "mean, with 5 it is the mean of the middle 3, with 16 of the middle 8), **95 % CI** = percentile bootstrap of "
        f"the IQM over seeds (`scipy.stats.bootstrap`, {N_RESAMPLES} resamples). **Steps to threshold**: per seed, "
        "the first evaluation at or above the threshold; the median over seeds, with seeds that never reach it counted as "
        'infinite ("never" when half or more never do). **Wall-clock** is per run (setup, training, evaluations); '
        "**env-steps/s** counts training time only (evaluations excluded). Thresholds: "
        + ", ".join(f"{env} {value:g}" for env, value in THRESHOLDS.items())
        + " (Pendulum has no official threshold, -200 is a common choice; LunarLander's is its official one; "
        "Hopper's 1000 is about the alive bonus of a full 1000-step episode, which a policy reaches by staying up "
        'without moving forward (so it reads "stays up", not "hops"); HalfCheetah\'s is a provisional choice).',
        "",
    ]
    labels = machine_labels(runs)
    if any_marker is not None:
        revisions = sorted({str(run.marker.get("sb3_ppo_ext_revision")) for run in all_runs(runs)})
        if len(labels) == 1:
            where = f"Machine: {next(iter(labels))}"
        else:
            where = (
                "Machines (column *machine* of the tables): "
                + "; ".join(f"**{label}**: {name}" for name, label in labels.items())
                + ". Wall-clock and env-steps/s depend on the machine: the ratio to stock PPO is only given within one"
            )
        lines += [
            f"{where}. One torch thread per run, device {any_marker['budget']['device']}; sb3_ppo_ext commits of the "
            f"runs: {', '.join(revisions)} (None: recorded before commits were). "
            f"Evaluation: {any_marker['budget']['eval_episodes']} episodes.",
            "",
        ]
    lines += ["## What was run", "", *coverage_section(suite, runs), ""]
    for env, by_algo in runs.items():
        threshold = THRESHOLDS.get(env)
        ordered = by_algo
        env_summaries = [summarize(algo, algo_runs, threshold) for algo, algo_runs in ordered.items()]
        env_identical = frozenset(algo for identical_env, algo in identical if identical_env == env)
        summaries[env] = env_summaries
        figure = figures / f"{env}.png"
        plot_env(env, ordered, figure, threshold)
        budget = ordered[next(iter(ordered))][0].marker["budget"]
        lines += [
            f"## {env}",
            "",
            f"Budget {budget['steps']} env steps, evaluation every {budget['eval_freq']} steps.",
            "",
            *env_table(env_summaries, threshold, ordered, env_identical, labels if len(labels) > 1 else None),
            "",
            f"![{env} learning curves]({figure.relative_to(out_md.parent).as_posix()})",
            "",
        ]
    throughput_lines, ratios = throughput_sections(throughput)
    lines += [
        "## Throughput: each Ext algorithm ÷ its upstream algorithm, identical hyperparameters",
        "",
        *throughput_lines,
        "",
    ]
    lines += ["## Targets", "", *targets_section(suite, summaries, ratios, identical), ""]
    if yml is not None:
        lines += ["## Tuning", "", *tuning_section(suite, yml), ""]
    lines += ["## GPU check", "", gpu_note or "Not run: no CUDA machine was available when this report was built.", ""]
    if notes:
        lines += ["## Findings", "", notes.strip(), ""]
    lines += ["## Settings of each run", "", *setup_section(runs), ""]
    lines += [
        "## Reproduce",
        "",
        "```bash",
        'pip install -e ".[bench]"',
        "python scripts/benchmark.py --suite issue --workers $(nproc)   # resumable: finished runs are skipped",
        "python scripts/throughput.py --env LunarLanderContinuous-v3 --n-envs 16 --n-steps 1024 --n-epochs 4 \\",
        "    --steps 16384 --repeats 12 --json docs/benchmarks/throughput.json",
        "python scripts/throughput.py --env MountainCarContinuous-v0 --n-envs 1 --n-steps 8 --batch-size 8 \\",
        "    --n-epochs 10 --steps 4096 --repeats 15 --json docs/benchmarks/throughput-mountaincar.json",
        "python scripts/throughput.py --family maskable --steps 8192 --repeats 12 \\",
        "    --json docs/benchmarks/throughput-maskable.json",
        "python scripts/throughput.py --family recurrent --n-steps 128 --batch-size 128 --steps 4096 --repeats 9 \\",
        "    --json docs/benchmarks/throughput-recurrent.json",
        "python scripts/benchmark_report.py --results logs/benchmark --throughput docs/benchmarks/throughput*.json \\",
        "    --notes docs/benchmarks/notes.md",
        "# or rebuild this report from the committed inputs alone:",
        "python scripts/benchmark_report.py --results docs/benchmarks/data --keep-data '' \\",
        "    --throughput docs/benchmarks/throughput*.json --notes docs/benchmarks/notes.md",
        "```",
        "",
    ]
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(lines))
    return summaries


def keep_data(runs: dict[str, dict[str, list[Run]]], folder: Path) -> None:
    """Copy each run's CSV and done marker to ``folder/<env>/<algo>/`` (the report's committed evidence)."""
    for run in all_runs(runs):
        target = folder / run.env / run.algo
        target.mkdir(parents=True, exist_ok=True)
        marker = run.csv_path.with_name(run.csv_path.name.replace(".csv", ".done.json"))
        for source in (run.csv_path, marker):
            if source.resolve() != (target / source.name).resolve():
                shutil.copyfile(source, target / source.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="logs/benchmark", help="folder of scripts/benchmark.py results")
    parser.add_argument("--out", default="docs/BENCHMARKS.md")
    parser.add_argument("--figures", default="docs/benchmarks", help="folder for the PNGs")
    parser.add_argument("--keep-data", default="docs/benchmarks/data", help="copy the inputs here ('' to skip)")
    parser.add_argument(
        "--throughput", nargs="+", default=[], help="JSON files written by scripts/throughput.py --json (one per measurement)"
    )
    parser.add_argument("--suite", choices=sorted(SUITES), default="issue", help="the suite the coverage and targets refer to")
    parser.add_argument("--gpu-note", default="", help="what the GPU check found (default: not run, no CUDA machine)")
    parser.add_argument("--notes", help="markdown file with findings, included as they are")
    parser.add_argument("--yml", default=str(PPO_EXT_YML), help="the shipped ppo_ext.yml (its # Tuned entries are listed)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(Path(args.results))
    except BadRunError as error:
        print(f"{error}\nDelete the run's .done.json marker and rerun scripts/benchmark.py to redo it.", file=sys.stderr)
        return 1
    if not runs:
        print(f"no finished runs under {args.results}", file=sys.stderr)
        return 1
    throughput = [json.loads(Path(path).read_text()) for path in args.throughput]
    notes = Path(args.notes).read_text() if args.notes else ""
    if args.keep_data:
        keep_data(runs, Path(args.keep_data))
    summaries = build_report(
        runs,
        Path(args.out),
        Path(args.figures),
        args.suite,
        throughput,
        args.gpu_note,
        notes,
        Path(args.yml) if args.yml else None,
    )
    for env, env_summaries in summaries.items():
        for s in env_summaries:
            print(f"{env} {s.algo}: IQM {s.iqm:.1f} [{s.ci[0]:.1f}, {s.ci[1]:.1f}] over {len(s.seeds)} seeds")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
