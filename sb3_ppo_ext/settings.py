"""Settings entries in rl-zoo3's yml form, checked whole before anything runs, and this package's algorithms for rl-zoo3."""

from __future__ import annotations

import ast
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sb3_ppo_ext import samplers, validation
from sb3_ppo_ext.maskable import MaskablePPOExt
from sb3_ppo_ext.ppo_ext import PPOExt
from sb3_ppo_ext.recurrent import RecurrentPPOExt
from sb3_ppo_ext.validation import ALGORITHM_RULES, InvalidSettingError, Rule

HYPERPARAMS_DIR = Path(__file__).resolve().parent / "hyperparams"
PPO_EXT_YML = HYPERPARAMS_DIR / "ppo_ext.yml"


@dataclass(frozen=True)
class AlgorithmSpec:
    """
    One algorithm of this package, as rl-zoo3 knows it.

    :param name: rl-zoo3's ``--algo`` name
    :param algorithm: the class
    :param hyperparams: default hyperparameter file (``--conf-file``); ``None``: rl-zoo3's own lookup
    :param sampler: the function for ``HYPERPARAMS_SAMPLER`` (``-optimize``; default: the PPO family's), or ``None``
    :param converter: the function for ``HYPERPARAMS_CONVERTER`` (``--trial-id``; default: the PPO family's), or ``None``
    :param masked: whether the algorithm needs action masks (rl-zoo3's evaluation and ``enjoy`` then pass them)
    """

    name: str
    algorithm: type
    hyperparams: Path | None = None
    sampler: Callable[..., dict[str, Any]] | None = samplers.sample_zoo_params
    converter: Callable[[dict[str, Any]], dict[str, Any]] | None = samplers.convert_zoo_params
    masked: bool = False


# This package's algorithms, by rl-zoo3 name: registering another one is one entry here.
ALGORITHMS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec("ppo_ext", PPOExt, PPO_EXT_YML),
        AlgorithmSpec(
            "ppo_lstm_ext",
            RecurrentPPOExt,
            HYPERPARAMS_DIR / "ppo_lstm_ext.yml",
            samplers.sample_recurrent_zoo_params,
            samplers.convert_recurrent_zoo_params,
        ),
        AlgorithmSpec("ppo_mask_ext", MaskablePPOExt, HYPERPARAMS_DIR / "ppo_mask_ext.yml", masked=True),
    )
}
DEFAULT_ALGO = "ppo_ext"

# Keyword arguments that rl-zoo3 passes to the algorithm itself: an entry may not set them.
RESERVED_KEYS = frozenset({"env", "tensorboard_log", "seed", "verbose", "device", "_init_setup_model"})


def _check(function: Callable[..., object], *args: object) -> str | None:
    try:
        function(*args)
    except InvalidSettingError as error:
        return str(error)
    return None


def _judge(rule: Rule, name: str, value: object) -> str | None:
    """The row's problem with a yml value: ``lin_<x>`` is a schedule; a number in a string gets a hint."""
    if rule.schedule and isinstance(value, str) and validation.linear_schedule_start(value) is not None:
        return None
    if rule.schedule and isinstance(value, str):
        problem: str | None = f"{name}={value!r} is invalid: expected a number or a 'lin_<x>' schedule with x > 0"
    else:
        problem = _check(rule.judge, name, value)
    if problem and isinstance(value, str) and "a string" not in problem and _NUMBER.fullmatch(value.strip()):
        problem += " (a string: PyYAML reads 3e-4 as a string; write 3.0e-4 or !!float 3e-4)"
    return problem


def _expected(name: str, value: object, expected: str) -> str:
    return f"{name}={value!r} is invalid: expected {expected}"


# A value of a ``policy_kwargs`` / ``normalize`` string that rl-zoo3 evaluates (e.g. nn.ReLU): only its name is checked.
_NOT_LITERAL = object()
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _kwargs_expression(text: str, key: str) -> tuple[dict[str, object] | None, str | None]:
    """The keywords and literal values of a ``dict(...)`` / ``{...}`` string, or ``(None, problem or None)``."""
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
    parsed: dict[str, object] = {}
    for name, node in items:
        try:
            parsed[name] = ast.literal_eval(node)
        except ValueError:
            parsed[name] = _NOT_LITERAL
    return parsed, None


