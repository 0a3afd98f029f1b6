"""What the rl-zoo3 registration (:mod:`sb3_ppo_ext.zoo`) and its manager (:mod:`sb3_ppo_ext.zoo_manager`) share.

Which algorithms are ours, their settings check, masks and one-line errors; below both modules, which import it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sb3_contrib.common.maskable.utils import is_masking_supported
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_ext import settings, validation
from sb3_ppo_ext.envs import MaskedObservations
from sb3_ppo_ext.validation import InvalidSettingError

# The rl-zoo3 names of this package's algorithms; every seam acts only for them.
OUR_ALGOS = frozenset(settings.ALGORITHMS)


class ZooConfigError(InvalidSettingError):
    """A setting of one of our algorithms on the rl-zoo3 route is invalid, or its Optuna storage cannot be opened."""


def check_hyperparams(hyperparams: dict[str, Any], source: str, algo: str = "ppo_ext") -> dict[str, Any]:
    """A yml entry checked (a :class:`ZooConfigError` naming ``source`` and each problem), activation names resolved."""
    raise_problems(settings.entry_problems(hyperparams, algo), algo, f"from {source}")
    return resolve_activation(hyperparams)


def raise_problems(problems: list[str], algo: str, where: str) -> None:
    """Raise a :class:`ZooConfigError` ``invalid <algo> hyperparameters <where>: <problems>`` if there is a problem."""
    if problems:
        raise ZooConfigError(f"invalid {algo} hyperparameters {where}: {'; '.join(problems)}")


def resolve_activation(hyperparams: dict[str, Any]) -> dict[str, Any]:
    """The settings with an activation name in ``policy_kwargs`` made the torch class, without ``eval``."""
    policy_kwargs = hyperparams.get("policy_kwargs")
    if isinstance(policy_kwargs, dict) and isinstance(policy_kwargs.get("activation_fn"), str):
        activation = validation.activation_class(policy_kwargs["activation_fn"])
        hyperparams = {**hyperparams, "policy_kwargs": {**policy_kwargs, "activation_fn": activation}}
    return hyperparams


def is_ours(algo: str | None) -> bool:
    """Whether the rl-zoo3 algorithm name ``algo`` is one of this package's (:data:`OUR_ALGOS`)."""
    return algo in OUR_ALGOS


def is_masked(algo: str | None) -> bool:
    """Whether ``algo`` is one of this package's algorithms that need action masks (``ppo_mask_ext``)."""
    return algo is not None and is_ours(algo) and settings.ALGORITHMS[algo].masked


def masked_env(env: VecEnv, algo: str, env_id: str, carry_masks: bool) -> VecEnv:
    """
    ``env``, checked for ``action_masks()`` (a :class:`ZooConfigError` naming the env); with ``carry_masks`` wrapped in
    :class:`sb3_ppo_ext.envs.MaskedObservations` (for ``enjoy``, whose loop calls ``predict(obs)`` without masks).
    """
    if not is_masking_supported(env):
        raise ZooConfigError(
            f"--algo {algo} needs action masks, but the env {env_id} provides no action_masks(): give it a wrapper that "
            "does in the entry's env_wrapper (sb3_ppo_ext.envs.ActionMaskFromInfo for an env that reports its mask in "
            "info['action_mask'], as Taxi-v4 does; sb3_contrib.common.wrappers.ActionMasker for a mask function)"
        )
    return MaskedObservations(env) if carry_masks else env


@contextlib.contextmanager
def settings_errors_end_the_command() -> Iterator[None]:
    """A settings error in the block ends the command: one ``error: ...`` line, exit status 1, no traceback."""
    try:
        yield
    except InvalidSettingError as error:
        raise SystemExit(f"error: {error}") from error
