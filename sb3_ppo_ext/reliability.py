"""Fault tolerance: atomic saves, checkpoints that resume a killed run, and clear errors for bad model files.

- :func:`atomic_path` writes a file under a temporary name in the target's folder and renames it
  over the target only once it is complete and on disk (``os.replace``), so an interrupted save
  never replaces the previous good file with a broken one. Otherwise it behaves like a plain
  ``open(path, "wb")``: it writes through a symlink, keeps the file's mode, works for names up to
  the file-name limit and for concurrent writers; in a sticky world-writable folder (``/tmp``) it
  refuses another user's link or file, as the kernel's ``protected_symlinks`` / ``protected_regular``
  rules make ``open()`` do. Temporary files left by killed processes are removed by the next save
  into the same folder; a temporary file is locked while it is written, so a save in progress is
  never taken for a dead one (not even from another PID namespace). :meth:`sb3_ppo_ext.PPOExt.save` uses it.
- :class:`AtomicCheckpointCallback` is SB3's ``CheckpointCallback`` with atomic saves of the model
  (any SB3 algorithm) and of the ``VecNormalize`` statistics, the statistics first, so that every
  model checkpoint on disk has its statistics next to it. It never writes a checkpoint whose
  weights or statistics hold a NaN or an infinity.
- :func:`latest_checkpoint` / :func:`resume` find the newest complete checkpoint of a run and load
  it, with its ``VecNormalize`` statistics, into a fresh environment after a crash; :func:`resume`
  skips broken checkpoints (with a warning saying why) and falls back to the previous good one.
- :func:`check_model_file` (called by :meth:`sb3_ppo_ext.PPOExt.load`) turns a truncated, corrupt
  or foreign model file into a :class:`ModelFileError` that names the file and the problem;
  :func:`model_family` tells which algorithm family wrote a model file.

A model zip holds pickled objects (SB3 stores schedules, spaces and the policy class with
cloudpickle): loading one runs code from it. Load only files you trust (see the README).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import pickletools
import re
import secrets
import socket
import stat
import threading
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


class ModelFileError(ValueError):
    """A model file cannot be loaded: the message names the file and the problem."""


class ForeignModelFileError(ModelFileError):
    """A sound model file, saved by an algorithm family that the loading class does not accept."""


class CheckpointWarning(RuntimeWarning):
    """A checkpoint was not written (non-finite state) or was skipped by :func:`resume` (broken)."""


# --- non-finite values -------------------------------------------------------------------------


def non_finite_entries(value: Any, name: str = "") -> list[str]:
    """
    The names of the floating-point entries of ``value`` that hold a NaN or an infinity.

    :param value: a tensor, array, number, or a (nested) dict / list / tuple of them; other
        objects (ints, strings, None, ...) count as finite
    :param name: the name of ``value`` in the result (dict keys and list positions are appended)
    :return: e.g. ``["policy.mlp_extractor.policy_net.0.weight"]``; empty when all is finite
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
    """
    The non-finite ``VecNormalize`` statistics: ``obs_rms`` (one per key for dict observations)
    and ``ret_rms``, mean and var.

    :param vec_normalize: the statistics to check
    :return: e.g. ``["ret_rms.var"]``; empty when all are finite
    """
    statistics: dict[str, Any] = {}
    obs_rms = getattr(vec_normalize, "obs_rms", None)
    running = obs_rms.items() if isinstance(obs_rms, Mapping) else [("", obs_rms)]
    for key, rms in running:
        if rms is not None:
            statistics[f"obs_rms[{key!r}]" if key else "obs_rms"] = {"mean": rms.mean, "var": rms.var}
    ret_rms = getattr(vec_normalize, "ret_rms", None)
    if ret_rms is not None:
        statistics["ret_rms"] = {"mean": ret_rms.mean, "var": ret_rms.var}
    return non_finite_entries(statistics)


