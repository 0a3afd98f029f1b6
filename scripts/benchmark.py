"""Benchmark matrix: PPOExt variants against stock PPO and TRPO, algorithms x envs x seeds, in parallel processes.

Every model is built by rl-zoo3's own ``ExperimentManager`` (the path ``python -m rl_zoo3.train``
takes: hyperparameter preprocessing, schedules, ``normalize``, ``n_envs``, env wrappers), so stock
PPO gets exactly rl-zoo3's ``ppo.yml`` entry and the PPOExt variants the shipped ``ppo_ext.yml``
entry (see ``ALGOS``). Every algorithm gets the same seeds and the same env-step budget.

Each run evaluates deterministically on a separate eval env (VecNormalize statistics synced from
the training env when ``normalize`` is on) at step 0, at every multiple of ``--eval-freq`` below
the budget and once more after the last update. It writes ``<out>/<env>/<algo>/seed<k>.csv``
(``timesteps, mean_return, std_return, episodes, wall_time, fps``: ``wall_time`` is the training
time so far, evaluations excluded, ``fps`` the env steps per second of that time) and then a
``seed<k>.done.json`` marker (total wall-clock, training time, env-steps/s, the hyperparameters
used, versions, and the run's segments). Both are written to a temporary file and renamed. A
restarted benchmark skips runs whose marker matches the requested budget and settings.

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
    python scripts/benchmark.py --suite mujoco-1m --out docs/benchmarks/data-1m --machine "local 2-core" --stop-after 120
    python scripts/benchmark.py --envs Pendulum-v1 --algos ppo ppo_ext_clip --seeds 2 --steps 20000
    python scripts/benchmark.py --suite tuned-1m --out docs/benchmarks/data-tuned-1m   # a tuned entry, fresh seeds
    python scripts/benchmark.py --suite heads --out docs/benchmarks/data-heads   # clipped, squashed, Beta head (issue 26)
    python scripts/benchmark.py --suite fast --out docs/benchmarks/data-fast     # fast mode against the default (issue 22)
    python scripts/benchmark_report.py   # docs/BENCHMARKS.md from the results

A tuned entry is validated as ``ppo_ext_tuned``: the entry for the env in ``--candidate FILE`` (a
yml as ``scripts/zoo_study.py best`` writes it; the ``tuned-1m`` suite reads
``docs/benchmarks/study/candidates.yml``), trained beside the shipped entry (``ppo_ext_clip``) on seeds
the study did not use. Its entry's settings are part of what a finished run or checkpoint must match.

Run one process per core at most (``--workers``, default: the core count); each uses one torch thread.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import dataclasses
import io
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: runs are not locked there (see run_lock)
    fcntl = None  # type: ignore[assignment]

CSV_FIELDS = ("timesteps", "mean_return", "std_return", "episodes", "wall_time", "fps")
DEFAULT_OUT = "logs/benchmark"  # logs/ is git-ignored

# name -> (rl-zoo3 algo, overrides of the yml entry, description). "policy_kwargs" overrides are
# merged into the entry's policy_kwargs (see _zoo_overrides).
ALGOS: dict[str, tuple[str, dict[str, Any], str]] = {
    "ppo": ("ppo", {}, "stock SB3 PPO, rl-zoo3's ppo.yml entry"),
    "trpo": ("trpo", {}, "sb3-contrib TRPO, rl-zoo3's trpo.yml entry"),
    "ppo_ext_clip": (
        "ppo_ext",
        {},
        "PPOExt, the shipped ppo_ext.yml entry as it is (squashed head + clip unless a # Tuned entry says otherwise)",
    ),
    "ppo_ext_kl": (
        "ppo_ext",
        {"clip_range": None, "kl_coef": 1.0, "kl_target": 0.01},
        "PPOExt, squashed head + adaptive KL penalty (clip_range: None, kl_coef: 1.0, kl_target: 0.01)",
    ),
    "ppo_ext_gauss": (
        "ppo_ext",
        {"policy_kwargs": {"squash_output": False}},
        "PPOExt, Gaussian head + clip (policy_kwargs.squash_output: False, without the squashed head's own settings)",
    ),
    "ppo_ext_beta": (
        "ppo_ext",
        {"use_sde": False, "policy_kwargs": {"action_dist": "beta"}},
        "PPOExt, Beta head + clip (policy_kwargs.action_dist: beta, use_sde: False; without the Gaussian heads' "
        "own settings: log_std_init, gSDE)",
    ),
    # The Gaussian heads without gSDE, where the shipped entry uses it (Pendulum-v1): the Beta head cannot
    # use gSDE, so these rows separate the head's effect from the noise model's.
    "ppo_ext_gauss_nosde": (
        "ppo_ext",
        {"use_sde": False, "policy_kwargs": {"squash_output": False}},
        "PPOExt, Gaussian head + clip without gSDE (policy_kwargs.squash_output: False, use_sde: False)",
    ),
    "ppo_ext_clip_nosde": (
        "ppo_ext",
        {"use_sde": False},
        "PPOExt, squashed head + clip without gSDE (use_sde: False)",
    ),
    "ppo_ext_tanh": (
        "ppo_ext",
        {"policy_kwargs": {"activation_fn": "tanh"}},
        "PPOExt, squashed head + clip with tanh hidden activations (policy_kwargs.activation_fn: tanh)",
    ),
    # PPOExt's fast mode (issue 22): fused Adam; not bit for bit, so its learning curves are compared with the
    # default's at 10 seeds ("fast" suite).
    "ppo_ext_fast": (
        "ppo_ext",
        {"policy_kwargs": {"fast": True}},
        "PPOExt, the shipped entry with fast mode on (policy_kwargs.fast: True)",
    ),
    "ppo_ext_tuned": (
        "ppo_ext",
        {},
        "PPOExt, a candidate entry (--candidate FILE: a tuning study's best trial) instead of the shipped one",
    ),
    # Masked tasks: stock PPO at the shipped ppo_mask_ext.yml entry's settings (it never sees the masks),
    # MaskablePPOExt as shipped, and with the adaptive KL penalty between masked distributions instead of clipping.
    "ppo_unmasked": ("ppo", {}, "stock SB3 PPO (no masks), the shipped ppo_mask_ext.yml entry's settings"),
    "ppo_mask_ext": ("ppo_mask_ext", {}, "MaskablePPOExt, the shipped ppo_mask_ext.yml entry as it is"),
    "ppo_mask_ext_kl": (
        "ppo_mask_ext",
        {"clip_range": None, "kl_coef": 1.0, "kl_target": 0.01},
        "MaskablePPOExt, adaptive KL penalty (clip_range: None, kl_coef: 1.0, kl_target: 0.01)",
    ),
}
# Algorithms of rl-zoo3 trained with the settings of a yml shipped here (by the --algo whose file it is).
SHIPPED_SETTINGS = {"ppo_unmasked": "ppo_mask_ext"}
# Settings of the squashed head alone, left out when a variant turns the head off (a tuned entry
# may set them; PPOExt raises for them on a Gaussian head, whose entropy has a closed form).
SQUASHED_HEAD_ONLY = ("entropy_estimator",)
# Settings of the Gaussian heads (their std and exploration noise), left out when a variant takes the
# Beta head, which rejects them (its spread is its own; gSDE is a Gaussian noise model).
GAUSSIAN_HEAD_ONLY = ("entropy_estimator", "log_std_init", "state_dependent_std", "log_std_bounds", "full_std", "use_expln")
# Algorithms whose settings come from rl-zoo3's own yml files (the rest from the shipped ppo_ext.yml).
ZOO_OWN = ("ppo", "trpo")
# A candidate entry (a yml of entries by env id, as `scripts/zoo_study.py best` writes them) runs as
# CANDIDATE beside the shipped entry as it is (SHIPPED), on seeds the study never trained with.
CANDIDATE = "ppo_ext_tuned"
SHIPPED = "ppo_ext_clip"
REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class EnvBudget:
    """One env of a suite: env-step budget, seeds, evaluation interval."""

    env: str
    steps: int
    seeds: int
    eval_freq: int
    algos: tuple[str, ...] | None = None  # None: every requested algorithm
    first_seed: int = 0


# Locomotion at the budget users train at: Hopper for the five algorithms, Walker2d for stock PPO, TRPO
# and the PPOExt variant that did best on Hopper. That was ppo_ext_tanh (IQM 1018.9 of 5 seeds); the
# Walker2d-v5 entry keeps SB3's default policy (64x64, tanh activations), where ppo_ext_tanh is the same
# configuration as ppo_ext_clip, so Walker2d runs ppo_ext_clip: the shipped entry as it is.
MUJOCO_1M_HOPPER = ("ppo", "trpo", "ppo_ext_clip", "ppo_ext_kl", "ppo_ext_tanh")
MUJOCO_1M_WALKER = ("ppo", "trpo", "ppo_ext_clip")

MASKED = ("ppo_unmasked", "ppo_mask_ext", "ppo_mask_ext_kl")

# The three heads at the shipped settings (issue 26): SB3's clipped Gaussian, the squashed Gaussian (the
# shipped entry as it is) and the Beta head, on bounded-action tasks, 10 seeds each; where the shipped
# entry explores with gSDE (Pendulum-v1), also both Gaussian heads without it.
HEADS = ("ppo_ext_gauss", "ppo_ext_clip", "ppo_ext_beta")
HEADS_GSDE = (*HEADS, "ppo_ext_gauss_nosde", "ppo_ext_clip_nosde")

# Fast mode against the default, the shipped entry otherwise (issue 22), 10 seeds on two tasks.
FAST = ("ppo_ext_clip", "ppo_ext_fast")

# The first suite (300k steps, issue 5) on a 2-core machine; "pendulum" is its first row alone.
SUITE_300K = ("ppo", "ppo_ext_clip", "ppo_ext_kl", "ppo_ext_gauss")
SUITES: dict[str, list[EnvBudget]] = {
    "pendulum": [EnvBudget("Pendulum-v1", 100_000, 5, 10_000, SUITE_300K)],
    "issue": [
        EnvBudget("Pendulum-v1", 100_000, 5, 10_000, SUITE_300K),
        EnvBudget("LunarLanderContinuous-v3", 300_000, 3, 20_000, SUITE_300K),
        EnvBudget("Hopper-v5", 300_000, 3, 20_000, SUITE_300K),
        EnvBudget("HalfCheetah-v5", 300_000, 3, 20_000, SUITE_300K),
    ],
    "mujoco-1m": [
        EnvBudget("Hopper-v5", 1_000_000, 5, 20_000, MUJOCO_1M_HOPPER),
        EnvBudget("Walker2d-v5", 1_000_000, 3, 20_000, MUJOCO_1M_WALKER),
    ],
    # A tuned entry earns its place on fresh seeds: the Hopper-v5 study's best trial against the shipped
    # entry at 1M steps, on seeds 100-104 (the study's workers seeded their envs with seeds below 20).
    "tuned-1m": [EnvBudget("Hopper-v5", 1_000_000, 5, 20_000, (SHIPPED, CANDIDATE), first_seed=100)],
    # The three Box heads (clipped Gaussian, squashed Gaussian, Beta) at the shipped settings (issue 26).
    "heads": [
        EnvBudget("Pendulum-v1", 100_000, 10, 10_000, HEADS_GSDE),
        # The shipped entry's own budget (20k steps; at n_steps 8 a 300k-step run costs ~8 CPU-minutes).
        EnvBudget("MountainCarContinuous-v0", 20_000, 10, 2_000, HEADS),
        EnvBudget("LunarLanderContinuous-v3", 300_000, 10, 20_000, HEADS),
    ],
    # Fast mode's learning curves against the default's (issue 22).
    "fast": [
        EnvBudget("Pendulum-v1", 100_000, 10, 10_000, FAST),
        EnvBudget("LunarLanderContinuous-v3", 300_000, 10, 20_000, FAST),
    ],
    # Masking through the zoo (--algo ppo_mask_ext): evaluations of MaskablePPOExt are masked
    # (sb3_ppo_ext.envs.MaskedObservations), stock PPO's are its own greedy actions.
    "masked": [
        EnvBudget("Taxi-v4", 200_000, 5, 20_000, MASKED),
        EnvBudget("InvalidActionEnvDiscrete-v0", 20_000, 5, 2_000, MASKED),
    ],
}
# The candidate file a suite validates, relative to the repository (--candidate replaces it).
SUITE_CANDIDATES = {"tuned-1m": "docs/benchmarks/study/candidates.yml"}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the matrix."""

    env: str
    algo: str
    seed: int
    steps: int
    eval_freq: int
    eval_episodes: int
    out: str
    device: str = "cpu"
    # How this invocation runs it (not part of the result): the machine label its segment records,
    # and when to pause at the next checkpoint (after this many more env steps / at this time.time()).
    machine: str = ""
    segment_steps: int | None = None
    deadline: float | None = None
    # The candidate yml (absolute path) that CANDIDATE runs take their entry from; its entry's settings,
    # not its path, are what a finished run or checkpoint must match.
    candidate: str | None = None

    @property
    def stem(self) -> Path:
        return Path(self.out) / self.env / self.algo / f"seed{self.seed}"

    @property
    def csv_path(self) -> Path:
        return self.stem.with_suffix(".csv")

    @property
    def marker_path(self) -> Path:
        return self.stem.with_suffix(".done.json")

    @property
    def log_path(self) -> Path:
        return self.stem.with_suffix(".log")

    @property
    def checkpoint_path(self) -> Path:
        return self.stem.with_suffix(".ckpt")

    def budget(self) -> dict[str, Any]:
        """What a finished run must match to be skipped."""
        return {"steps": self.steps, "eval_freq": self.eval_freq, "eval_episodes": self.eval_episodes, "device": self.device}


