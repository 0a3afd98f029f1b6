"""The one table of parameter rules (:data:`ALGORITHM_RULES`, :data:`POLICY_KWARG_RULES`) and its validators."""

from __future__ import annotations

import difflib
import inspect
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.utils import LinearSchedule
from torch import nn


class InvalidSettingError(ValueError, AssertionError):
    """An invalid setting (the message names it, its value and what is allowed); an ``AssertionError`` too, like PPO's."""


def is_real(value: object) -> bool:
    """Whether ``value`` is a real number (Python or numpy scalar), ``bool`` excluded."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (Python or numpy scalar), ``bool`` excluded."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_bool(value: object) -> bool:
    """Whether ``value`` is a ``bool`` or ``np.bool_``."""
    return isinstance(value, (bool, np.bool_))


def _bounds_text(low: float | None, high: float | None, strict: bool) -> str:
    lower = "" if low is None else f" {'>' if strict else '>='} {low}"
    return lower + ("" if high is None else f"{' and' if lower else ''} <= {high}")


def _above(value: Any, low: float | None, strict: bool) -> bool:
    return low is None or (value > low if strict else value >= low)


def check_real(
    name: str, value: Any, low: float | None = None, high: float | None = None, strict: bool = True, finite: bool = True
) -> float:
    """``float(value)`` for a real number above ``low`` (or equal unless ``strict``), ``<= high``, finite if ``finite``."""
    ok = is_real(value) and not math.isnan(value) and (math.isfinite(value) or not finite)
    if not (ok and _above(value, low, strict) and (high is None or value <= high)):
        kind = "a finite number" if finite else "a number"
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected {kind}{_bounds_text(low, high, strict)}")
    return float(value)


def optional_real(name: str, value: Any, **bounds: Any) -> float | None:
    """:func:`check_real` (same keyword arguments) letting ``None`` through."""
    return None if value is None else check_real(name, value, **bounds)


def check_int(name: str, value: Any, low: int | None = 1) -> int:
    """``int(value)``, or an :class:`InvalidSettingError` unless ``value`` is an integer ``>= low`` (``2.0`` is not)."""
    if not is_int(value) or not _above(value, low, False):
        whole_float = is_real(value) and not is_int(value) and float(value).is_integer()
        hint = " (a float: write it without a decimal point)" if whole_float else ""
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected an int{_bounds_text(low, None, False)}{hint}")
    return int(value)


def check_bool(name: str, value: Any, allow_none: bool = False) -> bool | None:
    """``bool(value)`` (or an allowed ``None``), or an :class:`InvalidSettingError` unless ``value`` is a boolean."""
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
    name: str, value: Any, allow_none: bool = False, check_schedule: bool = True, low: float = 0.0, strict: bool = True
) -> None:
    """That ``value`` is a finite number above ``low``, a schedule whose value at progress 1 is, or an allowed ``None``."""
    bound = _bounds_text(low, None, strict)
    if value is None and not allow_none:
        raise InvalidSettingError(f"{name}=None is not allowed: expected a number{bound} or a schedule")
    if callable(value) and check_schedule:
        start = value(1.0)
        if not (is_real(start) and math.isfinite(start) and _above(start, low, strict)):
            raise InvalidSettingError(f"{name} is a schedule whose initial value {start!r} is not a finite number{bound}")
    elif not (value is None or callable(value) or (is_real(value) and math.isfinite(value) and _above(value, low, strict))):
        allowed = f"a finite number{bound}, a schedule" + (" or None" if allow_none else "")
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected {allowed}")


def linear_schedule_start(value: Any) -> float | None:
    """The ``x`` of rl-zoo3's linear schedule string ``"lin_<x>"`` (from ``x`` to 0) with a finite ``x > 0``, else ``None``."""
    if not isinstance(value, str) or not value.startswith("lin_"):
        return None
    try:
        start = float(value[len("lin_") :])
    except ValueError:
        return None
    return start if math.isfinite(start) and start > 0 else None


