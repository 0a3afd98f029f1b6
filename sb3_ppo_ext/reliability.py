"""Fault tolerance: atomic saves, checkpoints that resume a killed run, and clear errors for bad model files.

- :func:`atomic_path` writes a file under a temporary name in the target's folder and renames it
  over the target only once it is complete and on disk (``os.replace``), so an interrupted save
  never replaces the previous good file with a broken one. :meth:`sb3_ppo_ext.PPOExt.save` uses it.
- :class:`AtomicCheckpointCallback` is SB3's ``CheckpointCallback`` with atomic saves of the model
  (any SB3 algorithm) and of the ``VecNormalize`` statistics, the statistics first, so that every
  model checkpoint on disk has its statistics next to it.
- :func:`latest_checkpoint` / :func:`resume` find the newest complete checkpoint of a run and load
  it, with its ``VecNormalize`` statistics, into a fresh environment after a crash.
- :func:`check_model_file` (called by :meth:`sb3_ppo_ext.PPOExt.load`) turns a truncated, corrupt
  or foreign model file into a :class:`ModelFileError` that names the file and the problem.

A model zip holds pickled objects (SB3 stores schedules, spaces and the policy class with
cloudpickle): loading one runs code from it. Load only files you trust (see the README).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import CheckpointCallback
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

AlgorithmT = TypeVar("AlgorithmT", bound=BaseAlgorithm)

# Attributes every PPO-family model file (stock PPO or PPOExt) stores; another algorithm lacks some.
PPO_DATA_KEYS = ("n_steps", "batch_size", "n_epochs", "clip_range", "gae_lambda", "ent_coef", "vf_coef")
# Attributes only PPOExt stores.
PPO_EXT_DATA_KEYS = ("kl_coef", "current_kl_coef", "vf_clip_mode")


class ModelFileError(ValueError):
    """A model file cannot be loaded: the message names the file and the problem."""


# --- atomic writes -----------------------------------------------------------------------------


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform / file system can open a folder
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[io.BufferedWriter]:
    """
    Open a temporary file next to ``path`` for writing; on success make it ``path`` in one step.

    The temporary file (``.<name>.tmp-<pid>``, hidden, so that no ``*.zip`` pattern matches it)
    is flushed and fsynced, then renamed over ``path`` with ``os.replace`` (atomic on POSIX and
    Windows within one file system). If the block raises, the temporary file is removed and
    ``path`` is untouched; if the process is killed, ``path`` is untouched and the temporary file
    is left behind.

    :param path: the final file (its folder is created if needed)
    :return: a binary file object open for writing
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(target.parent)


def zip_path(path: str | os.PathLike[str]) -> Path:
    """The file SB3's ``save`` writes for ``path``: ``.zip`` is appended when the name has no suffix."""
    path = Path(path)
    return path if path.suffix else path.with_name(path.name + ".zip")


