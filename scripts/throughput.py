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
    python scripts/throughput.py --steps 8192 --repeats 15 --json docs/benchmarks/throughput.jsonl  # for the report
    python scripts/throughput.py --env MountainCarContinuous-v0 --n-envs 1 --n-steps 8 --batch-size 8 \\
        --n-epochs 10 --steps 4096 --repeats 15       # rl-zoo3's small-rollout MountainCarContinuous settings
    python scripts/throughput.py --family maskable --steps 8192 --repeats 15
    python scripts/throughput.py --family recurrent --n-steps 128 --batch-size 128 --steps 4096 --repeats 9
    python scripts/throughput.py --workload hopper --steps 4096 --repeats 9   # rl-zoo3's Hopper settings
    python scripts/throughput.py --workload hopper-batched --envs-and-batch 256 8192 --steps 65536 --repeats 5
    python scripts/throughput.py --workload hopper-entry --env-backend envpool --steps 65536 --repeats 5
    python scripts/throughput.py --workload hopper --steps 4096 --repeats 9 \\
        --variants "PPOExt, fast" "SBX PPO" --warm-model   # SBX's PPO as a reference (pip install sbx-rl)

``--workload NAME`` takes the env, ``n_envs``, ``normalize`` and every hyperparameter of rl-zoo3's own
entry for it (:data:`WORKLOADS`, copied from rl-zoo3's ``ppo.yml`` / ``ppo_lstm.yml``; ``--steps`` and
``--repeats`` still apply), and the family it belongs to.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch as th
from benchmarks.records import cpu_model, source_revision  # scripts/benchmarks, beside this script
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.utils import LinearSchedule
from stable_baselines3.common.vec_env import VecNormalize
from torch import nn

import sb3_ppo_ext
from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt

STOCK = "stock PPO"
SBX = "SBX PPO"


def sbx_ppo(policy: str, env, **kwargs):
    """
    SBX's PPO (Stable-Baselines-Jax, ``pip install sbx-rl``) with the workload's settings: a JAX reference row.
    Its ``activation_fn`` is translated to JAX's; XLA runs on one thread (as torch does here), unless
    ``XLA_FLAGS`` says otherwise.
    """
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    try:
        import jax
        from sbx import PPO as SBXPPO
    except ImportError as error:
        raise SystemExit(f"the {SBX!r} variant needs SBX: pip install sbx-rl ({error})") from error
    policy_kwargs = dict(kwargs.pop("policy_kwargs", None) or {})
    if "activation_fn" in policy_kwargs:
        policy_kwargs["activation_fn"] = {nn.ReLU: jax.nn.relu, nn.Tanh: jax.nn.tanh}[policy_kwargs["activation_fn"]]
    return SBXPPO(policy, env, policy_kwargs=policy_kwargs or None, **kwargs)


HYPERPARAMS = dict(n_steps=512, batch_size=64, n_epochs=10, learning_rate=3e-4)
PENALTY = dict(clip_range_vf=0.2, vf_clip_mode="max", kl_coef=1.0, kl_target=0.01)
VARIANTS = {
    STOCK: (PPO, dict()),
    "PPOExt, squash off": (PPOExt, dict(policy_kwargs=dict(squash_output=False))),
    "PPOExt, squash on": (PPOExt, dict()),
    "PPOExt, squash + value clip + adaptive KL": (PPOExt, PENALTY),
    "PPOExt, fast": (PPOExt, dict(policy_kwargs=dict(squash_output=False, fast=True))),
    SBX: (sbx_ppo, dict()),  # only when asked for (--variants "SBX PPO"), where SBX is installed
}
OPTIONAL = (SBX,)  # variants that run only when --variants names them
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
            "RecurrentPPOExt, fast": (RecurrentPPOExt, dict(policy_kwargs=dict(squash_output=False, fast=True))),
        },
        "MlpLstmPolicy",
        "Pendulum-v1",
    ),
}