@dataclass(frozen=True)
class Rule:
    """
    What one parameter may be.

    :param kind: ``"real"``, ``"int"``, ``"bool"``, ``"choice"`` (of ``choices``), ``"pair"`` (``(min, max)``) or ``"check"``
    :param low: lower bound (``None``: none); for a pair, the bound ``min`` must exceed
    :param high: upper bound, inclusive (``None``: none)
    :param strict: whether ``low`` is exclusive (ints: always ``>= low``)
    :param finite: whether infinity is rejected (NaN always is)
    :param nullable: whether ``None`` is allowed (the feature off)
    :param schedule: whether a schedule is allowed (a callable judged at progress 1; in yml, ``lin_<x>``)
    :param choices: the allowed values of a ``"choice"``
    :param check: ``check(name, value)`` raising :class:`InvalidSettingError`, for a ``"check"``
    :param scheduled: ``(low, strict, high)`` for a value set by ``ParameterScheduler``, when stricter
    :param at_construction: whether the policies' constructors apply it (``False``: yml entries only)
    """

    kind: Literal["real", "int", "bool", "choice", "pair", "check"]
    low: float | None = None
    high: float | None = None
    strict: bool = True
    finite: bool = True
    nullable: bool = False
    schedule: bool = False
    choices: tuple[object, ...] = ()
    check: Callable[[str, Any], object] | None = None
    scheduled: tuple[float | None, bool, float | None] | None = None
    at_construction: bool = True

    def judge(self, name: str, value: Any, check_schedule: bool = True) -> None:
        """An :class:`InvalidSettingError` naming ``name``, ``value`` and what is allowed unless ``value`` meets the rule."""
        if self.schedule:
            low = 0.0 if self.low is None else self.low
            check_number_or_schedule(name, value, self.nullable, check_schedule, low, self.strict)
        elif value is None and self.nullable:
            return
        elif self.kind == "real":
            check_real(name, value, self.low, self.high, self.strict, self.finite)
        elif self.kind == "int":
            check_int(name, value, None if self.low is None else int(self.low))
        elif self.kind == "bool":
            check_bool(name, value, self.nullable)
        elif self.kind == "choice":
            check_choice(name, value, self.choices)
        elif self.kind == "pair":
            low, _ = check_real_pair(name, value, self.finite)
            if self.low is not None and not low > self.low:
                raise InvalidSettingError(f"{name}={value!r} is invalid: expected finite {self.low:g} < min <= max")
        elif self.check is not None:
            self.check(name, value)

    def scheduled_bounds(self) -> tuple[float | None, bool, float | None]:
        """``(low, strict, high)`` a value set by ``ParameterScheduler`` must meet (an int: ``>= low``)."""
        return self.scheduled or (self.low, self.strict and self.kind != "int", self.high)


VF_CLIP_MODES = ("clipped", "max")
ENTROPY_ESTIMATORS = ("sample", "gaussian", "mc")
ACTION_DISTS = ("gaussian", "beta")
DEFAULT_LOG_STD_BOUNDS = (-5.0, 2.0)

