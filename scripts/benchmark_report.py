"""Build docs/BENCHMARKS.md and its figures from the CSVs of scripts/benchmark.py, one section per suite.

The score of a run is its final deterministic evaluation return (the last CSV row). Per env (one task:
score arrays of shape ``(runs, 1)``), the statistics are rliable's (Agarwal et al., "Deep reinforcement
learning at the edge of the statistical precipice", NeurIPS 2021):

- IQM, ``rliable.metrics.aggregate_iqm`` (the mean of the middle 50 % of the runs, ``trim_mean(x, 0.25)``),
  with a 95 % stratified-bootstrap percentile CI (``rliable.library.get_interval_estimates``);
- probability of improvement of each PPOExt variant (every algorithm but ``ppo`` and ``trpo``) over stock
  PPO and over TRPO, and of the pairs in ``VARIANT_PAIRS`` (a candidate entry over the shipped one; on the
  masked tasks each ``ppo_mask_ext`` variant over ``ppo_unmasked``), ``metrics.probability_of_improvement``:
  the Mann-Whitney U statistic over ``n_x * n_y``, i.e. P(X > Y) + P(X = Y) / 2 for a random run of
  each; its 95 % CI resamples the runs of the two algorithms independently (rliable's
  ``StratifiedIndependentBootstrap``), each with its own run count, so unequal seed counts are fine;
- performance profiles (fraction of runs whose final return is above tau, 95 % CIs),
  ``library.create_performance_profile``;

drawn with ``rliable.plot_utils`` (IQM intervals, probability of improvement, performance profile) beside
the learning curves (mean across seeds, 95 % percentile bootstrap band of ``scipy.stats.bootstrap``).
rliable draws its resamples from NumPy's global generator (its ``random_state`` argument does not
reach the resampling), so each estimate is computed with that generator seeded with 0 and restored
afterwards: the report is reproducible. Also: mean ± std, steps to a stated threshold, wall-clock and
env-steps/s (compared only within one machine; a run whose segments ran on different machines counts
as mixed and stays out of them), the throughput table of ``scripts/throughput.py --json``, each suite's
coverage (what was run and what was not) and targets (met, missed or not measured yet), and every run's
segments, machines and commits.

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
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import ALGOS, CANDIDATE, SHIPPED, SUITE_CANDIDATES, SUITES, RunSpec, changed_settings, git_output

from sb3_ppo_ext.hyperparams import PPO_EXT_YML

STOCK = "ppo"
REPO = Path(__file__).resolve().parents[1]  # the checkout whose git history names the runs' commits
GPU_NOTE = Path("docs/benchmarks/gpu/note.md")  # what scripts/gpu_check.py --device cuda found, written by hand
TRPO = "trpo"
# Stock PPO on the masked tasks (suite masked): the shipped ppo_mask_ext.yml settings, no masks.
UNMASKED = "ppo_unmasked"
# The references every other algorithm (a PPOExt variant) is compared with.
BASELINES = (STOCK, TRPO)
# Further (variant, reference) pairs compared when both ran: a candidate entry against the shipped
# one; on the masked tasks each masked variant against stock PPO without masks, and the KL penalty
# against the clipped objective.
VARIANT_PAIRS = (
    (CANDIDATE, SHIPPED),
    ("ppo_mask_ext", UNMASKED),
    ("ppo_mask_ext_kl", UNMASKED),
    ("ppo_mask_ext_kl", "ppo_mask_ext"),
)
CONFIDENCE = 0.95
N_RESAMPLES = 10_000  # the learning curves' bands (scipy)
# rliable's bootstrap resamples: its README's 50 000 for aggregate metrics would cost minutes here for
# 10 000's third decimal; 2 000 is its default for performance profiles (and its examples' for the
# probability of improvement, whose values are multiples of 1 / (n_x n_y) anyway).
IQM_REPS = 10_000
IMPROVEMENT_REPS = 2_000
PROFILE_REPS = 2_000
SEED = 0
DASH = "\u2013"  # an en dash: ranges of steps and seeds (0-300k, seeds 0-15 with it)
# Each suite's committed evidence (--keep-data's default); other suites: docs/benchmarks/data-<suite>.
DATA_FOLDERS = {"issue": "docs/benchmarks/data", "mujoco-1m": "docs/benchmarks/data-1m"}
# Suites judged by the mujoco-1m goal instead of issue 5's targets.
GOAL_1M_SUITES = ("mujoco-1m",)
# Suites that validate a candidate entry against the shipped one (judged by validation_section).
VALIDATION_SUITES = ("tuned-1m",)
# Suites of masked tasks (judged by masked_targets_section: masked against unmasked).
MASKED_SUITES = ("masked",)
# Suites comparing the Box action heads (judged by heads_section): each head against the others, and the
# Gaussian heads with their shipped gSDE against the same heads without it.
HEADS_SUITES = ("heads",)
HEAD_NAMES = {
    "ppo_ext_gauss": "clipped Gaussian",
    "ppo_ext_clip": "squashed Gaussian",
    "ppo_ext_beta": "Beta",
    "ppo_ext_gauss_nosde": "clipped Gaussian, no gSDE",
    "ppo_ext_clip_nosde": "squashed Gaussian, no gSDE",
}
# Suites comparing fast mode with the default (judged by fast_section): same learning curves or not.
FAST_SUITES = ("fast",)
FAST_PAIR = ("ppo_ext_fast", "ppo_ext_clip")
SUITE_PAIRS = {
    "fast": (FAST_PAIR,),
    "heads": (
        ("ppo_ext_clip", "ppo_ext_gauss"),
        ("ppo_ext_beta", "ppo_ext_gauss"),
        ("ppo_ext_beta", "ppo_ext_clip"),
        ("ppo_ext_clip_nosde", "ppo_ext_gauss_nosde"),
        ("ppo_ext_beta", "ppo_ext_gauss_nosde"),
        ("ppo_ext_beta", "ppo_ext_clip_nosde"),
        ("ppo_ext_gauss", "ppo_ext_gauss_nosde"),
        ("ppo_ext_clip", "ppo_ext_clip_nosde"),
    ),
}
# Returns that mean "has learned the task": for Pendulum (no official threshold) a common choice,
# LunarLander's official one. Hopper's 1000 turned out to be the level of the alive bonus (about 1 per step for 1000
# steps), which a policy reaches by balancing in place: read it as "stays up", not as locomotion. HalfCheetah's is provisional.
THRESHOLDS = {
    "Pendulum-v1": -200.0,
    "LunarLanderContinuous-v3": 200.0,
    "Hopper-v5": 1000.0,
    "HalfCheetah-v5": 1000.0,
    "MountainCarContinuous-v0": 90.0,  # gymnasium's reward_threshold
}
THROUGHPUT_TARGETS = {
    "PPOExt, squash off": 0.98,
    "PPOExt, squash on": 0.95,
    "MaskablePPOExt": 0.95,
    "RecurrentPPOExt, squash off": 0.95,
    "RecurrentPPOExt, squash on": 0.95,
}
# The speed bars of issue 22 for scripts/throughput.py --workload measurements: by (workload, variant), the
# least median of paired ratios (Ext ÷ upstream, CPU time). "PPOExt, squash off" is bit for bit stock PPO.
SPEED_BARS = {
    **{(workload, "PPOExt, squash off"): 1.2 for workload in ("hopper", "halfcheetah", "cartpole")},
    **{(workload, "PPOExt, squash off"): 1.1 for workload in ("pendulum", "lunarlander")},
    ("mountaincar", "PPOExt, squash off"): 1.0,
    **{
        (workload, "PPOExt, squash on"): 1.1
        for workload in ("hopper", "halfcheetah", "cartpole", "pendulum", "lunarlander", "mountaincar")
    },
    ("masked", "MaskablePPOExt"): 1.15,
    ("recurrent", "RecurrentPPOExt, squash off"): 1.1,
    # The fast mode (policy_kwargs=dict(fast=True)): not bit for bit.
    ("hopper", "PPOExt, fast"): 1.4,
    ("halfcheetah", "PPOExt, fast"): 1.4,
    ("recurrent", "RecurrentPPOExt, fast"): 1.5,
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


class BadRunError(ValueError):
    """A finished run's CSV cannot be a benchmark's evaluation record."""


def load_runs(results: Path) -> dict[str, dict[str, list[Run]]]:
    """
    Finished runs under ``results`` (``<env>/<algo>/seed<k>.csv`` with ``seed<k>.done.json``), by env and algo.
    A folder that does not exist has none.

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


