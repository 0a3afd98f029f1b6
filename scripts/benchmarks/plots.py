"""The report's figures: learning curves and rliable's IQM, improvement and profile plots (PNG, matplotlib on Agg)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .records import Run
from .stats import Improvements, Summary, curve_band, load_rliable, performance_profiles
from .suites import ALGOS


def algo_colors(algos: Iterable[str]) -> dict[str, str]:
    """One colour per algorithm, the same in every figure and on every env (by its place in ALGOS)."""
    order = [*ALGOS, *sorted(set(algos) - set(ALGOS))]
    return {algo: f"C{order.index(algo) % 10}" for algo in algos}


def _save(figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def plot_env(env: str, by_algo: dict[str, list[Run]], path: Path, threshold: float | None, title: str = "") -> None:
    """PNG of the learning curves of every algo on ``env``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = algo_colors(by_algo)
    # Left: the whole run; right: the second half, where the final returns are decided.
    figure, (whole, late) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    for algo, runs in by_algo.items():
        timesteps, mean, low, high = curve_band(runs)
        color = colors[algo]
        whole.plot(timesteps, mean, color=color, label=f"{algo} ({len(runs)} seeds)")
        whole.fill_between(timesteps, low, high, color=color, alpha=0.2, linewidth=0)
        second_half = timesteps >= timesteps[-1] / 2
        late.plot(timesteps[second_half], mean[second_half], color=color, marker="o", markersize=3)
        late.fill_between(timesteps[second_half], low[second_half], high[second_half], color=color, alpha=0.2, linewidth=0)
    for axes in (whole, late):
        if threshold is not None:
            axes.axhline(threshold, color="grey", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        axes.set_xlabel("env steps")
        axes.grid(alpha=0.3)
    whole.set_ylabel("mean return")
    whole.set_title(f"{env}{title}: deterministic evaluation return", fontsize=9)
    late.set_title("second half of training (mean, 95 % bootstrap CI across seeds)", fontsize=9)
    whole.legend(fontsize=8)
    figure.tight_layout()
    _save(figure, path)


def plot_iqm(env: str, summaries: list[Summary], path: Path, title: str = "") -> None:
    """rliable's interval plot of each algorithm's IQM (95 % stratified-bootstrap CI)."""
    _, _, plot_utils = load_rliable()
    algos = [s.algo for s in summaries]
    figure, axes = plot_utils.plot_interval_estimates(
        {s.algo: np.array([s.iqm]) for s in summaries},
        {s.algo: np.array([[s.ci[0]], [s.ci[1]]]) for s in summaries},
        metric_names=[f"{env}{title}: IQM of the final return, 95 % CI"],
        algorithms=algos,
        colors=algo_colors(algos),
        xlabel="",
        subfigure_width=6.0,
        row_height=0.5,
    )
    axes.set_xlabel("final return", fontsize="medium")
    axes.tick_params(labelsize="medium")
    axes.set_title(axes.get_title(), fontsize="medium")
    _save(figure, path)


def plot_improvements(env: str, found: Improvements, path: Path, title: str = "") -> None:
    """rliable's probability-of-improvement plot: each PPOExt variant X over each baseline Y."""
    import matplotlib.pyplot as plt

    _, _, plot_utils = load_rliable()
    colors = algo_colors({x for x, _ in found})
    figure, axes = plt.subplots(figsize=(5, 0.55 * len(found) + 1.2))
    plot_utils.plot_probability_of_improvement(
        {f"{x},{y}": p for (x, y), (p, _) in found.items()},
        {f"{x},{y}": np.array(ci) for (x, y), (_, ci) in found.items()},
        ax=axes,
        colors=[colors[x] for x, _ in found],
        xlabel="P(X > Y), final return",
        ticklabelsize="medium",
        labelsize="medium",
    )
    axes.axvline(0.5, color="grey", linestyle="--", linewidth=1)
    axes.set_xlim(0, 1)
    axes.set_title(f"{env}{title}: probability of improvement (95 % CI)", fontsize="medium", pad=22)
    _save(figure, path)


def plot_profiles(env: str, summaries: list[Summary], path: Path, title: str = "") -> None:
    """rliable's performance profiles: the fraction of runs whose final return is above tau, with 95 % CIs."""
    import matplotlib.pyplot as plt

    _, _, plot_utils = load_rliable()
    finals = {s.algo: s.finals for s in summaries}
    low, high = min(f.min() for f in finals.values()), max(f.max() for f in finals.values())
    margin = 0.05 * (high - low) or 1.0
    taus = np.linspace(low - margin, high + margin, 101)
    profiles, intervals = performance_profiles(finals, taus)
    figure, axes = plt.subplots(figsize=(6, 3.6))
    plot_utils.plot_performance_profiles(
        profiles,
        taus,
        performance_profile_cis=intervals,
        colors=algo_colors(finals),
        ax=axes,
        xlabel=r"final return $\tau$",
        ylabel=r"fraction of runs above $\tau$",
        labelsize="medium",
        ticklabelsize="medium",
        legend=True,
        legendsize="small",
    )
    axes.set_title(f"{env}{title}: performance profile (95 % CIs)", fontsize="medium")
    _save(figure, path)