# Every checked argument of the algorithms (PPO's, in PPO's order, then PPOExt's own).
ALGORITHM_RULES: dict[str, Rule] = {
    "learning_rate": Rule("real", low=0.0, strict=False, schedule=True, scheduled=(0.0, True, None)),
    "n_steps": Rule("int", low=1),
    "batch_size": Rule("int", low=1),
    "n_epochs": Rule("int", low=1),
    "gamma": Rule("real", low=0.0, high=1.0, strict=False),
    "gae_lambda": Rule("real", low=0.0, high=1.0, strict=False),
    "clip_range": Rule("real", low=0.0, nullable=True, schedule=True),
    "clip_range_vf": Rule("real", low=0.0, nullable=True, schedule=True),
    "normalize_advantage": Rule("bool"),
    "ent_coef": Rule("real"),
    "vf_coef": Rule("real", scheduled=(0.0, False, None)),
    "max_grad_norm": Rule("real", low=0.0, finite=False),
    "use_sde": Rule("bool"),
    "sde_sample_freq": Rule("int"),
    "target_kl": Rule("real", low=0.0, finite=False, nullable=True),
    "stats_window_size": Rule("int", low=1),
    "vf_clip_mode": Rule("choice", choices=VF_CLIP_MODES),
    "kl_coef": Rule("real", low=0.0, strict=False),
    "kl_target": Rule("real", low=0.0, nullable=True),
    "kl_adapt_factor": Rule("real", low=1.0),
    "kl_adapt_tolerance": Rule("real", low=1.0),
    "kl_coef_bounds": Rule("pair", low=0.0),
}
# The algorithms' other arguments: judged by SB3, torch, the buffer class or POLICY_KWARG_RULES.
UNRULED_ARGUMENTS = frozenset(
    "policy env rollout_buffer_class rollout_buffer_kwargs tensorboard_log policy_kwargs verbose seed device "
    "_init_setup_model".split()
)
# Arguments that take rl-zoo3's ``lin_<x>`` schedule strings.
SCHEDULE_KEYS = tuple(name for name, rule in ALGORITHM_RULES.items() if rule.schedule)


def check_arguments(arguments: Mapping[str, Any], check_schedules: bool = True, n_envs: int | None = None) -> None:
    """The algorithms' check: each argument by its row (another name: ``TypeError``), then :func:`check_together`."""
    unknown = set(arguments) - set(ALGORITHM_RULES)
    if unknown:
        raise TypeError(f"check_arguments() got unexpected arguments {sorted(unknown)}")
    for name, value in arguments.items():
        ALGORITHM_RULES[name].judge(name, value, check_schedules)
    check_together(arguments, n_envs)


def check_together(arguments: Mapping[str, Any], n_envs: int | None = None) -> None:
    """The rules across arguments, each applied when its arguments are given."""
    get = arguments.get
    normalize, n_steps, kl_target, kl_coef = get("normalize_advantage", True), get("n_steps"), get("kl_target"), get("kl_coef")
    if normalize and get("batch_size", 2) <= 1:
        raise InvalidSettingError(
            f"batch_size={arguments['batch_size']!r} is invalid with normalize_advantage=True: expected an int > 1 "
            "(see https://github.com/DLR-RM/stable-baselines3/issues/440)"
        )
    if n_envs is not None and n_steps is not None and normalize and n_steps * n_envs <= 1:
        raise InvalidSettingError(f"n_steps * n_envs = {n_steps * n_envs} is invalid with normalize_advantage: expected > 1")
    if get("vf_clip_mode") == "max" and "clip_range_vf" in arguments and arguments["clip_range_vf"] is None:
        raise InvalidSettingError("vf_clip_mode='max' needs clip_range_vf (a positive float or schedule); it is None")
    if kl_target is not None and kl_coef == 0:
        raise InvalidSettingError(
            f"kl_target={kl_target!r} needs kl_coef > 0 (the initial beta); with kl_coef=0 the penalty is off"
        )
    bounds = get("kl_coef_bounds")
    if kl_target is not None and kl_coef is not None and bounds is not None and not bounds[0] <= kl_coef <= bounds[1]:
        raise InvalidSettingError(f"kl_coef={kl_coef!r} must lie within kl_coef_bounds={bounds!r} when kl_target is set")


def is_integer_parameter(name: str) -> bool:
    """Whether the algorithm argument ``name`` holds an int (a scheduled value is rounded)."""
    return name in ALGORITHM_RULES and ALGORITHM_RULES[name].kind == "int"


def scheduled_value_problem(name: str, value: float) -> str | None:
    """Why ``ParameterScheduler`` may not set ``name`` to ``value`` (``"expected ..."``; an int rounded), or ``None``."""
    low, strict, high = ALGORITHM_RULES[name].scheduled_bounds() if name in ALGORITHM_RULES else (None, True, None)
    integer = is_integer_parameter(name)
    try:
        check_real(name, round(value) if integer and math.isfinite(value) else value, low, high, strict)
    except InvalidSettingError as error:
        return str(error).split(" is invalid: ", 1)[-1] + (" (after rounding: it is an int)" if integer else "")
    return None


ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "leaky_relu": nn.LeakyReLU, "gelu": nn.GELU, "silu": nn.SiLU}