# --- rliable ------------------------------------------------------------------------------------


def _rliable() -> tuple[Any, Any, Any]:
    """rliable's ``library``, ``metrics`` and ``plot_utils`` (imported on first use; matplotlib on Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    try:  # rliable's bootstrap, arch 7, needs pandas < 3 (the bench and test extras declare it)
        from rliable import library, metrics, plot_utils
    except ImportError as error:
        raise ImportError(f'the report needs rliable ({error}): pip install -e ".[bench]"') from error
    return library, metrics, plot_utils


@contextlib.contextmanager
def _seeded() -> Iterator[None]:
    """NumPy's global generator seeded with :data:`SEED` (rliable resamples with ``np.random.choice``), then restored."""
    state = np.random.get_state()
    np.random.seed(SEED)
    try:
        yield
    finally:
        np.random.set_state(state)


def _scores(values: Iterable[float]) -> np.ndarray:
    """rliable's score matrix of one env: ``(runs, 1)``."""
    return np.asarray(list(values), dtype=float).reshape(-1, 1)


def iqm_with_ci(finals: Iterable[float]) -> tuple[float, tuple[float, float]]:
    """rliable's IQM of the runs' final returns and its 95 % stratified-bootstrap percentile CI."""
    library, metrics, _ = _rliable()
    with _seeded():
        points, intervals = library.get_interval_estimates(
            {"runs": _scores(finals)},
            lambda scores: np.array([metrics.aggregate_iqm(scores)]),
            reps=IQM_REPS,
            confidence_interval_size=CONFIDENCE,
        )
    low, high = np.ravel(intervals["runs"])
    return float(points["runs"][0]), (float(low), float(high))


def improvement_probability(x: Iterable[float], y: Iterable[float]) -> tuple[float, tuple[float, float]]:
    """
    rliable's probability of improvement of X over Y (the Mann-Whitney U of X's runs against Y's,
    over ``n_x * n_y``: ties count one half) and its 95 % CI, each algorithm's runs resampled on their
    own (stratified independent bootstrap; the run counts may differ).
    """
    library, metrics, _ = _rliable()
    with _seeded():
        points, intervals = library.get_interval_estimates(
            {"x,y": (_scores(x), _scores(y))},
            metrics.probability_of_improvement,
            reps=IMPROVEMENT_REPS,
            confidence_interval_size=CONFIDENCE,
        )
    low, high = np.ravel(intervals["x,y"])
    return float(points["x,y"]), (float(low), float(high))


