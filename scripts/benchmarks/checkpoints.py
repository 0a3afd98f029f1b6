"""A run's checkpoint (``seed<k>.ckpt``): what a resumed run continues from, read back only for the same budget and settings.

A checkpoint is a zip of ``state.json`` (evaluations, segments, settings fingerprint, the Python and
numpy generator states), ``arrays.npz`` (VecNormalize statistics, the torch and numpy generator
states; read without pickle) and ``model.zip`` (the model as ``model.save`` writes it).
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

from .entries import expected_hyperparams
from .records import RunSpec
from .suites import ALGOS

CHECKPOINT_FORMAT = 1


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


def checkpoint_bytes(model, spec: RunSpec, progress: dict[str, Any]) -> bytes:
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


def restore(model, state: dict[str, Any], spec: RunSpec, eval_env):
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
