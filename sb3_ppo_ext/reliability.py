"""Atomic saves, resumable checkpoints, clear errors for bad model files; a model zip runs code: load only trusted ones."""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import io
import json
import os
import pickle
import re
import secrets
import stat
import warnings
import zipfile
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CheckpointCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.running_mean_std import RunningMeanStd
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from sb3_ppo_ext.validation import check_int

AlgorithmT = TypeVar("AlgorithmT", bound=BaseAlgorithm)
FileT = TypeVar("FileT", bound=IO[bytes] | io.BufferedIOBase)  # SB3 loads from both kinds of file object

# Attributes every PPO-family model file stores; another algorithm lacks some.
PPO_DATA_KEYS = ("n_steps", "batch_size", "n_epochs", "clip_range", "gae_lambda", "ent_coef", "vf_coef")
# Temporary files of atomic_path: hidden, matching no ``*.zip`` / ``*.pkl`` pattern, short (for names at the limit).
TEMPORARY_PREFIX = ".sb3_ppo_ext-tmp-"


class ModelFileError(ValueError):
    """A model file cannot be loaded: the message names the file and the problem."""


class ForeignModelFileError(ModelFileError):
    """A sound model file, saved by an algorithm family that the loading class does not accept."""


class CheckpointWarning(RuntimeWarning):
    """A checkpoint was not written (non-finite state) or was skipped by :func:`resume` (broken)."""


def non_finite_entries(value: object, name: str = "") -> list[str]:
    """The names (``name[i]``, ``name.key``) of the NaN / inf arrays, numbers and statistics in nested ``value``."""
    if isinstance(value, (np.ndarray, float, np.floating)):  # first: the health guard checks each step's observations
        finite = not np.issubdtype(np.asarray(value).dtype, np.floating) or bool(np.isfinite(value).all())
    elif isinstance(value, th.Tensor):
        finite = not value.is_floating_point() or bool(th.isfinite(value).all())
    elif isinstance(value, RunningMeanStd):
        return non_finite_entries({"mean": value.mean, "var": value.var}, name)
    elif isinstance(value, Mapping):
        named = {f"{name}.{key}" if name else str(key): item for key, item in value.items()}
        return [entry for key, item in named.items() for entry in non_finite_entries(item, key)]
    elif isinstance(value, (list, tuple)):
        return [entry for index, item in enumerate(value) for entry in non_finite_entries(item, f"{name}[{index}]")]
    else:
        return []
    return [] if finite else [name or "value"]


def model_state_problems(model: BaseAlgorithm) -> list[str]:
    """The non-finite parts of ``model``'s weights, optimizer state and ``VecNormalize`` statistics, as messages."""
    stats = model.get_vec_normalize_env()
    found = {
        "weights or optimizer state": non_finite_entries(model.get_parameters()),
        "VecNormalize statistics": non_finite_entries({name: getattr(stats, name, None) for name in ("obs_rms", "ret_rms")}),
    }
    return [f"non-finite {what} ({_listed(names)})" for what, names in found.items() if names]


def _listed(names: list[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[io.BufferedWriter]:
    """
    A temporary file in ``path``'s folder, open for writing; after the block it is fsynced and renamed over ``path``
    (``os.replace``), and the folder fsynced. A symlink is written through, the mode kept, as by ``open(path, "wb")``.

    :param path: the final file (its folder is created if needed)
    """
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f"{TEMPORARY_PREFIX}{secrets.token_hex(8)}"
    file = os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), "wb")
    try:
        with file:
            with contextlib.suppress(FileNotFoundError, AttributeError):  # a new file; no os.fchmod (Windows)
                os.fchmod(file.fileno(), stat.S_IMODE(os.stat(target).st_mode))
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # not every platform / file system can open a folder
        folder = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One checkpoint on disk: its step count, model file and ``VecNormalize`` statistics (if saved)."""

    timesteps: int
    model_path: Path
    vec_normalize_path: Path | None


class AtomicCheckpointCallback(CheckpointCallback):
    """
    SB3's ``CheckpointCallback`` writing each checkpoint with :func:`save_checkpoint`.

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
        super().__init__(save_freq, save_path, name_prefix=name_prefix, save_vecnormalize=save_vecnormalize, verbose=verbose)
        self.keep_last = None if keep_last is None else check_int("keep_last", keep_last)

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            self.save_checkpoint()
        return True

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint now; return its model file, or None when it was not written."""
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


def _statistics_name(name_prefix: str, timesteps: int) -> str:
    return f"{name_prefix}_vecnormalize_{timesteps}_steps.pkl"


def save_checkpoint(
    model: BaseAlgorithm, save_path: str | os.PathLike[str], name_prefix: str = "rl_model", save_vecnormalize: bool = True
) -> Checkpoint | None:
    """Write ``model`` and its statistics atomically, named as by SB3's ``CheckpointCallback``; warn instead if unsound."""
    problems = model_state_problems(model)
    if problems:
        message = f"checkpoint at {model.num_timesteps} steps not written: {'; '.join(problems)}"
        warnings.warn(message, CheckpointWarning, stacklevel=3)
        return None
    folder, steps = Path(save_path), model.num_timesteps
    vec_normalize = model.get_vec_normalize_env() if save_vecnormalize else None
    statistics = None if vec_normalize is None else folder / _statistics_name(name_prefix, steps)
    if statistics is not None:
        with atomic_path(statistics) as file:
            pickle.dump(vec_normalize, file)  # what VecNormalize.save writes
    checkpoint = Checkpoint(steps, folder / f"{name_prefix}_{steps}_steps.zip", statistics)
    with atomic_path(checkpoint.model_path) as file:
        model.save(file)  # given a file object, SB3 writes into it and leaves it open
    return checkpoint