def performance_profiles(
    finals: dict[str, np.ndarray], taus: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """rliable's score distribution of each algorithm (fraction of runs above each tau) and its 95 % CIs."""
    library, _, _ = _rliable()
    profiles, intervals = {}, {}
    for algo, values in finals.items():  # one call each: an algorithm's band does not depend on the others
        with _seeded():
            profile, interval = library.create_performance_profile(
                {algo: _scores(values)}, taus, reps=PROFILE_REPS, confidence_interval_size=CONFIDENCE
            )
        profiles.update(profile)
        intervals.update(interval)
    return profiles, intervals


# --- segments and machines ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Segment:
    """A stretch of a run's training, trained in one go on one machine."""

    from_timesteps: int
    to_timesteps: int
    machine: str
    revision: str | None
    ended_at: str | None
    started_at: str | None = None
    train_time_s: float | None = None
    label: str | None = None  # the ``--machine`` label the segment recorded (which machine, by name)


def machine(marker: dict[str, Any]) -> str:
    """
    Where a run ran, as far as its marker says: core count and software versions. Timings are
    only compared between runs of one machine.
    """
    versions = ", ".join(f"{key} {value}" for key, value in marker.get("versions", {}).items())
    return f"{marker.get('cpu_count')} CPU cores; {versions}"


def _segment_machine(segment: dict[str, Any], marker: dict[str, Any]) -> str:
    """
    A segment's kind of machine, as :func:`machine` gives it for a whole run: its core count and
    software versions (the segment's own; for segments that did not record them, the marker's,
    that is the last segment's). Timings compare within one kind; the segment's ``--machine``
    label, which names the machine, is listed with the segments.
    """
    return machine({"cpu_count": segment.get("cpu_count"), "versions": segment.get("versions") or marker.get("versions", {})})


def run_segments(marker: dict[str, Any]) -> list[Segment]:
    """
    The segments a run was trained in: its marker's ``segments``, or for a marker without them (one
    written before runs could be resumed) one segment from step 0 to the marker's, on :func:`machine`.
    """
    if not marker.get("segments"):
        return [
            Segment(
                from_timesteps=0,
                to_timesteps=int(marker["timesteps"]),
                machine=machine(marker),
                revision=marker.get("sb3_ppo_ext_revision"),
                ended_at=marker.get("finished_at"),
                train_time_s=marker.get("train_time_s"),
            )
        ]
    return [
        Segment(
            from_timesteps=int(segment["from_timesteps"]),
            to_timesteps=int(segment["to_timesteps"]),
            machine=_segment_machine(segment, marker),
            revision=segment.get("revision"),
            ended_at=segment.get("ended_at"),
            started_at=segment.get("started_at"),
            train_time_s=segment.get("train_time_s"),
            label=segment.get("machine"),
        )
        for segment in marker["segments"]
    ]


def run_machines(run: Run) -> list[str]:
    """The machines a run's segments ran on, in order of first use."""
    return list(dict.fromkeys(segment.machine for segment in run_segments(run.marker)))


def is_mixed(run: Run) -> bool:
    """Whether a run's segments ran on more than one machine: its timings compare with nothing."""
    return len(run_machines(run)) > 1


def all_runs(runs: dict[str, dict[str, list[Run]]]) -> Iterator[Run]:
    """Every run of ``runs``, env by env and algo by algo."""
    for by_algo in runs.values():
        for algo_runs in by_algo.values():
            yield from algo_runs


def machine_labels(suites: list[dict[str, dict[str, list[Run]]]]) -> dict[str, str]:
    """A letter per machine of any segment of any suite's runs, in order of first appearance."""
    labels: dict[str, str] = {}
    for runs in suites:
        for run in all_runs(runs):
            for name in run_machines(run):
                labels.setdefault(name, chr(ord("A") + len(labels)))
    return labels


# --- statistics ---------------------------------------------------------------------------------


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
    machines: tuple[str, ...]  # of the runs whose timings count (each on one machine)
    mixed_runs: int = 0  # runs whose segments ran on different machines: left out of the timings
    all_machines: tuple[str, ...] = ()

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
    timed = [run for run in runs if not is_mixed(run)]
    iqm, ci = iqm_with_ci(finals)
    return Summary(
        algo=algo,
        seeds=[run.seed for run in runs],
        final_steps=int(min(run.timesteps[-1] for run in runs)),
        finals=finals,
        iqm=iqm,
        ci=ci,
        threshold_steps=[steps_to_threshold(run, threshold) for run in runs] if threshold is not None else [],
        wall_s=float(np.mean([run.marker["total_wall_time_s"] for run in timed])) if timed else float("nan"),
        fps=float(np.mean([run.marker["env_steps_per_s"] for run in timed])) if timed else float("nan"),
        machines=tuple(sorted({name for run in timed for name in run_machines(run)})),
        mixed_runs=len(runs) - len(timed),
        all_machines=tuple(sorted({name for run in runs for name in run_machines(run)})),
    )


def improvements(
    summaries: list[Summary], extra_pairs: Iterable[tuple[str, str]] = ()
) -> dict[tuple[str, str], tuple[float, tuple[float, float]]]:
    """
    Probability of improvement (and CI) of each PPOExt variant over each baseline that ran, and of a
    candidate entry over the shipped entry when both ran, by ``(variant, baseline)``.

    :param extra_pairs: further ``(variant, reference)`` pairs of the suite (:data:`SUITE_PAIRS`), compared when both ran
    """
    finals = {s.algo: s.finals for s in summaries}
    pairs = [
        (algo, baseline)
        for algo in finals
        if algo not in (*BASELINES, UNMASKED)
        for baseline in BASELINES
        if baseline in finals
    ]
    pairs += [
        (algo, reference) for algo, reference in (*VARIANT_PAIRS, *extra_pairs) if algo in finals and reference in finals
    ]
    return {(algo, baseline): improvement_probability(finals[algo], finals[baseline]) for algo, baseline in pairs}


def interquartile_mean(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """rliable's IQM (``aggregate_iqm``: the 25 % trimmed mean) along ``axis``."""
    return stats.trim_mean(scores, proportiontocut=0.25, axis=axis)


def curve_band(runs: list[Run], statistic: Any = np.mean) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """
    Timesteps, the statistic of the returns across seeds (default: the mean; :func:`interquartile_mean` for
    the IQM) and its 95 % percentile-bootstrap band, over the evaluations all seeds share.
    """
    length = min(len(run.returns) for run in runs)
    timesteps = np.median([run.timesteps[:length] for run in runs], axis=0)
    returns = np.array([run.returns[:length] for run in runs])  # seeds x evaluations
    mean = statistic(returns, axis=0)
    if len(runs) < 2:
        return timesteps, mean, mean, mean
    result = stats.bootstrap(
        (returns,),
        statistic,
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


# --- figures ------------------------------------------------------------------------------------


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
    _, _, plot_utils = _rliable()
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


def plot_improvements(
    env: str, found: dict[tuple[str, str], tuple[float, tuple[float, float]]], path: Path, title: str = ""
) -> None:
    """rliable's probability-of-improvement plot: each PPOExt variant X over each baseline Y."""
    import matplotlib.pyplot as plt

    _, _, plot_utils = _rliable()
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

    _, _, plot_utils = _rliable()
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


def _budget(steps: int) -> str:
    """A step budget as the suites state it: 100k, 1M."""
    return f"{steps // 1_000_000}M" if steps % 1_000_000 == 0 else f"{steps // 1000}k"


def _seed_list(seeds: list[int]) -> str:
    """Seeds as ranges: 0-2, 5, 7-15."""
    parts: list[str] = []
    for seed in sorted(seeds):
        if parts and parts[-1][1] == seed - 1:
            parts[-1][1] = seed
        else:
            parts.append([seed, seed])
    return ", ".join(str(a) if a == b else f"{a}{DASH}{b}" for a, b in parts)


def _timing_cells(s: Summary) -> tuple[str, str]:
    """Wall-clock and env-steps/s cells: runs whose segments ran on different machines are left out."""
    if not s.machines:
        return "— (runs split across machines)", "— (runs split across machines)"
    fps = f"{s.fps:.0f}"
    if s.mixed_runs:
        fps += f" (without {s.mixed_runs} run{'s' if s.mixed_runs > 1 else ''} split across machines)"
    return f"{s.wall_s:.0f} s", fps


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
        elif not s.machines or not stock.machines:
            ratio = "— (runs split across machines)"
        elif len(s.machines) != 1 or s.machines != stock.machines:
            ratio = "— (ran on another machine than stock PPO)"
        else:
            same = _settings_match_stock(by_algo[s.algo], by_algo[STOCK])
            ratio = f"{s.fps / stock.fps:.2f} ({'same settings but the variant' if same else 'different settings'})"
        name = f"`{s.algo}`"
        if s.algo in identical:
            name += " (= stock PPO: every evaluation of each of its seeds identical)"
        wall, fps = _timing_cells(s)
        lines.append(
            f"| {name} | {len(s.seeds)} | {s.final_steps} | {s.mean:.1f} ± {s.std:.1f} | {s.iqm:.1f} | "
            f"[{s.ci[0]:.1f}, {s.ci[1]:.1f}] | {crossing} | {wall} | {fps} | {ratio} |"
            + (f" {'+'.join(sorted(labels[m] for m in s.all_machines))} |" if labels else "")
        )
    return lines


def improvement_table(summaries: list[Summary], found: dict[tuple[str, str], tuple[float, tuple[float, float]]]) -> list[str]:
    """Probability of improvement of each PPOExt variant over each baseline (or the shipped entry) that ran on the env."""
    baselines = list(dict.fromkeys(baseline for _, baseline in found))
    variants = [s.algo for s in summaries if any(algo == s.algo for algo, _ in found)]
    if not found:
        return [
            "No probability of improvement: it needs a PPOExt variant and `ppo` or `trpo`, "
            f"or `{CANDIDATE}` and `{SHIPPED}`, on this env."
        ]
    lines = [
        "| algorithm X | " + " | ".join(f"P(X > `{b}`) | 95 % CI" for b in baselines) + " |",
        "|---|" + "---|---|" * len(baselines),
    ]
    for algo in variants:
        cells = []
        for baseline in baselines:
            if (algo, baseline) not in found:
                cells.append("— | —")
                continue
            p, (low, high) = found[algo, baseline]
            cells.append(f"{p:.2f} | [{low:.2f}, {high:.2f}]")
        lines.append(f"| `{algo}` | " + " | ".join(cells) + " |")
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
        workload = f" (rl-zoo3's settings, `--workload {throughput['workload']}`)" if throughput.get("workload") else ""
        lines += [f"### {FAMILY_TITLES.get(family, family)}, {throughput['env']}{workload}", "", *section, ""]
        ratios.update(section_ratios)
    return lines, ratios


def speed_bars_section(throughputs: list[dict[str, Any]]) -> list[str]:
    """
    Issue 22's speed bars (:data:`SPEED_BARS`) against the ``--workload`` measurements: met when the median
    of the paired ratios reaches the bar; the ratio of medians beside it.
    """
    measured = {
        (t["workload"], name): entry for t in throughputs if t.get("workload") for name, entry in t["variants"].items()
    }
    lines = [
        "| workload | variant | bar (median of paired ratios) | measured | ratio of medians | status |",
        "|---|---|---|---|---|---|",
    ]
    for (workload, variant), bar in SPEED_BARS.items():
        entry = measured.get((workload, variant))
        if entry is None:
            lines.append(f"| {workload} | {variant} | ≥ {bar} | not measured yet | — | — |")
            continue
        paired = entry["median_of_paired_ratios"]
        status = "met" if paired >= bar else "**missed**"
        lines.append(f"| {workload} | {variant} | ≥ {bar} | {paired:.3f} | {entry['ratio_of_medians']:.3f} | {status} |")
    return lines


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
    if throughput.get("workload"):
        command = f"--workload {throughput['workload']} --steps {throughput['steps']} --repeats {throughput['repeats']}"
    else:
        command = (
            f"{f'--family {family} ' if family else ''}--env {throughput['env']} --steps {throughput['steps']} "
            f"--repeats {throughput['repeats']} --n-envs {throughput['n_envs']}"
        )
    lines = [
        f"`python scripts/throughput.py {command} --json ...`, measured {throughput['measured_at']} on "
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
        ext = [s for algo, s in by_algo.items() if algo not in BASELINES]
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
        measured_as = [key for key in ratios if not key.endswith(" (best)") and (key == name or key.startswith(f"{name} @ "))]
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


def targets_1m_section(
    suite: str,
    summaries: dict[str, list[Summary]],
    found: dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]],
    complete: dict[str, bool],
) -> list[str]:
    """
    The 1M-step suite's goal, met / missed / not measured yet: on every env the best PPOExt variant's
    IQM at or above stock PPO's and TRPO's, and on at least one env its probability of improvement over
    stock PPO above 0.5 with the 95 % CI excluding 0.5. An env whose runs are incomplete (fewer
    seeds, steps or algorithms than the suite's) is not measured yet; its numbers so far are given.

    :param found: by env, the probabilities of improvement of :func:`improvements`
    :param complete: by env, whether its runs cover the suite's budget
    """
    envs = [budget.env for budget in SUITES[suite]]
    target = "best PPOExt variant IQM ≥ stock PPO's and ≥ TRPO's"
    lines = ["| target | env / variant | status | measured |", "|---|---|---|---|"]
    iqm_verdicts: dict[str, str] = {}
    best_p: list[str] = []
    separated, judged = [], []
    for env in envs:
        by_algo = {s.algo: s for s in summaries.get(env, [])}
        variants = [s for algo, s in by_algo.items() if algo not in BASELINES]
        if any(baseline not in by_algo for baseline in BASELINES) or not variants:
            lines.append(f"| {target} | {env} | not measured yet | — |")
            continue
        best = max(variants, key=lambda s: s.iqm)
        margins = {baseline: best.iqm - by_algo[baseline].iqm for baseline in BASELINES}
        verdict = "met" if all(margin >= 0 for margin in margins.values()) else "missed"
        measured = f"{best.iqm:.1f} vs " + ", ".join(
            f"`{baseline}` {by_algo[baseline].iqm:.1f} ({margin:+.1f})" for baseline, margin in margins.items()
        )
        p, (low, high) = found[env][best.algo, STOCK]
        best_p.append(f"{env} (`{best.algo}`): {p:.2f} [{low:.2f}, {high:.2f}]" + ("" if complete[env] else " so far"))
        if complete[env]:
            iqm_verdicts[env] = verdict
            status = "met" if verdict == "met" else "**missed**"
            judged.append(env)
            if p > 0.5 and low > 0.5:
                separated.append(env)
        else:
            status = f"not measured yet (runs incomplete; so far {verdict})"
        lines.append(f"| {target} | {env} (`{best.algo}`) | {status} | {measured} |")
    if separated:
        p_status = "met"
    elif len(judged) == len(envs):
        p_status = "**missed**"
    else:
        p_status = f"not measured yet ({len(judged)} of {len(envs)} envs complete)"
    lines.append(
        f"| P(best variant > stock PPO) > 0.5, 95 % CI excluding 0.5, on ≥ 1 env | {', '.join(envs)} | {p_status} | "
        f"{'; '.join(best_p) or '—'} |"
    )
    if "missed" in iqm_verdicts.values() or p_status == "**missed**":
        goal = "**missed**"
    elif p_status == "met" and len(iqm_verdicts) == len(envs):
        goal = "met"
    else:
        goal = "not measured yet"
    lines.append(f"| the goal: both targets above, on both envs | {', '.join(envs)} | {goal} | — |")
    return lines


def masked_targets_section(
    suite: str,
    summaries: dict[str, list[Summary]],
    found: dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]],
    complete: dict[str, bool],
) -> list[str]:
    """
    The masked suite's question, per env: does MaskablePPOExt through the zoo (masked training and
    masked evaluation) beat stock PPO at the same settings without masks? Met when a masked variant's
    IQM is higher and the CI of its probability of improvement lies above 0.5.

    :param complete: by env, whether its runs cover the suite's budget
    """
    lines = ["| target | env | status | measured |", "|---|---|---|---|"]
    for budget in SUITES[suite]:
        env = budget.env
        by_algo = {s.algo: s for s in summaries.get(env, [])}
        masked = [s for algo, s in by_algo.items() if algo != UNMASKED]
        if UNMASKED not in by_algo or not masked:
            lines.append(f"| a masked variant above unmasked stock PPO | {env} | not measured yet | — |")
            continue
        stock, best = by_algo[UNMASKED], max(masked, key=lambda s: s.iqm)
        probability, (low, high) = found[env][(best.algo, UNMASKED)]
        above = best.iqm > stock.iqm and low > 0.5
        status = ("met" if above else "**missed**") if complete.get(env) else "not measured yet (runs incomplete)"
        lines.append(
            f"| a masked variant above unmasked stock PPO | {env} (`{best.algo}`) | {status} | IQM {best.iqm:.1f} vs "
            f"{stock.iqm:.1f} ({best.iqm - stock.iqm:+.1f}); P(improvement) {probability:.2f} [{low:.2f}, {high:.2f}] |"
        )
    return lines


