"""Startup hook that registers PPOExt with rl-zoo3 when, and only when, rl-zoo3 is imported.

``sb3_ppo_ext_zoo_hook.pth`` (installed next to this module in site-packages) imports this module
at interpreter start and calls :func:`install`, which puts one small finder at the front of
``sys.meta_path``. The finder does nothing until one of the rl-zoo3 modules in :data:`WATCHED` is
imported; then, right after that module has run, it hands the module to ``sb3_ppo_ext.zoo``,
which adds ``ALGOS["ppo_ext"]``, the Optuna sampler and converter, and sets
``rl_zoo3.exp_manager.ExperimentManager`` to the package's subclass (default ``ppo_ext.yml``,
settings checks, ...) before ``rl_zoo3.train`` imports that name. Nothing heavy (not even
``sb3_ppo_ext``) is imported before that.

Rules this module keeps, because it runs in every interpreter of the environment:

- it imports nothing at start but ``os`` and ``sys`` (already loaded by ``site``);
- no exception ever leaves it and it never prints: if ``sb3_ppo_ext`` is broken or half
  uninstalled, rl-zoo3 simply runs without ``ppo_ext`` (the last error is kept in
  :data:`last_error` for debugging);
- ``SB3_PPO_EXT_NO_ZOO_HOOK`` set to a true value (``1``, ``true``, ``yes`` or ``on``, in any
  case) switches it off; any other value (``0``, ``false``, ``no``, empty) leaves it on. The
  ``.pth`` line reads the variable itself, so that a switched-off hook imports nothing; it runs
  its ``try`` block through ``exec`` of a constant string, because a ``.pth`` line must be a
  single statement (nothing from the environment or a file is evaluated).

Interpreters that do not read ``.pth`` files (``python -S``, some embedded ones) can use the
route without a hook: ``python -m sb3_ppo_ext.zoo train --algo ppo_ext ...``.
"""

import os
import sys

DISABLE_ENV_VAR = "SB3_PPO_EXT_NO_ZOO_HOOK"
# Values of DISABLE_ENV_VAR that switch the hook off (compared stripped and lower-cased); the .pth line repeats them.
TRUE_VALUES = ("1", "true", "yes", "on")
# rl-zoo3 modules after whose first import sb3_ppo_ext.zoo registers something.
WATCHED = frozenset({"rl_zoo3.utils", "rl_zoo3.hyperparams_opt", "rl_zoo3.exp_manager"})

# The last exception swallowed by the hook, or None.
last_error = None


def _notify(fullname, module):
    """Hand a freshly imported rl-zoo3 module to ``sb3_ppo_ext.zoo``; never raises."""
    global last_error
    try:
        from sb3_ppo_ext import zoo

        zoo.on_zoo_module_imported(fullname, module)
    except Exception as error:  # a broken sb3_ppo_ext must not break rl-zoo3
        last_error = error


class _PostImportLoader:
    """Wraps a module's loader: runs the module, then :func:`_notify`. Everything else is delegated."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Put the real loader back first, so that reload() and introspection see the original.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _notify(module.__name__, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class ZooImportHook:
    """``sys.meta_path`` finder that only reacts to the modules in :data:`WATCHED`."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _PostImportLoader(spec.loader)
                    return spec
            return None
        except Exception as error:
            global last_error
            last_error = error
            return None
        finally:
            self._busy.discard(fullname)


def enabled():
    """Whether the hook may run: ``SB3_PPO_EXT_NO_ZOO_HOOK`` is not one of :data:`TRUE_VALUES`."""
    return os.environ.get(DISABLE_ENV_VAR, "").strip().lower() not in TRUE_VALUES


def install():
    """Install the finder once (idempotent); register at once for watched modules already imported."""
    global last_error
    try:
        if not enabled() or any(isinstance(finder, ZooImportHook) for finder in sys.meta_path):
            return
        sys.meta_path.insert(0, ZooImportHook())
        for name in sorted(WATCHED):
            module = sys.modules.get(name)
            if module is not None:
                _notify(name, module)
    except Exception as error:
        last_error = error