def list_checkpoints(save_path: str | os.PathLike[str], name_prefix: str = "rl_model") -> list[Checkpoint]:
    """The checkpoints in ``save_path``, oldest first (``name_prefix`` is matched literally, not as a glob)."""
    folder = Path(save_path)
    pattern = re.compile(rf"{re.escape(name_prefix)}_(\d+)_steps\.zip")
    found = []
    for file in folder.iterdir() if folder.is_dir() else []:
        match = pattern.fullmatch(file.name)
        if match:
            stats = folder / _statistics_name(name_prefix, int(match.group(1)))
            found.append(Checkpoint(int(match.group(1)), file, stats if stats.is_file() else None))
    return sorted(found, key=lambda checkpoint: checkpoint.timesteps)


def latest_checkpoint(save_path: str | os.PathLike[str], name_prefix: str = "rl_model") -> Checkpoint | None:
    """The newest checkpoint in ``save_path`` (unchecked), or None."""
    return next(reversed(list_checkpoints(save_path, name_prefix)), None)


def _load_checkpoint(
    algorithm: type[AlgorithmT],
    checkpoint: Checkpoint,
    env: VecEnv,
    name_prefix: str,
    run_has_statistics: bool,
    load_kwargs: dict[str, Any],
) -> AlgorithmT | str:
    """The loaded model, or why the checkpoint is unusable; the caller's mistakes (foreign file, wrong env) raise."""
    try:
        check_model_file(checkpoint.model_path, algorithm.__name__, getattr(algorithm, "_model_families", None))
    except ForeignModelFileError:
        raise
    except ModelFileError as error:
        return str(error)
    statistics, name = checkpoint.vec_normalize_path, _statistics_name(name_prefix, checkpoint.timesteps)
    if statistics is None and run_has_statistics:
        return f"its VecNormalize statistics {name} are missing, and other checkpoints of the run have them"
    try:
        checkpoint_env = env if statistics is None else VecNormalize.load(str(statistics), env)
    except AssertionError:  # set_venv: the env's spaces are not the saved ones
        raise
    except Exception as error:  # a truncated or damaged pickle
        return f"its VecNormalize statistics {name} cannot be read ({type(error).__name__}: {error})"
    model = algorithm.load(checkpoint.model_path, env=checkpoint_env, **load_kwargs)
    # SB3 sets an on-policy model's _last_original_obs only with a VecNormalize.
    if statistics is None and isinstance(model, OnPolicyAlgorithm) and model._last_original_obs is not None:
        return f"its VecNormalize statistics {name} are missing, and its model was trained with VecNormalize"
    return "; ".join(model_state_problems(model)) or model