_ZOO_MUJOCO = dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=dict(pi=[256, 256], vf=[256, 256]))
# name -> (family, env id, n_envs, normalize, hyperparameters): rl-zoo3's own entries (ppo.yml: the v4 entries of
# Hopper and HalfCheetah, run on v5; ppo_lstm.yml: PendulumNoVel-v1), the workloads of the benchmark report.
WORKLOADS: dict[str, tuple[str, str, int, bool, dict]] = {
    "hopper": (
        "ppo",
        "Hopper-v5",
        1,
        True,
        dict(
            n_steps=512, batch_size=32, gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
            n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671, policy_kwargs=_ZOO_MUJOCO,
        ),
    ),
    "halfcheetah": (
        "ppo",
        "HalfCheetah-v5",
        1,
        True,
        dict(
            n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
            n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096, policy_kwargs=_ZOO_MUJOCO,
        ),
    ),
    "pendulum": (
        "ppo",
        "Pendulum-v1",
        4,
        False,
        dict(
            n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2,
            use_sde=True, sde_sample_freq=4,
        ),
    ),
    "cartpole": (
        "ppo",
        "CartPole-v1",
        8,
        False,
        dict(
            n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=LinearSchedule(0.001, 0.0, 1.0), clip_range=LinearSchedule(0.2, 0.0, 1.0),
        ),
    ),
    "lunarlander": (
        "ppo",
        "LunarLanderContinuous-v3",
        16,
        False,
        dict(n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01),
    ),
    "mountaincar": (
        "ppo",
        "MountainCarContinuous-v0",
        1,
        True,
        dict(
            batch_size=256, n_steps=8, gamma=0.9999, learning_rate=7.77e-05, ent_coef=0.00429, clip_range=0.1,
            n_epochs=10, gae_lambda=0.9, max_grad_norm=5, vf_coef=0.19, use_sde=True,
            policy_kwargs=dict(log_std_init=-3.29, ortho_init=False),
        ),
    ),
    # Batched: 64 envs stepped in one call, large minibatches (the shape of the time-to-score runs).
    "hopper-batched": (
        "ppo",
        "Hopper-v5",
        64,
        True,
        dict(n_steps=64, batch_size=4096, n_epochs=10, policy_kwargs=dict(_ZOO_MUJOCO, log_std_init=-0.5)),
    ),
    # The shipped Hopper-v5 entry of ppo_ext_envpool.yml, on gymnasium's envs (DummyVecEnv) unless --env-backend envpool.
    "hopper-entry": (
        "ppo",
        "Hopper-v5",
        32,
        True,
        dict(
            n_steps=64, batch_size=128, n_epochs=10, learning_rate=1e-3, target_kl=0.02,
            policy_kwargs=dict(log_std_init=-0.5, activation_fn=nn.Tanh, net_arch=dict(pi=[64, 64], vf=[64, 64])),
        ),
    ),
    # The same with 256-256 networks and learning rate 6e-4 (the GPU check's settings).
    "hopper-256": (
        "ppo",
        "Hopper-v5",
        32,
        True,
        dict(
            n_steps=64, batch_size=512, n_epochs=10, learning_rate=6e-4, target_kl=0.02,
            policy_kwargs=dict(log_std_init=-0.5, activation_fn=nn.Tanh, net_arch=dict(pi=[256, 256], vf=[256, 256])),
        ),
    ),
    "masked": ("maskable", "InvalidActionEnvDiscrete", 4, False, dict(HYPERPARAMS)),
    "recurrent": (
        "recurrent",
        "PendulumNoVel-v1",
        4,
        True,
        dict(
            n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2,
            use_sde=True, sde_sample_freq=4,
            policy_kwargs=dict(
                ortho_init=False, activation_fn=nn.ReLU, lstm_hidden_size=64, enable_critic_lstm=True,
                net_arch=dict(pi=[64], vf=[64]),
            ),
        ),
    ),
}  # fmt: skip


