"""The one table of parameter rules: every checked argument of the algorithms and key of ``policy_kwargs``.

Each public parameter of PPOExt, MaskablePPOExt and RecurrentPPOExt, and each ``policy_kwargs`` key of
the package's policies, has one :class:`Rule` here: its kind, range, strictness, whether ``None`` is
allowed and whether it takes a schedule. Everything that judges a value derives from this table:

- the algorithms' constructors and ``_setup_model`` (also on ``load``): :func:`check_arguments`;
- the policies' constructors: :func:`check_policy_kwargs`;
- the settings check of yml entries and rl-zoo3's ``-params`` (:mod:`sb3_ppo_ext.settings`): each
  key's rule, in yml form (``lin_<x>`` schedules, activation names);
- :class:`~sb3_ppo_ext.callbacks.ParameterScheduler`: :func:`scheduled_value_problem`, the range
  a scheduled value may take (the rule's own unless the row gives a stricter ``scheduled`` range);
- the Optuna sampler's inverse (:func:`sb3_ppo_ext.samplers.params_from_zoo_entry`), through the
  settings check and the rows' checks.

Adding a parameter is one row here (plus the signatures a drop-in needs); the test
``tests/test_parameters.py`` fails when a public parameter has neither a row nor an entry in
:data:`UNRULED_ARGUMENTS` / :data:`UNRULED_POLICY_KWARGS` saying who judges it instead.

Besides the table, this module holds what the settings owner and the samplers share about values in
rl-zoo3's yml form: :data:`ACTIVATIONS`, :func:`activation_class`, :func:`to_algorithm_kwargs`, and the
names a policy class takes (:func:`policy_parameters`). It imports only :mod:`~sb3_ppo_ext.validation`,
:mod:`~sb3_ppo_ext.losses` and :mod:`~sb3_ppo_ext.distributions` from the package.
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from stable_baselines3.common.utils import LinearSchedule
from torch import nn

from sb3_ppo_ext import validation
from sb3_ppo_ext.distributions import ENTROPY_ESTIMATORS
from sb3_ppo_ext.losses import VF_CLIP_MODES
from sb3_ppo_ext.validation import ACTION_DISTS, InvalidSettingError, SettingsError

KINDS = ("real", "int", "bool", "choice", "pair", "check")


@dataclass(frozen=True)
class Rule:
    """
    What one parameter may be.

    :param kind: ``"real"`` (a number), ``"int"``, ``"bool"``, ``"choice"`` (one of ``choices``),
        ``"pair"`` (``(min, max)`` numbers, ``min <= max``) or ``"check"`` (judged by ``check``)
    :param low: lower bound (``None``: none); for a pair, the bound ``min`` must exceed
    :param high: upper bound, inclusive (``None``: none)
    :param strict: whether ``low`` is exclusive (ints: always ``>= low``)
    :param finite: whether infinity is rejected (NaN always is)
    :param nullable: whether ``None`` is allowed (the feature off)
    :param schedule: whether a schedule is allowed: a callable of the progress remaining (judged by
        its value at progress 1) or, in a yml entry, rl-zoo3's ``lin_<x>``
    :param choices: the allowed values of a ``"choice"``
    :param check: ``check(name, value)`` raising :class:`~sb3_ppo_ext.validation.InvalidSettingError`,
        for a ``"check"``
    :param scheduled: ``(low, strict, high)`` that a value set by ``ParameterScheduler`` must meet
        when stricter than the constructor's (``None``: the rule's own bounds)
    :param at_construction: whether the policies' constructors apply it (``False``: the settings check
        of yml entries only; from Python, SB3's own constructor judges the value)
    """

    kind: str
    low: float | None = None
    high: float | None = None
    strict: bool = True
    finite: bool = True
    nullable: bool = False
    schedule: bool = False
    choices: tuple[Any, ...] = ()
    check: Callable[[str, Any], Any] | None = None
    scheduled: tuple[float | None, bool, float | None] | None = None
    at_construction: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Rule(kind={self.kind!r}) is invalid: expected one of {KINDS}")
        if (self.kind == "check") != (self.check is not None):
            raise ValueError("Rule: kind='check' needs check=..., and only it takes one")

    def judge(self, name: str, value: Any, check_schedule: bool = True) -> None:
        """
        An :class:`~sb3_ppo_ext.validation.InvalidSettingError` naming ``name``, the value and what
        is allowed, unless ``value`` meets the rule.

        :param name: the name for the message (``policy_kwargs.<key>`` for a policy keyword)
        :param value: the value (Python objects: schedules are callables)
        :param check_schedule: whether to evaluate a schedule at progress 1
        """
        if self.schedule:
            validation.check_number_or_schedule(
                name, value, self.nullable, check_schedule, low=0.0 if self.low is None else self.low, strict=self.strict
            )
        elif value is None and self.nullable:
            return
        elif self.kind == "real":
            validation.check_real(name, value, self.low, self.high, self.strict, self.finite)
        elif self.kind == "int":
            validation.check_int(name, value, None if self.low is None else int(self.low))
        elif self.kind == "bool":
            validation.check_bool(name, value)
        elif self.kind == "choice":
            validation.check_choice(name, value, self.choices)
        elif self.kind == "pair":
            low, _ = validation.check_real_pair(name, value, self.finite)
            if self.low is not None and not low > self.low:
                raise InvalidSettingError(f"{name}={value!r} is invalid: expected finite {self.low:g} < min <= max")
        else:
            assert self.check is not None  # __post_init__
            self.check(name, value)

    def scheduled_bounds(self) -> tuple[float | None, bool, float | None]:
        """``(low, strict, high)`` a value set by ``ParameterScheduler`` must meet (an int: ``>= low``)."""
        if self.scheduled is not None:
            return self.scheduled
        return self.low, self.strict and self.kind != "int", self.high


# --- the algorithms' arguments ---------------------------------------------------------------------

# Every checked argument of the algorithms (PPO's, in PPO's order, then PPOExt's own). PPO accepts
# numpy scalars for each; a float is not an int; inf is PPO's "no gradient clipping" and "no early stop".
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

# The algorithms' other arguments, and who judges each instead of a row.
UNRULED_ARGUMENTS: dict[str, str] = {
    "policy": "the algorithm (an alias of policy_aliases or a policy class)",
    "env": "SB3 (an env, a VecEnv or a registered id)",
    "rollout_buffer_class": "SB3 (a class; the engine swaps upstream's for the one that carries pi_old)",
    "rollout_buffer_kwargs": "the buffer class",
    "tensorboard_log": "SB3's logger",
    "policy_kwargs": "POLICY_KWARG_RULES, at the policy's construction",
    "verbose": "SB3",
    "seed": "SB3",
    "device": "torch",
    "_init_setup_model": "SB3",
}


def check_arguments(arguments: Mapping[str, Any], check_schedules: bool = True, n_envs: int | None = None) -> None:
    """
    Each argument by its row of :data:`ALGORITHM_RULES`, then the rules that tie arguments together
    (:func:`check_together`): the algorithms' constructors and ``load`` run this.

    :param arguments: argument name -> value (any subset of :data:`ALGORITHM_RULES`)
    :param check_schedules: whether to evaluate schedules at progress 1
    :param n_envs: the number of environments, when known (see :func:`check_together`)
    :raises InvalidSettingError: naming the argument, its value and what is allowed
    :raises TypeError: for a name without a row
    """
    unknown = set(arguments) - set(ALGORITHM_RULES)
    if unknown:
        raise TypeError(f"check_arguments() got unexpected arguments {sorted(unknown)}")
    for name, value in arguments.items():
        ALGORITHM_RULES[name].judge(name, value, check_schedules)
    check_together(arguments, n_envs)


def check_together(arguments: Mapping[str, Any], n_envs: int | None = None) -> None:
    """
    The rules that tie arguments together, each applied when all its arguments are given (and each of
    them already judged by its row): a one-sample minibatch cannot be normalised, nor a one-step rollout;
    ``vf_clip_mode='max'`` needs ``clip_range_vf``; an adaptive beta (``kl_target``) needs ``kl_coef > 0``
    within ``kl_coef_bounds``.

    :param arguments: argument name -> value
    :param n_envs: the number of environments, when known: ``n_steps * n_envs`` must exceed 1 with
        ``normalize_advantage`` (as PPO asserts)
    :raises InvalidSettingError: naming the arguments and what is allowed
    """
    normalize = arguments.get("normalize_advantage", True)
    if normalize and arguments.get("batch_size", 2) <= 1:
        # PPO asserts the same: a one-sample minibatch has no advantage spread to normalise by.
        raise InvalidSettingError(
            f"batch_size={arguments['batch_size']!r} is invalid with normalize_advantage=True: expected an int > 1 "
            "(see https://github.com/DLR-RM/stable-baselines3/issues/440)"
        )
    n_steps = arguments.get("n_steps")
    if n_envs is not None and n_steps is not None and normalize and n_steps * n_envs <= 1:
        raise InvalidSettingError(f"n_steps * n_envs = {n_steps * n_envs} is invalid with normalize_advantage: expected > 1")
    if arguments.get("vf_clip_mode") == "max" and "clip_range_vf" in arguments and arguments["clip_range_vf"] is None:
        raise InvalidSettingError("vf_clip_mode='max' needs clip_range_vf (a positive float or schedule); it is None")
    kl_target, kl_coef = arguments.get("kl_target"), arguments.get("kl_coef")
    if kl_target is None or kl_coef is None:
        return
    if kl_coef == 0:
        raise InvalidSettingError(
            f"kl_target={kl_target!r} needs kl_coef > 0 (the initial beta); with kl_coef=0 the penalty is off"
        )
    bounds = arguments.get("kl_coef_bounds")
    if bounds is not None and not float(bounds[0]) <= kl_coef <= float(bounds[1]):
        raise InvalidSettingError(f"kl_coef={kl_coef!r} must lie within kl_coef_bounds={bounds!r} when kl_target is set")


def scheduled_value_problem(name: str, value: float) -> str | None:
    """
    What ``ParameterScheduler`` may not set ``name`` to (``"expected ..."``), or ``None`` when ``value``
    is allowed: a finite number within the row's scheduled range (an attribute without a row: any
    finite number). An ``"int"`` row's value is judged, and set, rounded.
    """
    rule = ALGORITHM_RULES.get(name)
    low, strict, high = rule.scheduled_bounds() if rule is not None else (None, True, None)
    integer = is_integer_parameter(name)
    applied = round(value) if integer and math.isfinite(value) else value
    try:
        validation.check_real(name, applied, low, high, strict)
    except InvalidSettingError as error:
        return str(error).split(" is invalid: ", 1)[-1] + (" (after rounding: it is an int)" if integer else "")
    return None


def is_integer_parameter(name: str) -> bool:
    """Whether the algorithm argument ``name`` holds an int (a scheduled value is rounded)."""
    rule = ALGORITHM_RULES.get(name)
    return rule is not None and rule.kind == "int"


# Arguments that take rl-zoo3's ``lin_<x>`` schedule strings (a linear schedule from x to 0).
SCHEDULE_KEYS = tuple(name for name, rule in ALGORITHM_RULES.items() if rule.schedule)


# --- the policies' keyword arguments -------------------------------------------------------------

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}


def activation_class(name: str) -> type[nn.Module]:
    """The torch class of an activation name of the yml form (``tanh``, ``nn.ReLU``, ...); a SettingsError otherwise."""
    key = re.sub(r"^(torch\.)?nn\.", "", name.strip())
    by_class_name = {cls.__name__: cls for cls in ACTIVATIONS.values()}
    if key.lower() in ACTIVATIONS:
        return ACTIVATIONS[key.lower()]
    if key in by_class_name:
        return by_class_name[key]
    raise SettingsError(f"activation_fn={name!r} is not one of {sorted(ACTIVATIONS)} (or their nn.* class names)")


def _check_activation(name: str, value: Any) -> None:
    if isinstance(value, str):
        activation_class(value)
    elif not (isinstance(value, type) and issubclass(value, nn.Module)):
        raise InvalidSettingError(f"'{name}: {value!r}' is invalid: expected an activation name such as tanh or relu")


def _check_net_arch(name: str, value: Any) -> None:
    def layers_ok(layers: Any) -> bool:
        return isinstance(layers, (list, tuple)) and all(validation.is_int(n) and n >= 1 for n in layers)

    if value is None or layers_ok(value):
        return
    if isinstance(value, Mapping) and set(value) <= {"pi", "vf", "qf"} and all(layers_ok(v) for v in value.values()):
        return
    raise InvalidSettingError(f"'{name}: {value!r}' is invalid: expected a list of layer sizes or dict(pi=[...], vf=[...])")


# Every ``policy_kwargs`` key of the package's policies that is judged by value (the rest: see
# UNRULED_POLICY_KWARGS). The policies apply the rows at construction, the settings check on yml entries.
POLICY_KWARG_RULES: dict[str, Rule] = {
    # PPOExt's heads and modes
    "squash_output": Rule("bool", nullable=True),
    "state_dependent_std": Rule("bool"),
    "log_std_bounds": Rule("pair", nullable=True),
    "entropy_estimator": Rule("choice", nullable=True, choices=ENTROPY_ESTIMATORS),
    "action_dist": Rule("choice", choices=ACTION_DISTS),
    "learning_rates": Rule("check", check=validation.check_network_learning_rates),
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
    "lstm_kwargs": Rule("check", check=validation.check_lstm_kwargs),
    "shared_lstm": Rule("bool"),
    "enable_critic_lstm": Rule("bool"),
}

# The policies' other keyword arguments, and who judges each instead of a row.
UNRULED_POLICY_KWARGS: dict[str, str] = {
    "features_extractor_class": "SB3 (a class, the user's choice)",
    "features_extractor_kwargs": "the features extractor class (the settings check: a mapping)",
    "optimizer_class": "SB3 (a torch optimizer class)",
    "optimizer_kwargs": "the optimizer class (the settings check: a mapping)",
}


def check_policy_kwargs_together(policy_kwargs: Mapping[str, Any]) -> None:
    """
    An :class:`InvalidSettingError` for policy keyword arguments that exclude each other: sb3-contrib's LSTM
    policies share the LSTM (``shared_lstm=True``) only without a critic LSTM of its own
    (``enable_critic_lstm``, default True) and with a shared features extractor. The Beta head
    excludes the Gaussian head's settings (:func:`~sb3_ppo_ext.validation.check_action_dist_together`).
    """
    if "action_dist" in policy_kwargs:
        validation.check_action_dist_together(
            policy_kwargs["action_dist"],
            **{key: policy_kwargs[key] for key in validation.BETA_EXCLUDED_KWARGS if key in policy_kwargs},
        )
    if policy_kwargs.get("shared_lstm") is not True:
        return
    if policy_kwargs.get("enable_critic_lstm", True) is True:
        raise InvalidSettingError(
            "policy_kwargs.shared_lstm=True is invalid with policy_kwargs.enable_critic_lstm=True (its default): "
            "the critic either shares the actor's LSTM or has its own; set enable_critic_lstm=False to share it"
        )
    if policy_kwargs.get("share_features_extractor", True) is False:
        raise InvalidSettingError(
            "policy_kwargs.shared_lstm=True is invalid with policy_kwargs.share_features_extractor=False: "
            "a shared LSTM needs the shared features extractor"
        )


def check_policy_kwargs(policy_kwargs: Mapping[str, Any]) -> None:
    """
    An :class:`InvalidSettingError` naming ``policy_kwargs.<key>`` for any invalid policy keyword argument
    with a row of :data:`POLICY_KWARG_RULES` applied at construction, then for those that exclude each
    other (:func:`check_policy_kwargs_together`).
    """
    for key, value in policy_kwargs.items():
        rule = POLICY_KWARG_RULES.get(key)
        if rule is not None and rule.at_construction:
            rule.judge(f"policy_kwargs.{key}", value)
    check_policy_kwargs_together(policy_kwargs)


# Arguments the algorithm passes to the policy itself: not valid in policy_kwargs.
POLICY_ARGUMENTS_SET_BY_ALGORITHM = frozenset({"self", "observation_space", "action_space", "lr_schedule", "use_sde"})


def policy_parameters(policy_class: type) -> dict[str, Any]:
    """
    The ``policy_kwargs`` a policy class takes, with their defaults: the keyword parameters of its
    ``__init__`` and, while an ``__init__`` passes ``**kwargs`` on, of its base classes' (less the
    arguments the algorithm passes itself: spaces, ``lr_schedule``, ``use_sde``).

    :param policy_class: e.g. ``PPOExt.policy_aliases["MlpPolicy"]``
    :return: parameter name -> default (``inspect.Parameter.empty`` when it has none)
    """
    parameters: dict[str, Any] = {}
    for klass in policy_class.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        signature = inspect.signature(init)
        for parameter in signature.parameters.values():
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                parameters.setdefault(parameter.name, parameter.default)
        if not any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
            break
    return {name: default for name, default in parameters.items() if name not in POLICY_ARGUMENTS_SET_BY_ALGORITHM}


def unknown_key(key: Any, allowed: list[str], where: str = "") -> str:
    """The problem of a key that is not among ``allowed``, with the closest valid name."""
    close = difflib.get_close_matches(str(key), allowed, n=1) if isinstance(key, str) else []
    return f"unknown key {key!r}{where}" + (f" (did you mean '{close[0]}'?)" if close else "")


def unknown_policy_kwarg(key: Any, policy_class: type, parameters: Mapping[str, Any] | None = None) -> str:
    """
    The problem of a ``policy_kwargs`` key that ``policy_class``'s constructor chain does not take,
    with the closest valid name: ``unknown key 'squash_outputs' in policy_kwargs of ... (did you mean ...)``.

    :param parameters: ``policy_parameters(policy_class)``, when already computed
    """
    names = sorted(policy_parameters(policy_class) if parameters is None else parameters)
    return unknown_key(key, names, f" in policy_kwargs of {policy_class.__name__}")


def signature_defaults(algorithm: type) -> dict[str, Any]:
    """The default value of each parameter of ``algorithm``'s constructor that has one."""
    signature = inspect.signature(algorithm)  # the class's __init__, without self
    return {name: p.default for name, p in signature.parameters.items() if p.default is not inspect.Parameter.empty}