def heads_section(
    suite: str,
    summaries: dict[str, list[Summary]],
    found: dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]],
    complete: dict[str, bool],
) -> list[str]:
    """
    The heads suite's question, per env: at the same settings, which Box action head learns best? Every
    pair of :data:`SUITE_PAIRS` that ran, with the IQM difference and the probability of improvement. A head
    is "better" than another when its IQM is higher and the CI of its probability of improvement lies above
    0.5; "worse" when the CI lies below; otherwise the data cannot tell them apart at this many seeds.

    :param complete: by env, whether its runs cover the suite's budget
    """
    lines = ["| env | head | vs head | IQM difference | P(improvement) [95 % CI] | verdict |", "|---|---|---|---|---|---|"]
    for budget in SUITES[suite]:
        env = budget.env
        by_algo = {s.algo: s for s in summaries.get(env, [])}
        pairs = [(a, b) for a, b in SUITE_PAIRS[suite] if (a, b) in found.get(env, {})]
        if not pairs or not complete.get(env):
            lines.append(f"| {env} | — | — | — | — | not measured yet{'' if not pairs else ' (runs incomplete)'} |")
            continue
        for head, other in pairs:
            probability, (low, high) = found[env][(head, other)]
            diff = by_algo[head].iqm - by_algo[other].iqm
            if diff > 0 and low > 0.5:
                verdict = "better"
            elif diff < 0 and high < 0.5:
                verdict = "worse"
            else:
                verdict = "not distinguishable"
            lines.append(
                f"| {env} | {HEAD_NAMES.get(head, head)} (`{head}`) | {HEAD_NAMES.get(other, other)} (`{other}`) "
                f"| {diff:+.1f} ({by_algo[head].iqm:.1f} vs {by_algo[other].iqm:.1f}) "
                f"| {probability:.2f} [{low:.2f}, {high:.2f}] | {verdict} |"
            )
    return lines


