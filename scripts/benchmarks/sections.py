"""The report's tables, one function per section: per-env results, throughput, coverage, tuning.

Each returns markdown lines; the comparisons each suite was run for are :mod:`benchmarks.targets`'.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .records import Run
from .stats import Improvements, Summary
from .suites import ALGOS, CANDIDATE, SHIPPED, STOCK, SUITES, VALIDATION_SUITES

if TYPE_CHECKING:
    from .report import SuiteResults

DASH = "\u2013"  # an en dash: ranges of steps and seeds (0-300k, seeds 0-15 with it)


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


def improvement_table(summaries: list[Summary], found: Improvements) -> list[str]:
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


def current_throughputs(throughputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """
    The measurements that are current: those that time some variant (other than the reference, the first) most
    recently (``measured_at``) on its workload and protocol. Earlier measurements of the same are history.
    """
    newest: dict[tuple, dict[str, Any]] = {}
    for throughput in sorted(throughputs, key=lambda t: t.get("measured_at", "")):
        workload = throughput.get("workload") or throughput["env"]
        where = (throughput.get("family"), workload, bool(throughput.get("warm_model")), _backend(throughput))
        for name in list(throughput["variants"])[1:]:
            newest[(*where, name)] = throughput
    return list({id(t): t for t in newest.values()}.values())


def _backend(throughput: dict[str, Any]) -> str:
    return throughput.get("env_backend", "gymnasium")


def _machine(throughput: dict[str, Any]) -> str:
    machine = throughput["machine"]
    return ", ".join(filter(None, [f"{machine['cpu_count']}-core", machine.get("cpu_model"), machine.get("cpu_capability")]))


def throughput_table(throughputs: list[dict[str, Any]]) -> list[str]:
    """One table of the current measurements (:func:`current_throughputs`), a row per variant, the reference first."""
    current = current_throughputs(throughputs)
    if not current:
        return ["Not measured for this report (`scripts/throughput.py --json` output not given)."]
    lines = [
        "Each Ext algorithm ÷ its upstream algorithm (the first row of each workload), identical hyperparameters "
        "(rl-zoo3's for the workload), all diagnostics on: `python scripts/throughput.py --workload NAME --steps N "
        "--repeats R`, timed by the process CPU time of one single-threaded process (`time.process_time()`: time "
        "other processes hold the CPU is not counted), the variants interleaved (order reversed every other repeat). "
        "`--warm-model` rows time each model after its first rollout (SBX compiles per model). *on EnvPool* rows "
        "(`--env-backend envpool`) step the task's EnvPool envs, whose threads' CPU time is counted too.",
        "",
        "| workload | variant | settings | median env-steps/s | ÷ reference (medians) | best env-steps/s "
        "| ÷ reference (bests) | median of paired ratios | measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for throughput in current:
        workload = throughput.get("workload") or throughput["env"]
        title = f"{workload} ({throughput['env']})" if workload != throughput["env"] else workload
        if throughput.get("warm_model"):
            title += " (`--warm-model`)"
        if _backend(throughput) == "envpool":
            title += " on EnvPool"
        when = (
            f"{throughput['measured_at'][:10]}, {throughput.get('commit') or 'commit not recorded'}, "
            f"{throughput['steps']} steps x {throughput['repeats']}, {_machine(throughput)}"
        )
        for name, entry in throughput["variants"].items():
            paired = entry.get("median_of_paired_ratios")
            lines.append(
                f"| {title} | {name} | `{entry['kwargs']}` | {entry['median']:.0f} | {entry['ratio_of_medians']:.3f} "
                f"| {entry['best']:.0f} | {entry['ratio_of_bests']:.3f} | {'—' if paired is None else f'{paired:.3f}'} "
                f"| {when} |"
            )
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
        from zoo_study import study_status  # scripts/zoo_study.py: scripts/ is on sys.path (the CLI's folder)

        from sb3_ppo_ext.storage import make_storage

        lines += ["", "Studies read from their storage when this report was written:", ""]
        for storage, name in studies:
            study = optuna.load_study(study_name=name, storage=make_storage(storage))
            lines.append(f"- `{storage}`: {study_status(study)}")
    return lines
