"""This package's algorithms in rl-zoo3, and ``python -m sb3_ppo_ext.zoo``: the route that needs no startup hook.

The startup hook (``sb3_ppo_ext_zoo_hook``) calls :func:`on_zoo_module_imported` right after each rl-zoo3 module
below has run (:func:`register`: all at once), binding before ``train``, ``enjoy`` and ``record_video`` import them:
``ALGOS`` entries, ``StoreDict`` and ``create_test_env`` in ``rl_zoo3.utils``, samplers in ``rl_zoo3.hyperparams_opt``,
:class:`sb3_ppo_ext.zoo_manager.PPOExtExperimentManager` as ``rl_zoo3.exp_manager.ExperimentManager``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sb3_ppo_ext import settings
from sb3_ppo_ext.envpool import task_kwargs
from sb3_ppo_ext.envs import register_envs
from sb3_ppo_ext.zoo_support import is_masked, is_ours, masked_env, settings_errors_end_the_command

if TYPE_CHECKING:
    import argparse

    from stable_baselines3.common.vec_env import VecEnv

# Marks what registration installed in rl_zoo3.utils: registering twice changes nothing.
_PATCHED = "_sb3_ppo_ext_patched"


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


def _test_envs(create_test_env: Callable[..., VecEnv]) -> Callable[..., VecEnv]:
    """``rl_zoo3.utils.create_test_env`` (``enjoy``, ``record_video``): masked for a masked algorithm, EnvPool-trained
    runs' ``env_kwargs`` without :data:`~sb3_ppo_ext.envpool.POOL_OPTIONS`."""

    @functools.wraps(create_test_env)
    def wrapper(env_id: str, *args: Any, **kwargs: Any) -> VecEnv:
        if (kwargs.get("hyperparams") or {}).get("env_backend") == "envpool" and kwargs.get("env_kwargs"):
            kwargs["env_kwargs"] = task_kwargs(kwargs["env_kwargs"])
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
        utils.create_test_env = _test_envs(utils.create_test_env)  # type: ignore[attr-defined]
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