def activation_class(name: str) -> type[nn.Module]:
    """The torch class of an activation name of the yml form (``tanh``, ``nn.ReLU``, ...)."""
    key = re.sub(r"^(torch\.)?nn\.", "", name.strip())
    by_class_name = {cls.__name__: cls for cls in ACTIVATIONS.values()}
    if key.lower() in ACTIVATIONS or key in by_class_name:
        return ACTIVATIONS.get(key.lower()) or by_class_name[key]
    raise InvalidSettingError(f"activation_fn={name!r} is not one of {sorted(ACTIVATIONS)} (or their nn.* class names)")


def _check_activation(name: str, value: object) -> None:
    if isinstance(value, str):
        activation_class(value)
    elif not (isinstance(value, type) and issubclass(value, nn.Module)):
        raise InvalidSettingError(f"'{name}: {value!r}' is invalid: expected an activation name such as tanh or relu")


def _check_net_arch(name: str, value: object) -> None:
    def layers_ok(layers: object) -> bool:
        return isinstance(layers, (list, tuple)) and all(is_int(n) and n >= 1 for n in layers)

    mapping_ok = isinstance(value, Mapping) and set(value) <= {"pi", "vf", "qf"} and all(map(layers_ok, value.values()))
    if not (value is None or layers_ok(value) or mapping_ok):
        raise InvalidSettingError(
            f"'{name}: {value!r}' is invalid: expected a list of layer sizes or dict(pi=[...], vf=[...])"
        )


def check_network_learning_rates(name: str, value: object) -> None:
    """That ``value`` is ``None`` or ``{"pi": rate, "vf": rate}``, each rate a number, ``"lin_<x>"`` or a schedule, > 0."""
    if value is not None and (not isinstance(value, Mapping) or set(value) != {"pi", "vf"}):
        raise InvalidSettingError(
            f"{name}={value!r} is invalid: expected a mapping with exactly the keys 'pi' (the actor) and 'vf' (the critic), "
            "e.g. {'pi': 3e-4, 'vf': 1e-3}"
        )
    for network, rate in (value or {}).items():
        if not isinstance(rate, str):
            check_number_or_schedule(f"{name}.{network}", rate)
        elif linear_schedule_start(rate) is None:
            raise InvalidSettingError(
                f"{name}.{network}={rate!r} is invalid: expected a number > 0, a schedule or 'lin_<x>' with x > 0"
            )


def _check_lstm_kwargs(name: str, value: object) -> None:
    if not isinstance(value, (Mapping, type(None))):
        raise InvalidSettingError(f"{name}={value!r} is invalid: expected a mapping of torch.nn.LSTM arguments")
    if value and "dropout" in value:
        check_real(f"{name}.dropout", value["dropout"], low=0.0, high=1.0, strict=False)


# Every ``policy_kwargs`` key of the package's policies judged by value (the rest: UNRULED_POLICY_KWARGS).
POLICY_KWARG_RULES: dict[str, Rule] = {
    # PPOExt's heads and modes
    "squash_output": Rule("bool", nullable=True),
    "state_dependent_std": Rule("bool"),
    "log_std_bounds": Rule("pair", nullable=True),
    "entropy_estimator": Rule("choice", nullable=True, choices=ENTROPY_ESTIMATORS),
    "action_dist": Rule("choice", choices=ACTION_DISTS),
    "learning_rates": Rule("check", check=check_network_learning_rates),
    "fast": Rule("bool"),
    # SB3's ActorCriticPolicy (the gSDE-only flags are saved as None when gSDE is off)
    "log_std_init": Rule("real"),
    "ortho_init": Rule("bool"),
    "share_features_extractor": Rule("bool"),
    "normalize_images": Rule("bool"),
    "full_std": Rule("bool", nullable=True),
    "use_expln": Rule("bool", nullable=True),
    "net_arch": Rule("check", check=_check_net_arch, at_construction=False),
    "activation_fn": Rule("check", check=_check_activation, at_construction=False),
    # sb3-contrib's LSTM policies
    "lstm_hidden_size": Rule("int", low=1),
    "n_lstm_layers": Rule("int", low=1),
    "lstm_kwargs": Rule("check", check=_check_lstm_kwargs),
    "shared_lstm": Rule("bool"),
    "enable_critic_lstm": Rule("bool"),
}
# The policies' other keyword arguments: classes judged by SB3, their kwargs by the classes (yml: a mapping).
UNRULED_POLICY_KWARGS = frozenset(
    {"features_extractor_class", "features_extractor_kwargs", "optimizer_class", "optimizer_kwargs"}
)


