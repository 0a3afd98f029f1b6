"""This package's algorithms in rl-zoo3, and ``python -m sb3_ppo_ext.zoo``: the route that needs no startup hook.

rl-zoo3 has no plugin interface: the startup hook (``sb3_ppo_ext_zoo_hook``) calls :func:`on_zoo_module_imported`
right after each rl-zoo3 module below has run (:func:`register`: all at once), which binds, before ``train``,
``enjoy`` and ``record_video`` import them: ``ALGOS`` entries, ``StoreDict`` (``-params`` errors) and
``create_test_env`` (masks for ``enjoy``) in ``rl_zoo3.utils``; samplers in ``rl_zoo3.hyperparams_opt``;
``ExperimentManager`` in ``rl_zoo3.exp_manager`` (:class:`sb3_ppo_ext.zoo_manager.PPOExtExperimentManager`).
Each seam acts only for this package's algorithms. Importing this module imports neither rl_zoo3 nor optuna.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sb3_contrib.common.maskable.utils import is_masking_supported

from sb3_ppo_ext import settings
from sb3_ppo_ext.envs import MaskedObservations, register_envs
from sb3_ppo_ext.settings import SettingsError

if TYPE_CHECKING:
    import argparse

    from stable_baselines3.common.vec_env import VecEnv

# The rl-zoo3 names of this package's algorithms; every seam acts only for them.
OUR_ALGOS = frozenset(settings.ALGORITHMS)
# Marks what registration installed in rl_zoo3.utils: registering twice changes nothing.
_PATCHED = "_sb3_ppo_ext_patched"


class ZooConfigError(SettingsError):
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
        activation = settings.activation_class(policy_kwargs["activation_fn"])
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
    except SettingsError as error:
        raise SystemExit(f"error: {error}") from error


def _command_line_algo(namespace: argparse.Namespace | None) -> str | None:
    """The ``--algo`` of the command line (read from ``sys.argv``: ``-params`` may be parsed before ``--algo``)."""
    import argparse

    pre_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre_parser.add_argument("--algo")
    try:
        algo = pre_parser.parse_known_args(sys.argv[1:])[0].algo
    except SystemExit:  # a malformed --algo: rl-zoo3's own parser reports it
        algo = None
    return algo if algo is not None else getattr(namespace, "algo", None)


class _ParseErrors:
    """Mixed into rl-zoo3's ``StoreDict``: for our algorithms a value rl-zoo3 cannot read is an argparse error."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: list[str], option: Any = None
    ) -> None:
        try:
            super().__call__(parser, namespace, values, option)  # type: ignore[misc]
        except Exception as error:
            if not is_ours(_command_line_algo(namespace)):
                raise
            parser.error(
                f"argument {option}: cannot parse {' '.join(values)!r} ({type(error).__name__}: {error}); "
                "expected key:value pairs with Python literal values, e.g. kl_target:0.01 clip_range:None"
            )


def _masked_test_envs(create_test_env: Callable[..., VecEnv]) -> Callable[..., VecEnv]:
    """``rl_zoo3.utils.create_test_env`` (``enjoy``, ``record_video``) with :func:`masked_env` for a masked algorithm."""

    @functools.wraps(create_test_env)
    def wrapper(env_id: str, *args: Any, **kwargs: Any) -> VecEnv:
        env = create_test_env(env_id, *args, **kwargs)
        algo = _command_line_algo(None)
        if not is_masked(algo):
            return env
        with settings_errors_end_the_command():
            return masked_env(env, algo, env_id, carry_masks=True)  # type: ignore[arg-type]

    setattr(wrapper, _PATCHED, True)
    return wrapper


def _register_algo(utils: ModuleType) -> None:
    register_envs()
    for name, spec in settings.ALGORITHMS.items():
        utils.ALGOS.setdefault(name, spec.algorithm)
    if not getattr(utils.create_test_env, _PATCHED, False):
        utils.create_test_env = _masked_test_envs(utils.create_test_env)  # type: ignore[attr-defined]
    if not vars(utils.StoreDict).get(_PATCHED, False):
        mixed = type("StoreDict", (_ParseErrors, utils.StoreDict), {_PATCHED: True, "__module__": __name__})
        utils.StoreDict = mixed  # type: ignore[attr-defined]


def _register_sampler(hyperparams_opt: ModuleType) -> None:
    for name, spec in settings.ALGORITHMS.items():
        if spec.sampler is not None:
            hyperparams_opt.HYPERPARAMS_SAMPLER.setdefault(name, spec.sampler)
        if spec.converter is not None:
            hyperparams_opt.HYPERPARAMS_CONVERTER.setdefault(name, spec.converter)


def _install_experiment_manager(exp_manager: ModuleType) -> None:
    from sb3_ppo_ext.zoo_manager import PPOExtExperimentManager

    exp_manager.ExperimentManager = PPOExtExperimentManager  # type: ignore[attr-defined]


_REGISTRARS = {
    "rl_zoo3.utils": _register_algo,
    "rl_zoo3.hyperparams_opt": _register_sampler,
    "rl_zoo3.exp_manager": _install_experiment_manager,
}


def on_zoo_module_imported(name: str, module: ModuleType) -> None:
    """Register at the seam of the rl-zoo3 module ``name`` that has just been imported."""
    if name in _REGISTRARS:
        _REGISTRARS[name](module)


def register() -> None:
    """Import rl-zoo3's modules and register at every seam (idempotent)."""
    import importlib

    for name, registrar in _REGISTRARS.items():
        registrar(importlib.import_module(name))


COMMANDS = ("train", "enjoy", "record_video", "record_training")
USAGE = f"""usage: python -m sb3_ppo_ext.zoo {{{",".join(COMMANDS)}}} [rl-zoo3 arguments ...]

Runs rl-zoo3's command with ppo_ext registered, without the startup hook, e.g.:
  python -m sb3_ppo_ext.zoo train --algo ppo_ext --env Pendulum-v1
"""


def main(argv: list[str] | None = None) -> int:
    """Run ``rl_zoo3.<command>`` as ``__main__`` after :func:`register`; return an exit status."""
    import runpy

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in {"-h", "--help"}:
        print(USAGE, end="")
        return 0 if argv else 2
    command, rest = argv[0].replace("-", "_"), argv[1:]
    if command not in COMMANDS:
        print(USAGE + f"\nerror: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    register()
    sys.argv = [f"python -m sb3_ppo_ext.zoo {command}", *rest]
    runpy.run_module(f"rl_zoo3.{command}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