def is_finished(spec: RunSpec) -> bool:
    """Whether ``spec`` has a CSV and a done marker recorded for the same budget."""
    if not (spec.csv_path.is_file() and spec.marker_path.is_file()):
        return False
    try:
        marker = json.loads(spec.marker_path.read_text())
    except (OSError, ValueError):
        return False
    if marker.get("budget") != spec.budget():
        return False
    # A run whose yml entry or overrides changed since (e.g. an entry was tuned) is stale.
    return not changed_settings(spec, marker.get("hyperparams") or {})


def changed_settings(spec: RunSpec, recorded: dict[str, Any]) -> list[str]:
    """
    The settings whose value in ``recorded`` (a done marker's ``hyperparams``) differs from what
    ``spec`` would run with now, sorted; empty when they agree or cannot be determined up front.
    """
    expected = expected_hyperparams(spec)
    if expected is None:
        return []
    recorded = _comparable(recorded)
    return sorted(key for key in expected.keys() | recorded.keys() if expected.get(key) != recorded.get(key))


def _comparable(hyperparams: dict[str, Any]) -> dict[str, str]:
    """Hyperparameters as ``repr`` strings, without the budget (``n_timesteps``), as the marker records them."""
    return {
        key: value if isinstance(value, str) else repr(value) for key, value in hyperparams.items() if key != "n_timesteps"
    }