def fast_section(
    suite: SuiteResults,
    summaries: dict[str, list[Summary]],
    found: dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]],
    complete: dict[str, bool],
) -> list[str]:
    """
    The fast suite's question, per env: does fast mode (``policy_kwargs=dict(fast=True)``, not bit for bit)
    learn like the default? Compared as rliable would: the IQM of the final returns with its 95 %
    stratified-bootstrap CI for each, the probability that a fast run beats a default one, and the learning
    curves evaluation by evaluation (the IQM's 95 % percentile-bootstrap CIs of the two at each evaluation
    all the seeds reached; one task, so rliable's stratified bootstrap is this one).
    "Same learning curves" when the two CIs overlap at every evaluation and the CI of the probability of
    improvement contains 0.5.

    :param complete: by env, whether its runs cover the suite's budget
    """
    fast, default = FAST_PAIR
    lines = [
        "| env | seeds | default IQM [95 % CI] | fast IQM [95 % CI] | P(fast > default) [95 % CI] "
        "| evaluations whose IQM CIs overlap | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for budget in SUITES[suite.name]:
        env = budget.env
        by_algo = {s.algo: s for s in summaries.get(env, [])}
        runs = suite.runs.get(env, {})
        if not complete.get(env) or (fast, default) not in found.get(env, {}):
            lines.append(f"| {env} | — | — | — | — | — | not measured yet |")
            continue
        length = min(len(run.returns) for algo in FAST_PAIR for run in runs[algo])
        (_, _, fast_low, fast_high), (_, _, low, high) = (curve_band(runs[algo], interquartile_mean) for algo in FAST_PAIR)
        overlapping = int(np.sum((fast_low[:length] <= high[:length]) & (low[:length] <= fast_high[:length])))
        probability, (p_low, p_high) = found[env][(fast, default)]
        same = overlapping == length and p_low <= 0.5 <= p_high
        a, b = by_algo[default], by_algo[fast]
        lines.append(
            f"| {env} | {len(a.seeds)} + {len(b.seeds)} | {a.iqm:.1f} [{a.ci[0]:.1f}, {a.ci[1]:.1f}] "
            f"| {b.iqm:.1f} [{b.ci[0]:.1f}, {b.ci[1]:.1f}] | {probability:.2f} [{p_low:.2f}, {p_high:.2f}] "
            f"| {overlapping} of {length} | {'same learning curves' if same else '**different**'} |"
        )
    return lines


def validation_section(
    suite: str,
    summaries: dict[str, list[Summary]],
    found: dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]],
    complete: dict[str, bool],
) -> list[str]:
    """
    The verdict on a candidate entry, env by env: it **wins** (ship it) when its runs are complete,
    its IQM is above the shipped entry's and its probability of improvement over the shipped entry
    has a 95 % CI above 0.5; it does not win otherwise; incomplete runs are not judged yet.

    :param found: by env, the probabilities of improvement of :func:`improvements`
    :param complete: by env, whether its runs cover the suite's budget
    """
    target = f"`{CANDIDATE}` IQM > `{SHIPPED}`'s and P(`{CANDIDATE}` > `{SHIPPED}`) with its 95 % CI above 0.5"
    lines = ["| target | env | status | measured |", "|---|---|---|---|"]
    for budget in SUITES[suite]:
        by_algo = {s.algo: s for s in summaries.get(budget.env, [])}
        if CANDIDATE not in by_algo or SHIPPED not in by_algo:
            lines.append(f"| {target} | {budget.env} | not measured yet | — |")
            continue
        candidate, shipped = by_algo[CANDIDATE], by_algo[SHIPPED]
        p, (low, high) = found[budget.env][CANDIDATE, SHIPPED]
        wins = candidate.iqm > shipped.iqm and low > 0.5
        measured = (
            f"IQM {candidate.iqm:.1f} [{candidate.ci[0]:.1f}, {candidate.ci[1]:.1f}] vs {shipped.iqm:.1f} "
            f"[{shipped.ci[0]:.1f}, {shipped.ci[1]:.1f}] ({candidate.iqm - shipped.iqm:+.1f}); "
            f"P = {p:.2f} [{low:.2f}, {high:.2f}]"
        )
        if complete[budget.env]:
            status = "**wins**: ship it" if wins else "does not win: keep the shipped entry"
        else:
            status = f"not judged yet (runs incomplete; so far it {'wins' if wins else 'does not win'})"
        lines.append(f"| {target} | {budget.env} | {status} | {measured} |")
    return lines


