"""The verdicts on each suite's targets: issue 5's, the 1M goal, masked, heads, fast mode, candidates, speed bars.

Each takes a suite's summaries and probabilities of improvement (:mod:`benchmarks.stats`) and returns
the markdown table of its targets, each met, missed or not measured yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .stats import Improvements, Summary, curve_band, interquartile_mean
from .suites import (
    BASELINES,
    CANDIDATE,
    FAST_PAIRS,
    HEAD_NAMES,
    SHIPPED,
    SPEED_BARS,
    STOCK,
    SUITE_PAIRS,
    SUITES,
    THROUGHPUT_TARGETS,
    UNMASKED,
)

if TYPE_CHECKING:
    from .report import SuiteResults


def speed_bars_section(throughputs: list[dict[str, Any]]) -> list[str]:
    """
    Issue 22's speed bars (:data:`SPEED_BARS`) against the ``--workload`` measurements: met when the median
    of the paired ratios reaches the bar; the ratio of medians beside it. Where several measurements time the
    same variant on the same workload, the newest (``measured_at``) is judged, whatever the order of the files.
    Runs of another protocol (``--warm-model``, for SBX's reference row) are not judged.
    """
    standard = (t for t in throughputs if t.get("workload") and not t.get("warm_model"))
    newest_last = sorted(standard, key=lambda t: t.get("measured_at", ""))
    measured = {(t["workload"], name): entry for t in newest_last for name, entry in t["variants"].items()}
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
    found: dict[str, Improvements],
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
    found: dict[str, Improvements],
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
