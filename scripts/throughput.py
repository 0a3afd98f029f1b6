"""Side-by-side throughput: PPOExt / stock PPO env-steps per second under identical hyperparameters.

Built for a shared, noisy machine. Each variant is timed with the *process CPU time* of this
(single-threaded: one torch thread, ``DummyVecEnv``) process, ``time.process_time()``, which does
not count the time other processes hold the CPU; wall-clock time is recorded beside it. The
headline figures (``median``, ``best``, ``ratio_of_medians``, ``ratio_of_bests`` in the JSON) are
CPU-time based; their wall-clock counterparts are under ``wall``.

Many short runs, interleaved: every repeat builds each variant afresh (not timed) and times one
``learn(steps)``; the order of the variants is reversed every other repeat, and one untimed
warm-up run of each variant comes first. Reported per variant: the median and the best
(= minimum CPU time) env-steps/s, and PPOExt ÷ stock ratios of the medians, of the bests, and the
median of the per-repeat (paired) ratios. Interference only ever adds time, so the best run is the
least disturbed one. Read the ratios, not the absolute figures.

    python scripts/throughput.py --env Pendulum-v1 --steps 8192 --repeats 15
    python scripts/throughput.py --env LunarLanderContinuous-v3 --n-envs 16 --n-steps 1024 --n-epochs 4 \\
        --steps 16384 --repeats 9      # rl-zoo3's LunarLander settings
    python scripts/throughput.py --steps 8192 --repeats 15 --json docs/benchmarks/throughput.json  # for the report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext import PPOExt

STOCK = "stock PPO"
HYPERPARAMS = dict(n_steps=512, batch_size=64, n_epochs=10, learning_rate=3e-4)
VARIANTS = {
    STOCK: (PPO, dict()),
    "PPOExt, squash off": (PPOExt, dict(policy_kwargs=dict(squash_output=False))),
    "PPOExt, squash on": (PPOExt, dict()),
    "PPOExt, squash + value clip + adaptive KL": (
        PPOExt,
        dict(clip_range_vf=0.2, vf_clip_mode="max", kl_coef=1.0, kl_target=0.01),
    ),
}


def measure(
    algo: type, kwargs: dict, env_id: str, steps: int, n_envs: int, seed: int, hyperparams: dict
) -> tuple[float, float]:
    """One timed ``learn(steps)`` of a freshly built model: ``(env-steps per CPU second, env-steps per wall second)``."""
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = algo("MlpPolicy", env, seed=seed, **hyperparams, **kwargs)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    model.learn(steps)
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    env.close()
    return model.num_timesteps / cpu, model.num_timesteps / wall


def summarize(values: dict[str, list[float]]) -> dict[str, dict[str, float | list[float]]]:
    """Median, best, ratios of medians / bests to stock, and the median of the per-repeat ratios."""
    stock = values[STOCK]
    stock_median, stock_best = statistics.median(stock), max(stock)
    return {
        name: {
            "fps": runs,
            "median": statistics.median(runs),
            "best": max(runs),
            "ratio_of_medians": statistics.median(runs) / stock_median,
            "ratio_of_bests": max(runs) / stock_best,
            "median_of_paired_ratios": statistics.median(run / ref for run, ref in zip(runs, stock, strict=True)),
        }
        for name, runs in values.items()
    }


def run(
    env_id: str, steps: int, n_envs: int, repeats: int, hyperparams: dict, warmup: int = 1, variants: dict | None = None
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Interleaved measurements: CPU-time and wall-clock env-steps/s of each variant, one entry per repeat."""
    variants = VARIANTS if variants is None else variants
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for _ in range(warmup):
        for _name, (algo, kwargs) in order:
            measure(algo, kwargs, env_id, min(steps, n_envs * hyperparams["n_steps"]), n_envs, 0, hyperparams)
    for repeat in range(repeats):
        for name, (algo, kwargs) in order if repeat % 2 == 0 else order[::-1]:
            cpu_fps, wall_fps = measure(algo, kwargs, env_id, steps, n_envs, seed=repeat, hyperparams=hyperparams)
            cpu[name].append(cpu_fps)
            wall[name].append(wall_fps)
    return cpu, wall


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per timed run (keep runs short, repeats many)")
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each variant before the timed ones")
    parser.add_argument("--n-steps", type=int, default=HYPERPARAMS["n_steps"])
    parser.add_argument("--batch-size", type=int, default=HYPERPARAMS["batch_size"])
    parser.add_argument("--n-epochs", type=int, default=HYPERPARAMS["n_epochs"])
    parser.add_argument(
        "--json", metavar="PATH", help="also write the measurements to PATH (read by scripts/benchmark_report.py)"
    )
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    hyperparams = dict(HYPERPARAMS, n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs)

    cpu, wall = run(args.env, args.steps, args.n_envs, args.repeats, hyperparams, warmup=args.warmup)
    cpu_summary, wall_summary = summarize(cpu), summarize(wall)
    print(f"{args.env}, {args.steps} steps x {args.repeats} repeats, {args.n_envs} envs, {hyperparams}")
    print("env-steps per second of process CPU time (headline); wall clock in the last two columns")
    print(
        "| variant | median | ratio of medians | best | ratio of bests | median paired ratio "
        "| wall median | wall ratio of medians |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, entry in cpu_summary.items():
        w = wall_summary[name]
        print(
            f"| {name} | {entry['median']:.0f} | {entry['ratio_of_medians']:.3f} | {entry['best']:.0f} "
            f"| {entry['ratio_of_bests']:.3f} | {entry['median_of_paired_ratios']:.3f} "
            f"| {w['median']:.0f} | {w['ratio_of_medians']:.3f} |"
        )
    result = {
        "env": args.env,
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "n_envs": args.n_envs,
        "hyperparams": hyperparams,
        "torch_threads": th.get_num_threads(),
        "clock": "process_time",
        "clock_note": (
            "median/best/ratio_* are env-steps per second of process CPU time (time.process_time(), one torch thread, "
            "DummyVecEnv); 'wall' holds the same statistics for wall-clock time"
        ),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "variants": {
            name: {"kwargs": repr(VARIANTS[name][1]), **entry, "wall": wall_summary[name]}
            for name, entry in cpu_summary.items()
        },
    }
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)
    return result


if __name__ == "__main__":
    main()