def _listed(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --- atomic writes -----------------------------------------------------------------------------

# Temporary files: ``.sb3_ppo_ext-tmp-<host>-<pid>-<thread>-<random>``. Short (a target name near
# the 255-byte limit still works), hidden, matching no ``*.zip`` / ``*.pkl`` pattern, and unique
# per call. The host (a hash of the host name) and pid are a first sieve for a later save's
# clean-up; what proves a file stale is its lock: the writer holds an exclusive ``flock`` on it
# from its creation until it has been renamed (or removed), so a file whose lock can be taken has
# no writer, in any process, PID namespace or container sharing the folder.
TEMPORARY_PREFIX = ".sb3_ppo_ext-tmp-"
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TEMPORARY_NAME = re.compile(rf"{re.escape(TEMPORARY_PREFIX)}(?P<host>[0-9a-f]{{8}})-(?P<pid>\d+)-\d+-[0-9a-f]+")
_MAX_SYMLINKS = 40  # as the kernel's ELOOP limit


def temporary_name() -> str:
    """A fresh temporary file name for :func:`atomic_path` in this process and thread."""
    return f"{TEMPORARY_PREFIX}{_HOST}-{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(4)}"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, as another user's process
        return True
    return True


def _hold_lock(fd: int, blocking: bool) -> int | None:
    """
    Take an exclusive ``flock`` on the open file ``fd`` through a duplicate descriptor, which keeps
    the lock until it is closed (closing ``fd`` alone does not release it).

    :return: the duplicate descriptor, or None where the lock is held by another open file
        (``blocking=False``) or the file system or platform has no ``flock``
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    lock = os.dup(fd)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:  # BlockingIOError: a writer holds it; ENOLCK, EOPNOTSUPP, EBADF (NFS): cannot tell
        os.close(lock)
        return None
    return lock


def _remove_if_unlocked(path: str) -> bool:
    """Remove the temporary file ``path`` if no writer holds its lock (taken, and kept while removing); True if removed."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # gone, unreadable (another user's file), or a link planted since the scan
        return False
    try:
        lock = _hold_lock(fd, blocking=False)
        if lock is None:
            return False
        try:
            os.unlink(path)  # under the lock: a writer that created the file but has not locked it yet sees it gone
            return True
        except OSError:
            return False
        finally:
            os.close(lock)
    finally:
        os.close(fd)


def remove_stale_temporary_files(folder: str | os.PathLike[str]) -> list[Path]:
    """
    Remove the temporary files that :func:`atomic_path` calls killed on this machine left in ``folder``.

    Only provably stale files are removed: regular files named like :func:`temporary_name`,
    written on this host (by its name), by a process that is no longer alive (in this PID
    namespace), and whose lock no process holds. Every writer holds its temporary file's lock
    until the file is renamed, so a save in progress is left alone even when its pid means nothing
    here (another container or PID namespace on this host sharing the folder), and so is every
    other file, and every file whose lock cannot be tested (a file system without ``flock``).
    Does nothing except on POSIX systems.

    :param folder: the folder to clean
    :return: the files removed
    """
    removed: list[Path] = []
    if os.name != "posix":
        return removed
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            match = _TEMPORARY_NAME.fullmatch(entry.name)
            if match is None or match["host"] != _HOST or not entry.is_file(follow_symlinks=False):
                continue
            if not _process_alive(int(match["pid"])) and _remove_if_unlocked(entry.path):
                removed.append(Path(entry.path))
    return removed


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform / file system can open a folder
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _shared_folder(folder: os.stat_result) -> bool:
    """A sticky world-writable folder (``/tmp``): every local user may create links and files in it."""
    return bool(folder.st_mode & stat.S_ISVTX) and bool(folder.st_mode & stat.S_IWOTH)


def _refuse_in_shared_folder(what: str, path: Path, owner: int, folder: Path, rule: str) -> PermissionError:
    return PermissionError(
        errno.EACCES,
        f"refusing to save through {what} {path}: it belongs to uid {owner}, neither this user ({os.geteuid()}) nor the "
        f"owner of the sticky world-writable folder {folder}, so another local user may have planted it "
        f"(open() refuses it as well where the kernel's {rule} is on); remove it or save to another folder",
        str(path),
    )


def _resolve_for_writing(path: str | os.PathLike[str]) -> Path:
    """
    ``os.path.realpath(path)``, the file that ``open(path, "wb")`` writes, resolved one link at a
    time so that, as Linux's ``fs.protected_symlinks`` does, a symlink lying in a sticky
    world-writable folder is followed only if this user or the folder's owner owns it.

    :raises PermissionError: such a link belongs to another user
    :raises OSError: ``ELOOP``, too many levels of links
    """
    if os.name != "posix":
        return Path(os.path.realpath(path))
    remaining = [part for part in reversed(os.path.join(os.getcwd(), os.fspath(path)).split("/")) if part]
    resolved, followed = Path("/"), 0
    while remaining:
        part = remaining.pop()
        if part in (".", ".."):
            resolved = resolved.parent if part == ".." else resolved
            continue
        candidate = resolved / part
        try:
            link = os.lstat(candidate)
        except OSError:  # not there (yet): the rest is created as named
            link = None
        if link is None or not stat.S_ISLNK(link.st_mode):
            resolved = candidate
            continue
        followed += 1
        if followed > _MAX_SYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), os.fspath(path))
        folder = os.stat(resolved)
        if _shared_folder(folder) and link.st_uid not in (os.geteuid(), folder.st_uid):
            raise _refuse_in_shared_folder("the symlink", candidate, link.st_uid, resolved, "fs.protected_symlinks")
        destination = os.readlink(candidate)
        if destination.startswith("/"):
            resolved = Path("/")
        remaining.extend(part for part in reversed(destination.split("/")) if part)
    return resolved


