"""Time to a score: CPU-seconds until the deterministic evaluation first reaches a task's target, returns at CPU budgets.

Every run's CSV has ``cpu_time``: the CPU time (all threads) its process spent training up to each evaluation,
evaluations excluded. Per env and algorithm the report gives the median CPU-seconds to the target (runs that never
reach it count as infinite), rliable's IQM with its 95 % CI of the return at each of :data:`CPU_BUDGETS` (each run's
last evaluation at or before the budget; runs that stopped earlier are left out and counted), the IQM at 1M steps,
env-steps per CPU-second, how many times sooner than each of :data:`REFERENCES` each algorithm reaches that
reference's 1M-step IQM, and learning curves against CPU-seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .records import Run
from .stats import interquartile_mean, iqm_with_ci
from .suites import CPU_BUDGETS, SCORE_TARGETS, SHIPPED, STOCK

TIME_SUITES = ("time-to-score", "time-to-score-references")
SAMPLE_STEPS = 1_000_000
REFERENCES = (STOCK, SHIPPED)  # stock PPO with rl-zoo3's settings, the 1-env ppo_ext.yml entry


def cpu_seconds(run: Run) -> np.ndarray:
    return np.array(run.evaluations["cpu_time"], dtype=np.float64)


def cpu_to_reach(run: Run, target: float) -> float:
    """CPU-seconds of training until the run's first evaluation at or above ``target`` (inf if never)."""
    reached = np.nonzero(run.returns >= target)[0]
    return float(cpu_seconds(run)[reached[0]]) if len(reached) else float("inf")


def return_at(run: Run, clock: np.ndarray, at: float) -> float:
    """The return of the run's last evaluation with ``clock <= at``; NaN when the run stopped before ``at``."""
    if clock[-1] < at:
        return float("nan")
    return float(run.returns[np.nonzero(clock <= at)[0][-1]])


def _median_cpu(times: list[float]) -> str:
    median = float(np.median(times))
    reached = sum(np.isfinite(times))
    return f"{median:.0f} ({reached}/{len(times)})" if np.isfinite(median) else f"never ({reached}/{len(times)})"


def _iqm_cell(values: list[float]) -> str:
    kept = [value for value in values if np.isfinite(value)]
    if not kept:
        return "-"
    iqm, (low, high) = iqm_with_ci(kept)
    return f"{iqm:.0f} [{low:.0f}, {high:.0f}] ({len(kept)})"


def _sooner(level: tuple[float, float] | None, runs: list[Run]) -> str:
    """How many times sooner ``runs`` reach a reference's (1M-step IQM, median CPU-seconds to it); "-" without one."""
    if level is None:
        return "-"
    own = float(np.median([cpu_to_reach(r, level[0]) for r in runs]))
    if not np.isfinite(own):
        return "never"
    if own == 0.0:  # the evaluation before any training already scores it: no ratio
        return "at start"
    if level[1] == 0.0:
        return "reference at start"
    return f"{level[1] / own:.1f}" if np.isfinite(level[1]) else "reference never"


def merged_runs(suites: dict[str, dict[str, dict[str, list[Run]]]]) -> dict[str, dict[str, list[Run]]]:
    """The runs of the time suites by env and algorithm that recorded their CPU time."""
    merged: dict[str, dict[str, list[Run]]] = {}
    for name in TIME_SUITES:
        for env, by_algo in suites.get(name, {}).items():
            for algo, runs in by_algo.items():
                timed = [run for run in runs if "cpu_time" in run.evaluations]
                merged.setdefault(env, {}).setdefault(algo, []).extend(timed)
    kept = {env: {algo: runs for algo, runs in by_algo.items() if runs} for env, by_algo in merged.items()}
    return {env: by_algo for env, by_algo in kept.items() if by_algo}