def resume(
    algorithm: type[AlgorithmT],
    save_path: str | os.PathLike[str],
    env: VecEnv,
    name_prefix: str = "rl_model",
    **load_kwargs: Any,
) -> AlgorithmT:
    """
    Load the newest good checkpoint of a run into ``env`` (wrapped in its ``VecNormalize`` statistics), ready for
    ``learn(..., reset_num_timesteps=False)``; a broken one is skipped with a :class:`CheckpointWarning`.

    :param algorithm: the class that saved the run (``PPOExt``, ``PPO``, ...)
    :param save_path: the checkpoint folder
    :param env: a fresh environment, without ``VecNormalize``
    :param name_prefix: the checkpoints' prefix (matched literally)
    :param load_kwargs: passed to ``algorithm.load``
    :raises FileNotFoundError: no checkpoint in ``save_path``
    :raises ModelFileError: no usable checkpoint (each listed with why), or a foreign one (:class:`ForeignModelFileError`)
    """
    checkpoints = list_checkpoints(save_path, name_prefix)
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoint {name_prefix}_<steps>_steps.zip in {save_path}")
    run_has_statistics = any(checkpoint.vec_normalize_path is not None for checkpoint in checkpoints)
    skipped = []
    for checkpoint in reversed(checkpoints):
        loaded = _load_checkpoint(algorithm, checkpoint, env, name_prefix, run_has_statistics, load_kwargs)
        if not isinstance(loaded, str):
            return loaded
        skipped.append(f"{checkpoint.model_path.name}: {loaded}")
        message = f"resume: skipped checkpoint {checkpoint.model_path} ({loaded}); trying the previous one"
        warnings.warn(message, CheckpointWarning, stacklevel=2)
    raise ModelFileError(f"resume: no usable checkpoint in {save_path}: " + "; ".join(skipped))


# PPO-like families, told by the policy class's module, else by its name (<family>Ext) in sb3_ppo_ext.policies.
_PPO_VARIANTS = (("MaskablePPO", "maskable"), ("RecurrentPPO", "recurrent"))
_FAMILY_TEXT = {"on-policy": "another on-policy algorithm (A2C, ...)", "off-policy": "an off-policy algorithm (SAC, ...)"}


def _family(data: Mapping[str, Any]) -> tuple[str, str]:
    """The family of a model file's parsed ``data`` and the reason."""
    policy_class = data.get("policy_class")
    policy_class = policy_class if isinstance(policy_class, Mapping) else {}
    module = str(policy_class.get("__module__", ""))
    for family, part in _PPO_VARIANTS:
        if module.startswith((f"sb3_ppo_ext.{part}", f"sb3_contrib.common.{part}")):
            return family, f"its policy class comes from {module}"
    if module == "sb3_ppo_ext.policies":
        try:
            pickled = base64.b64decode(str(policy_class.get(":serialized:", "")))
        except binascii.Error:
            pickled = b""
        for family, _ in _PPO_VARIANTS:
            if f"{family}Ext".encode() in pickled:
                return family, f"its policy class is sb3_ppo_ext.policies.{family}Ext*"
    match = re.fullmatch(r"(?:stable_baselines3|sb3_contrib)\.(\w+)\..*", module)
    if match and match.group(1) != "common":
        return match.group(1).upper(), f"its policy class comes from {module}"
    missing = [key for key in PPO_DATA_KEYS if key not in data]
    if not missing:
        return "PPO", f"it has PPO's {', '.join(PPO_DATA_KEYS)}"
    family = "off-policy" if "buffer_size" in data else "on-policy" if "n_steps" in data else "unknown"
    return family, f"it lacks {', '.join(missing)}"


def model_family(data: Mapping[str, Any]) -> str:
    """The family (``"PPO"``, ``"MaskablePPO"``, ``"SAC"``, ..., ``"off-policy"``, ``"unknown"``) that saved ``data``."""
    return _family(data)[0]