def _create_temporary(
    folder: Path, like: os.stat_result | None, give_away: bool
) -> tuple[Path, io.BufferedWriter, int | None]:
    """
    Create a temporary file in ``folder`` for writing, with the mode ``open()`` gives the target (the
    existing one's, else the umask's) and, with ``give_away``, the existing one's owner where allowed.

    :return: the file's path, the file object, and the descriptor holding the file's lock (None
        where ``flock`` is not available): close it only once the file has been renamed or removed
    """
    while True:
        temporary = folder / temporary_name()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(temporary, flags, 0o666)
        lock = None
        try:
            lock = _hold_lock(fd, blocking=True)
            if lock is not None and os.fstat(fd).st_nlink == 0:
                # Removed between its creation and the lock by a clean-up that could not tell our pid
                # (another PID namespace): start again under a new name.
                os.close(lock)
                os.close(fd)
                continue
            if like is not None and hasattr(os, "fchmod"):
                os.fchmod(fd, stat.S_IMODE(like.st_mode))
                if give_away and (like.st_uid, like.st_gid) != (os.getuid(), os.getgid()):
                    with contextlib.suppress(OSError):  # only root may give a file away; a group we are in is fine
                        os.fchown(fd, like.st_uid, like.st_gid)
            return temporary, os.fdopen(fd, "wb"), lock
        except BaseException:
            if lock is not None:
                os.close(lock)
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[io.BufferedWriter]:
    """
    Open a temporary file next to ``path`` for writing; on success make it ``path`` in one step.

    The temporary file (:func:`temporary_name`: hidden and short) is flushed and fsynced, then
    renamed over ``path`` with ``os.replace`` (atomic on POSIX and Windows within one file system).
    As with ``open(path, "wb")``: a symlink ``path`` is written through (its target is replaced,
    the link stays); an existing file keeps its mode (and, where allowed, its owner and group); a
    new file gets the mode the umask gives. Each call has its own temporary file, so concurrent
    saves to one path never mix: the last to finish wins, complete. Before writing, temporary
    files of dead processes in the folder are removed (:func:`remove_stale_temporary_files`); the
    temporary file is locked (``flock``) until it has been renamed, so that clean-up never takes
    it for a dead one.
    If the block raises, the temporary file is removed and ``path`` is untouched; if the process
    is killed, ``path`` is untouched and the temporary file waits for the next save to remove it.

    In a sticky world-writable folder (``/tmp``), where any local user may plant a link or a file,
    the save follows the rules that Linux's ``fs.protected_symlinks`` / ``fs.protected_regular``
    apply to ``open()``: a symlink there, or an existing file there, owned by neither this user
    nor the folder's owner is refused with a ``PermissionError`` (never followed, never replaced),
    and the new file there is this user's (never given to the old file's owner).

    :param path: the final file (its folder is created if needed)
    :return: a binary file object open for writing
    :raises PermissionError: ``path`` is (or goes through) another user's link or file in a sticky
        world-writable folder
    """
    target = _resolve_for_writing(path)  # through symlinks, like open()
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporary_files(target.parent)
    folder = os.stat(target.parent)
    shared = os.name == "posix" and _shared_folder(folder)
    try:
        existing: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        existing = None
    if shared and existing is not None and existing.st_uid not in (os.geteuid(), folder.st_uid):
        raise _refuse_in_shared_folder("the file", target, existing.st_uid, target.parent, "fs.protected_regular")
    temporary, file, lock = _create_temporary(target.parent, existing, give_away=not shared)
    try:
        with file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    finally:
        if lock is not None:
            os.close(lock)
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