def time_to_score_section(runs: dict[str, dict[str, list[Run]]], figures: Path, out_md: Path, draw: bool = True) -> list[str]:
    """The report's section: one table per env (:data:`SCORE_TARGETS`) and its learning curves against CPU-seconds."""
    lines = [
        "## Time to a score",
        "",
        "Training CPU-seconds of the run's process (all threads, EnvPool's included; evaluations excluded) until the "
        "deterministic evaluation on gymnasium's env (10 episodes) first reaches the target: the median over seeds "
        "(reached/runs; a run that never reaches it counts as infinite). Returns at CPU budgets and at 1M steps: "
        "rliable's IQM [95 % CI] (runs that got there). *x sooner than R*: the median CPU-seconds the reference R "
        "(stock PPO, or the 1-env `ppo_ext.yml` entry) takes to reach its own 1M-step IQM, divided by this algorithm's "
        "median to reach that return; *at start*: this algorithm's evaluation before any training already reaches it, "
        "*reference at start*: the reference's does; *never*: half or more of this algorithm's runs never reach it, "
        "*reference never*: half or more of the reference's own runs never do.",
        "",
    ]
    for env, target in SCORE_TARGETS.items():
        by_algo = runs.get(env)
        if not by_algo:
            continue
        levels = {}  # reference -> (its 1M-step IQM, its median CPU-seconds to reach it)
        for reference in REFERENCES:
            at_steps = [return_at(r, r.timesteps.astype(float), SAMPLE_STEPS) for r in by_algo.get(reference, [])]
            if at_steps and np.all(np.isfinite(at_steps)):  # every run of the reference got to 1M steps
                level = iqm_with_ci(at_steps)[0]
                levels[reference] = level, float(np.median([cpu_to_reach(r, level) for r in by_algo[reference]]))
        budgets = " | ".join(f"IQM at {budget:.0f} CPU-s" for budget in CPU_BUDGETS)
        soonest = " | ".join(f"x sooner than {reference}" for reference in REFERENCES)
        lines += [
            f"### {env}: target {target:g}",
            "",
            f"| algorithm | runs | CPU-s to {target:g} | {budgets} | IQM at 1M steps | env-steps per CPU-s | {soonest} |",
            "|---|---|---|" + "---|" * (len(CPU_BUDGETS) + 2 + len(REFERENCES)),
        ]
        for algo, algo_runs in by_algo.items():
            at_budgets = [_iqm_cell([return_at(r, cpu_seconds(r), budget) for r in algo_runs]) for budget in CPU_BUDGETS]
            at_steps = _iqm_cell([return_at(r, r.timesteps.astype(float), SAMPLE_STEPS) for r in algo_runs])
            speed = np.median([r.timesteps[-1] / cpu_seconds(r)[-1] for r in algo_runs])
            sooner = [_sooner(levels.get(reference), algo_runs) for reference in REFERENCES]
            cells = [algo, str(len(algo_runs)), _median_cpu([cpu_to_reach(r, target) for r in algo_runs]), *at_budgets]
            lines.append("| " + " | ".join([*cells, at_steps, f"{speed:.0f}", *sooner]) + " |")
        if levels:
            named = "; ".join(f"{reference} {level:.0f}" for reference, (level, _) in levels.items())
            lines += ["", f"1M-step IQM of the references: {named}."]
        png = figures / "time-to-score" / f"{env}-cpu.png"
        if draw:
            plot_cpu_curves(env, by_algo, target, png)
        lines += [
            "",
            f"![{env} IQM return against training CPU-seconds]({Path(os.path.relpath(png, out_md.parent)).as_posix()})",
            "",
        ]
    return lines


def plot_cpu_curves(env: str, by_algo: dict[str, list[Run]], target: float, path: Path) -> None:
    """PNG of each algorithm's IQM return across seeds against training CPU-seconds (while every seed is still running)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .plots import _save, algo_colors

    colors = algo_colors(by_algo)
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=100)
    for algo, runs in by_algo.items():
        grid = np.linspace(0.0, min(cpu_seconds(run)[-1] for run in runs), 200)
        returns = np.array([[return_at(run, cpu_seconds(run), t) for t in grid] for run in runs])
        axes.plot(grid, interquartile_mean(returns, axis=0), color=colors[algo], label=f"{algo} ({len(runs)} seeds)")
    axes.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    axes.set_xlabel("training CPU-seconds (all threads)")
    axes.set_ylabel("IQM of the deterministic evaluation return")
    axes.set_title(f"{env}: return against CPU time", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    _save(figure, path)
