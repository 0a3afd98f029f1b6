"""Where a run's time goes: acting, the environment, GAE, the update (and PPOExt's no-grad passes), stock vs PPOExt.

Stock PPO and PPOExt (``squash_output=False``, the extensions off: bit for bit with stock) learn the same steps of a
``scripts/throughput.py`` workload, interleaved (the order reversed every other repeat), one torch thread. Each part is
the process CPU time spent in it (and, beside it, the wall-clock time: what counts when the networks run on an
accelerator, ``--device cuda``), per rollout and its update, the median over the repeats:

- env: the VecEnv's ``step`` (``VecNormalize`` included); acting: the rest of ``collect_rollouts``;
- GAE: ``compute_returns_and_advantage``; update: ``train()``; passes: PPOExt's two actor passes without gradients.

    python scripts/time_split.py --workload hopper-batched --envs-and-batch 256 8192 --steps 65536 --repeats 3
    python scripts/time_split.py --workload hopper-entry --steps 32768 --device cuda   # the shipped Hopper-v5 settings
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from unittest import mock

import throughput  # scripts/throughput.py, beside this script
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_ext import PPOExt

PARTS = ("acting", "env", "GAE", "update", "passes")


def _timed(owner: type, name: str, totals: dict[str, float], part: str) -> mock._patch:
    """``owner.name`` adding its process CPU time to ``totals[part]`` and its wall-clock time to ``totals[part + " wall"]``."""
    original: Callable = getattr(owner, name)

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        start, start_wall = time.process_time(), time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[part] += time.process_time() - start
            totals[part + " wall"] += time.perf_counter() - start_wall

    return mock.patch.object(owner, name, timed)


def split(algorithm: type, workload: str, steps: int, n_envs: int, batch_size: int, device: str = "cpu") -> dict[str, float]:
    """CPU seconds (and, under ``"<part> wall"``, wall-clock seconds) per rollout and update of one ``learn(steps)``."""
    _, env_id, _, normalize, hyperparams = throughput.WORKLOADS[workload]
    kwargs = dict(hyperparams, batch_size=batch_size)
    if algorithm is PPOExt:
        kwargs["policy_kwargs"] = dict(kwargs.get("policy_kwargs") or {}, squash_output=False)
    model = algorithm("MlpPolicy", throughput.make_env(env_id, n_envs, 0, normalize), seed=0, device=device, **kwargs)
    totals = dict.fromkeys([f"{part}{clock}" for part in (*PARTS, "collect") for clock in ("", " wall")], 0.0)
    patches = [
        _timed(VecEnv, "step", totals, "env"),
        _timed(type(model), "collect_rollouts", totals, "collect"),
        _timed(RolloutBuffer, "compute_returns_and_advantage", totals, "GAE"),
        _timed(type(model), "train", totals, "update"),
    ]
    if algorithm is PPOExt:
        patches.append(_timed(PPOExt, "_rollout_distributions", totals, "passes"))
    for patch in patches:
        patch.start()
    try:
        model.learn(steps)
    finally:
        for patch in patches:
            patch.stop()
    for clock in ("", " wall"):
        totals["acting" + clock] = totals.pop("collect" + clock) - totals["env" + clock] - totals["GAE" + clock]
    n_rollouts = steps // (model.n_steps * n_envs)
    return {part: value / n_rollouts for part, value in totals.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(throughput.WORKLOADS), default="hopper-batched")
    parser.add_argument(
        "--envs-and-batch", nargs=2, type=int, metavar=("N_ENVS", "BATCH_SIZE"), help="instead of the workload's"
    )
    parser.add_argument("--steps", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="where the networks run (cuda: the acting and the update on the GPU)")
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    _, _, workload_envs, _, workload_hyperparams = throughput.WORKLOADS[args.workload]
    n_envs, batch_size = args.envs_and_batch or (workload_envs, workload_hyperparams["batch_size"])
    runs: dict[str, list[dict[str, float]]] = {"stock PPO": [], "PPOExt": []}
    for repeat in range(args.repeats):
        order = [(PPO, "stock PPO"), (PPOExt, "PPOExt")]
        for algorithm, name in order if repeat % 2 == 0 else order[::-1]:
            runs[name].append(split(algorithm, args.workload, args.steps, n_envs, batch_size, args.device))
    for clock, unit in (("", "CPU-s"), (" wall", "wall-clock s")):
        print(
            f"{args.workload}, {n_envs} envs, minibatch {batch_size}, device {args.device}: {unit} per rollout and update, "
            f"median of {args.repeats}"
        )
        print("| | " + " | ".join(PARTS) + " |")
        print("|---|" + "---|" * len(PARTS))
        for name, measured in runs.items():
            cells = [f"{statistics.median(run[part + clock] for run in measured):.4f}" for part in PARTS]
            print(f"| {name} | " + " | ".join(cells if name == "PPOExt" else [*cells[:-1], ""]) + " |")


if __name__ == "__main__":
    main()