def model_state_problems(model: BaseAlgorithm) -> list[str]:
    """
    The non-finite parts of what a checkpoint of ``model`` would hold: weights and optimizer
    state (``model.get_parameters()``) and the ``VecNormalize`` statistics of its env, if any.

    :param model: the model to check
    :return: a description per non-finite part; empty when all is finite
    """
    problems = []
    weights = non_finite_entries(model.get_parameters())
    if weights:
        problems.append(f"non-finite weights or optimizer state ({_listed(weights)})")
    vec_normalize = model.get_vec_normalize_env()
    statistics = [] if vec_normalize is None else vec_normalize_problems(vec_normalize)
    if statistics:
        problems.append(f"non-finite VecNormalize statistics ({_listed(statistics)})")
    return problems


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

    A checkpoint is never written from a poisoned state: when the weights, the optimizer state
    or the ``VecNormalize`` statistics (``obs_rms`` / ``ret_rms``, e.g. after a NaN reward) hold a
    NaN or an infinity, that checkpoint is skipped with a :class:`CheckpointWarning` saying why,
    and the previous good ones stay (``keep_last`` removes nothing then).

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
        """
        Write a checkpoint now (statistics first, then the model).

        :return: the model file, or None when the checkpoint was skipped because of non-finite state
        """
        problems = model_state_problems(self.model)
        if problems:
            warnings.warn(
                f"AtomicCheckpointCallback: checkpoint at {self.num_timesteps} steps not written: "
                f"{'; '.join(problems)}. The previous checkpoints are kept.",
                CheckpointWarning,
                stacklevel=2,
            )
            return None
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


def statistics_name(name_prefix: str, timesteps: int) -> str:
    """The name SB3's ``CheckpointCallback`` gives the ``VecNormalize`` statistics of the checkpoint at ``timesteps``."""
    return f"{name_prefix}_vecnormalize_{timesteps}_steps.pkl"


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


def _trained_with_vec_normalize(data: Mapping[str, Any]) -> bool:
    """
    Whether an on-policy model file's ``data`` says its run had a ``VecNormalize``: SB3's
    ``_setup_learn`` sets ``_last_original_obs`` only then (off-policy algorithms always set it).
    """
    return "buffer_size" not in data and data.get("_last_original_obs") is not None


def _model_file_problems(file: Path) -> list[str]:
    """NaN / inf in a model file's weights (every ``.pth`` member, read with ``weights_only``) or numbers of its ``data``."""
    problems = []
    with zipfile.ZipFile(file) as archive:
        data = json.loads(archive.read("data"))
        numbers = [key for key, value in data.items() if isinstance(value, float) and not math.isfinite(value)]
        if numbers:
            problems.append(f"non-finite {_listed(numbers)} in its data")
        for name in archive.namelist():
            if name.endswith(".pth"):
                with archive.open(name) as member:
                    state = th.load(io.BytesIO(member.read()), map_location="cpu", weights_only=True)
                bad = non_finite_entries(state, name.removesuffix(".pth"))
                if bad:
                    problems.append(f"non-finite weights ({_listed(bad)})")
    return problems


