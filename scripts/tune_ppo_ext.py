"""Tune PPOExt with plain Optuna (no rl-zoo3): the ppo_ext search space, evaluation-based pruning, any storage.

One machine, no server (the default storage is an Optuna journal file; run the same command in
several terminals to add workers)::

    python scripts/tune_ppo_ext.py --env Pendulum-v1 --n-trials 50 --n-timesteps 50000

Many machines, one study on PostgreSQL (run on each machine; every worker runs ``--n-trials``)::

    python scripts/tune_ppo_ext.py --env Pendulum-v1 --n-trials 50 \\
        --storage postgresql://user:password@db-host/optuna --study-name ppo_ext-pendulum

On a database storage, a worker that dies mid-trial (SIGKILL, preemption) stops sending its
trial's heartbeat; once ``--grace-period`` seconds have passed, the next worker that starts a trial
marks it FAIL and re-queues its parameters (Optuna's heartbeat, see
``sb3_ppo_ext.storage.make_storage``). ``--max-total-trials`` makes every worker stop when the
study as a whole has that many finished trials, so the study reaches its size even if workers die.

Each trial trains PPOExt for ``--n-timesteps`` steps, evaluates it ``--n-evaluations`` times
(deterministic policy, ``--eval-episodes`` episodes) and reports each mean return to Optuna,
whose median pruner stops unpromising trials (the package's ``sb3_ppo_ext.callbacks.OptunaPruningCallback``:
the ``i``-th evaluation is reported as step ``i``). The best trial's PPOExt keyword arguments are
printed at the end; ``sb3_ppo_ext.samplers.ppo_ext_kwargs_from_params(study.best_trial.params)``
rebuilds them from the study at any time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pprint import pformat

import gymnasium as gym
import optuna
import torch as th
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext import NonFiniteLossError, PPOExt
from sb3_ppo_ext.callbacks import OptunaPruningCallback
from sb3_ppo_ext.samplers import sample_ppo_ext_params
from sb3_ppo_ext.storage import HEARTBEAT_INTERVAL, StorageError, make_storage

DEFAULT_STORAGE = "ppo_ext_study.log"


def make_objective(args: argparse.Namespace):
    probe = gym.make(args.env)
    continuous = isinstance(probe.action_space, gym.spaces.Box)
    probe.close()

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
        kwargs = sample_ppo_ext_params(trial, continuous=continuous)
        env = make_vec_env(args.env, n_envs=args.n_envs)
        eval_env = make_vec_env(args.env, n_envs=1)
        eval_freq = max(args.n_timesteps // args.n_evaluations // args.n_envs, 1)
        callback = OptunaPruningCallback(
            trial, eval_env, n_eval_episodes=args.eval_episodes, eval_freq=eval_freq, deterministic=True, verbose=0
        )
        try:
            model = PPOExt("MlpPolicy", env, device=args.device, **kwargs)
            model.learn(args.n_timesteps, callback=callback)
        except (NonFiniteLossError, ValueError) as error:
            # Some sampled settings diverge (or are rejected): prune them, as rl-zoo3 does.
            raise optuna.TrialPruned(f"{type(error).__name__}: {error}") from error
        finally:
            env.close()
            eval_env.close()
        if callback.is_pruned:
            raise optuna.TrialPruned()
        if callback.eval_idx == 0:  # fewer steps than one evaluation period: evaluate once at the end
            callback.eval_freq = 1
            callback.n_calls = 0
            callback._on_step()
        return float(callback.last_mean_reward)

    return objective


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Pendulum-v1", help="gymnasium environment id")
    parser.add_argument("--n-trials", type=int, default=20, help="trials run by this worker")
    parser.add_argument("--n-timesteps", type=int, default=50_000, help="training steps per trial")
    parser.add_argument("--n-envs", type=int, default=1)
    parser.add_argument("--n-evaluations", type=int, default=4, help="evaluations (and pruning checks) per trial")
    parser.add_argument("--eval-episodes", type=int, default=5, help="episodes per evaluation, >= 1")
    parser.add_argument(
        "--storage",
        default=DEFAULT_STORAGE,
        help=f"Optuna storage: a journal file ending in .log (default {DEFAULT_STORAGE}, no server), "
        "sqlite:///file.db, or postgresql://user:password@host/db for many machines",
    )
    parser.add_argument("--study-name", default=None, help="default: ppo_ext-<env>")
    parser.add_argument(
        "--max-total-trials",
        type=int,
        default=None,
        help="stop once the study (all workers together) has this many finished (complete or pruned) trials",
    )
    parser.add_argument(
        "--heartbeat-interval",
        type=int,
        default=HEARTBEAT_INTERVAL,
        help=f"database storages: seconds between a running trial's heartbeats (default {HEARTBEAT_INTERVAL}; 0: off). "
        "A trial whose worker died is marked FAIL after --grace-period seconds without one and re-queued",
    )
    parser.add_argument("--grace-period", type=int, default=None, help="seconds without a heartbeat (default: 2 intervals)")
    parser.add_argument("--n-startup-trials", type=int, default=5, help="random trials before TPE and pruning start")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (give each worker its own)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    th.set_num_threads(1)
    try:
        gym.spec(args.env)
    except gym.error.Error as error:
        print(f"error: unknown environment id {args.env!r}: {error}", file=sys.stderr)
        return 2
    try:
        storage = make_storage(args.storage, heartbeat_interval=args.heartbeat_interval, grace_period=args.grace_period)
    except (StorageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    study = optuna.create_study(
        storage=storage,
        study_name=args.study_name or f"ppo_ext-{args.env}",
        load_if_exists=True,
        direction="maximize",
        # constant_liar: concurrent workers do not all sample around the same running trials.
        sampler=optuna.samplers.TPESampler(n_startup_trials=args.n_startup_trials, seed=args.seed, constant_liar=True),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=args.n_startup_trials, n_warmup_steps=args.n_evaluations // 3),
    )
    if "command" not in study.user_attrs:
        study.set_user_attr("command", " ".join(sys.orig_argv))
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    callbacks = [] if args.max_total_trials is None else [optuna.study.MaxTrialsCallback(args.max_total_trials, done)]
    if args.max_total_trials is None or len(study.get_trials(deepcopy=False, states=done)) < args.max_total_trials:
        study.optimize(make_objective(args), n_trials=args.n_trials, callbacks=callbacks, gc_after_trial=True)

    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    print(f"study {study.study_name}: {len(study.trials)} trials, {len(finished)} complete")
    if finished:
        from sb3_ppo_ext.samplers import ppo_ext_kwargs_from_params

        best = study.best_trial
        print(f"best trial {best.number}: mean return {best.value:.2f}")
        print(f"best params: {best.params}")
        print(f"PPOExt kwargs:\n{pformat(ppo_ext_kwargs_from_params(best.params))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
