"""Input validators: the primitives of the parameter rules (:mod:`sb3_ppo_ext.parameters`), used by every check.

Every check raises :class:`InvalidSettingError` with a message naming the parameter, the value and
what is allowed. It is a ``ValueError`` and also an ``AssertionError``: Stable-Baselines3's PPO
asserts some of the same settings (``batch_size > 1``, a positive ``clip_range_vf``, ...), and code
written against PPO that catches ``AssertionError`` keeps working with PPOExt.

Numbers are judged like PPO uses them: any real number type (Python ``int`` / ``float``, numpy
scalars such as ``np.float32(0.5)`` or ``np.int64(4)``) is a number; ``bool`` is not (``True``
would silently be 1). A boolean must be a real boolean (``bool`` or ``np.bool_``): the string
``"false"`` is truthy and would switch a feature on.

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class InvalidSettingError(ValueError, AssertionError):
    """
    An invalid setting. A ``ValueError`` whose message names the parameter, the value and what is
    allowed; also an ``AssertionError``, as Stable-Baselines3's PPO asserts the settings it checks.
    """


class SettingsError(InvalidSettingError):
    """A settings entry or file is invalid: the message names the file, the entry, each key and the problem."""


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or numpy scalar), ``bool`` excluded."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python ``int`` or numpy integer scalar), ``bool`` excluded."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_bool(value: Any) -> bool:
    """Whether ``value`` is a boolean (``bool`` or ``np.bool_``)."""
    return isinstance(value, (bool, np.bool_))


def _bounds_text(low: float | None, high: float | None, strict: bool) -> str:
    lower = "" if low is None else f" {'>' if strict else '>='} {low}"
    upper = "" if high is None else f"{' and' if lower else ''} <= {high}"
    return lower + upper


def check_real(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    strict: bool = True,
    finite: bool = True,
) -> float:
    """
    ``float(value)``, or an :class:`InvalidSettingError` unless ``value`` is a real number within the bounds.

    :param name: parameter name, for the message
    :param value: the value to check
    :param low: lower bound (``None``: none)
    :param high: upper bound, inclusive (``None``: none)
    :param strict: whether the lower bound is exclusive
    :param finite: whether infinity is rejected (NaN always is)
    :return: the value as a float
    """
    ok = is_real(value) and not math.isnan(value) and (math.isfinite(value) or not finite)
    if ok and low is not None:
        ok = value > low if strict else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        kind = "a finite number" if finite else "a number"
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected {kind}{_bounds_text(low, high, strict)}")
    return float(value)


def optional_real(name: str, value: Any, **bounds: Any) -> float | None:
    """:func:`check_real` (same keyword arguments: ``low``, ``high``, ``strict``, ``finite``) letting ``None`` through."""
    return None if value is None else check_real(name, value, **bounds)


def check_int(name: str, value: Any, low: int | None = 1) -> int:
    """
    ``int(value)``, or an :class:`InvalidSettingError` unless ``value`` is an integer ``>= low``.

    A float, even a whole one such as ``2.0``, is not an integer (PPO fails on it later with a TypeError).

    :param name: parameter name, for the message
    :param value: the value to check
    :param low: smallest allowed value (``None``: any integer)
    :return: the value as an int
    """
    if not is_int(value) or (low is not None and value < low):
        bound = "" if low is None else f" >= {low}"
        whole_float = is_real(value) and not is_int(value) and float(value).is_integer()
        hint = " (a float: write it without a decimal point)" if whole_float else ""
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected an int{bound}{hint}")
    return int(value)


def check_positive_int(name: str, value: Any) -> int:
    """:func:`check_int` with ``low=1``."""
    return check_int(name, value, 1)


def check_bool(name: str, value: Any, allow_none: bool = False) -> bool | None:
    """
    ``bool(value)``, or an :class:`InvalidSettingError` unless ``value`` is a ``bool`` or ``np.bool_``
    (or an allowed ``None``). Strings such as ``"false"`` are rejected: they are truthy.

    :param name: parameter name, for the message
    :param value: the value to check
    :param allow_none: whether ``None`` is allowed (and returned as is)
    :return: the value as a bool (or None)
    """
    if value is None and allow_none:
        return None
    if not is_bool(value):
        hint = " (a string is not a boolean: write true/false without quotes)" if isinstance(value, str) else ""
        allowed = "True, False or None" if allow_none else "True or False"
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected {allowed}, got {type(value).__name__}{hint}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """``value``, or an :class:`InvalidSettingError` unless it is one of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # an unhashable value against a set
        ok = False
    if not ok:
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected one of {tuple(choices)}")
    return value


