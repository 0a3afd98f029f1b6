"""Benchmark matrix: PPOExt variants against stock PPO and TRPO, algorithms x envs x seeds, in parallel processes.

Every model is built by rl-zoo3's own ``ExperimentManager`` (the path ``python -m rl_zoo3.train``
takes: hyperparameter preprocessing, schedules, ``normalize``, ``n_envs``, env wrappers), so stock
PPO gets exactly rl-zoo3's ``ppo.yml`` entry and the PPOExt variants the shipped ``ppo_ext.yml``
entry (see ``ALGOS``). Every algorithm gets the same seeds and the same env-step budget.

Each run evaluates deterministically on a separate eval env (VecNormalize statistics synced from
the training env when ``normalize`` is on) at step 0, at every multiple of ``--eval-freq`` below
the budget and once more after the last update. It writes ``<out>/<env>/<algo>/seed<k>.csv``
(``timesteps, mean_return, std_return, episodes, wall_time, fps, cpu_time``: ``wall_time`` is the
training time so far, evaluations excluded, ``fps`` the env steps per second of that time, ``cpu_time``
the process's CPU time of that training, all threads, EnvPool's included) and then a
``seed<k>.done.json`` marker (total wall-clock, training time, env-steps/s, the hyperparameters
used, versions, and the run's segments). Both are written to a temporary file and renamed. A
restarted benchmark skips runs whose marker matches the requested budget and settings.
``scripts/benchmark_report.py --results SUITE=FOLDER`` then records a suite's finished runs in one
file, ``docs/benchmarks/records/SUITE.jsonl``, from which the committed report is rebuilt.

Runs survive being cut off. At the first rollout boundary after each evaluation a run writes an
atomic checkpoint, ``seed<k>.ckpt``: the model (policy, optimizer, step count, learning-rate
schedule, PPOExt's current beta), the VecNormalize statistics, the torch/numpy/random generator
states, the evaluations so far and the segments so far. A restarted run continues from it, on
this machine or another (copy the results folder there and back): evaluations after the last
checkpoint are redone, the rest are kept. The envs' episodes in flight are not saved; a resumed
run starts new ones, seeded from the run's seed and the step it resumes at, so it is deterministic
but not bit-identical to an uninterrupted run. A checkpoint whose budget or settings differ from
the run's (or that cannot be read) is discarded and the run starts over: results are never mixed.
Each segment records its machine (``--machine``), core count, package commit and times.
``--segment-steps N`` pauses every run at its first checkpoint N steps on, ``--stop-after M`` at
its next checkpoint after M minutes (and starts no run after that): the way to fit a 1M-step run
into commands of ten minutes on a lent machine.

One writer per run: a run holds an exclusive lock on ``seed<k>.lock`` while it trains, and a second
process that reaches the same run (another benchmark on the same ``--out``) fails that run at once
with a message instead of writing into its files. The lock dies with its process, so a killed run
never blocks a restart. Worker processes exit when the benchmark process that started them dies
(killed, not just interrupted), so no orphaned worker keeps writing results.

    python scripts/benchmark.py --suite pendulum --workers 1
    python scripts/benchmark.py --suite mujoco-1m --machine "local 2-core" --stop-after 120   # into logs/benchmark/mujoco-1m
    python scripts/benchmark.py --envs Pendulum-v1 --algos ppo ppo_ext_clip --seeds 2 --steps 20000
    python scripts/benchmark.py --suite tuned-1m   # a tuned entry, fresh seeds
    python scripts/benchmark.py --suite heads      # clipped, squashed and Beta heads
    python scripts/benchmark.py --suite fast       # fast mode against the default
    python scripts/benchmark.py --suite time-to-score             # the EnvPool entries, CPU-seconds to a score
    python scripts/benchmark.py --suite time-to-score-references  # stock PPO (rl-zoo3's v4 settings), the 1-env entries
    python scripts/benchmark_report.py --results heads=logs/benchmark/heads   # the report; records the suite's runs

A tuned entry is validated as ``ppo_ext_tuned``: the entry for the env in ``--candidate FILE`` (a
yml as ``scripts/zoo_study.py best`` writes it; the ``tuned-1m`` suite reads
``docs/benchmarks/study/candidates.yml``), trained beside the shipped entry (``ppo_ext_clip``) on seeds
the study did not use. Its entry's settings are part of what a finished run or checkpoint must match.

Run one process per core at most (``--workers``, default: the core count); each uses one torch thread.

This is the command line of the ``benchmarks`` package (``scripts/benchmarks/``): the suites are
``benchmarks.suites``', the runs ``benchmarks.runner``'s, their files ``benchmarks.records``'.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.checkpoints import read_checkpoint
from benchmarks.runner import build_matrix, is_finished, run_matrix
from benchmarks.suites import ALGOS, CANDIDATE, SUITE_CANDIDATES, SUITES

DEFAULT_OUT = "logs/benchmark"  # logs/ is git-ignored; each suite's runs in a folder of their own


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="pendulum", help="preset envs and budgets")
    parser.add_argument("--envs", nargs="+", help="env ids instead of a suite (budget from --steps/--seeds/--eval-freq)")
    parser.add_argument(
        "--algos",
        nargs="+",
        choices=list(ALGOS),
        help=f"algorithms (default: all, {CANDIDATE} only with a candidate; a suite may limit an env to some)",
    )
    parser.add_argument(
        "--candidate",
        help=f"yml of candidate entries by env id (scripts/zoo_study.py best) that {CANDIDATE} runs "
        f"(default for a suite: {SUITE_CANDIDATES})",
    )
    parser.add_argument("--steps", type=int, help="env-step budget per run (overrides the suite)")
    parser.add_argument("--seeds", type=int, help="number of seeds (overrides the suite)")
    parser.add_argument("--first-seed", type=int, help="first seed (default: the suite's, 0 for --envs)")
    parser.add_argument("--eval-freq", type=int, help="evaluate every this many env steps (overrides the suite)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel processes (default: core count)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help=f"results folder (default {DEFAULT_OUT}/SUITE, or {DEFAULT_OUT}/envs with --envs)")
    parser.add_argument(
        "--machine", help="label of this machine in the runs' segment records (default: host name and core count)"
    )
    parser.add_argument(
        "--segment-steps", type=int, help="pause each run at its first checkpoint after this many more env steps"
    )
    parser.add_argument(
        "--stop-after",
        type=float,
        help="minutes: pause the runs at their next checkpoint after this long, start no run after it",
    )
    parser.add_argument("--list", action="store_true", help="print the matrix and whether each run is finished, then exit")
    args = parser.parse_args(argv)
    args.out = args.out or f"{DEFAULT_OUT}/{'envs' if args.envs else args.suite}"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    specs = build_matrix(args)
    if args.list:
        for spec in specs:
            state, _ = read_checkpoint(spec)
            status = "done" if is_finished(spec) else f"at {state['timesteps']}" if state else "todo"
            print(f"{status} {spec.env} {spec.algo} seed {spec.seed} ({spec.steps} steps)")
        return 0
    failures = run_matrix(specs, max(1, args.workers))
    if failures:
        print(f"{failures} run(s) failed; rerun the same command to retry them", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
