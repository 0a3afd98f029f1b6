"""Side-by-side throughput: PPOExt / stock PPO env-steps per second under identical hyperparameters.

Variants run interleaved in one process with one torch thread (the order reversed every other
repeat), so that a shared, noisy machine affects them alike. Two ratios are reported: of the
medians, and of the best runs (interference only ever adds time, so the best run is the
least disturbed one). Read the ratios, not the absolute figures.

    python scripts/throughput.py --env Pendulum-v1 --steps 20000 --repeats 3
    python scripts/throughput.py --steps 8192 --repeats 7 --json docs/benchmarks/throughput.json  # for the report
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

HYPERPARAMS = dict(n_steps=512, batch_size=64, n_epochs=10, learning_rate=3e-4)
VARIANTS = {
    "stock PPO": (PPO, dict()),
    "PPOExt, squash off": (PPOExt, dict(policy_kwargs=dict(squash_output=False))),
    "PPOExt, squash on": (PPOExt, dict()),
    "PPOExt, squash + value clip + adaptive KL": (
        PPOExt,
        dict(clip_range_vf=0.2, vf_clip_mode="max", kl_coef=1.0, kl_target=0.01),
    ),
}


def measure(algo: type, kwargs: dict, env_id: str, steps: int, n_envs: int, seed: int) -> float:
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = algo("MlpPolicy", env, seed=seed, **HYPERPARAMS, **kwargs)
    start = time.perf_counter()
    model.learn(steps)
    return model.num_timesteps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--json", metavar="PATH", help="also write the measurements to PATH (read by scripts/benchmark_report.py)"
    )
    args = parser.parse_args()
    th.set_num_threads(1)

    fps: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats):
        order = list(VARIANTS.items())
        for name, (algo, kwargs) in order if repeat % 2 == 0 else order[::-1]:
            fps[name].append(measure(algo, kwargs, args.env, args.steps, args.n_envs, seed=repeat))
    stock_median, stock_best = statistics.median(fps["stock PPO"]), max(fps["stock PPO"])
    print(f"{args.env}, {args.steps} steps x {args.repeats} repeats, {args.n_envs} envs, {HYPERPARAMS}")
    print("| variant | median env-steps/s | ratio of medians | best env-steps/s | ratio of bests |")
    print("|---|---|---|---|---|")
    for name, values in fps.items():
        median, best = statistics.median(values), max(values)
        print(f"| {name} | {median:.0f} | {median / stock_median:.3f} | {best:.0f} | {best / stock_best:.3f} |")
    if args.json:
        result = {
            "env": args.env,
            "steps": args.steps,
            "repeats": args.repeats,
            "n_envs": args.n_envs,
            "hyperparams": HYPERPARAMS,
            "torch_threads": th.get_num_threads(),
            "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "variants": {
                name: {
                    "kwargs": repr(VARIANTS[name][1]),
                    "fps": values,
                    "median": statistics.median(values),
                    "best": max(values),
                    "ratio_of_medians": statistics.median(values) / stock_median,
                    "ratio_of_bests": max(values) / stock_best,
                }
                for name, values in fps.items()
            },
        }
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