def check_policy_kwargs(policy_kwargs: Mapping[str, Any], action_space: spaces.Space | None = None) -> None:
    """The policies' check: each keyword argument by its row (``use_sde`` by the algorithm's), then the rules across them."""
    for key, value in policy_kwargs.items():
        rule = POLICY_KWARG_RULES.get(key)
        if rule is not None and rule.at_construction:
            rule.judge(f"policy_kwargs.{key}", value)
        elif key == "use_sde":
            ALGORITHM_RULES[key].judge(key, value)
    check_policy_kwargs_together(policy_kwargs, action_space)


def check_policy_kwargs_together(policy_kwargs: Mapping[str, Any], action_space: spaces.Space | None = None) -> None:
    """The rules across policy keyword arguments (each judged by its row) and, given ``action_space``, on it."""
    get = policy_kwargs.get
    squash, state_dependent, bounds = get("squash_output"), get("state_dependent_std"), get("log_std_bounds")
    log_std_init = get("log_std_init", 0.0)
    beta_excludes = {
        "squash_output": squash is False,
        "state_dependent_std": state_dependent is True,
        "log_std_bounds": bounds is not None,
        "entropy_estimator": get("entropy_estimator") is not None,
        "log_std_init": is_real(log_std_init) and float(log_std_init) != 0.0,
        "use_sde": get("use_sde") is True,
    }
    conflict = next((key for key, excluded in beta_excludes.items() if excluded), None)
    if get("action_dist") == "beta" and conflict is not None:
        raise InvalidSettingError(
            f"{'' if conflict == 'use_sde' else 'policy_kwargs.'}{conflict}={get(conflict)!r} is invalid with "
            "policy_kwargs.action_dist='beta': the Beta head is bounded by construction, has a state-dependent spread of "
            f"its own and a closed-form entropy; {conflict} applies to the Gaussian head (action_dist='gaussian')"
        )
    if get("shared_lstm") is True and get("enable_critic_lstm", True) is True:
        raise InvalidSettingError(
            "policy_kwargs.shared_lstm=True is invalid with policy_kwargs.enable_critic_lstm=True (its default): "
            "the critic either shares the actor's LSTM or has its own; set enable_critic_lstm=False to share it"
        )
    if get("shared_lstm") is True and get("share_features_extractor", True) is False:
        raise InvalidSettingError(
            "policy_kwargs.shared_lstm=True is invalid with policy_kwargs.share_features_extractor=False: "
            "a shared LSTM needs the shared features extractor"
        )
    if state_dependent and get("use_sde"):
        raise InvalidSettingError("state_dependent_std=True cannot be combined with use_sde=True (gSDE has its own std)")
    if bounds is not None and not state_dependent:
        raise InvalidSettingError(
            f"log_std_bounds={bounds!r} only applies with state_dependent_std=True (the state-independent log-std is free)"
        )
    low, high = DEFAULT_LOG_STD_BOUNDS if bounds is None else (float(bounds[0]), float(bounds[1]))
    if state_dependent and is_real(log_std_init) and not low < log_std_init < high:
        raise InvalidSettingError(
            f"log_std_init={float(log_std_init)} must lie strictly inside log_std_bounds={(low, high)} of state_dependent_std"
        )
    if action_space is not None:
        squash = _check_action_space(get("action_dist") == "beta", squash, state_dependent, action_space)
    if get("entropy_estimator") is not None and squash is not None and not squash:
        raise InvalidSettingError(
            f"entropy_estimator={get('entropy_estimator')!r} only applies to the squashed head "
            "(the unsquashed Gaussian's entropy is exact in closed form)"
        )


