"""The comparisons that the masked, heads, fast and candidate suites were run for.

Each takes a suite's summaries and probabilities of improvement (:mod:`benchmarks.stats`) and returns
the markdown table of its comparison, env by env (incomplete runs are not judged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .stats import Improvements, Summary, curve_band, interquartile_mean
from .suites import (
    CANDIDATE,
    FAST_PAIRS,
    HEAD_NAMES,
    SHIPPED,
    SUITE_PAIRS,
    SUITES,
    UNMASKED,
)

if TYPE_CHECKING:
    from .report import SuiteResults


def masked_section(
    suite: str,
    summaries: dict[str, list[Summary]],
    found: dict[str, Improvements],
    complete: dict[str, bool],
) -> list[str]:
    """
    The masked suite's question, per env: does MaskablePPOExt through the zoo (masked training and
    masked evaluation) beat stock PPO at the same settings without masks? Yes when a masked variant's
    IQM is higher and the CI of its probability of improvement lies above 0.5.

    :param complete: by env, whether its runs cover the suite's budget
    """
    lines = ["| question | env | answer | measured |", "|---|---|---|---|"]
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
        status = ("yes" if above else "**no**") if complete.get(env) else "not measured yet (runs incomplete)"
        lines.append(
            f"| a masked variant above unmasked stock PPO | {env} (`{best.algo}`) | {status} | IQM {best.iqm:.1f} vs "
            f"{stock.iqm:.1f} ({best.iqm - stock.iqm:+.1f}); P(improvement) {probability:.2f} [{low:.2f}, {high:.2f}] |"
        )
    return lines


def heads_section(
    suite: str,
    summaries: dict[str, list[Summary]],
    found: dict[str, Improvements],
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
    found: dict[str, Improvements],
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
    pair = FAST_PAIRS[suite.name]
    fast, default = pair
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
        length = min(len(run.returns) for algo in pair for run in runs[algo])
        (_, _, fast_low, fast_high), (_, _, low, high) = (curve_band(runs[algo], interquartile_mean) for algo in pair)
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
    found: dict[str, Improvements],
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
    lines = ["| question | env | answer | measured |", "|---|---|---|---|"]
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
