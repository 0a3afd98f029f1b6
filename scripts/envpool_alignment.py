"""How closely EnvPool's MuJoCo tasks follow gymnasium's: the same actions from the same start, per task.

Steps ``EnvPoolVecEnv(task, reset_noise_scale=0)`` and gymnasium's env of the same id (``reset_noise_scale=0``,
in SB3's ``DummyVecEnv``) with the same random float32 actions, and prints per task, as a markdown table: the
steps compared, the episodes that ended, the median over steps of the step's largest |Δobs|, max |Δobs|
(terminal observations included) and max |Δreward| (SB3's float32 rewards) over those steps, the first step at
which |Δobs| exceeds 1e-6, and the first step at which the two disagree on which episodes end (the comparison
stops there: the trajectories no longer correspond).

    python scripts/envpool_alignment.py                                  # the four tasks of the EnvPool entries
    python scripts/envpool_alignment.py --tasks Hopper-v5 --steps 200 --envs 8
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext.envpool import EnvPoolVecEnv

TASKS = ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5")
THRESHOLD = 1e-6


def compare(task: str, steps: int, num_envs: int, seed: int) -> dict[str, Any]:
    """
    The agreement of EnvPool's ``task`` with gymnasium's over ``steps`` steps of ``num_envs`` envs.

    :return: ``task``, ``steps`` (compared), ``episodes``, ``median_obs`` (median over steps of the step's largest
        absolute difference), ``obs`` and ``reward`` (max absolute differences),
        ``first_obs_step`` (first step with |Δobs| > 1e-6, or None) and ``done_mismatch`` (the step at which
        the episode ends differed, or None)
    """
    pool = EnvPoolVecEnv(task, num_envs, seed=seed, reset_noise_scale=0.0)
    reference = make_vec_env(task, n_envs=num_envs, seed=seed, env_kwargs={"reset_noise_scale": 0.0})
    result: dict[str, Any] = dict(task=task, steps=0, episodes=0, first_obs_step=None, done_mismatch=None)
    result["obs"] = float(np.abs(pool.reset() - reference.reset()).max())
    result["reward"] = 0.0
    per_step: list[float] = []
    space = pool.action_space
    rng = np.random.default_rng(seed)
    for step in range(1, steps + 1):
        actions = rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32)
        obs, rewards, dones, infos = pool.step(actions)
        ref_obs, ref_rewards, ref_dones, ref_infos = reference.step(actions)
        if not np.array_equal(dones, ref_dones):
            result["done_mismatch"] = step
            break
        ended = np.flatnonzero(dones)
        deltas = [np.abs(obs - ref_obs).max()]
        deltas += [np.abs(infos[i]["terminal_observation"] - ref_infos[i]["terminal_observation"]).max() for i in ended]
        per_step.append(float(max(deltas)))
        result["obs"] = max(result["obs"], per_step[-1])
        result["reward"] = max(result["reward"], float(np.abs(rewards - ref_rewards).max()))
        if result["first_obs_step"] is None and result["obs"] > THRESHOLD:
            result["first_obs_step"] = step
        result["steps"], result["episodes"] = step, result["episodes"] + len(ended)
    result["median_obs"] = float(np.median(per_step)) if per_step else 0.0
    pool.close()
    reference.close()
    return result


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help="MuJoCo task ids (both registries)")
    parser.add_argument("--steps", type=int, default=1000, help="steps of each env")
    parser.add_argument("--envs", type=int, default=4, help="envs stepped side by side")
    parser.add_argument("--seed", type=int, default=0, help="seed of the actions (and of the envs)")
    args = parser.parse_args(argv)
    results = [compare(task, args.steps, args.envs, args.seed) for task in args.tasks]
    print(f"{args.envs} envs, up to {args.steps} steps each, the same random actions, reset_noise_scale=0")
    print()
    print("| task | steps | episodes | median abs Δobs | max abs Δobs | max abs Δreward | first Δobs > 1e-6 | ends differ |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        first = "never" if r["first_obs_step"] is None else f"step {r['first_obs_step']}"
        mismatch = "never" if r["done_mismatch"] is None else f"step {r['done_mismatch']}"
        deltas = f"{r['median_obs']:.1e} | {r['obs']:.1e} | {r['reward']:.1e}"
        print(f"| {r['task']} | {r['steps']} | {r['episodes']} | {deltas} | {first} | {mismatch} |")
    return results


if __name__ == "__main__":
    main()