def _check_action_space(beta: bool, squash: object, state_dependent: object, action_space: spaces.Space) -> bool:
    """The rules of :func:`check_policy_kwargs_together` on the action space; returns whether the head squashes."""
    is_box = isinstance(action_space, spaces.Box)
    squash = is_box if squash is None else bool(squash)
    if beta and not is_box:
        raise InvalidSettingError(f"policy_kwargs.action_dist='beta' needs a Box action space, got {action_space}")
    if squash and not is_box:
        raise InvalidSettingError(f"squash_output=True needs a Box action space, got {action_space}; use None (auto) or False")
    if state_dependent and not is_box:
        raise InvalidSettingError(f"state_dependent_std=True needs a Box action space, got {action_space}")
    if squash and isinstance(action_space, spaces.Box) and not np.isfinite([action_space.low, action_space.high]).all():
        setting = "action_dist='beta'" if beta else "squash_output=True"
        raise InvalidSettingError(
            f"{setting} needs finite action bounds, got low={action_space.low} high={action_space.high}; for unbounded "
            "actions use policy_kwargs=dict(action_dist='gaussian', squash_output=False) (Gaussian plus clipping)"
        )
    return squash


# Arguments the algorithm passes to the policy itself: not valid in policy_kwargs.
POLICY_ARGUMENTS_SET_BY_ALGORITHM = frozenset({"self", "observation_space", "action_space", "lr_schedule", "use_sde"})


def policy_parameters(policy_class: type) -> dict[str, object]:
    """The ``policy_kwargs`` of a policy class's ``__init__`` chain (while it passes ``**kwargs`` on), with their defaults."""
    parameters: dict[str, object] = {}
    for init in (klass.__dict__["__init__"] for klass in policy_class.__mro__ if "__init__" in klass.__dict__):
        signature = inspect.signature(init).parameters.values()
        for parameter in signature:
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                parameters.setdefault(parameter.name, parameter.default)
        if not any(p.kind == p.VAR_KEYWORD for p in signature):
            break
    return {name: default for name, default in parameters.items() if name not in POLICY_ARGUMENTS_SET_BY_ALGORITHM}


def unknown_key(key: object, allowed: list[str], where: str = "") -> str:
    """The problem of a key that is not among ``allowed``, with the closest valid name."""
    close = difflib.get_close_matches(str(key), allowed, n=1) if isinstance(key, str) else []
    return f"unknown key {key!r}{where}" + (f" (did you mean '{close[0]}'?)" if close else "")


def unknown_policy_kwarg(key: object, policy_class: type, parameters: Mapping[str, object] | None = None) -> str:
    """The problem of a ``policy_kwargs`` key that ``policy_class`` does not take, with the closest valid name."""
    names = sorted(policy_parameters(policy_class) if parameters is None else parameters)
    return unknown_key(key, names, f" in policy_kwargs of {policy_class.__name__}")


def to_algorithm_kwargs(entry: Mapping[str, Any]) -> dict[str, Any]:
    """yml-form settings as the algorithm's keyword arguments: ``lin_<x>`` as linear schedules, activation names as classes."""
    kwargs = dict(entry)
    for key in SCHEDULE_KEYS:
        start = linear_schedule_start(kwargs.get(key))
        if start is not None:
            kwargs[key] = LinearSchedule(start, 0.0, 1.0)
    policy_kwargs = kwargs.get("policy_kwargs")
    if isinstance(policy_kwargs, Mapping) and isinstance(policy_kwargs.get("activation_fn"), str):
        kwargs["policy_kwargs"] = {**policy_kwargs, "activation_fn": activation_class(policy_kwargs["activation_fn"])}
    return kwargs
