"""The one owner of settings: hyperparameter entries (rl-zoo3's yml form) checked whole, before anything runs.

A settings entry maps rl-zoo3 keys (``n_envs``, ``n_timesteps``, ``normalize``, ``policy``, ...)
and the algorithm's parameters to values, as in rl-zoo3's hyperparameter files. :func:`check_entry`
checks one whole entry: unknown keys (with the closest valid name), reserved keys, types (an int
parameter takes ints, numpy ints included, never ``2.0``; a boolean takes ``true`` / ``false``,
never the string ``"false"``), ranges, schedules (``learning_rate: lin_3e-4``) and the contents of
``policy_kwargs`` (names from the policy class's constructor chain, booleans, activation names,
``net_arch``), each by its row of the parameter table (:mod:`sb3_ppo_ext.parameters`); then the
rules that tie the algorithm's arguments together (:func:`sb3_ppo_ext.parameters.check_together`) run
on the entry merged over the algorithm's defaults.

The checks are parameterised by the algorithm class, not written for PPOExt: valid parameter
names come from the class's ``__init__`` signature, ``policy_kwargs`` names from the policy class
(``policy_aliases[policy]``) and its base classes. :data:`ALGORITHMS` is the table of this
package's algorithms as rl-zoo3 knows them (``--algo`` name, class, default hyperparameter file,
Optuna sampler); :mod:`sb3_ppo_ext.zoo` registers every entry with rl-zoo3.

Nothing here evaluates configuration: yml files are read with ``yaml.safe_load``, and a string
``policy_kwargs`` / ``normalize`` (which rl-zoo3 itself ``eval``\\ s) is only parsed (``ast``) to
check its key names. Importing this module imports neither rl_zoo3 nor optuna.
"""

from __future__ import annotations

import ast
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sb3_ppo_ext import samplers, validation
from sb3_ppo_ext.maskable import MaskablePPOExt
from sb3_ppo_ext.parameters import (  # re-exported: the settings owner's names for them
    ACTIVATIONS,
    ALGORITHM_RULES,
    POLICY_KWARG_RULES,
    SCHEDULE_KEYS,
    activation_class,
    check_policy_kwargs_together,
    check_together,
    policy_parameters,
    to_algorithm_kwargs,
    unknown_key,
    unknown_policy_kwarg,
)
from sb3_ppo_ext.ppo_ext import PPOExt
from sb3_ppo_ext.recurrent import RecurrentPPOExt
from sb3_ppo_ext.validation import InvalidSettingError, SettingsError

HYPERPARAMS_DIR = Path(__file__).resolve().parent / "hyperparams"
PPO_EXT_YML = HYPERPARAMS_DIR / "ppo_ext.yml"


@dataclass(frozen=True)
class AlgorithmSpec:
    """
    One algorithm of this package, as the settings owner and rl-zoo3 know it.

    :param name: rl-zoo3's ``--algo`` name (a key of ``rl_zoo3.utils.ALGOS``)
    :param algorithm: the class
    :param hyperparams: default hyperparameter file (``--conf-file``); ``None``: rl-zoo3's own lookup
    :param sampler: the function for ``HYPERPARAMS_SAMPLER`` (``-optimize``), or ``None``
    :param converter: the function for ``HYPERPARAMS_CONVERTER`` (``--trial-id``), or ``None``
    :param rules_together: the rules that tie the algorithm's arguments together, called as
        ``rules_together(arguments, n_envs=...)`` with the entry's values (over the class's defaults) of
        the names with a row in :data:`~sb3_ppo_ext.parameters.ALGORITHM_RULES` (each value is judged by
        its row first); it raises :class:`~sb3_ppo_ext.validation.InvalidSettingError`. Default: the PPO
        family's, :func:`sb3_ppo_ext.parameters.check_together`; ``None``: none.
    :param masked: whether the algorithm needs action masks (the env must provide ``action_masks()``;
        rl-zoo3's evaluation and ``enjoy`` then pass the masks to ``predict``)
    """

    name: str
    algorithm: type
    hyperparams: Path | None = None
    sampler: Callable[..., dict[str, Any]] | None = None
    converter: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    rules_together: Callable[..., None] | None = check_together
    masked: bool = False