def make_env(env_id: str, n_envs: int, seed: int, normalize: bool = False, backend: str = "gymnasium"):
    """
    A DummyVecEnv of ``env_id`` (in ``VecNormalize`` with ``normalize``, as rl-zoo3's ``normalize: true``);
    ``InvalidActionEnvDiscrete`` is sb3-contrib's masked test env (dim 100, 50 invalid).

    :param backend: ``"envpool"``: EnvPool's batched envs of the task (:class:`~sb3_ppo_ext.envpool.EnvPoolVecEnv`)
    """
    if backend == "envpool":
        from sb3_ppo_ext.envpool import EnvPoolVecEnv

        env = EnvPoolVecEnv(env_id, n_envs, seed=seed)
    elif env_id == "InvalidActionEnvDiscrete":
        env = make_vec_env(lambda: InvalidActionEnvDiscrete(dim=100, n_invalid_actions=50), n_envs=n_envs, seed=seed)
    else:
        if env_id.endswith("NoVel-v1"):
            import rl_zoo3.import_envs  # noqa: F401  (registers rl-zoo3's PendulumNoVel-v1)
        env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    return VecNormalize(env) if normalize else env


def measure(
    algo: type,
    kwargs: dict,
    env_id: str,
    steps: int,
    n_envs: int,
    seed: int,
    hyperparams: dict,
    policy: str = "MlpPolicy",
    normalize: bool = False,
    warm_model: bool = False,
    backend: str = "gymnasium",
) -> tuple[float, float]:
    """
    One timed ``learn(steps)`` of a freshly built model: ``(env-steps per CPU second, env-steps per wall second)``.

    :param warm_model: first learn one rollout, untimed, and time the ``learn(steps)`` that continues it (SBX's
        JAX functions compile for each model on its first rollout and update)
    """
    env = make_env(env_id, n_envs, seed, normalize, backend)
    policy_kwargs = {**hyperparams.get("policy_kwargs", {}), **kwargs.get("policy_kwargs", {})}
    merged = {**hyperparams, **kwargs, **({"policy_kwargs": policy_kwargs} if policy_kwargs else {})}
    model = algo(policy, env, seed=seed, **merged)
    if warm_model:
        model.learn(n_envs * hyperparams["n_steps"])
    start = model.num_timesteps
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    model.learn(steps, reset_num_timesteps=not warm_model)
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    env.close()
    return (model.num_timesteps - start) / cpu, (model.num_timesteps - start) / wall


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
    normalize: bool = False,
    warm_model: bool = False,
    backend: str = "gymnasium",
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Interleaved measurements: CPU-time and wall-clock env-steps/s of each variant, one entry per repeat."""
    variants = {name: spec for name, spec in VARIANTS.items() if name not in OPTIONAL} if variants is None else variants
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants.items())
    for _ in range(warmup):
        for _name, (algo, kwargs) in order:
            warm_steps = min(steps, n_envs * hyperparams["n_steps"])
            measure(algo, kwargs, env_id, warm_steps, n_envs, 0, hyperparams, policy, normalize, warm_model, backend)
    for repeat in range(repeats):
        for name, (algo, kwargs) in order if repeat % 2 == 0 else order[::-1]:
            cpu_fps, wall_fps = measure(
                algo, kwargs, env_id, steps, n_envs, repeat, hyperparams, policy, normalize, warm_model, backend
            )
            cpu[name].append(cpu_fps)
            wall[name].append(wall_fps)
    return cpu, wall


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="ppo", help="which Ext algorithm against its upstream")
    parser.add_argument(
        "--workload", choices=sorted(WORKLOADS), help="rl-zoo3's settings for an env (sets the family, env, envs and settings)"
    )
    parser.add_argument(
        "--envs-and-batch",
        nargs=2,
        type=int,
        metavar=("N_ENVS", "BATCH_SIZE"),
        help="with --workload: that workload's settings at another number of envs and minibatch size",
    )
    parser.add_argument("--env", default=None, help="env id (default: the family's)")
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per timed run (keep runs short, repeats many)")
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each variant before the timed ones")
    parser.add_argument("--n-steps", type=int, default=HYPERPARAMS["n_steps"])
    parser.add_argument("--batch-size", type=int, default=HYPERPARAMS["batch_size"])
    parser.add_argument("--n-epochs", type=int, default=HYPERPARAMS["n_epochs"])
    parser.add_argument(
        "--variants", nargs="+", metavar="NAME", help="only these variants of the family (the reference always runs first)"
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also append the measurement to PATH as one JSON line (read by scripts/benchmark_report.py)",
    )
    parser.add_argument(
        "--warm-model",
        action="store_true",
        help="time each run after an untimed first rollout and update of the same model (for SBX, whose JAX "
        "functions compile per model); every variant alike",
    )
    parser.add_argument(
        "--env-backend",
        choices=("gymnasium", "envpool"),
        default="gymnasium",
        help="envpool: the task's EnvPool envs (pip install '.[envpool]'), its threads' CPU time counted",
    )
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    hyperparams = dict(HYPERPARAMS, n_steps=args.n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs)
    normalize = False
    if args.workload:
        args.family, args.env, args.n_envs, normalize, hyperparams = WORKLOADS[args.workload]
        if args.envs_and_batch:
            args.n_envs, batch_size = args.envs_and_batch
            hyperparams = dict(hyperparams, batch_size=batch_size)

    variants, policy, default_env = FAMILIES[args.family]
    if args.variants:
        unknown = sorted(set(args.variants) - set(variants))
        if unknown:
            parser.error(f"--variants: {unknown} not among {sorted(variants)}")
        reference = next(iter(variants))
        variants = {name: spec for name, spec in variants.items() if name == reference or name in args.variants}
    else:
        variants = {name: spec for name, spec in variants.items() if name not in OPTIONAL}
    args.env = args.env or default_env
    cpu, wall = run(
        args.env, args.steps, args.n_envs, args.repeats, hyperparams, args.warmup, variants, policy, normalize,
        args.warm_model, args.env_backend,
    )  # fmt: skip
    cpu_summary, wall_summary = summarize(cpu), summarize(wall)
    print(f"{args.env} ({args.env_backend}), {args.steps} steps x {args.repeats} repeats, {args.n_envs} envs, {hyperparams}")
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
        "workload": args.workload,
        "normalize": normalize,
        "env": args.env,
        "steps": args.steps,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "warm_model": args.warm_model,
        "n_envs": args.n_envs,
        "env_backend": args.env_backend,
        "hyperparams": hyperparams,
        "torch_threads": th.get_num_threads(),
        "clock": "process_time",
        "clock_note": (
            "median/best/ratio_* are env-steps per second of process CPU time (time.process_time(), one torch thread, "
            "DummyVecEnv, or EnvPool's pool with its threads counted); 'wall' holds the same statistics for wall-clock time"
        ),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "cpu_model": cpu_model(),
            # the vector instructions torch's CPU kernels use (AVX2, AVX512, ...): the ratios differ between them
            "cpu_capability": th.backends.cpu.get_cpu_capability(),
        },
        # the commit of the sb3_ppo_ext that was timed (+dirty with uncommitted changes), as benchmark.py's runs record it
        "commit": source_revision(Path(sb3_ppo_ext.__file__).parent),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "variants": {
            name: {"kwargs": repr(variants[name][1]), **entry, "wall": wall_summary[name]}
            for name, entry in cpu_summary.items()
        },
    }
    if args.json:
        with open(args.json, "a") as file:
            file.write(json.dumps(result, default=repr) + "\n")  # schedules and activation classes by name
    return result


if __name__ == "__main__":
    main()