def _policy_kwargs_problems(algorithm: type, policy: object, policy_kwargs: object) -> list[str]:
    if isinstance(policy_kwargs, str):
        parsed, problem = _kwargs_expression(policy_kwargs, "policy_kwargs")
        if parsed is None:
            return [problem] if problem else []
        policy_kwargs = parsed
    if policy_kwargs is None:
        return []
    if not isinstance(policy_kwargs, Mapping):
        return [_expected("policy_kwargs", policy_kwargs, "a mapping")]
    policy_class = getattr(algorithm, "policy_aliases", {}).get(policy) if isinstance(policy, str) else policy
    if not isinstance(policy_class, type):
        return []  # a dotted class path that rl-zoo3 imports later: names unknown here
    parameters = validation.policy_parameters(policy_class)
    literal = {key: value for key, value in policy_kwargs.items() if value is not _NOT_LITERAL}
    problems: list[str | None] = [
        validation.unknown_policy_kwarg(key, policy_class, parameters) for key in policy_kwargs if key not in parameters
    ]
    for key, value in literal.items():
        if key in parameters and key in validation.POLICY_KWARG_RULES:
            problems.append(_judge(validation.POLICY_KWARG_RULES[key], f"policy_kwargs.{key}", value))
        elif key in parameters and key.endswith("_kwargs"):
            problems.append(_typed(Mapping, type(None), expected="a mapping")(f"policy_kwargs.{key}", value))
    found = [problem for problem in problems if problem]
    together = None if found else _check(validation.check_policy_kwargs_together, literal)
    return [together] if together else found


def _normalize_problem(key: str, value: object) -> str | None:
    from stable_baselines3.common.vec_env import VecNormalize

    if validation.is_bool(value) or value is None:
        return None
    if isinstance(value, str):
        parsed, problem = _kwargs_expression(value, key)
        if problem or parsed is None:
            return problem or _expected(key, value, "true, false or a mapping of VecNormalize arguments")
        value = parsed
    if not isinstance(value, Mapping):
        return _expected(key, value, "true, false or a mapping of VecNormalize arguments")
    allowed = sorted(set(inspect.signature(VecNormalize.__init__).parameters) - {"self", "venv"})
    return "; ".join(validation.unknown_key(name, allowed, " in normalize") for name in value if name not in allowed) or None


def _n_timesteps_problem(key: str, value: object) -> str | None:
    if validation.is_real(value) and math.isfinite(value) and float(value).is_integer() and value >= 0:  # type: ignore[arg-type, operator]
        return None
    return _expected(key, value, "a whole number of steps >= 0")


# Where an entry's training envs come from (``env_backend``); evaluation always runs on gymnasium's envs.
ENV_BACKENDS = ("gymnasium", "envpool")


def _typed(*types: type, expected: str) -> Callable[[str, object], str | None]:
    return lambda key, value: None if isinstance(value, types) else _expected(key, value, expected)


# rl-zoo3's own keys of an entry (and env_backend, optimize_cpu_budget: this package's ExperimentManager's), each checked.
ZOO_KEY_CHECKS: dict[str, Callable[[str, object], str | None]] = {
    "policy": _typed(str, type, expected="a policy name such as MlpPolicy"),
    "env_backend": lambda key, value: None if value in ENV_BACKENDS else _expected(key, value, f"one of {ENV_BACKENDS}"),
    "n_envs": lambda key, value: _check(validation.check_int, key, value),
    "n_timesteps": _n_timesteps_problem,
    "optimize_cpu_budget": lambda key, value: (
        None
        if validation.is_real(value) and math.isfinite(value) and value > 0  # type: ignore[arg-type, operator]
        else _expected(key, value, "a number of CPU-seconds > 0")
    ),
    "normalize": _normalize_problem,
    "monitor_kwargs": _typed(Mapping, str, expected="a mapping"),
    "env_kwargs": _typed(Mapping, expected="a mapping"),
    "frame_stack": lambda key, value: _check(validation.check_int, key, value),
    "env_wrapper": _typed(str, list, dict, expected="str or list"),
    "vec_env_wrapper": _typed(str, list, dict, expected="str or list"),
    "callback": _typed(str, list, dict, expected="str or list"),
}