# This package's algorithms, by rl-zoo3 name. Registering another one (same settings checks, same
# rl-zoo3 seams) is one entry here.
ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            "ppo_ext", PPOExt, PPO_EXT_YML, sampler=samplers.sample_zoo_params, converter=samplers.convert_zoo_params
        ),
        AlgorithmSpec(
            "ppo_lstm_ext",
            RecurrentPPOExt,
            HYPERPARAMS_DIR / "ppo_lstm_ext.yml",
            sampler=samplers.sample_recurrent_zoo_params,
            converter=samplers.convert_recurrent_zoo_params,
        ),
        AlgorithmSpec(
            "ppo_mask_ext",
            MaskablePPOExt,
            HYPERPARAMS_DIR / "ppo_mask_ext.yml",
            sampler=samplers.sample_maskable_zoo_params,
            converter=samplers.convert_maskable_zoo_params,
            masked=True,
        ),
    )
}
DEFAULT_ALGO = "ppo_ext"

# Keyword arguments that rl-zoo3 passes to the algorithm itself: an entry may not set them.
RESERVED_KEYS = frozenset({"env", "tensorboard_log", "seed", "verbose", "device", "_init_setup_model"})


# --- rules for single values -------------------------------------------------------------------


def _wrong_type(key: str, value: Any, expected: str) -> str:
    hint = ""
    if isinstance(value, str):
        try:
            float(value)
            hint = " (a string: PyYAML reads 3e-4 as a string; write 3.0e-4 or !!float 3e-4)"
        except ValueError:
            hint = " (a string: quote marks or a typo?)"
        if expected.startswith("bool"):
            hint = " (a string is not a boolean: write true or false without quotes)"
    return f"'{key}: {value!r}' is a {type(value).__name__}{hint}, expected {expected}"


def _int_problem(key: str, value: Any, low: int | None) -> str | None:
    if validation.is_bool(value):
        return f"'{key}: {value!r}' is a bool, expected int"
    if validation.is_real(value) and not validation.is_int(value):
        if not float(value).is_integer():
            return f"'{key}: {value!r}' is not a whole number"
        return f"'{key}: {value!r}' is a {type(value).__name__}, expected int (write {int(value)})"
    if not validation.is_int(value):
        return _wrong_type(key, value, "int")
    if low is not None and value < low:
        return f"'{key}: {value!r}' is invalid: expected an int >= {low}"
    return None


def _check(function: Any, *args: Any) -> str | None:
    try:
        function(*args)
    except InvalidSettingError as error:
        return str(error)
    return None


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _schedule_problem(key: str, value: Any) -> str | None:
    if isinstance(value, str):
        if validation.linear_schedule_start(value) is not None:
            return None
        if not value.startswith("lin_") and _check(validation.check_real, key, _float_or_none(value)) is None:
            return _wrong_type(key, value, "a number or a schedule 'lin_<x>'")
        return (
            f"'{key}: {value!r}' is neither a number nor a linear schedule 'lin_<initial value>' "
            "with a positive initial value (e.g. lin_3.0e-4)"
        )
    if value is None or callable(value):
        return None  # None: off for the clip ranges; the row says whether None is allowed
    if not validation.is_real(value):
        return _wrong_type(key, value, "a number or a schedule 'lin_<x>'")
    return None


def _typed_by_default_problem(key: str, value: Any, default: Any) -> str | None:
    """Why ``value`` cannot be the parameter ``key`` whose default is ``default`` (judged by its type)."""
    if value is None or default is None or default is inspect.Parameter.empty:
        return None
    if isinstance(default, bool):
        return None if validation.is_bool(value) else _wrong_type(key, value, "bool (true or false)")
    if isinstance(default, int):
        return _int_problem(key, value, None)
    if isinstance(default, float):
        return None if validation.is_real(value) else _wrong_type(key, value, "a number")
    if isinstance(default, (tuple, list)):
        return None if isinstance(value, (tuple, list)) else _wrong_type(key, value, "a list")
    if isinstance(default, str):
        return None if isinstance(value, str) else _wrong_type(key, value, "str")
    return None


def _algorithm_value_problem(key: str, value: Any, default: Any) -> str | None:
    rule = ALGORITHM_RULES.get(key)
    if rule is not None and rule.schedule:  # yml strings as schedules; numbers, None and callables by the row
        if isinstance(value, str):
            return _schedule_problem(key, value)
        return _schedule_problem(key, value) or _check(rule.judge, key, value)
    if problem := _typed_by_default_problem(key, value, default):
        return problem
    if rule is not None:
        return _check(rule.judge, key, value)
    if key.endswith("_kwargs") and value is not None and not isinstance(value, Mapping):
        return _wrong_type(key, value, "a mapping")
    return None


