"""Train PPOExt on one environment with the shipped hyperparameters and print its evaluation return.

``python -m sb3_ppo_ext --env Pendulum-v1 [--timesteps N] [--seed S] [--eval-episodes K]`` needs neither rl-zoo3
nor optuna; ``python -m rl_zoo3.train --algo ppo_ext`` is the full-featured route.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, cast

import torch as th
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization

from sb3_ppo_ext import PPOExt
from sb3_ppo_ext.hyperparams import load_hyperparams
from sb3_ppo_ext.validation import to_algorithm_kwargs


def split_settings(entry: dict[str, Any]) -> dict[str, Any]:
    """A yml entry (rl-zoo3's format) as ``n_envs``, ``n_timesteps``, ``normalize``, ``policy`` and ``model_kwargs``."""
    entry = dict(entry)
    return dict(
        n_envs=int(entry.pop("n_envs", 1)),
        n_timesteps=int(entry.pop("n_timesteps", 100_000)),
        normalize=entry.pop("normalize", False),
        policy=entry.pop("policy", "MlpPolicy"),
        model_kwargs=to_algorithm_kwargs(entry),
    )


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(prog="python -m sb3_ppo_ext", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1", help="gymnasium environment id")
    parser.add_argument("--timesteps", type=int, default=None, help="training steps (default: the yml's n_timesteps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)

    th.set_num_threads(1)
    settings = split_settings(load_hyperparams(args.env))
    n_timesteps, normalize = int(args.timesteps or settings["n_timesteps"]), settings["normalize"]
    normalize_kwargs = normalize if isinstance(normalize, dict) else {}

    env = make_vec_env(args.env, n_envs=settings["n_envs"], seed=args.seed)
    eval_env = make_vec_env(args.env, n_envs=1, seed=args.seed + 10_000)
    if normalize:
        env = VecNormalize(env, **normalize_kwargs)
        # The eval env uses the training statistics as they are and reports raw rewards, whatever the entry says.
        eval_env = VecNormalize(eval_env, **{**normalize_kwargs, "training": False, "norm_reward": False})

    model = PPOExt(settings["policy"], env, seed=args.seed, device=args.device, **settings["model_kwargs"])
    start = time.time()
    model.learn(total_timesteps=n_timesteps)
    elapsed = time.time() - start
    sync_envs_normalization(env, eval_env)  # SB3's own copy of the statistics (none without norm_obs)
    mean_return, std_return = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True)
    result = f"evaluation return over {args.eval_episodes} episodes: {mean_return:.1f} +/- {std_return:.1f}"
    print(f"PPOExt on {args.env}: {n_timesteps} steps in {elapsed:.0f} s; {result}")
    return float(cast(float, mean_return))  # one evaluation: a number, not the per-episode list


if __name__ == "__main__":
    main()