def budget_complete(budget: Any, by_algo: dict[str, list[Run]], stale: Iterable[tuple[str, str, int]] = ()) -> bool:
    """
    Whether an env's runs cover its suite budget: every algorithm with its seeds and steps, not
    counting the ``stale`` runs (``(env, algo, seed)``: recorded with earlier settings).
    """
    if not by_algo:
        return False
    stale = set(stale)
    steps = min(run.marker["budget"]["steps"] for algo_runs in by_algo.values() for run in algo_runs)
    current = {
        algo: [run for run in algo_runs if (run.env, run.algo, run.seed) not in stale] for algo, algo_runs in by_algo.items()
    }
    return steps >= budget.steps and all(len(current.get(algo, [])) >= budget.seeds for algo in (budget.algos or ALGOS))


def coverage_section(suite: SuiteResults) -> list[str]:
    runs, stale = suite.runs, suite.uncounted
    lines = [] if runs else [f"Not run yet: no finished run under `{suite.folder}`.", ""]
    lines += ["| env | required by the suite | run for this report | status |", "|---|---|---|---|"]
    for budget in SUITES[suite.name]:
        algos = budget.algos or tuple(ALGOS)
        required = f"{_budget(budget.steps)} steps x {budget.seeds} seeds: {', '.join(f'`{a}`' for a in algos)}"
        by_algo = runs.get(budget.env, {})
        if not by_algo:
            lines.append(f"| {budget.env} | {required} | — | **not run** |")
            continue
        done = ", ".join(f"`{algo}` {len(by_algo.get(algo, []))}" for algo in dict.fromkeys([*algos, *by_algo]))
        steps = min(run.marker["budget"]["steps"] for algo_runs in by_algo.values() for run in algo_runs)
        status = "complete" if budget_complete(budget, by_algo, stale) else "**partial**"
        stale_here = sum(env == budget.env for env, _, _ in stale)
        status += f" ({stale_here} runs with earlier settings)" if stale_here else ""
        lines.append(f"| {budget.env} | {required} | {_budget(steps)} steps; seeds per algorithm: {done} | {status} |")
    return lines


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