def expected_hyperparams(spec: RunSpec) -> dict[str, str] | None:
    """
    The settings ``spec`` would run with now (yml entry plus the variant's overrides), in the
    marker's form; ``None`` when they cannot be determined up front (then only the budget counts).
    """
    zoo_algo, overrides, _ = ALGOS[spec.algo]
    if zoo_algo in ZOO_OWN and spec.algo not in SHIPPED_SETTINGS:
        entry, _ = _zoo_entry(zoo_algo, spec.env)
    elif spec.algo == CANDIDATE:
        entry = candidate_entry(spec.candidate, spec.env)
    else:
        from sb3_ppo_ext import settings

        algo = SHIPPED_SETTINGS.get(spec.algo, zoo_algo)
        entry = settings.load_hyperparams(spec.env, settings.ALGORITHMS[algo].hyperparams, algo)
    if entry is None:
        return None
    return _comparable({key: repr(value) for key, value in {**entry, **_zoo_overrides(spec.env, overrides)}.items()})


def candidate_entry(path: str | None, env_id: str) -> dict[str, Any]:
    """
    The entry for ``env_id`` in a candidate file: a yml of entries by env id, as
    ``scripts/zoo_study.py best`` writes them (rl-zoo3 reads the same file as its ``--conf-file``).
    """
    import yaml

    if path is None:
        raise ValueError(f"{CANDIDATE} needs a candidate entry: pass --candidate FILE (a yml of entries by env id)")
    try:
        entries = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"candidate file {path}: cannot read it as yml ({error})") from None
    if not isinstance(entries, dict) or not isinstance(entries.get(env_id), dict):
        found = sorted(map(str, entries)) if isinstance(entries, dict) else "no entries"
        raise ValueError(
            f"candidate file {path}: no entry (a mapping) for {env_id}; found {found}. "
            "Write one with: python scripts/zoo_study.py best --env ENV --storage ... --study-name ..."
        )
    return entries[env_id]