def _kwargs_expression(text: str, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """
    The keyword names (and literal values) of a ``dict(a=1, ...)`` / ``{"a": 1}`` expression, which
    rl-zoo3 evaluates; ``(None, None)`` for another kind of expression, ``(None, problem)`` if it is not Python.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        return None, f"'{key}: {text!r}' is not a Python expression ({error.msg}); write a mapping instead"
    items: list[tuple[str, ast.expr]] = []
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "dict" and not tree.args:
        items = [(keyword.arg, keyword.value) for keyword in tree.keywords if keyword.arg is not None]
    elif isinstance(tree, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in tree.keys):
        items = [(k.value, v) for k, v in zip(tree.keys, tree.values, strict=True)]  # type: ignore[union-attr]
    else:
        return None, None
    parsed: dict[str, Any] = {}
    for name, node in items:
        try:
            parsed[name] = ast.literal_eval(node)
        except ValueError:
            parsed[name] = _NOT_LITERAL  # e.g. nn.ReLU: rl-zoo3 evaluates it; only the name is checked
    return parsed, None


class _NotLiteral:
    def __repr__(self) -> str:
        return "<expression>"


_NOT_LITERAL = _NotLiteral()


def _policy_kwarg_problem(key: str, value: Any, default: Any) -> str | None:
    name = f"policy_kwargs.{key}"
    if value is _NOT_LITERAL:
        return None
    rule = POLICY_KWARG_RULES.get(key)
    if rule is not None:  # the row's rule, after the type its default implies (a boolean's rule says it itself)
        typed = None if rule.kind == "bool" else _typed_by_default_problem(name, value, default)
        return typed or _check(rule.judge, name, value)
    if isinstance(default, bool):
        return _check(validation.check_bool, name, value)
    if key.endswith("_kwargs") and value is not None and not isinstance(value, Mapping):
        return _wrong_type(name, value, "a mapping")
    if isinstance(default, (int, float)):
        return _typed_by_default_problem(name, value, default)
    return None


def _policy_kwargs_problems(algorithm: type, policy: Any, policy_kwargs: Any) -> list[str]:
    if policy_kwargs is None:
        return []
    if isinstance(policy_kwargs, str):
        parsed, problem = _kwargs_expression(policy_kwargs, "policy_kwargs")
        if parsed is None:
            return [problem] if problem else []
        policy_kwargs = parsed
    if not isinstance(policy_kwargs, Mapping):
        return [_wrong_type("policy_kwargs", policy_kwargs, "a mapping")]
    aliases = getattr(algorithm, "policy_aliases", {})
    policy_class = aliases.get(policy) if isinstance(policy, str) else policy
    if not isinstance(policy_class, type):
        return []  # a dotted class path that rl-zoo3 imports later: names unknown here
    parameters = policy_parameters(policy_class)
    problems = []
    for key, value in policy_kwargs.items():
        if key not in parameters:
            problems.append(unknown_policy_kwarg(key, policy_class, parameters))
        elif problem := _policy_kwarg_problem(key, value, parameters[key]):
            problems.append(problem)
    if not problems and (problem := _check(check_policy_kwargs_together, policy_kwargs)):
        problems.append(problem)
    return problems


# --- rl-zoo3's own keys --------------------------------------------------------------------------


def _normalize_problem(value: Any) -> str | None:
    from stable_baselines3.common.vec_env import VecNormalize

    if validation.is_bool(value) or value is None:
        return None
    if isinstance(value, str):
        parsed, problem = _kwargs_expression(value, "normalize")
        if problem or parsed is None:
            return problem or f"'normalize: {value!r}' is invalid: expected true, false or a mapping of VecNormalize arguments"
        value = parsed
    if not isinstance(value, Mapping):
        return _wrong_type("normalize", value, "bool or a mapping of VecNormalize arguments")
    allowed = sorted(set(inspect.signature(VecNormalize.__init__).parameters) - {"self", "venv"})
    unknown = [unknown_key(key, allowed, " in normalize") for key in value if key not in allowed]
    return "; ".join(unknown) or None


def _n_timesteps_problem(value: Any) -> str | None:
    if not validation.is_real(value):
        return _wrong_type("n_timesteps", value, "a number of steps")
    if not (math.isfinite(value) and float(value).is_integer() and value >= 0):
        return f"'n_timesteps: {value!r}' is invalid: expected a whole number >= 0"
    return None


# Where an entry's training envs come from (``env_backend``): gymnasium's envs in rl-zoo3's VecEnv, or EnvPool's
# batched envs (sb3_ppo_ext.envpool.EnvPoolVecEnv); evaluation always runs on gymnasium's envs.
ENV_BACKENDS = ("gymnasium", "envpool")


def _env_backend_problem(value: Any) -> str | None:
    if value in ENV_BACKENDS:
        return None
    return f"'env_backend: {value!r}' is invalid: expected one of {', '.join(ENV_BACKENDS)}"


# rl-zoo3's own keys of an entry (and env_backend, which this package's ExperimentManager reads), each with its check.
ZOO_KEY_CHECKS: dict[str, Any] = {
    "env_backend": lambda key, value: _env_backend_problem(value),
    "n_envs": lambda key, value: _int_problem(key, value, 1),
    "n_timesteps": lambda key, value: _n_timesteps_problem(value),
    "normalize": lambda key, value: _normalize_problem(value),
    "monitor_kwargs": lambda key, value: None if isinstance(value, (Mapping, str)) else _wrong_type(key, value, "a mapping"),
    "env_kwargs": lambda key, value: None if isinstance(value, Mapping) else _wrong_type(key, value, "a mapping"),
    "frame_stack": lambda key, value: _int_problem(key, value, 1),
    "env_wrapper": lambda key, value: None if isinstance(value, (str, list, dict)) else _wrong_type(key, value, "str or list"),
    "vec_env_wrapper": lambda key, value: (
        None if isinstance(value, (str, list, dict)) else _wrong_type(key, value, "str or list")
    ),
    "callback": lambda key, value: None if isinstance(value, (str, list, dict)) else _wrong_type(key, value, "str or list"),
}


# --- whole entries -----------------------------------------------------------------------------


def algorithm_spec(algo: str) -> AlgorithmSpec:
    """The :data:`ALGORITHMS` entry of ``algo``; a SettingsError naming the known ones otherwise."""
    if algo not in ALGORITHMS:
        raise SettingsError(f"unknown algorithm {algo!r}: expected one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[algo]


def algorithm_parameters(algorithm: type) -> dict[str, Any]:
    """The parameters an entry may give to ``algorithm`` (``policy`` included), with their defaults."""
    signature = inspect.signature(algorithm)  # the class's __init__, without self
    return {name: p.default for name, p in signature.parameters.items() if name != "self" and name not in RESERVED_KEYS}


def entry_problems(entry: Any, algo: str = DEFAULT_ALGO, whole: bool = True) -> list[str]:
    """
    Everything wrong with one settings entry, one message per problem (empty: valid).

    :param entry: the entry, in rl-zoo3's yml form
    :param algo: the algorithm's name in :data:`ALGORITHMS`
    :param whole: whether the entry is complete, so that the rules that tie parameters together
        (:func:`~sb3_ppo_ext.parameters.check_together`, ``n_steps * n_envs > 1``) apply; ``False`` for a part
        of the settings, such as ``-params``, that will be merged over a file's entry
    :return: the problems, each naming the key
    """
    if not isinstance(entry, Mapping):
        return [f"expected a mapping of settings, got {type(entry).__name__} {entry!r:.80}"]
    algorithm = algorithm_spec(algo).algorithm
    parameters = algorithm_parameters(algorithm)
    allowed = sorted({*parameters, *ZOO_KEY_CHECKS})
    problems = []
    for key, value in entry.items():
        if key in RESERVED_KEYS:
            problems.append(f"'{key}' is set by rl-zoo3 itself (use its command-line option instead)")
        elif not isinstance(key, str) or key not in allowed:
            problems.append(unknown_key(key, allowed))
        elif key in ZOO_KEY_CHECKS:
            if problem := ZOO_KEY_CHECKS[key](key, value):
                problems.append(problem)
        elif key == "policy":
            if not (isinstance(value, str) or isinstance(value, type)):
                problems.append(_wrong_type(key, value, "a policy name such as MlpPolicy"))
        elif key == "policy_kwargs":
            problems += _policy_kwargs_problems(algorithm, entry.get("policy", "MlpPolicy"), value)
        elif problem := _algorithm_value_problem(key, value, parameters[key]):
            problems.append(problem)
    if whole and not problems:
        problems += _whole_entry_problems(algorithm_spec(algo), parameters, entry)
    return problems


def _whole_entry_problems(spec: AlgorithmSpec, parameters: dict[str, Any], entry: Mapping[str, Any]) -> list[str]:
    """The rules that tie the algorithm's arguments together, on the entry merged over the algorithm's defaults."""
    if spec.rules_together is None:
        return []
    merged = {**parameters, **to_algorithm_kwargs({k: v for k, v in entry.items() if k in parameters})}
    try:
        # n_envs is absent once rl-zoo3 has consumed it: the algorithm checks n_steps * n_envs then.
        spec.rules_together({name: merged[name] for name in ALGORITHM_RULES if name in merged}, n_envs=entry.get("n_envs"))
    except InvalidSettingError as error:
        return [str(error)]
    return []


def whole_entry_problems(entry: Mapping[str, Any], algo: str = DEFAULT_ALGO) -> list[str]:
    """
    Only the rules that tie the algorithm's arguments together, on an entry whose keys were each
    checked already (:func:`entry_problems` with ``whole=False``), e.g. a file's entry merged with
    ``-params``: each setting is judged once.
    """
    spec = algorithm_spec(algo)
    return _whole_entry_problems(spec, algorithm_parameters(spec.algorithm), entry)


def check_entry(entry: Any, source: str, algo: str = DEFAULT_ALGO, whole: bool = True) -> dict[str, Any]:
    """
    Check one settings entry (see :func:`entry_problems`).

    :param entry: the parsed entry, in rl-zoo3's yml form
    :param source: where it comes from (file and entry, or ``-params``), for the message
    :param algo: the algorithm's name in :data:`ALGORITHMS`
    :param whole: ``False`` for a part of the settings (e.g. ``-params``): no rules across parameters
    :return: a fresh dict of the settings
    :raises SettingsError: naming the source and every problem (each with its key)
    """
    problems = entry_problems(entry, algo, whole)
    if problems:
        raise SettingsError(f"{source}: {'; '.join(problems)}")
    return dict(entry)


def read_entries(path: str | Path) -> dict[str, Any]:
    """
    The entries of a yml hyperparameter file, parsed with ``yaml.safe_load`` (a ``!!python/...`` tag is an error).

    :raises SettingsError: the file is not valid YAML or not a mapping
    """
    try:
        with open(path) as file:
            entries = yaml.safe_load(file)
    except yaml.YAMLError as error:
        raise SettingsError(f"{path}: not a valid (safe) YAML file: {error}") from None
    if not isinstance(entries, dict):
        raise SettingsError(f"{path}: expected a mapping of env ids to settings, got {type(entries).__name__}")
    return entries


def select_entry(entries: Mapping[str, Any], env_id: str, atari: bool = False) -> str | None:
    """The name of the entry rl-zoo3 uses for ``env_id``: the env id, ``atari`` for Atari, ``default``; or None."""
    for name, applies in ((env_id, True), ("atari", atari), ("default", True)):
        if applies and name in entries:
            return name
    return None


def load_hyperparams(env_id: str, path: str | Path = PPO_EXT_YML, algo: str = DEFAULT_ALGO) -> dict[str, Any]:
    """
    The checked settings for ``env_id`` from a yml hyperparameter file (its own entry, or ``default``).

    :param env_id: gymnasium environment id
    :param path: yml file in rl-zoo3's format
    :param algo: the algorithm's name in :data:`ALGORITHMS`
    :return: a fresh dict of settings
    :raises SettingsError: the file is not valid YAML, not a mapping, or the entry is invalid
    :raises KeyError: no entry for ``env_id`` and no ``default``
    """
    entries = read_entries(path)
    name = select_entry(entries, env_id)
    if name is None:
        raise KeyError(f"{path}: no entry for {env_id!r} and no 'default' entry")
    label = f"entry {env_id!r}" if name == env_id else f"entry {name!r} for {env_id!r}"
    return check_entry(entries[name], f"{path} ({label})", algo)


__all__ = [
    "ACTIVATIONS",
    "ALGORITHMS",
    "DEFAULT_ALGO",
    "ENV_BACKENDS",
    "HYPERPARAMS_DIR",
    "PPO_EXT_YML",
    "RESERVED_KEYS",
    "SCHEDULE_KEYS",
    "ZOO_KEY_CHECKS",
    "AlgorithmSpec",
    "SettingsError",
    "activation_class",
    "algorithm_parameters",
    "algorithm_spec",
    "check_entry",
    "entry_problems",
    "load_hyperparams",
    "policy_parameters",
    "read_entries",
    "select_entry",
    "to_algorithm_kwargs",
    "unknown_key",
    "unknown_policy_kwarg",
    "whole_entry_problems",
]
