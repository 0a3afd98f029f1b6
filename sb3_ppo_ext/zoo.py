"""Registration of PPOExt with rl-zoo3, and ``python -m sb3_ppo_ext.zoo``: the route that needs no startup hook.

rl-zoo3 has no plugin interface: ``--algo`` choices come from ``rl_zoo3.utils.ALGOS`` when the
arguments are parsed, the default hyperparameter file is looked up inside the rl_zoo3 package and
``-optimize`` reads ``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER``.
This module adds PPOExt at each of these seams, one rl-zoo3 module at a time, right after that
module has executed (:func:`on_zoo_module_imported`, called by the ``sb3_ppo_ext_zoo_hook``
startup hook), or all at once (:func:`register`, used by ``python -m sb3_ppo_ext.zoo``). Each
registration is idempotent: what it installed carries the :data:`_PATCHED` marker.

Every seam acts only when rl-zoo3 runs one of this package's algorithms (:data:`OUR_ALGOS`,
tested by :func:`is_ours`); for rl-zoo3's own algorithms (``--algo ppo``, ``sac``, ...) each one
calls rl-zoo3's original code unchanged, so they behave, save and evaluate exactly as without this
package (``tests/test_zoo_seams.py`` runs ``--algo ppo`` both ways and compares). The seams, and why
each exists:

- ``rl_zoo3.utils.ALGOS``: ``ALGOS["ppo_ext"] = PPOExt`` and every other entry of
  :data:`sb3_ppo_ext.settings.ALGORITHMS` (new keys; existing keys are kept), as
  ``--algo`` choices are read from it when the parser is built.
- ``rl_zoo3.hyperparams_opt.HYPERPARAMS_SAMPLER`` / ``HYPERPARAMS_CONVERTER``: new keys, the
  samplers and converters of :mod:`sb3_ppo_ext.samplers` (``-optimize``, ``--trial-id``).
- ``rl_zoo3.exp_manager.ExperimentManager``: replaced, once, by the subclass
  :class:`sb3_ppo_ext.zoo_manager.PPOExtExperimentManager` right after that module executed, so
  ``rl_zoo3.train`` binds the subclass when it imports the name (:func:`_install_experiment_manager`).
  Its overrides (each calls rl-zoo3's method through ``super()``; see that module for the one that
  merges itself) give our algorithms: the ``ppo_ext.yml`` shipped in this package as the default
  ``--conf-file``; the settings read once and each entry checked once by :mod:`sb3_ppo_ext.settings`
  before rl-zoo3 parses schedules or evaluates strings (the yml entry and the ``-params`` values key
  by key, each mistake blamed on its own source, then the merged settings as a whole; nothing is
  written before); ``clip_range: null`` / ``clip_range_vf: null`` passed through rl-zoo3's
  preprocessing and activation names mapped to torch classes without ``eval``; with ``-optimize``,
  the Optuna storage opened first (an unreachable database leaves no folder), on Optuna's
  heartbeat (:func:`_check_storage`), with ``--max-total-trials`` counted by
  :class:`TrialBudgetCallback`; a run folder left by a failed run (or ``-optimize``'s, which holds
  no model) removed, since it would become the "latest" run that ``enjoy`` loads; for a masked
  algorithm, envs checked for ``action_masks()`` and evaluation callbacks (``--eval-freq``,
  ``-optimize`` trials) that read the masks from the eval env; with ``env_backend: envpool`` in the
  entry, training envs from EnvPool (:mod:`sb3_ppo_ext.envpool`; evaluation stays on gymnasium's
  envs); ``--save-freq`` checkpoints written atomically with their VecNormalize statistics, and
  ``-i <checkpoint>`` resumed with them, with the timestep count and (with
  :class:`~sb3_ppo_ext.callbacks.KLAdaptiveLR`) the checkpoint's learning rate.

Three seams remain wrappers in place, each one function with the :data:`_PATCHED` marker, where
rl-zoo3 offers nothing to subclass or configure (their docstrings say why):

- ``rl_zoo3.utils.StoreDict.__call__`` (:func:`_store_dict_errors`): for our algorithms a
  malformed ``-params`` / ``--env-kwargs`` value becomes an argparse error (usage line, exit
  status 2) naming the value, instead of rl-zoo3's traceback from ``eval``. The algorithm is read
  from the command line, as ``-params`` may come before ``--algo``.
- ``rl_zoo3.utils.create_test_env`` (:func:`_masked_test_envs`): ``enjoy`` / ``record_video``
  with a masked algorithm step an env whose observations carry their masks
  (:class:`sb3_ppo_ext.envs.MaskedObservations`), as their loops call ``predict(obs)`` without masks.
- ``sys.excepthook`` (:func:`_print_settings_errors`, for our errors only): a settings or storage
  error ends the command with one ``error: ...`` paragraph and exit status 1, without a traceback.

Importing this module imports neither rl_zoo3 nor optuna (:mod:`sb3_ppo_ext.zoo_manager` does,
and is imported only once ``rl_zoo3.exp_manager`` has run).
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any

from sb3_ppo_ext import settings
from sb3_ppo_ext.validation import InvalidSettingError
from sb3_ppo_ext.zoo_support import (  # re-exported: the names rl-zoo3 users reach through sb3_ppo_ext.zoo
    _PATCHED,
    ALGO_NAME,
    OUR_ALGOS,
    ZOO_RESERVED_KWARGS,
    TrialBudgetCallback,
    ZooConfigError,
    check_hyperparams,
    count_trials_against_budget,
    is_masked,
    is_ours,
    masked_env,
    ppo_ext_parameters,
    resolve_activation,
)


def _print_settings_errors(hook: Any) -> Any:
    """
    ``sys.excepthook`` that prints our settings and storage errors as one ``error:`` paragraph,
    without a traceback (the exit status stays 1); every other exception goes to ``hook``.

    A wrapper of the hook in place, because the error leaves rl-zoo3's ``train`` (its ``__main__``
    has no ``try``), and Python's excepthook is the interpreter's own place to report an uncaught
    exception; installed once, with the manager (:func:`_install_experiment_manager`).
    """

    @functools.wraps(hook)
    def excepthook(kind, error, traceback):
        if isinstance(error, InvalidSettingError):
            print(f"error: {error}", file=sys.stderr)
            return None
        return hook(kind, error, traceback)

    setattr(excepthook, _PATCHED, True)
    return excepthook


# --- rl_zoo3.utils ---------------------------------------------------------------------------


def _command_line_algo(namespace: Any) -> str | None:
    """
    The ``--algo`` of the command line being parsed, wherever it stands among the arguments.

    argparse fills the namespace in command-line order, so while ``-params`` is parsed the
    namespace may still hold the default algorithm: read ``--algo`` from ``sys.argv`` first.
    """
    import argparse

    pre_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre_parser.add_argument("--algo")
    try:
        algo = pre_parser.parse_known_args(sys.argv[1:])[0].algo
    except SystemExit:  # a malformed --algo: rl-zoo3's own parser reports it
        algo = None
    return algo if algo is not None else getattr(namespace, "algo", None)


def _register_algo(utils: ModuleType) -> None:
    from sb3_ppo_ext.envs import register_envs

    register_envs()  # sb3-contrib's masked test envs as --env ids (new ids only)
    for name, spec in settings.ALGORITHMS.items():
        utils.ALGOS.setdefault(name, spec.algorithm)
    if not getattr(utils.create_test_env, _PATCHED, False):
        utils.create_test_env = _masked_test_envs(utils.create_test_env)  # type: ignore[attr-defined]
    if not getattr(utils.StoreDict.__call__, _PATCHED, False):
        utils.StoreDict.__call__ = _store_dict_errors(utils.StoreDict.__call__)


def _store_dict_errors(call: Any) -> Any:
    """
    ``StoreDict.__call__`` (``-params``, ``--env-kwargs``) for which, with our algorithms, a
    malformed value is an argparse error (usage line, exit status 2) naming the value instead of
    rl-zoo3's traceback from ``eval``; for any other algorithm the error propagates as before.

    A wrapper of rl-zoo3's method in place, because rl-zoo3 has no seam for it: ``train``,
    ``enjoy`` and ``record_video`` build their parsers inside their functions, with
    ``action=StoreDict`` bound at their import.
    """

    @functools.wraps(call)
    def __call__(self, parser, namespace, values, option_string=None):
        try:
            return call(self, parser, namespace, values, option_string)
        except Exception as error:
            if not is_ours(_command_line_algo(namespace)):
                raise  # rl-zoo3's own algorithms keep rl-zoo3's behaviour (a traceback)
            # rl-zoo3 evaluates each value as a Python expression: report which one failed.
            parser.error(
                f"argument {option_string}: cannot parse {' '.join(values)!r} ({type(error).__name__}: {error}); "
                "expected key:value pairs with Python literal values, e.g. kl_target:0.01 clip_range:None"
            )

    setattr(__call__, _PATCHED, True)
    return __call__


def _masked_test_envs(create_test_env: Any) -> Any:
    """
    ``rl_zoo3.utils.create_test_env`` (``enjoy``, ``record_video``) whose env, for a masked
    algorithm, is :func:`masked_env`'s: its observations carry their masks to ``predict``.

    A wrapper of the function in place, because rl-zoo3 has no seam for it: ``enjoy`` calls the
    module function (bound at its import from ``rl_zoo3``, which the hook reaches after
    ``rl_zoo3.utils`` ran and before ``rl_zoo3/__init__`` binds it), with no manager involved.
    """

    @functools.wraps(create_test_env)
    def wrapper(env_id, *args, **kwargs):
        env = create_test_env(env_id, *args, **kwargs)
        algo = _command_line_algo(None)
        return masked_env(env, algo, env_id, carry_masks=True) if is_masked(algo) else env

    setattr(wrapper, _PATCHED, True)
    return wrapper


# --- rl_zoo3.hyperparams_opt -----------------------------------------------------------------


def _register_sampler(hyperparams_opt: ModuleType) -> None:
    for name, spec in settings.ALGORITHMS.items():
        if spec.sampler is not None:
            hyperparams_opt.HYPERPARAMS_SAMPLER.setdefault(name, spec.sampler)
        if spec.converter is not None:
            hyperparams_opt.HYPERPARAMS_CONVERTER.setdefault(name, spec.converter)


# --- rl_zoo3.exp_manager ---------------------------------------------------------------------


def _install_experiment_manager(exp_manager: ModuleType) -> None:
    """
    Set ``exp_manager.ExperimentManager`` to :class:`sb3_ppo_ext.zoo_manager.PPOExtExperimentManager`, once.

    A class that carries the :data:`_PATCHED` marker is ours already: nothing changes (a second
    registration, or the hook and :func:`register` both). When the module holds another class
    than the one our subclass derives from, ``rl_zoo3.exp_manager`` has run again
    (``importlib.reload``): ``zoo_manager`` is reloaded, so the new subclass derives from the new class.
    """
    if exp_manager.ExperimentManager.__dict__.get(_PATCHED, False):
        return
    import importlib

    from sb3_ppo_ext import zoo_manager

    if zoo_manager.UPSTREAM is not exp_manager.ExperimentManager:
        zoo_manager = importlib.reload(zoo_manager)
    exp_manager.ExperimentManager = zoo_manager.PPOExtExperimentManager  # type: ignore[attr-defined]
    if not getattr(sys.excepthook, _PATCHED, False):
        sys.excepthook = _print_settings_errors(sys.excepthook)


_REGISTRARS = {
    "rl_zoo3.utils": _register_algo,
    "rl_zoo3.hyperparams_opt": _register_sampler,
    "rl_zoo3.exp_manager": _install_experiment_manager,
}


def on_zoo_module_imported(name: str, module: ModuleType) -> None:
    """Register PPOExt at the seam of the rl-zoo3 module ``name`` that has just been imported."""
    registrar = _REGISTRARS.get(name)
    if registrar is not None:
        registrar(module)


def register() -> None:
    """Import rl-zoo3's modules and register PPOExt at every seam (idempotent)."""
    import importlib

    for name, registrar in _REGISTRARS.items():
        registrar(importlib.import_module(name))


# --- python -m sb3_ppo_ext.zoo ---------------------------------------------------------------

COMMANDS = ("train", "enjoy", "record_video", "record_training")
USAGE = f"""usage: python -m sb3_ppo_ext.zoo {{{",".join(COMMANDS)}}} [rl-zoo3 arguments ...]

Runs rl-zoo3's command with ppo_ext registered, without the startup hook (for python -S, or
where .pth files are not processed), e.g.:
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
    try:
        runpy.run_module(f"rl_zoo3.{command}", run_name="__main__", alter_sys=True)
    except InvalidSettingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ALGO_NAME",
    "COMMANDS",
    "OUR_ALGOS",
    "ZOO_RESERVED_KWARGS",
    "TrialBudgetCallback",
    "ZooConfigError",
    "check_hyperparams",
    "count_trials_against_budget",
    "is_masked",
    "is_ours",
    "main",
    "masked_env",
    "on_zoo_module_imported",
    "ppo_ext_parameters",
    "register",
    "resolve_activation",
]
