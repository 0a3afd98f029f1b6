"""The hyperparameter files shipped with sb3_ppo_ext (rl-zoo3 format)."""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any

import yaml

HYPERPARAMS_DIR = Path(__file__).resolve().parent
PPO_EXT_YML = HYPERPARAMS_DIR / "ppo_ext.yml"

# Keys of an entry that rl-zoo3 itself consumes (not PPOExt parameters), with the types they take.
ZOO_KEYS: dict[str, tuple[type, ...]] = {
    "n_envs": (int,),
    "n_timesteps": (int, float),
    "normalize": (bool, str, dict),
    "monitor_kwargs": (dict,),
    "env_kwargs": (dict,),
    "frame_stack": (int,),
    "env_wrapper": (str, list, dict),
    "vec_env_wrapper": (str, list, dict),
    "callback": (str, list, dict),
}
# PPOExt parameters that also take rl-zoo3's ``lin_<x>`` schedule strings (or a schedule callable).
SCHEDULE_KEYS = ("learning_rate", "clip_range", "clip_range_vf")


class HyperparamsError(ValueError):
    """A hyperparameter file or entry is invalid: the message names the file, the entry and the problem."""


def type_problem(key: str, value: Any, default: Any) -> str | None:
    """Why ``value`` cannot be PPOExt's ``key`` (whose default is ``default``), judged by type only; None if it can."""
    if value is None or default is None or default is inspect.Parameter.empty:
        return None
    if key in SCHEDULE_KEYS and (callable(value) or (isinstance(value, str) and value.startswith("lin_"))):
        return None
    if isinstance(default, bool):
        expected: tuple[type, ...] = (bool,)
    elif isinstance(default, (int, float)):
        expected = (int, float)
    elif isinstance(default, (tuple, list)):
        expected = (tuple, list)
    elif isinstance(default, str):
        expected = (str,)
    else:
        return None
    if isinstance(value, bool) and bool not in expected:
        return f"'{key}: {value!r}' is a bool, expected {' or '.join(t.__name__ for t in expected)}"
    if isinstance(value, expected):
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) and not value.is_integer():
            return f"'{key}: {value!r}' is not a whole number"
        return None
    hint = " (a string: quote marks or a typo in a number?)" if isinstance(value, str) else ""
    return f"'{key}: {value!r}' is a {type(value).__name__}{hint}, expected {' or '.join(t.__name__ for t in expected)}"


def check_entry(entry: Any, source: str) -> dict[str, Any]:
    """
    Check one entry of a hyperparameter file: a mapping whose keys are PPOExt parameters or rl-zoo3
    keys (``n_envs``, ``n_timesteps``, ``normalize``, ...), each value of a type the parameter takes.

    :param entry: the parsed entry
    :param source: where it comes from (file and env id), for the message
    :return: a fresh dict of the settings
    :raises HyperparamsError: naming the source, each unknown key (with the closest valid one) and each wrong type
    """
    from sb3_ppo_ext.ppo_ext import PPOExt

    if not isinstance(entry, dict):
        raise HyperparamsError(f"{source}: expected a mapping of settings, got {type(entry).__name__} {entry!r:.80}")
    parameters = {
        name: p.default for name, p in inspect.signature(PPOExt.__init__).parameters.items() if name not in {"self", "env"}
    }
    allowed = sorted({*parameters, *ZOO_KEYS} - {"_init_setup_model"})
    problems = []
    for key, value in entry.items():
        if not isinstance(key, str) or key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            problems.append(f"unknown key {key!r}" + (f" (did you mean '{close[0]}'?)" if close else ""))
        elif key in ZOO_KEYS:
            if (isinstance(value, bool) and bool not in ZOO_KEYS[key]) or not isinstance(value, ZOO_KEYS[key]):
                names = " or ".join(t.__name__ for t in ZOO_KEYS[key])
                problems.append(f"'{key}: {value!r}' is a {type(value).__name__}, expected {names}")
        else:
            problem = type_problem(key, value, parameters[key])
            if problem:
                problems.append(problem)
    if problems:
        raise HyperparamsError(f"{source}: {'; '.join(problems)}")
    return dict(entry)


def load_hyperparams(env_id: str, path: str | Path = PPO_EXT_YML) -> dict[str, Any]:
    """
    The settings for ``env_id`` from a hyperparameter file, or its ``default`` entry, checked with :func:`check_entry`.

    Parsed with ``yaml.safe_load``: nothing in the file is executed (a ``!!python/...`` tag is an error).

    :param env_id: gymnasium environment id
    :param path: yml file in rl-zoo3's format
    :return: a fresh dict of settings
    :raises HyperparamsError: the file is not valid YAML, not a mapping, or the entry is invalid
    :raises KeyError: no entry for ``env_id`` and no ``default``
    """
    try:
        with open(path) as file:
            entries = yaml.safe_load(file)
    except yaml.YAMLError as error:
        raise HyperparamsError(f"{path}: not a valid (safe) YAML file: {error}") from None
    if not isinstance(entries, dict):
        raise HyperparamsError(f"{path}: expected a mapping of env ids to settings, got {type(entries).__name__}")
    if env_id in entries:
        return check_entry(entries[env_id], f"{path} (entry {env_id!r})")
    if "default" in entries:
        return check_entry(entries["default"], f"{path} (entry 'default' for {env_id!r})")
    raise KeyError(f"{path}: no entry for {env_id!r} and no 'default' entry")