def _open_checkpoint(
    algorithm: type[BaseAlgorithm], checkpoint: Checkpoint, env: VecEnv, name_prefix: str, series_has_statistics: bool
) -> tuple[str | None, VecEnv]:
    """
    Check one checkpoint's files and open its statistics around ``env``.

    :return: ``(problem, env)``: the reason to skip it (or None) and the env to load it into
    :raises ForeignModelFileError: the model file is sound but of another algorithm family (a
        mistake of the caller, not a broken checkpoint)
    """
    try:
        check_model_file(checkpoint.model_path, algorithm.__name__, getattr(algorithm, "_model_families", None))
        problems = _model_file_problems(checkpoint.model_path)
        with zipfile.ZipFile(checkpoint.model_path) as archive:
            with_statistics = _trained_with_vec_normalize(json.loads(archive.read("data")))
    except ForeignModelFileError:
        raise
    except Exception as error:  # any other failure to read it makes the file unusable
        return f"{type(error).__name__}: {error}", env
    if problems:
        return "; ".join(problems), env
    if checkpoint.vec_normalize_path is None:
        if series_has_statistics or with_statistics:
            reason = "its model was trained with VecNormalize" if with_statistics else "other checkpoints of the run have them"
            stats_name = statistics_name(name_prefix, checkpoint.timesteps)
            return f"its VecNormalize statistics {stats_name} are missing, and {reason}", env
        return None, env
    try:
        vec_normalize = VecNormalize.load(str(checkpoint.vec_normalize_path), env)
    except AssertionError:  # set_venv: the env's observation space is not the saved one (the caller's env)
        raise
    except Exception as error:  # truncated or damaged pickle
        return (
            f"its VecNormalize statistics {checkpoint.vec_normalize_path.name} cannot be read "
            f"({type(error).__name__}: {error})",
            env,
        )
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

    When the checkpoint has ``VecNormalize`` statistics, ``env`` (an unnormalised ``VecEnv``) is
    wrapped in the saved ``VecNormalize`` (``VecNormalize.load``), statistics and settings
    included; ``model.get_vec_normalize_env()`` returns it.

    A broken newest checkpoint is skipped, with a :class:`CheckpointWarning` naming it and why,
    for the previous one: a model file that is missing, truncated or corrupt, weights or numbers
    that are NaN / inf, statistics that cannot be read or are NaN / inf, and statistics that are
    missing although the run used ``VecNormalize`` (other checkpoints of the run have them, or the
    model file says so): resuming without them would train on unnormalised inputs.

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

# Policy modules that tell a family apart from PPO (same attributes, another rollout / policy interface).
_FAMILY_OF_POLICY_MODULE = (
    ("sb3_ppo_ext.maskable", "MaskablePPO"),
    ("sb3_contrib.common.maskable", "MaskablePPO"),
    ("sb3_ppo_ext.recurrent", "RecurrentPPO"),
    ("sb3_contrib.common.recurrent", "RecurrentPPO"),
)
# How :func:`check_model_file` describes the families that are not an algorithm's name.
_FAMILY_TEXT = {
    "on-policy": "another on-policy algorithm (A2C, ...)",
    "off-policy": "an off-policy algorithm (SAC, TD3, DQN, ...)",
    "unknown": "another algorithm",
}
# The class that loads each family's files, for the message.
_FAMILY_LOADER = {
    "PPO": "stable_baselines3.PPO or sb3_ppo_ext.PPOExt",
    "MaskablePPO": "sb3_contrib.MaskablePPO or sb3_ppo_ext.MaskablePPOExt",
    "RecurrentPPO": "sb3_contrib.RecurrentPPO or sb3_ppo_ext.RecurrentPPOExt",
}


# The policy classes of this package's masked and recurrent algorithms (in ``sb3_ppo_ext.policies``; older
# files name them in ``sb3_ppo_ext.maskable`` / ``sb3_ppo_ext.recurrent``, which _FAMILY_OF_POLICY_MODULE tells).
_FAMILY_OF_POLICY_NAME = (
    ("sb3_ppo_ext.policies.MaskablePPOExt", "MaskablePPO"),
    ("sb3_ppo_ext.policies.RecurrentPPOExt", "RecurrentPPO"),
)


def _policy_module(data: Mapping[str, Any]) -> str:
    policy_class = data.get("policy_class")
    module = policy_class.get("__module__") if isinstance(policy_class, Mapping) else None
    return module if isinstance(module, str) else ""


