"""Side-by-side throughput: each Ext algorithm / its upstream algorithm, env-steps per second under identical hyperparameters.

``--family ppo`` (default) times PPOExt against SB3's PPO, ``--family maskable`` MaskablePPOExt
against sb3-contrib's MaskablePPO (on ``InvalidActionEnvDiscrete`` unless ``--env`` names another
env with ``action_masks()``), ``--family recurrent`` RecurrentPPOExt against RecurrentPPO
(``MlpLstmPolicy``). The first variant of each family is the upstream reference of the ratios.

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
    python scripts/throughput.py --env MountainCarContinuous-v0 --n-envs 1 --n-steps 8 --batch-size 8 \\
        --n-epochs 10 --steps 4096 --repeats 15       # rl-zoo3's small-rollout MountainCarContinuous settings
    python scripts/throughput.py --family maskable --steps 8192 --repeats 15
    python scripts/throughput.py --family recurrent --n-steps 128 --batch-size 128 --steps 4096 --repeats 9
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch as th
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt

STOCK = "stock PPO"
HYPERPARAMS = dict(n_steps=512, batch_size=64, n_epochs=10, learning_rate=3e-4)
PENALTY = dict(clip_range_vf=0.2, vf_clip_mode="max", kl_coef=1.0, kl_target=0.01)
VARIANTS = {
    STOCK: (PPO, dict()),
    "PPOExt, squash off": (PPOExt, dict(policy_kwargs=dict(squash_output=False))),
    "PPOExt, squash on": (PPOExt, dict()),
    "PPOExt, squash + value clip + adaptive KL": (PPOExt, PENALTY),
}
# Per family: (variants, the first one being the reference; policy; default env)
FAMILIES: dict[str, tuple[dict[str, tuple[type, dict]], str, str]] = {
    "ppo": (VARIANTS, "MlpPolicy", "Pendulum-v1"),
    "maskable": (
        {
            "MaskablePPO": (MaskablePPO, dict()),
            "MaskablePPOExt": (MaskablePPOExt, dict()),
            "MaskablePPOExt + value clip + adaptive KL": (MaskablePPOExt, PENALTY),
        },
        "MlpPolicy",
        "InvalidActionEnvDiscrete",
    ),
    "recurrent": (
        {
            "RecurrentPPO": (RecurrentPPO, dict()),
            "RecurrentPPOExt, squash off": (RecurrentPPOExt, dict(policy_kwargs=dict(squash_output=False))),
            "RecurrentPPOExt, squash on": (RecurrentPPOExt, dict()),
            "RecurrentPPOExt, squash + value clip + adaptive KL": (RecurrentPPOExt, PENALTY),
        },
        "MlpLstmPolicy",
        "Pendulum-v1",
    ),
}


def make_env(env_id: str, n_envs: int, seed: int):
    """A DummyVecEnv of ``env_id``; ``InvalidActionEnvDiscrete`` is sb3-contrib's masked test env (dim 100, 50 invalid)."""
    if env_id == "InvalidActionEnvDiscrete":
        return make_vec_env(lambda: InvalidActionEnvDiscrete(dim=100, n_invalid_actions=50), n_envs=n_envs, seed=seed)
    return make_vec_env(env_id, n_envs=n_envs, seed=seed)


def measure(
    algo: type, kwargs: dict, env_id: str, steps: int, n_envs: int, seed: int, hyperparams: dict, policy: str = "MlpPolicy"
) -> tuple[float, float]:
    """One timed ``learn(steps)`` of a freshly built model: ``(env-steps per CPU second, env-steps per wall second)``."""
    env = make_env(env_id, n_envs, seed)
    model = algo(policy, env, seed=seed, **hyperparams, **kwargs)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    model.learn(steps)
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    env.close()
    return model.num_timesteps / cpu, model.num_timesteps / wall


def summarize(values: dict[str, list[float]]) -> dict[str, dict[str, float | list[float]]]:
    """Median, best, ratios of medians / bests to the reference (first variant), and the median of the per-repeat ratios."""
    stock = next(iter(values.values()))
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
    env_id: str,
    steps: int,
    n_envs: int,
    repeats: int,
    hyperparams: dict,
    warmup: int = 1,
    variants: dict | None = None,
    policy: str = "MlpPolicy",
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Interleaved measurements: CPU-time and wall-clock env-steps/s of each variant, one entry per repeat."""
    variants = VARIANTS if variants is None else variants
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for _ in range(warmup):
        for _name, (algo, kwargs) in order:
            measure(algo, kwargs, env_id, min(steps, n_envs * hyperparams["n_steps"]), n_envs, 0, hyperparams, policy)
    for repeat in range(repeats):
        for name, (algo, kwargs) in order if repeat % 2 == 0 else order[::-1]:
            cpu_fps, wall_fps = measure(algo, kwargs, env_id, steps, n_envs, repeat, hyperparams, policy)
            cpu[name].append(cpu_fps)
            wall[name].append(wall_fps)
    return cpu, wall


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="ppo", help="which Ext algorithm against its upstream")
    parser.add_argument("--env", default=None, help="env id (default: the family's)")
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

    variants, policy, default_env = FAMILIES[args.family]
    args.env = args.env or default_env
    cpu, wall = run(args.env, args.steps, args.n_envs, args.repeats, hyperparams, args.warmup, variants, policy)
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
        "family": args.family,
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
            name: {"kwargs": repr(variants[name][1]), **entry, "wall": wall_summary[name]}
            for name, entry in cpu_summary.items()
        },
    }
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)
    return result


if __name__ == "__main__":
    main()