def algorithm_spec(algo: str) -> AlgorithmSpec:
    """The :data:`ALGORITHMS` entry of ``algo``."""
    if algo not in ALGORITHMS:
        raise InvalidSettingError(f"unknown algorithm {algo!r}: expected one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[algo]


def algorithm_parameters(algorithm: type) -> dict[str, object]:
    """The parameters an entry may give to ``algorithm`` (``policy`` included), with their defaults."""
    signature = inspect.signature(algorithm)
    return {name: p.default for name, p in signature.parameters.items() if name != "self" and name not in RESERVED_KEYS}


def entry_problems(entry: object, algo: str = DEFAULT_ALGO, whole: bool = True) -> list[str]:
    """
    Everything wrong with one settings entry, one message per problem naming the key (empty: valid).

    :param entry: the entry, in rl-zoo3's yml form
    :param algo: the algorithm's name in :data:`ALGORITHMS`
    :param whole: whether the rules across parameters apply (``False`` for a part, such as ``-params``)
    """
    if not isinstance(entry, Mapping):
        return [f"expected a mapping of settings, got {type(entry).__name__} {entry!r:.80}"]
    algorithm = algorithm_spec(algo).algorithm
    parameters = algorithm_parameters(algorithm)
    allowed = sorted({*parameters, *ZOO_KEY_CHECKS})
    problems: list[str | None] = []
    for key, value in entry.items():
        if key in RESERVED_KEYS:
            problems.append(f"'{key}' is set by rl-zoo3 itself (use its command-line option instead)")
        elif not isinstance(key, str) or key not in allowed:
            problems.append(validation.unknown_key(key, allowed))
        elif key in ZOO_KEY_CHECKS:
            problems.append(ZOO_KEY_CHECKS[key](key, value))
        elif key == "policy_kwargs":
            problems += _policy_kwargs_problems(algorithm, entry.get("policy", "MlpPolicy"), value)
        elif key in ALGORITHM_RULES:
            problems.append(_judge(ALGORITHM_RULES[key], key, value))
        elif key.endswith("_kwargs"):
            problems.append(_typed(Mapping, type(None), expected="a mapping")(key, value))
    found = [problem for problem in problems if problem]
    return whole_entry_problems(entry, algo) if whole and not found else found


def whole_entry_problems(entry: Mapping[str, object], algo: str = DEFAULT_ALGO) -> list[str]:
    """The rules across arguments on an entry whose keys were judged already (a file's entry and ``-params``)."""
    parameters = algorithm_parameters(algorithm_spec(algo).algorithm)
    merged = {**parameters, **validation.to_algorithm_kwargs({k: v for k, v in entry.items() if k in parameters})}
    # n_envs is absent once rl-zoo3 has consumed it: the algorithm checks n_steps * n_envs then.
    n_envs = entry.get("n_envs")
    problem = _check(validation.check_together, {name: merged[name] for name in ALGORITHM_RULES if name in merged}, n_envs)
    return [problem] if problem else []


def check_entry(entry: Any, source: str, algo: str = DEFAULT_ALGO, whole: bool = True) -> dict[str, Any]:
    """A fresh dict of one settings entry; an :class:`InvalidSettingError` naming ``source`` and each problem otherwise."""
    problems = entry_problems(entry, algo, whole)
    if problems:
        raise InvalidSettingError(f"{source}: {'; '.join(problems)}")
    return dict(entry)


def read_entries(path: str | Path) -> dict[str, Any]:
    """The entries of a yml hyperparameter file, parsed with ``yaml.safe_load`` (a ``!!python/...`` tag is an error)."""
    try:
        with open(path) as file:
            entries = yaml.safe_load(file)
    except yaml.YAMLError as error:
        raise InvalidSettingError(f"{path}: not a valid (safe) YAML file: {error}") from None
    if not isinstance(entries, dict):
        raise InvalidSettingError(f"{path}: expected a mapping of env ids to settings, got {type(entries).__name__}")
    return entries


def select_entry(entries: Mapping[str, Any], env_id: str, atari: bool = False) -> str | None:
    """The name of the entry rl-zoo3 uses for ``env_id``: the env id, ``atari`` for Atari, ``default``; or None."""
    for name, applies in ((env_id, True), ("atari", atari), ("default", True)):
        if applies and name in entries:
            return name
    return None


def load_hyperparams(env_id: str, path: str | Path = PPO_EXT_YML, algo: str = DEFAULT_ALGO) -> dict[str, Any]:
    """
    The checked settings for ``env_id`` (its own entry, or ``default``) from a yml hyperparameter file.

    :param env_id: gymnasium environment id
    :param path: yml file in rl-zoo3's format
    :param algo: the algorithm's name in :data:`ALGORITHMS`
    """
    entries = read_entries(path)
    name = select_entry(entries, env_id)
    if name is None:
        raise KeyError(f"{path}: no entry for {env_id!r} and no 'default' entry")
    label = f"entry {env_id!r}" if name == env_id else f"entry {name!r} for {env_id!r}"
    return check_entry(entries[name], f"{path} ({label})", algo)