def earlier_settings_section(suite: SuiteResults) -> list[str]:
    """The suite's :func:`earlier_settings` as a paragraph and a list (seeds grouped); nothing when every run matches."""
    found: dict[tuple[str, str, tuple[str, ...]], list[int]] = {}
    for (env, algo, seed), changed in suite.earlier.items():
        found.setdefault((env, algo, tuple(changed)), []).append(seed)
    if not found:
        return []
    if suite.name in VALIDATION_SUITES:
        intro = (
            "Runs recorded with settings that differ from the shipped entry's now: the entry that was shipped when "
            f"`{CANDIDATE}` was judged against it (a candidate that won has replaced it since); their markers record it."
        )
    else:
        intro = (
            "Runs recorded with settings that differ from the ones this suite trains now (the entry changed after "
            "they ran): their numbers are those of the earlier settings, which their markers record, and "
            "`scripts/benchmark.py` reruns them."
        )
    lines = [intro, ""]
    for (env, algo, keys), seeds in found.items():
        shown = ", ".join(keys[:10]) + (f" and {len(keys) - 10} more" if len(keys) > 10 else "")
        lines.append(f"- {env} `{algo}`, seeds {_seed_list(seeds)}: {shown}")
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


def tuning_section(suites: str | list[str], yml: Path, studies: list[tuple[str, str]] = ()) -> list[str]:
    """
    Which envs of the suites have a tuned entry in the shipped yml, and by which study; then the
    progress of each of ``studies`` ((storage, study name) pairs, read with ``zoo_study.py``'s status).
    """
    tuned = tuned_comments(yml)
    names = [suites] if isinstance(suites, str) else suites
    envs = dict.fromkeys(budget.env for name in names for budget in SUITES[name])
    lines = ["| env | shipped `ppo_ext.yml` entry |", "|---|---|"]
    for env in envs:
        comment = tuned.get(env)
        text = "<br>".join(comment) if comment else "not tuned: the starting point (rl-zoo3's `ppo.yml` settings)"
        lines.append(f"| {env} | {text} |")
    if studies:
        import optuna
        from zoo_study import study_status

        from sb3_ppo_ext.samplers import make_storage

        lines += ["", "Studies read from their storage when this report was written:", ""]
        for storage, name in studies:
            study = optuna.load_study(study_name=name, storage=make_storage(storage))
            lines.append(f"- `{storage}`: {study_status(study)}")
    return lines


