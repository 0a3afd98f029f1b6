"""The resumable runner: one run under its lock (train, evaluate, checkpoint, record) and the matrix of runs.

Each run evaluates deterministically on a separate eval env at step 0, at every multiple of its
``eval_freq`` below the budget and once more after the last update, writes its CSV and then its done
marker (:mod:`benchmarks.records`), and checkpoints at the first rollout boundary after each
evaluation (:mod:`benchmarks.checkpoints`), so that a run cut off continues where it was. A run
holds an exclusive lock on ``seed<k>.lock`` while it trains; worker processes exit with the process
that started them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import checkpoints
from .entries import candidate_entry, changed_settings, shown_path, zoo_config, zoo_overrides
from .records import (
    CSV_FIELDS,
    DoneMarker,
    RunSpec,
    cpu_model,
    csv_row,
    default_machine,
    read_marker,
    source_revision,
    write_atomic,
    write_marker,
)
from .suites import ALGOS, CANDIDATE, CONF_FILES, REPO, SHIPPED_SETTINGS, SUITE_CANDIDATES, SUITES, ZOO_OWN, EnvBudget

try:
    import fcntl
except ImportError:  # Windows: runs are not locked there (see run_lock)
    fcntl = None  # type: ignore[assignment]


def is_finished(spec: RunSpec) -> bool:
    """Whether ``spec`` has a CSV and a done marker recorded for the same budget."""
    if not (spec.csv_path.is_file() and spec.marker_path.is_file()):
        return False
    try:
        marker = read_marker(spec.marker_path)
    except (OSError, ValueError):
        return False
    if marker.get("budget") != spec.budget():
        return False
    # A run whose yml entry or overrides changed since (e.g. an entry was tuned) is stale.
    return not changed_settings(spec, marker.get("hyperparams") or {})


def _make_eval_callback(
    eval_env, csv_file, spec: RunSpec, progress: dict[str, Any], segment: dict[str, Any], segment_began: float
):
    """
    A callback that evaluates at step 0, at each multiple of ``spec.eval_freq`` below the budget and
    after training, and checkpoints the run at the first rollout boundary after each evaluation.

    ``progress`` (rows, next evaluation, training and evaluation time so far, earlier segments)
    comes from the checkpoint a run resumes from, or is empty. The callback pauses the run at a
    checkpoint once ``spec.segment_steps`` more steps are done or ``spec.deadline`` has passed.
    ``segment_began`` is the ``time.perf_counter()`` at which this segment's process began the run.
    """
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import sync_envs_normalization

    class CSVEvalCallback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.writer = csv.writer(csv_file)
            self.writer.writerow(CSV_FIELDS)
            # A checkpoint written before the cpu_time column existed has rows of six.
            self.rows: list[tuple] = [(*row, float("nan"))[: len(CSV_FIELDS)] for row in progress["rows"]]
            for row in self.rows:
                self.writer.writerow(csv_row(row))
            csv_file.flush()
            self.next_eval = progress["next_eval"]
            self.train_before = progress["train_time_s"]
            self.eval_before = progress["eval_time_s"]
            self.cpu_before = progress.get("train_cpu_s", 0.0)
            self.segments = list(progress["segments"])
            self.start = self.start_cpu = 0.0
            self.eval_time = self.eval_cpu = 0.0  # this segment's
            self.rows_at_checkpoint = len(self.rows)
            self.checkpoint_timesteps = progress.get("timesteps")
            self.paused = False

        def _on_training_start(self) -> None:
            self.start, self.start_cpu = time.perf_counter(), time.process_time()
            if not self.rows:
                self.evaluate()

        def _on_rollout_start(self) -> None:
            # The policy is the one the last evaluation scored, and no rollout is in flight.
            steps = self.num_timesteps - segment["from_timesteps"]
            pause = (spec.segment_steps is not None and steps >= spec.segment_steps) or (
                spec.deadline is not None and time.time() >= spec.deadline
            )
            if len(self.rows) > self.rows_at_checkpoint or (pause and self.checkpoint_timesteps != self.num_timesteps):
                self.checkpoint()
            self.paused = pause

        def _on_step(self) -> bool:
            if self.paused:
                return False  # the rollout just begun is dropped: the checkpoint precedes it
            # Mid-rollout evaluations use the policy of the last update; the one at the budget
            # waits for the last update (_on_training_end).
            if self.next_eval <= self.num_timesteps < spec.steps:
                self.evaluate()
            return True

        def _on_training_end(self) -> None:
            if not self.paused:
                self.evaluate()

        def train_time(self) -> float:
            """Training time of this segment so far (evaluations excluded)."""
            return time.perf_counter() - self.start - self.eval_time

        def train_cpu(self) -> float:
            """This process's CPU time (all threads) of training in this segment so far, evaluations excluded."""
            return time.process_time() - self.start_cpu - self.eval_cpu

        def finished_segments(self) -> list[dict[str, Any]]:
            """The earlier segments and this one, up to now."""
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            current = {
                **segment,
                "to_timesteps": self.num_timesteps,
                "ended_at": now,
                "train_time_s": self.train_time(),
                "wall_time_s": time.perf_counter() - segment_began,
            }
            return [*self.segments, current]

        def checkpoint(self) -> None:
            progress = {
                "rows": self.rows,
                "next_eval": self.next_eval,
                "train_time_s": self.train_before + self.train_time(),
                "eval_time_s": self.eval_before + self.eval_time,
                "train_cpu_s": self.cpu_before + self.train_cpu(),
                "segments": self.finished_segments(),
            }
            write_atomic(spec.checkpoint_path, checkpoints.checkpoint_bytes(self.model, spec, progress))
            self.rows_at_checkpoint = len(self.rows)
            self.checkpoint_timesteps = self.num_timesteps

        def evaluate(self) -> None:
            began, began_cpu = time.perf_counter(), time.process_time()
            train_time = self.train_before + began - self.start - self.eval_time
            train_cpu = self.cpu_before + began_cpu - self.start_cpu - self.eval_cpu
            sync_envs_normalization(self.training_env, eval_env)
            returns, _ = evaluate_policy(
                self.model, eval_env, n_eval_episodes=spec.eval_episodes, deterministic=True, return_episode_rewards=True
            )
            self.eval_time += time.perf_counter() - began
            self.eval_cpu += time.process_time() - began_cpu
            fps = self.num_timesteps / train_time if train_time > 0 else 0.0
            mean = float(sum(returns) / len(returns))
            row = (self.num_timesteps, mean, float(_std(returns)), len(returns), train_time, fps, train_cpu)
            self.rows.append(row)
            self.writer.writerow(csv_row(row))
            csv_file.flush()
            self.next_eval = (self.num_timesteps // spec.eval_freq + 1) * spec.eval_freq

    return CSVEvalCallback()


def _std(values) -> float:
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


@contextlib.contextmanager
def _output_to(log) -> Iterator[None]:
    """Send this process's stdout and stderr to ``log``, at the file-descriptor level too (MuJoCo's warnings)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            yield
    finally:
        log.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


@contextlib.contextmanager
def _working_directory(folder: str) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def pause_line(name: str, marker: dict[str, Any]) -> str:
    """What the benchmark prints for a run that ``run_one`` paused or, past the deadline, did not start."""
    if marker.get("started", True):
        return f"PAUSED {name} at {marker['timesteps']} steps (checkpointed)"
    # The deadline passed before the run's turn: nothing was written for it.
    where = f"stays at its checkpoint of {marker['timesteps']} steps" if marker["timesteps"] else "not started"
    return f"NOT RUN {name} (the --stop-after deadline passed first; {where})"


class RunInProgressError(RuntimeError):
    """Another process holds the run's lock: it is training that run now."""


@contextlib.contextmanager
def run_lock(spec: RunSpec) -> Iterator[None]:
    """
    Hold the exclusive lock of ``spec``'s run (``seed<k>.lock``) or raise :class:`RunInProgressError`.

    ``flock`` locks belong to the open file: the kernel releases them when the holder exits, however
    it exits, so a stale lock file never blocks a later run. Where there is no ``fcntl`` (Windows),
    runs are not locked.
    """
    spec.stem.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # no flock on this platform: run unlocked, as before locks existed
        yield
        return
    with open(spec.lock_path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise RunInProgressError(
                f"{spec.env} {spec.algo} seed {spec.seed} is being run by another process ({holder}) "
                f"in {spec.stem.parent}: not started here, its files are left alone"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        yield


def run_one(spec: RunSpec) -> dict[str, Any]:
    """
    Train and evaluate one run under its lock, from its checkpoint when it has one; write its CSV
    and done marker, or pause it at a checkpoint (``spec.segment_steps``, ``spec.deadline``).

    :return: the marker's content, or ``{"paused": True, "timesteps": ..., "resumed": ...}``
        (with ``"started": False`` when the deadline had passed before the run's turn came)
    :raises RunInProgressError: another process is running the same run now
    """
    spec = dataclasses.replace(spec, out=str(Path(spec.out).resolve()))
    with run_lock(spec):
        return _run_locked(spec)


def _run_locked(spec: RunSpec) -> dict[str, Any]:
    import torch as th

    th.set_num_threads(1)
    state, why = checkpoints.read_checkpoint(spec)
    if spec.deadline is not None and time.time() >= spec.deadline:  # too late to start: its files stay as they are
        return {"paused": True, "started": False, "timesteps": state["timesteps"] if state else 0, "resumed": why}
    if state is None:  # from scratch: nothing of an earlier attempt may mix in
        for stale in (spec.marker_path, spec.csv_path, spec.checkpoint_path):
            stale.unlink(missing_ok=True)
    spec.marker_path.unlink(missing_ok=True)
    tmp_csv = spec.csv_path.with_suffix(".csv.tmp")
    began = time.perf_counter()
    # The run works in a temporary folder (MuJoCo writes MUJOCO_LOG.TXT to the working directory).
    with (
        tempfile.TemporaryDirectory(prefix="sb3_ppo_ext_bench_") as folder,
        open(spec.log_path, "a") as log,
        _output_to(log),
        _working_directory(folder),
    ):
        import rl_zoo3
        import stable_baselines3
        from stable_baselines3.common.utils import set_random_seed

        import sb3_ppo_ext
        from sb3_ppo_ext import zoo

        print(f"=== segment on {spec.machine or default_machine()}: {why}", flush=True)
        zoo.register()  # idempotent; the startup hook normally did it already
        from rl_zoo3.exp_manager import ExperimentManager  # after register(): the package's subclass

        zoo_algo, overrides, description = ALGOS[spec.algo]
        if spec.algo in SHIPPED_SETTINGS:
            from sb3_ppo_ext.settings import ALGORITHMS

            yml = ALGORITHMS[SHIPPED_SETTINGS[spec.algo]].hyperparams
            config, source = str(yml), f"sb3_ppo_ext/hyperparams/{yml.name}: {spec.env}"
        elif spec.algo in CONF_FILES:
            from sb3_ppo_ext.settings import HYPERPARAMS_DIR

            yml_name = CONF_FILES[spec.algo]
            config, source = str(HYPERPARAMS_DIR / yml_name), f"sb3_ppo_ext/hyperparams/{yml_name}: {spec.env}"
        elif zoo_algo in ZOO_OWN:
            config, source = zoo_config(zoo_algo, spec.env, folder)
        elif spec.algo == CANDIDATE:
            config, source = spec.candidate, f"{shown_path(spec.candidate)}: {spec.env} (candidate entry)"
        else:
            config, source = None, f"sb3_ppo_ext/hyperparams/{zoo_algo}.yml: {spec.env}"
        overrides = zoo_overrides(spec.env, overrides, SHIPPED_SETTINGS.get(spec.algo, zoo_algo)) if overrides else {}
        set_random_seed(spec.seed)  # as rl_zoo3.train does before building the manager
        manager = ExperimentManager(
            argparse.Namespace(**dataclasses.asdict(spec)),
            zoo_algo,
            spec.env,
            folder,
            n_timesteps=spec.steps,
            eval_freq=-1,  # our own evaluation callback below
            hyperparams=overrides or None,
            seed=spec.seed,
            verbose=0,
            device=spec.device,
            config=config,
        )
        try:
            setup = manager.setup_experiment()
        except SystemExit as error:  # the manager ends the command on invalid settings: here it fails this run only
            raise RuntimeError(f"{spec.env} {spec.algo}: {error}") from error.__cause__
        assert setup is not None
        model, saved_hyperparams = setup
        eval_env = manager.create_envs(1, eval_env=True)
        progress = {"rows": [], "next_eval": 0, "train_time_s": 0.0, "eval_time_s": 0.0, "train_cpu_s": 0.0, "segments": []}
        if state is not None:
            model = checkpoints.restore(model, state, spec, eval_env)
            progress = state
        revision = source_revision(Path(sb3_ppo_ext.__file__).parent)
        versions = {
            "python": sys.version.split()[0],
            "stable_baselines3": stable_baselines3.__version__,
            "rl_zoo3": rl_zoo3.__version__,
            "sb3_ppo_ext": sb3_ppo_ext.__version__,
            "torch": th.__version__,
        }
        segment = {
            "from_timesteps": model.num_timesteps,
            "machine": spec.machine or default_machine(),
            "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model(),
            "versions": versions,
            "revision": revision,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with open(tmp_csv, "w", newline="") as csv_file:
            evaluation = _make_eval_callback(eval_env, csv_file, spec, progress, segment, began)
            model.learn(
                manager.n_timesteps - model.num_timesteps,
                callback=[*manager.callbacks, evaluation],
                reset_num_timesteps=state is None,
            )
        model.env.close()
        eval_env.close()
        if evaluation.paused:
            return {"paused": True, "timesteps": evaluation.checkpoint_timesteps, "resumed": why}
        if model.num_timesteps < spec.steps:
            raise RuntimeError(f"training stopped at {model.num_timesteps} < {spec.steps} steps")
        final = evaluation.rows[-1]
        segments = evaluation.finished_segments()
        marker: DoneMarker = {
            "env": spec.env,
            "algo": spec.algo,
            "description": description,
            "seed": spec.seed,
            "budget": spec.budget(),
            "timesteps": model.num_timesteps,
            "final_mean_return": final[1],
            "train_time_s": final[4],
            "train_cpu_s": final[6],
            "eval_time_s": evaluation.eval_before + evaluation.eval_time,
            "total_wall_time_s": sum(part["wall_time_s"] for part in segments),
            "env_steps_per_s": final[5],
            "hyperparams_source": source,
            "overrides": {key: repr(value) for key, value in overrides.items()},
            "hyperparams": {key: repr(value) for key, value in saved_hyperparams.items()},
            "n_envs": manager.n_envs,
            "normalize": manager.normalize,
            "versions": versions,
            "sb3_ppo_ext_revision": revision,
            "cpu_count": os.cpu_count(),
            "segments": segments,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    os.replace(tmp_csv, spec.csv_path)
    write_marker(spec.marker_path, marker)
    spec.checkpoint_path.unlink(missing_ok=True)  # finished: the marker and CSV are the result
    return marker


def build_matrix(args: argparse.Namespace) -> list[RunSpec]:
    """Run specs, env by env, seed by seed, algorithm by algorithm (so that partial results stay balanced)."""
    if args.envs:
        budgets = [EnvBudget(env, args.steps or 100_000, args.seeds or 3, args.eval_freq or 10_000) for env in args.envs]
    else:
        budgets = [
            dataclasses.replace(
                b, steps=args.steps or b.steps, seeds=args.seeds or b.seeds, eval_freq=args.eval_freq or b.eval_freq
            )
            for b in SUITES[args.suite]
        ]
    if args.candidate:
        candidate = str(Path(args.candidate).resolve())
    else:
        candidate = None if args.envs or args.suite not in SUITE_CANDIDATES else str(REPO / SUITE_CANDIDATES[args.suite])
    # The candidate variant runs only with a candidate entry to run; every other variant by default.
    algos = args.algos or [algo for algo in ALGOS if algo != CANDIDATE or candidate]
    planned = [(b, algo) for b in budgets for algo in algos if b.algos is None or algo in b.algos]
    if candidate is None and any(algo == CANDIDATE for _, algo in planned):
        raise SystemExit(f"--algos {CANDIDATE} needs --candidate FILE (a yml of entries by env id)")
    if args.candidate and not any(algo == CANDIDATE for _, algo in planned):
        raise SystemExit(f"--candidate {args.candidate} is only used by {CANDIDATE}, which this matrix does not run")
    for b, algo in planned:
        if algo == CANDIDATE:
            try:
                candidate_entry(candidate, b.env)  # a missing file or entry fails here, before any run starts
            except ValueError as error:
                raise SystemExit(str(error)) from None
    deadline = time.time() + args.stop_after * 60 if args.stop_after else None
    machine = args.machine or default_machine()
    first_seeds = {b.env: b.first_seed if args.first_seed is None else args.first_seed for b in budgets}
    return [
        RunSpec(
            b.env,
            algo,
            seed,
            b.steps,
            b.eval_freq,
            args.eval_episodes,
            args.out,
            args.device,
            machine=machine,
            segment_steps=args.segment_steps,
            deadline=deadline,
            candidate=candidate if algo == CANDIDATE else None,
        )
        for b in budgets
        for seed in range(first_seeds[b.env], first_seeds[b.env] + b.seeds)
        for algo in algos
        if b.algos is None or algo in b.algos
    ]


def _format_duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def _exit_with_parent(parent_pid: int, interval_s: float = 1.0) -> None:
    """
    Pool initializer: end this worker as soon as the process that started it is gone.

    A benchmark killed with SIGTERM/SIGKILL does not take its spawned workers with it; left alone,
    they would finish their runs and race a restarted benchmark for the same result files.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def run_matrix(specs: list[RunSpec], workers: int) -> int:
    """
    Run the unfinished specs in ``workers`` processes (each from its checkpoint when it has one),
    printing one line per finished or paused run; return the failure count.
    """
    pending = []
    for spec in specs:
        if is_finished(spec):
            spec.checkpoint_path.unlink(missing_ok=True)  # left by a run killed between its marker and this cleanup
        else:
            pending.append(spec)
    print(
        f"{len(specs)} runs, {len(specs) - len(pending)} already finished (skipped), {len(pending)} to run, {workers} workers"
    )
    if not pending:
        return 0
    failures = 0
    paused = 0
    durations: list[float] = []
    started = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_exit_with_parent, initargs=(os.getpid(),)
    ) as pool:
        futures = {pool.submit(run_one, spec): spec for spec in pending}
        for done, future in enumerate(concurrent.futures.as_completed(futures), start=1):
            spec = futures[future]
            elapsed = time.perf_counter() - started
            name = f"{spec.env} {spec.algo} seed {spec.seed}"
            try:
                marker = future.result()
            except RunInProgressError as error:
                failures += 1
                print(f"[{done}/{len(pending)}] SKIPPED {name}: {error}", flush=True)
                continue
            except Exception:
                failures += 1
                print(f"[{done}/{len(pending)}] FAILED {name} (log: {spec.log_path})\n{traceback.format_exc()}", flush=True)
                continue
            if marker.get("paused"):
                paused += 1
                print(f"[{done}/{len(pending)}] {pause_line(name, marker)}", flush=True)
                continue
            durations.append(marker["total_wall_time_s"])
            # Runs finish about every elapsed/done seconds with all workers busy.
            eta = elapsed / done * (len(pending) - done)
            print(
                f"[{done}/{len(pending)}] {name}: final return {marker['final_mean_return']:.1f} at "
                f"{marker['timesteps']} steps, {marker['env_steps_per_s']:.0f} env-steps/s, "
                f"{_format_duration(marker['total_wall_time_s'])} | elapsed {_format_duration(elapsed)}, "
                f"ETA {_format_duration(eta)}",
                flush=True,
            )
    if paused:
        print(f"{paused} run(s) paused or not started; rerun the same command to continue them", flush=True)
    return failures