def to_algorithm_kwargs(entry: Mapping[str, Any]) -> dict[str, Any]:
    """
    Turn settings in rl-zoo3's yml form into keyword arguments of the algorithm.

    ``lin_<x>`` strings of :data:`SCHEDULE_KEYS` become linear schedules from x to 0, and
    ``policy_kwargs["activation_fn"]`` names become torch classes.

    :param entry: settings as a yml entry or the sampler gives them
    :return: a new dict
    """
    kwargs = dict(entry)
    for key in SCHEDULE_KEYS:
        start = validation.linear_schedule_start(kwargs.get(key))
        if start is not None:
            kwargs[key] = LinearSchedule(start, 0.0, 1.0)
    policy_kwargs = kwargs.get("policy_kwargs")
    if isinstance(policy_kwargs, Mapping) and isinstance(policy_kwargs.get("activation_fn"), str):
        kwargs["policy_kwargs"] = {**policy_kwargs, "activation_fn": activation_class(policy_kwargs["activation_fn"])}
    return kwargs


__all__ = [
    "ACTION_DISTS",
    "ACTIVATIONS",
    "ALGORITHM_RULES",
    "POLICY_KWARG_RULES",
    "SCHEDULE_KEYS",
    "UNRULED_ARGUMENTS",
    "UNRULED_POLICY_KWARGS",
    "Rule",
    "activation_class",
    "check_arguments",
    "check_policy_kwargs",
    "check_policy_kwargs_together",
    "check_together",
    "policy_parameters",
    "scheduled_value_problem",
    "signature_defaults",
    "to_algorithm_kwargs",
    "unknown_key",
    "unknown_policy_kwarg",
]