def _policy_class_path(data: Mapping[str, Any]) -> str:
    """
    ``module.name`` of the saved policy class, read from the opcodes of its pickle (SB3's ``:serialized:``)
    without executing it; ``""`` when it cannot be read.
    """
    policy_class = data.get("policy_class")
    serialized = policy_class.get(":serialized:") if isinstance(policy_class, Mapping) else None
    if not isinstance(serialized, str):
        return ""
    try:
        strings: list[str] = []
        for opcode, argument, _ in pickletools.genops(base64.b64decode(serialized)):
            if opcode.name == "GLOBAL" and isinstance(argument, str):  # protocols 0-3: "module name"
                return argument.replace(" ", ".", 1)
            if opcode.name == "STACK_GLOBAL" and len(strings) >= 2:  # protocol 4+: module, then name
                return f"{strings[-2]}.{strings[-1]}"
            if isinstance(argument, str):
                strings.append(argument)
    except (ValueError, TypeError, binascii.Error):
        return ""
    return ""


def _family_and_reason(data: Mapping[str, Any]) -> tuple[str, str]:
    module = _policy_module(data)
    for prefix, family in _FAMILY_OF_POLICY_MODULE:
        if module.startswith(prefix):  # sb3_ppo_ext.maskable, sb3_ppo_ext.maskable_policies, ...
            return family, f"its policy class comes from {module}"
    path = _policy_class_path(data) if module == "sb3_ppo_ext.policies" else ""
    for prefix, family in _FAMILY_OF_POLICY_NAME:
        if path.startswith(prefix):
            return family, f"its policy class is {path}"
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
    The algorithm family whose ``save`` wrote a model file's ``data`` member (the JSON, read
    without unpickling anything). A family is the upstream algorithm and its drop-ins: files of
    stock ``PPO`` and of ``PPOExt`` are both ``"PPO"``, those of ``MaskablePPO`` and
    ``MaskablePPOExt`` both ``"MaskablePPO"``.

    Told first by the module of the saved policy class, then by the saved attributes:

    - ``"MaskablePPO"``: a policy from ``sb3_contrib.common.maskable``, ``sb3_ppo_ext.policies.MaskablePPOExt*``
      (its class name read from the opcodes of the saved pickle, never executed) or, in older files,
      ``sb3_ppo_ext.maskable*``;
    - ``"RecurrentPPO"``: likewise with ``sb3_contrib.common.recurrent``, ``sb3_ppo_ext.policies.RecurrentPPOExt*``
      or ``sb3_ppo_ext.recurrent*``;
    - the upper-cased algorithm module of an algorithm's own policy (``stable_baselines3.sac.policies``:
      ``"SAC"``, ``sb3_contrib.qrdqn.policies``: ``"QRDQN"``);
    - ``"PPO"``: PPO's attributes (``n_steps``, ``batch_size``, ``n_epochs``, ``clip_range``, ...),
      with SB3's ``ActorCriticPolicy``, one of ``sb3_ppo_ext.policies`` or a custom policy (stock
      PPO and PPOExt);
    - ``"TRPO"``; otherwise ``"on-policy"`` (A2C, ...), ``"off-policy"`` or ``"unknown"``.

    :param data: the model file's ``data`` member, as parsed JSON
    :return: the family
    """
    return _family_and_reason(data)[0]


def _resolve_model_path(path: str | os.PathLike[str]) -> Path:
    """The file SB3's ``load`` reads: ``path``, else ``path.zip``."""
    path = Path(path)
    if not path.exists() and Path(f"{path}.zip").exists():
        return Path(f"{path}.zip")
    return path


_LOCAL_FILE_HEADER = b"PK\x03\x04"
_END_OF_CENTRAL_DIRECTORY = b"PK\x05\x06"