def _read_model_data(stream: IO[bytes] | io.BufferedIOBase, label: str, algorithm: str) -> dict[str, Any]:
    """Check the archive in ``stream`` (seekable, read from its start) and return its parsed ``data``."""
    where = f"{algorithm}.load: model file {label}"
    size = stream.seek(0, io.SEEK_END)
    if size == 0:
        raise ModelFileError(f"{where} is empty (0 bytes): an interrupted copy or save?")
    stream.seek(0)
    starts_as_zip = b"PK\x03\x04".startswith(stream.read(4))  # a file cut within its first 4 bytes too
    cut = f"{where} is truncated or corrupt: it starts as a zip archive, but its end (its directory) is missing or damaged"
    try:
        with zipfile.ZipFile(stream) as archive:
            # A cut file may show a (zip) .pth member's directory; the file's own ends it and lists offset 0.
            stream.seek(max(size - 22 - len(archive.comment), 0))
            first_offset = min((info.header_offset for info in archive.infolist()), default=0)
            if starts_as_zip and (stream.read(4) != b"PK\x05\x06" or first_offset != 0):
                raise ModelFileError(f"{cut} (the only directory found is that of a member archive)")
            broken = archive.testzip()
            if broken is not None:
                raise ModelFileError(f"{where} is corrupt: member {broken!r} fails its CRC check")
            names = set(archive.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise ModelFileError(
                    f"{where} is a zip archive but not a Stable-Baselines3 model (it holds {sorted(names)[:8]})"
                )
            raw = archive.read("data")
    except zipfile.BadZipFile as error:
        if starts_as_zip:
            raise ModelFileError(f"{cut} ({error})") from None
        raise ModelFileError(f"{where} is not a valid zip archive: the file {label} wasn't a zip-file ({error})") from None
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
    Check, unpickling nothing, that ``path`` is a complete model file of an ``accepted`` family (:func:`model_family`;
    ``None``: any); raise :class:`ModelFileError` (:class:`ForeignModelFileError`) naming the file and the problem.

    :param path: the model file (``.zip`` is tried as SB3 does), or a seekable binary file object (its position is kept)
    :param algorithm: the loading class's name, for the message
    :param accepted: the families the loading class loads
    :return: the resolved file, or the file object
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
        result, label = path, _label(path)
        if not (callable(getattr(path, "seekable", None)) and path.seekable()):
            raise ModelFileError(f"{algorithm}.load: model file object {label} cannot seek (read it into io.BytesIO first)")
        position = path.tell()
        try:
            data = _read_model_data(path, label, algorithm)
        finally:
            path.seek(position)
    family, reason = _family(data)
    if accepted is not None and family not in accepted:
        upstream = "stable_baselines3" if family == "PPO" else "sb3_contrib"
        loader = f" ({upstream}.{family} or sb3_ppo_ext.{family}Ext)" if family.endswith("PPO") else ""
        raise ForeignModelFileError(
            f"{algorithm}.load: model file {label} was saved by {_FAMILY_TEXT.get(family, family)} ({reason}), "
            f"not by the {'/'.join(sorted(accepted))} family that {algorithm} loads; load it with the class that saved it"
            + loader
        )
    return result


def _label(file: object) -> str:
    return str(getattr(file, "name", None) or f"<{type(file).__name__}>")


# The attribute through which ``load`` hands its keyword arguments to ``_setup_model``, which removes it.
LOADING = "_sb3_ppo_ext_loading"


class Loading(NamedTuple):
    """A ``load`` in progress, as ``_setup_model`` sees it: the class's name, the file, ``load``'s keyword arguments."""

    algorithm: str
    label: str
    overrides: dict[str, Any]


class ModelFiles:
    """``save`` (atomic for a path) and ``load`` (checked first) of the Ext algorithms, first in their bases."""

    _model_families: ClassVar[frozenset[str]] = frozenset({"PPO"})

    def save(
        self,
        path: str | Path | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """
        SB3's ``save``, atomic for a path (:func:`atomic_path`).

        :param path: file (``.zip`` appended when the name has no suffix, as in SB3) or binary file object
        :param exclude: names of parameters to exclude in addition to the default ones
        :param include: names of parameters to include even if excluded by default
        """
        if not isinstance(path, (str, os.PathLike)):
            super().save(path, exclude=exclude, include=include)  # type: ignore[misc]
            return
        with atomic_path(path if Path(path).suffix else f"{os.fspath(path)}.zip") as file:  # SB3's name
            super().save(file, exclude=exclude, include=include)  # type: ignore[misc]

    @classmethod
    def load(
        cls,
        path: str | Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> Any:
        """SB3's ``load``, raising :class:`ModelFileError` for a bad file (:func:`check_model_file`) or ``env``."""
        path = check_model_file(path, cls.__name__, cls._model_families)
        label = str(path) if isinstance(path, (str, os.PathLike)) else _label(path)
        # ``_setup_model`` sets the keyword arguments; SB3 also compares ``policy_kwargs`` with the saved one.
        passed = {key: kwargs[key] for key in ("policy_kwargs",) if key in kwargs}
        try:
            loading = {LOADING: Loading(cls.__name__, label, dict(kwargs))}
            return super().load(path, env, device, custom_objects, print_system_info, force_reset, **passed, **loading)  # type: ignore[misc]
        except ValueError as error:
            if not str(error).startswith(("Observation spaces do not match", "Action spaces do not match")):
                raise
            raise ModelFileError(f"{cls.__name__}.load: {path} does not fit the given env: {error}") from error