def check_real_pair(name: str, value: Any, finite: bool = True) -> tuple[float, float]:
    """``(min, max)`` floats with ``min <= max``, or an :class:`InvalidSettingError`."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2 or not all(map(is_real, value)):
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected (min, max) numbers")
    low, high = float(value[0]), float(value[1])
    if math.isnan(low) or math.isnan(high) or (finite and not (math.isfinite(low) and math.isfinite(high))) or low > high:
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected {'finite ' if finite else ''}min <= max")
    return low, high


def check_number_or_schedule(
    name: str,
    value: Any,
    allow_none: bool = False,
    check_schedule: bool = True,
    low: float = 0.0,
    strict: bool = True,
) -> None:
    """
    An :class:`InvalidSettingError` unless ``value`` is a finite number above ``low`` (``>= low``
    when not ``strict``), a schedule whose value at progress 1 is (when ``check_schedule``), or an
    allowed ``None``.
    """
    bound = _bounds_text(low, None, strict)
    if value is None:
        if not allow_none:
            raise InvalidSettingError(f"{name}=None is not allowed: expected a number{bound} or a schedule")
        return
    if callable(value):
        if not check_schedule:
            return
        start = value(1.0)
        if not (is_real(start) and math.isfinite(start) and (start > low if strict else start >= low)):
            raise InvalidSettingError(f"{name} is a schedule whose initial value {start!r} is not a finite number{bound}")
        return
    if not (is_real(value) and math.isfinite(value) and (value > low if strict else value >= low)):
        allowed = f"a finite number{bound}, a schedule" + (" or None" if allow_none else "")
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected {allowed}")


def linear_schedule_start(value: Any) -> float | None:
    """
    The initial value ``x`` of rl-zoo3's linear schedule string ``"lin_<x>"`` (a schedule from ``x``
    to 0), or ``None`` when ``value`` is not such a string with a finite ``x > 0``.
    """
    if not isinstance(value, str) or not value.startswith("lin_"):
        return None
    try:
        start = float(value[len("lin_") :])
    except ValueError:
        return None
    return start if math.isfinite(start) and start > 0 else None


def check_lstm_kwargs(name: str, value: Any) -> None:
    """An :class:`InvalidSettingError` unless ``value`` is ``None`` or a mapping whose ``dropout`` (if any) is in [0, 1]."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected a mapping of torch.nn.LSTM arguments")
    if "dropout" in value:
        check_real(f"{name}.dropout", value["dropout"], low=0.0, high=1.0, strict=False)


# The action distributions of PPOExt's policies for Box actions (``policy_kwargs["action_dist"]``).
ACTION_DISTS = ("gaussian", "beta")
# The networks of ``policy_kwargs["learning_rates"]``: the actor and the critic.
LEARNING_RATE_NETWORKS = ("pi", "vf")


def check_network_learning_rates(name: str, value: Any) -> None:
    """
    An :class:`InvalidSettingError` unless ``value`` is ``None`` or a mapping with exactly the keys
    ``"pi"`` and ``"vf"``, each a positive finite number, a linear schedule ``"lin_<x>"`` with ``x > 0``
    or a callable of the progress remaining that is positive at progress 1.

    :param name: parameter name, for the message (``policy_kwargs.learning_rates``)
    :param value: the value to check
    """
    if value is None:
        return
    if not isinstance(value, Mapping) or set(value) != set(LEARNING_RATE_NETWORKS):
        raise InvalidSettingError(
            f"{name}={value!r} is invalid: expected a mapping with exactly the keys 'pi' (the actor) and 'vf' (the critic), "
            "e.g. {'pi': 3e-4, 'vf': 1e-3}"
        )
    for network in LEARNING_RATE_NETWORKS:
        rate = value[network]
        if isinstance(rate, str):
            if linear_schedule_start(rate) is None:
                raise InvalidSettingError(
                    f"{name}.{network}={rate!r} is invalid: expected a number > 0, a schedule or 'lin_<x>' with x > 0"
                )
            continue
        check_number_or_schedule(f"{name}.{network}", rate)


def check_action_dist_together(
    action_dist: Any,
    squash_output: Any = None,
    state_dependent_std: Any = False,
    log_std_bounds: Any = None,
    entropy_estimator: Any = None,
    log_std_init: Any = 0.0,
    use_sde: Any = False,
) -> None:
    """
    An :class:`InvalidSettingError` for an unknown ``action_dist`` or one combined with a setting it
    excludes: the Beta head is bounded by construction (``squash_output`` must be ``None`` or ``True``),
    has its own state-dependent spread and a closed-form entropy (no ``state_dependent_std``,
    ``log_std_bounds``, ``entropy_estimator``, ``log_std_init`` other than 0, nor gSDE).
    """
    check_choice("policy_kwargs.action_dist", action_dist, ACTION_DISTS)
    if action_dist != "beta":
        return
    # setting -> (its value, whether it is set to something the Beta head excludes)
    given = {
        "squash_output": (squash_output, squash_output is False),
        "state_dependent_std": (state_dependent_std, state_dependent_std is True),
        "log_std_bounds": (log_std_bounds, log_std_bounds is not None),
        "entropy_estimator": (entropy_estimator, entropy_estimator is not None),
        "log_std_init": (log_std_init, is_real(log_std_init) and float(log_std_init) != 0.0),
        "use_sde": (use_sde, use_sde is True),
    }
    for key, (value, conflicting) in given.items():
        if conflicting:
            where = key if key == "use_sde" else f"policy_kwargs.{key}"
            raise InvalidSettingError(
                f"{where}={value!r} is invalid with policy_kwargs.action_dist='beta': the Beta head is bounded by "
                "construction, has a state-dependent spread of its own and a closed-form entropy; "
                f"{key} applies to the Gaussian head (action_dist='gaussian')"
            )


# The Gaussian head's settings that the Beta head excludes (see :func:`check_action_dist_together`).
BETA_EXCLUDED_KWARGS = ("squash_output", "state_dependent_std", "log_std_bounds", "entropy_estimator", "log_std_init")
