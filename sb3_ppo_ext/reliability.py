"""Fault tolerance: atomic saves, checkpoints that resume a killed run, and clear errors for bad model files.

:func:`atomic_path` (used by :meth:`sb3_ppo_ext.PPOExt.save`) and :class:`AtomicCheckpointCallback` write every file
to a temporary file in the target's folder, fsync it, rename it over the target and fsync the folder: an interrupted
save leaves the previous file intact. :func:`resume` loads the newest good checkpoint of a run after a crash.
:func:`check_model_file` (called by ``load``) turns a truncated, corrupt or foreign model file into a
:class:`ModelFileError` naming the file and the problem, before anything in it is unpickled. A model zip holds
pickled objects: loading one runs code from it, so load only files you trust.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import io
import json
import math
import os
import pickle
import re
import secrets
import stat
import warnings
import zipfile
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CheckpointCallback
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

AlgorithmT = TypeVar("AlgorithmT", bound=BaseAlgorithm)
FileT = TypeVar("FileT", bound=IO[bytes] | io.BufferedIOBase)  # SB3 loads from both kinds of file object

# Attributes every PPO-family model file (stock PPO or PPOExt) stores; another algorithm lacks some.
PPO_DATA_KEYS = ("n_steps", "batch_size", "n_epochs", "clip_range", "gae_lambda", "ent_coef", "vf_coef")
# Temporary files of atomic_path: hidden, matching no ``*.zip`` / ``*.pkl`` pattern, short (a target name at the
# 255-byte limit still works), one per call.
TEMPORARY_PREFIX = ".sb3_ppo_ext-tmp-"


class ModelFileError(ValueError):
    """A model file cannot be loaded: the message names the file and the problem."""


class ForeignModelFileError(ModelFileError):
    """A sound model file, saved by an algorithm family that the loading class does not accept."""


class CheckpointWarning(RuntimeWarning):
    """A checkpoint was not written (non-finite state) or was skipped by :func:`resume` (broken)."""


# --- non-finite values -------------------------------------------------------------------------


def non_finite_entries(value: Any, name: str = "") -> list[str]:
    """
    The names of the floating-point entries of ``value`` that hold a NaN or an infinity, e.g.
    ``["policy.mlp_extractor.policy_net.0.weight"]``; empty when all is finite.

    :param value: a tensor, array, number, or a (nested) dict / list / tuple of them; anything else counts as finite
    :param name: the name of ``value`` in the result (dict keys and list positions are appended)
    """
    if isinstance(value, Mapping):
        return [
            entry for key, item in value.items() for entry in non_finite_entries(item, f"{name}.{key}" if name else str(key))
        ]
    if isinstance(value, (list, tuple)):
        return [entry for index, item in enumerate(value) for entry in non_finite_entries(item, f"{name}[{index}]")]
    if isinstance(value, th.Tensor):
        finite = not value.is_floating_point() or bool(th.isfinite(value).all())
    elif isinstance(value, (float, np.floating, np.ndarray)):
        array = np.asarray(value)
        finite = not np.issubdtype(array.dtype, np.floating) or bool(np.isfinite(array).all())
    else:
        return []
    return [] if finite else [name or "value"]


def vec_normalize_problems(vec_normalize: VecNormalize) -> list[str]:
    """The non-finite ``VecNormalize`` statistics, e.g. ``["ret_rms.var"]``: ``obs_rms`` (per key for dict observations)
    and ``ret_rms``, mean and var."""

    def moments(rms: Any) -> dict[str, Any] | None:
        return None if rms is None else {"mean": rms.mean, "var": rms.var}

    obs_rms = getattr(vec_normalize, "obs_rms", None)
    observations = {key: moments(rms) for key, rms in obs_rms.items()} if isinstance(obs_rms, Mapping) else moments(obs_rms)
    return non_finite_entries({"obs_rms": observations, "ret_rms": moments(getattr(vec_normalize, "ret_rms", None))})


def model_state_problems(model: BaseAlgorithm) -> list[str]:
    """The non-finite parts of what a checkpoint of ``model`` would hold: its weights and optimizer state
    (``model.get_parameters()``) and the ``VecNormalize`` statistics of its env; empty when all is finite."""
    problems = []
    weights = non_finite_entries(model.get_parameters())
    if weights:
        problems.append(f"non-finite weights or optimizer state ({_listed(weights)})")
    vec_normalize = model.get_vec_normalize_env()
    statistics = [] if vec_normalize is None else vec_normalize_problems(vec_normalize)
    if statistics:
        problems.append(f"non-finite VecNormalize statistics ({_listed(statistics)})")
    return problems


def _listed(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --- atomic writes -----------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[io.BufferedWriter]:
    """
    Open a temporary file next to ``path`` for writing; on success make it ``path`` in one step.

    The temporary file (``.sb3_ppo_ext-tmp-<random>``, in the target's folder) is flushed and fsynced, renamed over
    the target with ``os.replace`` (atomic within one file system), and the folder is fsynced. As with
    ``open(path, "wb")``, a symlink ``path`` is written through (its target is replaced, the link stays), an existing
    file keeps its mode and a new file gets the mode the umask gives; the file belongs to the saver. Each call has its
    own temporary file, so concurrent saves to one path never mix: the last to finish wins, complete.
    If the block raises, the temporary file is removed and ``path`` is untouched; if the process is killed, ``path``
    is untouched and the temporary file stays behind (safe to delete).

    :param path: the final file (its folder is created if needed)
    :return: a binary file object open for writing
    """
    target = Path(os.path.realpath(path))  # through symlinks, like open()
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f"{TEMPORARY_PREFIX}{secrets.token_hex(8)}"
    file = os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), "wb")
    try:
        with file:
            with contextlib.suppress(FileNotFoundError):
                mode = stat.S_IMODE(os.stat(target).st_mode)
                if hasattr(os, "fchmod"):
                    os.fchmod(file.fileno(), mode)
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # not every platform / file system can open a folder
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def zip_path(path: str | os.PathLike[str]) -> Path:
    """The file SB3's ``save`` writes for ``path``: ``.zip`` is appended when the name has no suffix."""
    path = Path(path)
    return path if path.suffix else path.with_name(path.name + ".zip")


# --- checkpoints -------------------------------------------------------------------------------


class AtomicCheckpointCallback(CheckpointCallback):
    """
    SB3's ``CheckpointCallback`` whose every file is written atomically (:func:`atomic_path`).

    Files, as SB3 names them: ``<save_path>/<name_prefix>_<steps>_steps.zip`` and, with ``save_vecnormalize=True``
    (the default here) and a ``VecNormalize`` in the env stack, ``<name_prefix>_vecnormalize_<steps>_steps.pkl``,
    written *before* the model: a crash between the two leaves at most statistics without their model. The model
    file carries the rest of what a resume needs: ``num_timesteps``, PPOExt's beta (``current_kl_coef``) and the
    learning rate (``KLAdaptiveLR`` keeps its adapted rate in ``model.learning_rate``). A checkpoint whose weights,
    optimizer state or ``VecNormalize`` statistics hold a NaN or an infinity is not written (a
    :class:`CheckpointWarning` says why; the previous checkpoints are kept).

    :param save_freq: save every ``save_freq`` calls of the callback (``max(steps // n_envs, 1)`` for steps)
    :param save_path: folder of the checkpoints
    :param name_prefix: common prefix of the files
    :param save_vecnormalize: save the ``VecNormalize`` statistics too
    :param keep_last: keep only the newest ``keep_last`` checkpoints (``None``: keep all)
    :param verbose: 1 prints each file written, 2 also each file removed
    """

    def __init__(
        self,
        save_freq: int,
        save_path: str,
        name_prefix: str = "rl_model",
        save_vecnormalize: bool = True,
        keep_last: int | None = None,
        verbose: int = 0,
    ):
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last={keep_last!r} is invalid: expected an int >= 1 or None")
        super().__init__(save_freq, save_path, name_prefix=name_prefix, save_vecnormalize=save_vecnormalize, verbose=verbose)
        self.keep_last = keep_last

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            self.save_checkpoint()
        return True

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint now (:func:`save_checkpoint`); return its model file, or None when it was not written."""
        checkpoint = save_checkpoint(self.model, self.save_path, self.name_prefix, self.save_vecnormalize)
        if checkpoint is None:
            return None
        if self.verbose >= 1:
            print(f"Saving model checkpoint to {checkpoint.model_path}")
        for old in list_checkpoints(self.save_path, self.name_prefix)[: -self.keep_last] if self.keep_last else []:
            for file in (old.model_path, old.vec_normalize_path):
                if file is not None:
                    file.unlink(missing_ok=True)
                    if self.verbose >= 2:
                        print(f"Removing old checkpoint file {file}")
        return checkpoint.model_path


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One checkpoint on disk: the model file, its ``VecNormalize`` statistics (if saved) and its step count."""

    timesteps: int
    model_path: Path
    vec_normalize_path: Path | None


def statistics_name(name_prefix: str, timesteps: int) -> str:
    """The name SB3's ``CheckpointCallback`` gives the ``VecNormalize`` statistics of the checkpoint at ``timesteps``."""
    return f"{name_prefix}_vecnormalize_{timesteps}_steps.pkl"


def save_checkpoint(
    model: BaseAlgorithm, save_path: str | os.PathLike[str], name_prefix: str = "rl_model", save_vecnormalize: bool = True
) -> Checkpoint | None:
    """
    Write ``model`` atomically as ``<save_path>/<name_prefix>_<num_timesteps>_steps.zip``, after its ``VecNormalize``
    statistics (if any, and ``save_vecnormalize``) as ``<name_prefix>_vecnormalize_<num_timesteps>_steps.pkl``: the
    files of SB3's ``CheckpointCallback``, which :func:`resume` reads. Nothing is written, with a
    :class:`CheckpointWarning` saying why, when the weights, optimizer state or statistics hold a NaN or an infinity.

    :return: the checkpoint written, or None
    """
    problems = model_state_problems(model)
    if problems:
        message = f"checkpoint at {model.num_timesteps} steps not written: {'; '.join(problems)}"
        warnings.warn(message, CheckpointWarning, stacklevel=3)
        return None
    folder, steps = Path(save_path), model.num_timesteps
    vec_normalize = model.get_vec_normalize_env() if save_vecnormalize else None
    statistics = None if vec_normalize is None else folder / statistics_name(name_prefix, steps)
    if statistics is not None:
        with atomic_path(statistics) as file:
            pickle.dump(vec_normalize, file)  # what VecNormalize.save writes
    model_path = folder / f"{name_prefix}_{steps}_steps.zip"
    with atomic_path(model_path) as file:
        model.save(file)  # given a file object, SB3 writes into it and leaves it open
    return Checkpoint(steps, model_path, statistics)


def list_checkpoints(save_path: str | os.PathLike[str], name_prefix: str = "rl_model") -> list[Checkpoint]:
    """
    The checkpoints in ``save_path`` (:class:`AtomicCheckpointCallback` or SB3's ``CheckpointCallback``), oldest first.

    ``name_prefix`` is matched literally (``run[1]`` is a name, not a glob pattern).
    """
    folder = Path(save_path)
    pattern = re.compile(rf"{re.escape(name_prefix)}_(\d+)_steps\.zip")
    found = []
    for file in folder.iterdir() if folder.is_dir() else []:
        match = pattern.fullmatch(file.name)
        if match:
            stats = folder / statistics_name(name_prefix, int(match.group(1)))
            found.append(Checkpoint(int(match.group(1)), file, stats if stats.is_file() else None))
    return sorted(found, key=lambda checkpoint: checkpoint.timesteps)


def latest_checkpoint(save_path: str | os.PathLike[str], name_prefix: str = "rl_model") -> Checkpoint | None:
    """The newest checkpoint in ``save_path``, or None (no check of its contents: :func:`resume` does that)."""
    checkpoints = list_checkpoints(save_path, name_prefix)
    return checkpoints[-1] if checkpoints else None


def _open_checkpoint(
    algorithm: type[BaseAlgorithm], checkpoint: Checkpoint, env: VecEnv, name_prefix: str, series_has_statistics: bool
) -> tuple[str | None, VecEnv]:
    """
    Check one checkpoint's files (NaN / inf in the weights, every ``.pth`` member read with ``weights_only``, and in
    the numbers of ``data``) and open its statistics around ``env``.

    :return: ``(problem, env)``: the reason to skip it (or None) and the env to load it into
    :raises ForeignModelFileError: the model file is sound but of another algorithm family (the caller's mistake)
    """
    try:
        check_model_file(checkpoint.model_path, algorithm.__name__, getattr(algorithm, "_model_families", None))
        with zipfile.ZipFile(checkpoint.model_path) as archive:
            data = json.loads(archive.read("data"))
            numbers = [key for key, value in data.items() if isinstance(value, float) and not math.isfinite(value)]
            problems = [f"non-finite {_listed(numbers)} in its data"] if numbers else []
            for name in archive.namelist():
                if name.endswith(".pth"):
                    state = th.load(io.BytesIO(archive.read(name)), map_location="cpu", weights_only=True)
                    weights = non_finite_entries(state, name.removesuffix(".pth"))
                    problems += [f"non-finite weights ({_listed(weights)})"] if weights else []
    except ForeignModelFileError:
        raise
    except Exception as error:  # any other failure to read it makes the file unusable
        return f"{type(error).__name__}: {error}", env
    if problems:
        return "; ".join(problems), env
    if checkpoint.vec_normalize_path is None:
        # SB3's _setup_learn sets _last_original_obs only with a VecNormalize (off-policy algorithms always set it).
        trained_with_statistics = "buffer_size" not in data and data.get("_last_original_obs") is not None
        if not (series_has_statistics or trained_with_statistics):
            return None, env
        reason = (
            "its model was trained with VecNormalize" if trained_with_statistics else "other checkpoints of the run have them"
        )
        return (
            f"its VecNormalize statistics {statistics_name(name_prefix, checkpoint.timesteps)} are missing, and {reason}",
            env,
        )
    try:
        vec_normalize = VecNormalize.load(str(checkpoint.vec_normalize_path), env)
    except AssertionError:  # set_venv: the env's observation space is not the saved one (the caller's env)
        raise
    except Exception as error:  # truncated or damaged pickle
        name = checkpoint.vec_normalize_path.name
        return f"its VecNormalize statistics {name} cannot be read ({type(error).__name__}: {error})", env
    statistics = vec_normalize_problems(vec_normalize)
    if statistics:
        return f"non-finite VecNormalize statistics ({_listed(statistics)}) in {checkpoint.vec_normalize_path.name}", env
    return None, vec_normalize


def resume(
    algorithm: type[AlgorithmT],
    save_path: str | os.PathLike[str],
    env: VecEnv,
    name_prefix: str = "rl_model",
    **load_kwargs: Any,
) -> AlgorithmT:
    """
    Load the newest good checkpoint of a run into ``env``, ready for ``learn(..., reset_num_timesteps=False)``.

    With ``VecNormalize`` statistics, ``env`` (an unnormalised ``VecEnv``) is wrapped in the saved ``VecNormalize``
    (``VecNormalize.load``). A broken newest checkpoint is skipped for the previous one, with a
    :class:`CheckpointWarning` naming it and why: a model file that is truncated or corrupt, NaN / inf weights or
    numbers, statistics that cannot be read or are NaN / inf, and statistics missing although the run used
    ``VecNormalize`` (other checkpoints of the run have them, or the model file says so).

    :param algorithm: the class that saved the run (``PPOExt``, ``PPO``, ...)
    :param save_path: the checkpoint folder
    :param env: a fresh environment, without ``VecNormalize``
    :param name_prefix: the checkpoints' prefix (matched literally)
    :param load_kwargs: passed to ``algorithm.load``
    :return: the model, with its timestep count, optimizer state and (PPOExt) beta and learning rate
    :raises FileNotFoundError: no checkpoint in ``save_path``
    :raises ModelFileError: no usable checkpoint (the message lists each one and why), or the
        checkpoints were saved by another algorithm family (:class:`ForeignModelFileError`)
    """
    checkpoints = list_checkpoints(save_path, name_prefix)
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoint {name_prefix}_<steps>_steps.zip in {save_path}")
    series_has_statistics = any(checkpoint.vec_normalize_path is not None for checkpoint in checkpoints)
    skipped = []
    for checkpoint in reversed(checkpoints):
        problem, checkpoint_env = _open_checkpoint(algorithm, checkpoint, env, name_prefix, series_has_statistics)
        if problem is None:
            return algorithm.load(checkpoint.model_path, env=checkpoint_env, **load_kwargs)
        skipped.append(f"{checkpoint.model_path.name}: {problem}")
        warnings.warn(
            f"resume: skipped checkpoint {checkpoint.model_path} ({problem}); trying the previous one",
            CheckpointWarning,
            stacklevel=2,
        )
    raise ModelFileError(f"resume: no usable checkpoint in {save_path}: " + "; ".join(skipped))


# --- model files -------------------------------------------------------------------------------

# The families that share PPO's attributes are told apart by the saved policy class: by its module (sb3-contrib's,
# and sb3_ppo_ext.maskable* / .recurrent* in older files), else by its name, which the pickle of a class records as
# a string (this package's policies all live in sb3_ppo_ext.policies).
_FAMILY_OF_POLICY_MODULE = (
    ("sb3_ppo_ext.maskable", "MaskablePPO"),
    ("sb3_contrib.common.maskable", "MaskablePPO"),
    ("sb3_ppo_ext.recurrent", "RecurrentPPO"),
    ("sb3_contrib.common.recurrent", "RecurrentPPO"),
)
_FAMILY_OF_POLICY_NAME = (("MaskablePPOExt", "MaskablePPO"), ("RecurrentPPOExt", "RecurrentPPO"))
# How :func:`check_model_file` describes the families that are not an algorithm's name.
_FAMILY_TEXT = {"on-policy": "another on-policy algorithm (A2C, ...)", "off-policy": "an off-policy algorithm (SAC, ...)"}


def _family_and_reason(data: Mapping[str, Any]) -> tuple[str, str]:
    policy_class = data.get("policy_class")
    policy_class = policy_class if isinstance(policy_class, Mapping) else {}
    module = str(policy_class.get("__module__", ""))
    for prefix, family in _FAMILY_OF_POLICY_MODULE:
        if module.startswith(prefix):
            return family, f"its policy class comes from {module}"
    if module == "sb3_ppo_ext.policies":
        try:
            pickled = base64.b64decode(str(policy_class.get(":serialized:", "")))
        except binascii.Error:
            pickled = b""
        for name, family in _FAMILY_OF_POLICY_NAME:
            if name.encode() in pickled:
                return family, f"its policy class is sb3_ppo_ext.policies.{name}*"
    match = re.fullmatch(r"(?:stable_baselines3|sb3_contrib)\.(\w+)\..*", module)
    if match and match.group(1) != "common":
        return match.group(1).upper(), f"its policy class comes from {module}"
    missing = [key for key in PPO_DATA_KEYS if key not in data]
    if not missing:
        return "PPO", f"it has PPO's {', '.join(PPO_DATA_KEYS)}"
    lacks = f"it lacks {', '.join(missing)}"
    if "cg_max_steps" in data:
        return "TRPO", lacks
    if "buffer_size" in data:
        return "off-policy", lacks
    return ("on-policy" if "n_steps" in data else "unknown"), lacks


def model_family(data: Mapping[str, Any]) -> str:
    """
    The algorithm family whose ``save`` wrote a model file's ``data`` member (parsed JSON; nothing is unpickled):
    the upstream algorithm of the file's class (stock ``PPO`` and ``PPOExt`` files are both ``"PPO"``).

    ``"MaskablePPO"`` / ``"RecurrentPPO"`` for a policy class from sb3-contrib's ``common.maskable`` /
    ``common.recurrent`` or this package's ``MaskablePPOExt*`` / ``RecurrentPPOExt*`` policies; the upper-cased
    algorithm module of an algorithm's own policy (``stable_baselines3.sac.policies``: ``"SAC"``); ``"PPO"`` for PPO's
    attributes with any other policy; else ``"TRPO"``, ``"on-policy"`` (A2C, ...), ``"off-policy"`` or ``"unknown"``.
    """
    return _family_and_reason(data)[0]


def _read_model_data(stream: IO[bytes] | io.BufferedIOBase, label: str, algorithm: str) -> dict[str, Any]:
    """Check the archive in ``stream`` (seekable, read from its start) and return its parsed ``data``."""
    where = f"{algorithm}.load: model file {label}"
    size = stream.seek(0, io.SEEK_END)
    if size == 0:
        raise ModelFileError(f"{where} is empty (0 bytes): an interrupted copy or save?")
    stream.seek(0)
    starts_as_zip = b"PK\x03\x04".startswith(stream.read(4))  # a file cut within its first 4 bytes too
    truncated = (
        f"{where} is truncated or corrupt: it starts as a zip archive, but its end (the archive's directory) is "
        "missing or damaged: an interrupted copy or save?"
    )
    try:
        with zipfile.ZipFile(stream) as archive:
            # SB3 stores its .pth members uncompressed, and each is itself a zip archive: in a cut file zipfile
            # finds a member's directory. The file's own directory ends the file and lists a member at offset 0.
            stream.seek(max(size - 22 - len(archive.comment), 0))
            first_offset = min((info.header_offset for info in archive.infolist()), default=0)
            if starts_as_zip and (stream.read(4) != b"PK\x05\x06" or first_offset != 0):
                raise ModelFileError(f"{truncated} (the only directory found is that of a member archive)")
            broken = archive.testzip()
            if broken is not None:
                raise ModelFileError(f"{where} is corrupt: member {broken!r} fails its CRC check")
            names = set(archive.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise ModelFileError(
                    f"{algorithm}.load: {label} is a zip archive but not a Stable-Baselines3 model "
                    f"(no 'data' / 'policy.pth' member; it holds {sorted(names)[:8]})"
                )
            raw = archive.read("data")
    except zipfile.BadZipFile as error:
        if starts_as_zip:
            raise ModelFileError(f"{truncated} ({error})") from None
        # SB3's own words for this case ("the file <path> wasn't a zip-file") stay in the message.
        raise ModelFileError(
            f"{where} is not a valid zip archive: the file {label} wasn't a zip-file ({error}); not a model file, "
            "or one damaged from its start"
        ) from None
    except (EOFError, OSError, zipfile.LargeZipFile) as error:
        raise ModelFileError(f"{where} cannot be read ({type(error).__name__}: {error})") from None
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise ModelFileError(f"{where} has a corrupt 'data' member ({error})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{where} has a corrupt 'data' member (not a JSON object)")
    return data


def check_model_file(path: str | os.PathLike[str] | FileT, algorithm: str, accepted: Collection[str] | None) -> Path | FileT:
    """
    Check, without unpickling anything, that ``path`` is a complete model file of an accepted family.

    :param path: the model file (``.zip`` is tried as SB3 does), or a seekable binary file object (its position is kept)
    :param algorithm: the loading class's name, for the message
    :param accepted: the families (:func:`model_family`) the loading class loads (its ``_model_families``); ``None``
        accepts any Stable-Baselines3 model file
    :return: the resolved file, or the file object itself
    :raises ModelFileError: missing, empty, not a zip archive, truncated or corrupt (CRC), or not an SB3 model;
        :class:`ForeignModelFileError` when saved by a family not in ``accepted``
    """
    if isinstance(path, (str, os.PathLike)):
        file = Path(path) if Path(path).exists() or not Path(f"{path}.zip").exists() else Path(f"{path}.zip")
        result: Path | FileT = file
        label = str(file)
        if not file.is_file():
            raise ModelFileError(f"{algorithm}.load: model file {label} does not exist (nor {label}.zip)")
        with open(file, "rb") as stream:
            data = _read_model_data(stream, label, algorithm)
    else:
        result, label = path, str(getattr(path, "name", None) or f"<{type(path).__name__}>")
        if not (callable(getattr(path, "seekable", None)) and path.seekable()):
            raise ModelFileError(
                f"{algorithm}.load: model file object {label} cannot seek: a model zip needs random access "
                "(read it into io.BytesIO first)"
            )
        position = path.tell()
        try:
            data = _read_model_data(path, label, algorithm)
        finally:
            path.seek(position)
    family, reason = _family_and_reason(data)
    if accepted is not None and family not in accepted:
        upstream = "stable_baselines3" if family == "PPO" else "sb3_contrib"
        loader = f" ({upstream}.{family} or sb3_ppo_ext.{family}Ext)" if family.endswith("PPO") else ""
        raise ForeignModelFileError(
            f"{algorithm}.load: model file {label} was saved by {_FAMILY_TEXT.get(family, family)} ({reason}), "
            f"not by the {'/'.join(sorted(accepted))} family that {algorithm} loads; load it with the class that saved it"
            + loader
        )
    return result