def _describe_segments(run: Run, labels: dict[str, str]) -> str:
    """``0-500k on A @ 329b014, ended 2026-11-30; ...`` (steps, machine, sb3_ppo_ext commit, day it ended)."""
    parts = []
    for segment in run_segments(run.marker):
        start = "0" if segment.from_timesteps == 0 else _steps(segment.from_timesteps)
        where = labels[segment.machine] + (f" ({segment.label})" if segment.label else "")
        text = f"{start}{DASH}{_steps(segment.to_timesteps)} on {where} @ {segment.revision or 'unrecorded'}"
        if segment.ended_at:
            text += f", ended {segment.ended_at[:10]}"
        parts.append(text)
    return "; ".join(parts) + (" (machines differ: timings left out)" if is_mixed(run) else "")


def segments_section(suite: SuiteResults, labels: dict[str, str]) -> list[str]:
    """
    One row per run, listing its segments; seeds of one algorithm whose segments read the same
    (same steps, machines, commits and days) share a row.
    """
    if not suite.runs:
        return [f"Suite `{suite.name}`: no finished run yet."]
    lines = [
        f"Suite `{suite.name}`:",
        "",
        "| env | algorithm | seeds | segments: steps on machine @ sb3_ppo_ext commit, day it ended |",
        "|---|---|---|---|",
    ]
    for env, by_algo in suite.runs.items():
        for algo, algo_runs in by_algo.items():
            rows: dict[str, list[int]] = {}
            for run in algo_runs:
                rows.setdefault(_describe_segments(run, labels), []).append(run.seed)
            lines += [f"| {env} | `{algo}` | {_seed_list(seeds)} | {text} |" for text, seeds in rows.items()]
    return lines


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
        f"percentile, {IQM_REPS} resamples of the runs); **probability of improvement** P(X > Y) of each PPOExt "
        "variant X over stock PPO and over TRPO (where it ran) = `metrics.probability_of_improvement`, the "
        "Mann-Whitney U statistic over n_X n_Y (the chance that a random run of X ends above a random run of Y, ties "
        "counting one half), with a 95 % CI from rliable's independent stratified bootstrap (each algorithm's runs "
        f"resampled with its own run count, so unequal seed counts are fine; {IMPROVEMENT_REPS} resamples); "
        "**performance profile** = the fraction of runs whose final return is above τ, with 95 % CIs "
        f"(`library.create_performance_profile`, {PROFILE_REPS} resamples). The figures beside each env's learning "
        "curves are rliable's `plot_utils` plots of these three. rliable draws its resamples from NumPy's global "
        "generator, which the report seeds (0) for each estimate, so the intervals are reproducible. "
        "**Learning curves**: mean across seeds with a 95 % percentile bootstrap band (`scipy.stats.bootstrap`, "
        f"{N_RESAMPLES} resamples). **Steps to threshold**: per seed, the first evaluation at or above the threshold; "
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
    suite: SuiteResults, out_md: Path, figures: Path, labels: dict[str, str]
) -> tuple[list[str], dict[str, list[Summary]], dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]]]:
    """The suite's coverage and, per env, tables and figures; its summaries and probabilities of improvement by env."""
    summaries: dict[str, list[Summary]] = {}
    found: dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]] = {}
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
        plot_env(env, by_algo, curves, threshold, title)
        plot_iqm(env, env_summaries, iqm_png, title)
        plot_profiles(env, env_summaries, profile_png, title)
        rliable_figures = [f"![{env} IQM, 95 % CIs ({suite.name})]({_relative(iqm_png, out_md.parent)})"]
        rliable_figures.append(f"![{env} performance profiles ({suite.name})]({_relative(profile_png, out_md.parent)})")
        if found[env]:
            improvement_png = folder / f"{env}-improvement.png"
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
        "    --throughput docs/benchmarks/throughput*.json --notes docs/benchmarks/notes.md",
        "# or rebuild this report from the committed inputs alone:",
        "python scripts/benchmark_report.py --results issue=docs/benchmarks/data \\",
        "    --results mujoco-1m=docs/benchmarks/data-1m --results tuned-1m=docs/benchmarks/data-tuned-1m \\",
        "    --results masked=docs/benchmarks/data-masked --results heads=docs/benchmarks/data-heads \\",
        "    --results fast=docs/benchmarks/data-fast --keep-data '' \\",
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
) -> dict[str, dict[str, list[Summary]]]:
    """
    Write the markdown report and the PNGs; return the summaries by suite and env.

    :param studies: (storage, study name) of Optuna studies whose progress the tuning section lists
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
    found: dict[str, dict[str, dict[tuple[str, str], tuple[float, tuple[float, float]]]]] = {}
    for suite in suites:
        section, summaries[suite.name], found[suite.name] = suite_section(suite, out_md, figures, labels)
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
        marker = run.csv_path.with_name(run.csv_path.name.replace(".csv", ".done.json"))
        for source in (run.csv_path, marker):
            if source.resolve() != (target / source.name).resolve():
                shutil.copyfile(source, target / source.name)


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
    )
    for suite, by_env in summaries.items():
        for env, env_summaries in by_env.items():
            for s in env_summaries:
                print(f"{suite} {env} {s.algo}: IQM {s.iqm:.1f} [{s.ci[0]:.1f}, {s.ci[1]:.1f}] over {len(s.seeds)} seeds")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