def save_model_atomically(model: BaseAlgorithm, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """``model.save`` to ``path`` (``.zip`` appended as SB3 does) through :func:`atomic_path`; return the file."""
    target = zip_path(path)
    with atomic_path(target) as file:
        model.save(file, **kwargs)  # given a file object, SB3 writes into it and leaves it open
    return target


def save_vec_normalize_atomically(vec_normalize: VecNormalize, path: str | os.PathLike[str]) -> Path:
    """``VecNormalize.save`` (its pickle) to ``path`` through :func:`atomic_path`; return the file."""
    import pickle

    target = Path(path)
    with atomic_path(target) as file:
        pickle.dump(vec_normalize, file)  # exactly what VecNormalize.save writes
    return target


# --- checkpoints -------------------------------------------------------------------------------


class AtomicCheckpointCallback(CheckpointCallback):
    """
    SB3's ``CheckpointCallback`` whose every file is written atomically (:func:`atomic_path`).

    Files, as SB3 names them: ``<save_path>/<name_prefix>_<steps>_steps.zip`` and, with
    ``save_vecnormalize=True`` (the default here) and a ``VecNormalize`` in the env stack,
    ``<name_prefix>_vecnormalize_<steps>_steps.pkl``, written *before* the model, so a crash
    between the two leaves at most a statistics file without its model, never the reverse.
    The model file carries everything else a resume needs: ``num_timesteps``, PPOExt's live
    ``current_kl_coef`` (beta) and the learning rate (``KLAdaptiveLR`` keeps its adapted rate in
    ``model.learning_rate``).

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

    def save_checkpoint(self) -> Path:
        """Write a checkpoint now (statistics first, then the model); return the model file."""
        vec_normalize = self.model.get_vec_normalize_env()
        if self.save_vecnormalize and vec_normalize is not None:
            stats_path = save_vec_normalize_atomically(vec_normalize, self._checkpoint_path("vecnormalize_", extension="pkl"))
            if self.verbose >= 1:
                print(f"Saving model VecNormalize to {stats_path}")
        model_path = save_model_atomically(self.model, self._checkpoint_path(extension="zip"))
        if self.verbose >= 1:
            print(f"Saving model checkpoint to {model_path}")
        if self.keep_last is not None:
            for old in list_checkpoints(self.save_path, self.name_prefix)[: -self.keep_last]:
                for file in (old.model_path, old.vec_normalize_path):
                    if file is not None:
                        file.unlink(missing_ok=True)
                        if self.verbose >= 2:
                            print(f"Removing old checkpoint file {file}")
        return model_path


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """One checkpoint on disk: the model file, its ``VecNormalize`` statistics (if saved) and its step count."""

    timesteps: int
    model_path: Path
    vec_normalize_path: Path | None


def list_checkpoints(save_path: str | os.PathLike[str], name_prefix: str = "rl_model") -> list[Checkpoint]:
    """The checkpoints in ``save_path`` (:class:`AtomicCheckpointCallback` or SB3's ``CheckpointCallback``), oldest first."""
    folder = Path(save_path)
    pattern = re.compile(rf"{re.escape(name_prefix)}_(\d+)_steps\.zip")
    found = []
    for file in folder.glob(f"{name_prefix}_*_steps.zip") if folder.is_dir() else []:
        match = pattern.fullmatch(file.name)
        if match:
            stats = folder / f"{name_prefix}_vecnormalize_{match.group(1)}_steps.pkl"
            found.append(Checkpoint(int(match.group(1)), file, stats if stats.is_file() else None))
    return sorted(found, key=lambda checkpoint: checkpoint.timesteps)


def latest_checkpoint(save_path: str | os.PathLike[str], name_prefix: str = "rl_model") -> Checkpoint | None:
    """The newest checkpoint in ``save_path``, or None."""
    checkpoints = list_checkpoints(save_path, name_prefix)
    return checkpoints[-1] if checkpoints else None


def resume(
    algorithm: type[AlgorithmT],
    save_path: str | os.PathLike[str],
    env: VecEnv,
    name_prefix: str = "rl_model",
    **load_kwargs: Any,
) -> AlgorithmT:
    """
    Load the newest checkpoint of a run into ``env``, ready for ``learn(..., reset_num_timesteps=False)``.

    When the checkpoint has ``VecNormalize`` statistics, ``env`` (an unnormalised ``VecEnv``) is
    wrapped in the saved ``VecNormalize`` (``VecNormalize.load``), statistics and settings
    included; ``model.get_vec_normalize_env()`` returns it.

    :param algorithm: the class that saved the run (``PPOExt``, ``PPO``, ...)
    :param save_path: the checkpoint folder
    :param env: a fresh environment, without ``VecNormalize``
    :param name_prefix: the checkpoints' prefix
    :param load_kwargs: passed to ``algorithm.load``
    :return: the model, with its timestep count, optimizer state and (PPOExt) beta and learning rate
    :raises FileNotFoundError: no checkpoint in ``save_path``
    """
    checkpoint = latest_checkpoint(save_path, name_prefix)
    if checkpoint is None:
        raise FileNotFoundError(f"no checkpoint {name_prefix}_<steps>_steps.zip in {save_path}")
    if checkpoint.vec_normalize_path is not None:
        env = VecNormalize.load(str(checkpoint.vec_normalize_path), env)
    return algorithm.load(checkpoint.model_path, env=env, **load_kwargs)


# --- model files -------------------------------------------------------------------------------


def _resolve_model_path(path: str | os.PathLike[str]) -> Path:
    """The file SB3's ``load`` reads: ``path``, else ``path.zip``."""
    path = Path(path)
    if not path.exists() and Path(f"{path}.zip").exists():
        return Path(f"{path}.zip")
    return path


def _saved_by(data: dict[str, Any]) -> str:
    """A guess, for the message, at the algorithm family that wrote a model file's ``data``."""
    module = data.get("policy_class", {}).get("__module__", "") if isinstance(data.get("policy_class"), dict) else ""
    match = re.search(r"(?:stable_baselines3|sb3_contrib)\.(\w+)\.", str(module))
    if match and match.group(1) != "common":
        return match.group(1).upper()
    if "buffer_size" in data:
        return "an off-policy algorithm (SAC, TD3, DQN, ...)"
    return "another on-policy algorithm (A2C, ...)" if "n_steps" in data else "another algorithm"


def check_model_file(path: str | os.PathLike[str], algorithm: str = "PPOExt") -> Path:
    """
    Check, without unpickling anything, that ``path`` is a complete model file of the PPO family.

    Accepted: files saved by PPOExt and by stock SB3 ``PPO`` (PPOExt is a drop-in: a stock PPO
    file loads with its stock policy and PPOExt's extras at their defaults, i.e. PPO's objective).

    :param path: the model file (``.zip`` is tried as SB3 does)
    :param algorithm: the loading class's name, for the message
    :return: the resolved file
    :raises ModelFileError: missing, not a zip archive, truncated or corrupt (CRC), not an SB3
        model, or saved by another algorithm; the message names the file and the problem
    """
    file = _resolve_model_path(path)
    if not file.is_file():
        raise ModelFileError(f"{algorithm}.load: model file {file} does not exist (nor {file}.zip)")
    if file.stat().st_size == 0:
        raise ModelFileError(f"{algorithm}.load: model file {file} is empty (0 bytes): an interrupted copy or save?")
    try:
        with zipfile.ZipFile(file) as archive:
            broken = archive.testzip()
            if broken is not None:
                raise ModelFileError(f"{algorithm}.load: model file {file} is corrupt: member {broken!r} fails its CRC check")
            names = set(archive.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise ModelFileError(
                    f"{algorithm}.load: {file} is a zip archive but not a Stable-Baselines3 model "
                    f"(no 'data' / 'policy.pth' member; it holds {sorted(names)[:8]})"
                )
            raw = archive.read("data")
    except zipfile.BadZipFile as error:
        raise ModelFileError(
            f"{algorithm}.load: model file {file} is not a valid zip archive ({error}): truncated, corrupt or not a model file"
        ) from None
    except (EOFError, OSError, zipfile.LargeZipFile) as error:
        raise ModelFileError(f"{algorithm}.load: model file {file} cannot be read ({type(error).__name__}: {error})") from None
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise ModelFileError(f"{algorithm}.load: model file {file} has a corrupt 'data' member ({error})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{algorithm}.load: model file {file} has a corrupt 'data' member (not a JSON object)")
    missing = [key for key in PPO_DATA_KEYS if key not in data]
    if missing:
        raise ModelFileError(
            f"{algorithm}.load: model file {file} was saved by {_saved_by(data)}, not PPO/PPOExt "
            f"(it lacks {', '.join(missing)}); load it with the class that saved it"
        )
    return file
