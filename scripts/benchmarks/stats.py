"""The report's statistics: rliable's IQM, probability of improvement and profiles (seeded), summaries, curve bands.

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

drawn (:mod:`benchmarks.plots`) with ``rliable.plot_utils`` (IQM intervals, probability of improvement,
performance profile) beside the learning curves (mean across seeds, 95 % percentile bootstrap band of
``scipy.stats.bootstrap``, :func:`curve_band`).
rliable draws its resamples from NumPy's global generator (its ``random_state`` argument does not
reach the resampling), so each estimate is computed with that generator seeded with :data:`SEED` (0) and
restored afterwards: the report is reproducible.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from scipy import stats

from .records import Run, is_mixed, run_machines
from .suites import BASELINES, UNMASKED, VARIANT_PAIRS

# Probabilities of improvement with their 95 % CIs, by (variant, reference): what improvements() returns.
Improvements = dict[tuple[str, str], tuple[float, tuple[float, float]]]
CONFIDENCE = 0.95
N_RESAMPLES = 10_000  # the learning curves' bands (scipy)
# rliable's bootstrap resamples: its README's 50 000 for aggregate metrics would cost minutes here for
# 10 000's third decimal; 2 000 is its default for performance profiles (and its examples' for the
# probability of improvement, whose values are multiples of 1 / (n_x n_y) anyway).
IQM_REPS = 10_000
IMPROVEMENT_REPS = 2_000
PROFILE_REPS = 2_000
SEED = 0


def load_rliable() -> tuple[Any, Any, Any]:
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
    library, metrics, _ = load_rliable()
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
    library, metrics, _ = load_rliable()
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
    library, _, _ = load_rliable()
    profiles, intervals = {}, {}
    for algo, values in finals.items():  # one call each: an algorithm's band does not depend on the others
        with _seeded():
            profile, interval = library.create_performance_profile(
                {algo: _scores(values)}, taus, reps=PROFILE_REPS, confidence_interval_size=CONFIDENCE
            )
        profiles.update(profile)
        intervals.update(interval)
    return profiles, intervals


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


def improvements(summaries: list[Summary], extra_pairs: Iterable[tuple[str, str]] = ()) -> Improvements:
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