def _read_model_data(stream: IO[bytes] | io.BufferedIOBase, label: str, algorithm: str) -> dict[str, Any]:
    """Check the archive in ``stream`` (seekable, read from its start) and return its parsed ``data``."""
    size = stream.seek(0, io.SEEK_END)
    if size == 0:
        raise ModelFileError(f"{algorithm}.load: model file {label} is empty (0 bytes): an interrupted copy or save?")
    stream.seek(0)
    head = stream.read(4)
    starts_as_zip = bool(head) and _LOCAL_FILE_HEADER.startswith(head)  # a file cut within its first 4 bytes too
    truncated = (
        f"{algorithm}.load: model file {label} is truncated or corrupt: it starts as a zip archive, but its end "
        "(the archive's directory) is missing or damaged: an interrupted copy or save?"
    )
    try:
        with zipfile.ZipFile(stream) as archive:
            # An SB3 model stores its .pth members uncompressed, and each is itself a zip archive: in a
            # truncated file, zipfile finds the directory of such a member. The file's own directory
            # ends the file and lists a first member at offset 0.
            stream.seek(max(size - 22 - len(archive.comment), 0))
            own_directory = stream.read(4) == _END_OF_CENTRAL_DIRECTORY
            first_offset = min((info.header_offset for info in archive.infolist()), default=0)
            if starts_as_zip and (not own_directory or first_offset != 0):
                raise ModelFileError(
                    truncated + f" (the only directory found is that of a member archive at byte {first_offset})"
                )
            broken = archive.testzip()
            if broken is not None:
                raise ModelFileError(f"{algorithm}.load: model file {label} is corrupt: member {broken!r} fails its CRC check")
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
        # SB3's own words for this case ("Error: the file <path> wasn't a zip-file") stay in the message.
        raise ModelFileError(
            f"{algorithm}.load: model file {label} is not a valid zip archive: the file {label} wasn't a zip-file "
            f"({error}); not a model file, or one damaged from its start"
        ) from None
    except (EOFError, OSError, zipfile.LargeZipFile) as error:
        raise ModelFileError(
            f"{algorithm}.load: model file {label} cannot be read ({type(error).__name__}: {error})"
        ) from None
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise ModelFileError(f"{algorithm}.load: model file {label} has a corrupt 'data' member ({error})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{algorithm}.load: model file {label} has a corrupt 'data' member (not a JSON object)")
    return data


def check_model_file(path: str | os.PathLike[str] | FileT, algorithm: str, accepted: Collection[str] | None) -> Path | FileT:
    """
    Check, without unpickling anything, that ``path`` is a complete model file of an accepted family.

    Each algorithm class declares the families it loads in its ``_model_families`` class
    attribute (PPOExt: ``{"PPO"}``, its own files and stock SB3 ``PPO``'s, as a drop-in: a stock
    PPO file loads with its stock policy and PPOExt's extras at their defaults, i.e. PPO's
    objective); :func:`model_family` tells a file's family.

    :param path: the model file (``.zip`` is tried as SB3 does), or a binary file object
        (``io.BytesIO``, an open file; it must be seekable, and its position is kept)
    :param algorithm: the loading class's name, for the message
    :param accepted: the families (:func:`model_family`) the loading class accepts; ``None``
        accepts any Stable-Baselines3 model file
    :return: the resolved file, or the file object itself
    :raises ModelFileError: missing, empty, not a zip archive, truncated or corrupt (CRC), or not
        an SB3 model; :class:`ForeignModelFileError` when saved by a family not in ``accepted``.
        The message names the file and the problem.
    """
    if isinstance(path, (str, os.PathLike)):
        file = _resolve_model_path(path)
        if not file.is_file():
            raise ModelFileError(f"{algorithm}.load: model file {file} does not exist (nor {file}.zip)")
        with open(file, "rb") as stream:
            data = _read_model_data(stream, str(file), algorithm)
        result: Path | FileT = file
        label = str(file)
    else:
        label = str(getattr(path, "name", None) or f"<{type(path).__name__}>")
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
        result = path
    family, reason = _family_and_reason(data)
    if accepted is not None and family not in accepted:
        loader = _FAMILY_LOADER.get(family)
        raise ForeignModelFileError(
            f"{algorithm}.load: model file {label} was saved by {_FAMILY_TEXT.get(family, family)} ({reason}), "
            f"not by the {'/'.join(sorted(accepted))} family that {algorithm} loads; load it with the class that saved it"
            + (f" ({loader})" if loader else "")
        )
    return result