def shown_path(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (as markers record it), else as it is."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` atomically, with the package's own :func:`sb3_ppo_ext.reliability.atomic_path`."""
    from sb3_ppo_ext.reliability import atomic_path

    with atomic_path(path) as file:
        file.write(data.encode() if isinstance(data, str) else data)


# --- checkpoints: a run in segments ---------------------------------------------------------------

CHECKPOINT_FORMAT = 1


def default_machine() -> str:
    """The label a segment records when ``--machine`` is not given: host name and core count."""
    return f"{platform.node() or 'unknown host'} ({os.cpu_count()} cores)"


def run_fingerprint(spec: RunSpec) -> dict[str, Any]:
    """What a checkpoint must match to be continued: the budget and the settings the run trains with."""
    _, overrides, _ = ALGOS[spec.algo]
    return {
        "budget": spec.budget(),
        "algo": spec.algo,
        "overrides": repr(overrides),
        "hyperparams": expected_hyperparams(spec),
    }


def read_checkpoint(spec: RunSpec) -> tuple[dict[str, Any] | None, str]:
    """
    The run's checkpoint if it can be continued, else None and why not (no checkpoint, unreadable,
    another format, or settings that changed since: such a run is rerun, never mixed).

    A checkpoint is a zip of ``state.json`` (evaluations, segments, settings fingerprint, the Python
    and numpy generator states), ``arrays.npz`` (VecNormalize statistics, the torch and numpy
    generator states; read without pickle) and ``model.zip`` (the model as ``model.save`` writes it).
    """
    import numpy as np

    path = spec.checkpoint_path
    if not path.is_file():
        return None, "no checkpoint"
    try:
        with zipfile.ZipFile(path) as archive:
            state = json.loads(archive.read("state.json"))
            if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
                return None, f"checkpoint {path} is not a format-{CHECKPOINT_FORMAT} benchmark checkpoint"
            with np.load(io.BytesIO(archive.read("arrays.npz")), allow_pickle=False) as arrays:
                state["arrays"] = {name: arrays[name] for name in arrays.files}
            state["model"] = archive.read("model.zip")
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:  # truncated or foreign file: start over
        return None, f"checkpoint {path} is unreadable ({type(error).__name__}: {error})"
    if state.get("fingerprint") != run_fingerprint(spec):
        return None, f"the run's budget or settings changed since checkpoint {path} was written"
    return state, f"checkpoint at {state['timesteps']} steps"


def _named_running_stats(vec_normalize) -> dict[str, Any]:
    """VecNormalize's ``RunningMeanStd`` objects by name (``obs_rms`` is one per key for a Dict space)."""
    obs_rms = vec_normalize.obs_rms
    named = {f"obs_rms.{key}": rms for key, rms in obs_rms.items()} if isinstance(obs_rms, dict) else {"obs_rms": obs_rms}
    return {**named, "ret_rms": vec_normalize.ret_rms}


def _checkpoint_bytes(model, spec: RunSpec, progress: dict[str, Any]) -> bytes:
    """Everything a later segment needs, at a rollout boundary (after an update, before the next rollout)."""
    import random

    import numpy as np
    import torch as th

    model_file = io.BytesIO()
    model.save(model_file)  # policy, optimizer, num_timesteps, the learning-rate schedule, PPOExt's current beta
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    version, python_state, python_gauss = random.getstate()
    vec_normalize = model.get_vec_normalize_env()
    stats = {} if vec_normalize is None else _named_running_stats(vec_normalize)
    arrays = {
        "torch_rng": th.get_rng_state().numpy(),
        "numpy_rng_keys": keys,
        **{
            f"{name}.{field}": np.asarray(getattr(rms, field), dtype=np.float64)
            for name, rms in stats.items()
            for field in ("mean", "var", "count")
        },
    }
    state = {
        "format": CHECKPOINT_FORMAT,
        "fingerprint": run_fingerprint(spec),
        "timesteps": model.num_timesteps,
        "numpy_rng": [name, int(position), int(has_gauss), float(cached_gaussian)],
        "python_rng": [version, list(python_state), python_gauss],
        **progress,
    }
    array_file = io.BytesIO()
    np.savez(array_file, **arrays)
    archive_file = io.BytesIO()
    with zipfile.ZipFile(archive_file, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("state.json", json.dumps(state))
        archive.writestr("arrays.npz", array_file.getvalue())
        archive.writestr("model.zip", model_file.getvalue())
    return archive_file.getvalue()


def _restore(model, state: dict[str, Any], spec: RunSpec, eval_env):
    """
    The model of a checkpoint, on the freshly built training env of ``model``, with its VecNormalize
    statistics and random states. The envs' own state (the episodes in flight) is not saved: the
    continued run starts new episodes, seeded from the run's seed and the step it resumes at, so a
    resumed run is deterministic but not bit-identical to an uninterrupted one.
    """
    import random

    import numpy as np
    import torch as th

    env = model.get_env()
    restored = type(model).load(io.BytesIO(state["model"]), env=env, device=spec.device)  # force_reset: new episodes
    arrays = state["arrays"]
    vec_normalize = restored.get_vec_normalize_env()
    for name, rms in ({} if vec_normalize is None else _named_running_stats(vec_normalize)).items():
        rms.mean, rms.var = arrays[f"{name}.mean"].copy(), arrays[f"{name}.var"].copy()
        rms.count = float(arrays[f"{name}.count"])
    env.seed(spec.seed + restored.num_timesteps)
    eval_env.seed(spec.seed + restored.num_timesteps + 1_000_003)  # apart from the training envs' seeds
    # After load, which reseeds every generator from the model's seed.
    th.set_rng_state(th.from_numpy(arrays["torch_rng"].copy()))
    name, position, has_gauss, cached_gaussian = state["numpy_rng"]
    np.random.set_state((name, arrays["numpy_rng_keys"], position, has_gauss, cached_gaussian))
    version, python_state, python_gauss = state["python_rng"]
    random.setstate((version, tuple(python_state), python_gauss))
    return restored


# --- one run (in a worker process) -------------------------------------------------------------


def _zoo_entries(zoo_algo: str) -> dict[str, Any]:
    """rl-zoo3's own ``<zoo_algo>.yml``, YAML anchors and merge keys resolved."""
    import rl_zoo3
    import yaml

    return yaml.safe_load((Path(rl_zoo3.__file__).parent / "hyperparams" / f"{zoo_algo}.yml").read_text())


def _zoo_entry(zoo_algo: str, env_id: str) -> tuple[dict[str, Any] | None, str]:
    """
    rl-zoo3's ``<zoo_algo>.yml`` entry for ``env_id``, or, for a ``-v5`` env without one, its ``-v4``
    entry (rl-zoo3 2.9.2 has MuJoCo entries for v4 only).

    :return: the entry (None: none, rl-zoo3 decides) and where it comes from
    """
    entries = _zoo_entries(zoo_algo)
    if env_id in entries:
        return entries[env_id], f"rl_zoo3/hyperparams/{zoo_algo}.yml: {env_id}"
    name, _, version = env_id.rpartition("-v")
    v4 = f"{name}-v4"
    if version == "5" and v4 in entries:
        return entries[v4], f"rl_zoo3/hyperparams/{zoo_algo}.yml: {v4} (the v4 entry, applied to {env_id})"
    return None, f"rl_zoo3/hyperparams/{zoo_algo}.yml: default"


def _zoo_config(zoo_algo: str, env_id: str, folder: str) -> tuple[str | None, str]:
    """
    The config file rl-zoo3 should read for its own ``zoo_algo`` on ``env_id``: its own yml (None)
    or, for a ``-v5`` env, a copy of the ``-v4`` entry under the v5 id in ``folder``.

    :return: the config path (None: rl-zoo3's default file) and the name of the entry used
    """
    import yaml

    entry, source = _zoo_entry(zoo_algo, env_id)
    if entry is None or env_id in _zoo_entries(zoo_algo):
        return None, source
    copy = Path(folder) / f"{zoo_algo}_v5_from_v4.yml"
    copy.write_text(yaml.safe_dump({env_id: entry}))
    return str(copy), source


def _zoo_overrides(env_id: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """
    The variant's overrides, with ``policy_kwargs`` merged into the shipped entry's own. A variant
    that turns the squashed head off also leaves out the entry's settings of that head
    (:data:`SQUASHED_HEAD_ONLY`), which PPOExt rejects for a Gaussian head; a variant that takes the
    Beta head leaves out the Gaussian heads' settings (:data:`GAUSSIAN_HEAD_ONLY`), which it rejects.
    """
    if "policy_kwargs" not in overrides:
        return dict(overrides)
    from sb3_ppo_ext.hyperparams import load_hyperparams

    shipped = load_hyperparams(env_id).get("policy_kwargs") or {}
    if not isinstance(shipped, dict):
        raise ValueError(f"ppo_ext.yml {env_id}: policy_kwargs must be a mapping, got {shipped!r}")
    policy_kwargs = {**shipped, **overrides["policy_kwargs"]}
    if policy_kwargs.get("squash_output") is False:
        policy_kwargs = {key: value for key, value in policy_kwargs.items() if key not in SQUASHED_HEAD_ONLY}
    if policy_kwargs.get("action_dist") == "beta":
        policy_kwargs = {key: value for key, value in policy_kwargs.items() if key not in GAUSSIAN_HEAD_ONLY}
    return {**overrides, "policy_kwargs": policy_kwargs}


def _csv_row(row: tuple) -> list:
    return [row[0], f"{row[1]:.6g}", f"{row[2]:.6g}", row[3], f"{row[4]:.3f}", f"{row[5]:.1f}"]


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
            self.rows: list[tuple] = [tuple(row) for row in progress["rows"]]
            for row in self.rows:
                self.writer.writerow(_csv_row(row))
            csv_file.flush()
            self.next_eval = progress["next_eval"]
            self.train_before = progress["train_time_s"]
            self.eval_before = progress["eval_time_s"]
            self.segments = list(progress["segments"])
            self.start = 0.0
            self.eval_time = 0.0  # this segment's
            self.rows_at_checkpoint = len(self.rows)
            self.checkpoint_timesteps = progress.get("timesteps")
            self.paused = False

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()
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
                "segments": self.finished_segments(),
            }
            write_atomic(spec.checkpoint_path, _checkpoint_bytes(self.model, spec, progress))
            self.rows_at_checkpoint = len(self.rows)
            self.checkpoint_timesteps = self.num_timesteps

        def evaluate(self) -> None:
            began = time.perf_counter()
            train_time = self.train_before + began - self.start - self.eval_time
            sync_envs_normalization(self.training_env, eval_env)
            returns, _ = evaluate_policy(
                self.model, eval_env, n_eval_episodes=spec.eval_episodes, deterministic=True, return_episode_rewards=True
            )
            self.eval_time += time.perf_counter() - began
            fps = self.num_timesteps / train_time if train_time > 0 else 0.0
            row = (self.num_timesteps, float(sum(returns) / len(returns)), float(_std(returns)), len(returns), train_time, fps)
            self.rows.append(row)
            self.writer.writerow(_csv_row(row))
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


def git_output(folder: Path, *args: str) -> str:
    """
    ``git -C folder ARGS``'s stripped output.

    :raises OSError: git is not installed
    :raises subprocess.SubprocessError: git failed (not a checkout, unknown commit) or took over 10 s
    """
    import subprocess

    result = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True, timeout=10)
    return result.stdout.strip()


def source_revision(folder: Path) -> str | None:
    """The git commit of the checkout ``folder`` belongs to (``+dirty`` with uncommitted changes); None outside git."""
    import subprocess

    try:
        commit = git_output(folder, "rev-parse", "--short", "HEAD")
        dirty = git_output(folder, "status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


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
    with open(spec.stem.with_suffix(".lock"), "a+") as lock:
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
    state, why = read_checkpoint(spec)
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
        elif zoo_algo in ZOO_OWN:
            config, source = _zoo_config(zoo_algo, spec.env, folder)
        elif spec.algo == CANDIDATE:
            config, source = spec.candidate, f"{shown_path(spec.candidate)}: {spec.env} (candidate entry)"
        else:
            config, source = None, f"sb3_ppo_ext/hyperparams/{zoo_algo}.yml: {spec.env}"
        overrides = _zoo_overrides(spec.env, overrides)
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
        setup = manager.setup_experiment()
        assert setup is not None
        model, saved_hyperparams = setup
        eval_env = manager.create_envs(1, eval_env=True)
        progress = {"rows": [], "next_eval": 0, "train_time_s": 0.0, "eval_time_s": 0.0, "segments": []}
        if state is not None:
            model = _restore(model, state, spec, eval_env)
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
        marker = {
            "env": spec.env,
            "algo": spec.algo,
            "description": description,
            "seed": spec.seed,
            "budget": spec.budget(),
            "timesteps": model.num_timesteps,
            "final_mean_return": final[1],
            "train_time_s": final[4],
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
    write_atomic(spec.marker_path, json.dumps(marker, indent=1) + "\n")
    spec.checkpoint_path.unlink(missing_ok=True)  # finished: the marker and CSV are the result
    return marker


# --- the matrix ---------------------------------------------------------------------------------


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
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})")
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
    return parser.parse_args(argv)


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
