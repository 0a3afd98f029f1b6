"""Model files of the Ext algorithms: ``save`` atomic for a path, ``load`` checked before anything is unpickled.

:class:`ModelFiles` is a mixin placed first in each Ext class's bases (``PPOExt(ModelFiles,
ExtUpdateEngine, PPO)``), beside the atomic-file helpers of :mod:`sb3_ppo_ext.reliability` it uses.
``load`` hands its keyword arguments to the algorithm's ``_setup_model`` (:data:`LOADING`), which
checks them with the constructor's rules (:meth:`sb3_ppo_ext.engine.ExtUpdateEngine._setup_model`).
"""

from __future__ import annotations

import io
import os
import pathlib
from collections.abc import Iterable
from typing import Any, ClassVar, NamedTuple

import torch as th
from stable_baselines3.common.type_aliases import GymEnv

from sb3_ppo_ext.reliability import ModelFileError, atomic_path, check_model_file, zip_path

# The attribute through which ``load`` hands its keyword arguments to ``_setup_model`` (SB3's ``load`` sets
# its keyword arguments as attributes right before ``_setup_model``); removed there.
LOADING = "_sb3_ppo_ext_loading"


class Loading(NamedTuple):
    """A ``load`` in progress, as ``_setup_model`` sees it."""

    algorithm: str
    """the loading class's name"""
    label: str
    """the model file, for messages"""
    overrides: dict[str, Any]
    """``load``'s keyword arguments (set over the saved attributes, as SB3 does)"""


class ModelFiles:
    """``save`` and ``load`` of the Ext algorithms (placed before the update engine and the upstream algorithm)."""

    # Model-file families (see :func:`sb3_ppo_ext.reliability.check_model_file`) this class loads.
    _model_families: ClassVar[frozenset[str]] = frozenset({"PPO"})

    def save(
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
    ) -> None:
        """
        SB3's ``save``, atomic for a path: the zip is written to a temporary file in the same folder
        and renamed over ``path`` once complete, so an interrupted save leaves the previous file intact.

        :param path: file (``.zip`` appended when the name has no suffix, as in SB3) or binary file object
        :param exclude: names of parameters to exclude in addition to the default ones
        :param include: names of parameters to include even if excluded by default
        """
        if not isinstance(path, (str, os.PathLike)):
            super().save(path, exclude=exclude, include=include)  # type: ignore[misc]
            return
        with atomic_path(zip_path(path)) as file:
            super().save(file, exclude=exclude, include=include)  # type: ignore[misc]

    @classmethod
    def load(
        cls,
        path: str | pathlib.Path | io.BufferedIOBase,
        env: GymEnv | None = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        **kwargs: Any,
    ) -> Any:
        """
        SB3's ``load``, with a :class:`sb3_ppo_ext.reliability.ModelFileError` naming the file and the
        problem for a missing, truncated, corrupt or foreign file (checked before anything is unpickled)
        and for an ``env`` whose spaces differ from the saved ones. Files saved by the upstream
        algorithm load (upstream policy, the extras at their defaults, i.e. upstream's objective).
        The file's pickled objects are trusted: load only files you trust.
        """
        path = check_model_file(path, cls.__name__, cls._model_families)  # paths and file objects alike
        label = str(path) if isinstance(path, (str, os.PathLike)) else str(getattr(path, "name", None) or type(path).__name__)
        # SB3 sets the keyword arguments over the saved attributes right before ``_setup_model``;
        # ``_setup_model`` sets them itself, so that it knows which values are the file's.
        # ``policy_kwargs`` also goes to SB3, which compares it with the saved one.
        passed = {key: kwargs[key] for key in ("policy_kwargs",) if key in kwargs}
        try:
            return super().load(  # type: ignore[misc]
                path,
                env=env,
                device=device,
                custom_objects=custom_objects,
                print_system_info=print_system_info,
                force_reset=force_reset,
                **passed,
                **{LOADING: Loading(cls.__name__, label, dict(kwargs))},
            )
        except ValueError as error:
            if not str(error).startswith(("Observation spaces do not match", "Action spaces do not match")):
                raise
            raise ModelFileError(f"{cls.__name__}.load: {path} does not fit the given env: {error}") from error


__all__ = ["LOADING", "Loading", "ModelFiles"]
