"""The rule table (sb3_ppo_ext.validation): every public parameter has one row, and every check derives from it."""

from __future__ import annotations

import ast
import inspect
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt, validation
from sb3_ppo_ext.callbacks import ParameterScheduler
from sb3_ppo_ext.settings import entry_problems
from sb3_ppo_ext.validation import (
    ALGORITHM_RULES,
    POLICY_KWARG_RULES,
    UNRULED_ARGUMENTS,
    UNRULED_POLICY_KWARGS,
    InvalidSettingError,
    Rule,
    check_arguments,
    policy_parameters,
    scheduled_value_problem,
)

ALGORITHMS = (PPOExt, MaskablePPOExt, RecurrentPPOExt)
DEFAULT_POLICY = {PPOExt: "MlpPolicy", MaskablePPOExt: "MlpPolicy", RecurrentPPOExt: "MlpLstmPolicy"}
ZOO_NAME = {PPOExt: "ppo_ext", MaskablePPOExt: "ppo_mask_ext", RecurrentPPOExt: "ppo_lstm_ext"}
PACKAGE = Path(validation.__file__).resolve().parent

# Values that a "check" row must reject (the other kinds' invalid values follow from the rule).
INVALID_CHECKED = {
    "learning_rates": {"pi": 1e-3},
    "lstm_kwargs": {"dropout": 2.0},
    "net_arch": [64, 0],
    "activation_fn": "no_such_activation",
}


def invalid_values(name: str, rule: Rule) -> list[Any]:
    """Values the rule must reject, derived from the rule itself (its kind and bounds)."""
    if rule.kind == "check":
        return [INVALID_CHECKED[name]]
    if rule.kind == "bool":
        return ["false"]
    if rule.kind == "choice":
        return ["no_such_choice"]
    if rule.kind == "pair":
        return [(2.0, 1.0)] + ([(rule.low, rule.low + 1.0)] if rule.low is not None else [])
    values: list[Any] = [float("nan")] if rule.kind == "real" else [2.5]
    if rule.low is not None:
        values.append(rule.low if rule.strict and rule.kind == "real" else rule.low - 1)
    if rule.high is not None:
        values.append(rule.high + 1)
    if not rule.nullable:
        values.append(None)
    return values


def ruled_arguments(algorithm: type) -> list[str]:
    return [name for name in inspect.signature(algorithm).parameters if name in ALGORITHM_RULES]


def test_every_public_argument_and_policy_kwarg_has_one_owner():
    """A row in the table, or a named judge in UNRULED_*: adding a parameter without a row fails here."""
    arguments: set[str] = set()
    policy_kwargs: set[str] = set()
    for algorithm in ALGORITHMS:
        names = set(inspect.signature(algorithm).parameters)
        arguments |= names
        assert not names - set(ALGORITHM_RULES) - set(UNRULED_ARGUMENTS), algorithm.__name__
        for policy in algorithm.policy_aliases.values():
            taken = set(policy_parameters(policy))
            policy_kwargs |= taken
            assert not taken - set(POLICY_KWARG_RULES) - set(UNRULED_POLICY_KWARGS), policy.__name__
    # no stale rows, and no name both ruled and unruled
    assert set(ALGORITHM_RULES) | set(UNRULED_ARGUMENTS) == arguments
    assert set(POLICY_KWARG_RULES) | set(UNRULED_POLICY_KWARGS) == policy_kwargs
    assert not set(ALGORITHM_RULES) & set(UNRULED_ARGUMENTS)
    assert not set(POLICY_KWARG_RULES) & set(UNRULED_POLICY_KWARGS)


def test_rules_judge_by_kind_and_bounds():
    """Hand-picked values against each kind, bounds and strictness."""
    positive = Rule("real", low=0.0)
    positive.judge("x", 1e-9)
    positive.judge("x", np.float32(0.5))
    for bad in (0.0, -1.0, math.inf, math.nan, True, "1"):
        with pytest.raises(InvalidSettingError, match="x="):
            positive.judge("x", bad)
    Rule("real", low=0.0, strict=False, finite=False).judge("x", math.inf)
    Rule("real", low=0.0, strict=False).judge("x", 0.0)
    unit = Rule("real", low=0.0, high=1.0, strict=False)
    unit.judge("x", 1.0)
    with pytest.raises(InvalidSettingError, match=r"x=1\.5 is invalid: expected a finite number >= 0\.0 and <= 1\.0"):
        unit.judge("x", 1.5)
    Rule("int", low=1).judge("n", np.int64(1))
    for bad in (0, 2.0, True):
        with pytest.raises(InvalidSettingError, match="n="):
            Rule("int", low=1).judge("n", bad)
    Rule("bool", nullable=True).judge("b", None)
    with pytest.raises(InvalidSettingError, match="b='no' is invalid: expected True, False or None"):
        Rule("bool", nullable=True).judge("b", "no")
    with pytest.raises(InvalidSettingError, match="b=None"):
        Rule("bool").judge("b", None)
    with pytest.raises(InvalidSettingError, match=r"expected finite 0 < min <= max"):
        Rule("pair", low=0.0).judge("p", (0.0, 1.0))
    Rule("pair", low=0.0).judge("p", (1e-4, 1e4))
    schedule = Rule("real", low=0.0, schedule=True, nullable=True)
    schedule.judge("s", None)
    schedule.judge("s", lambda progress: 0.1)
    schedule.judge("s", lambda progress: -1.0, check_schedule=False)
    with pytest.raises(InvalidSettingError, match=r"initial value -1\.0"):
        schedule.judge("s", lambda progress: -1.0)


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda cls: cls.__name__)
def test_each_row_is_the_constructors_check(algorithm: type):
    """Every value a row rejects is an InvalidSettingError naming the argument, before upstream's constructor runs."""
    for name in ruled_arguments(algorithm):
        for value in invalid_values(name, ALGORITHM_RULES[name]):
            with pytest.raises(InvalidSettingError, match=f"^{name}="):
                algorithm(DEFAULT_POLICY[algorithm], "env-never-built", **{name: value})


def test_each_row_is_loads_check(tmp_path: Path):
    """``load(path, **kwargs)`` judges what it sets by the same rows (``_setup_model``)."""
    path = tmp_path / "model.zip"
    PPOExt("MlpPolicy", "Pendulum-v1", n_steps=8, batch_size=8, n_epochs=1).save(path)
    PPOExt.load(path, gamma=0.5)
    # stats_window_size is kept as _stats_window_size by SB3; load's keyword sets another attribute
    for name in set(ruled_arguments(PPOExt)) - {"stats_window_size"}:
        value = invalid_values(name, ALGORITHM_RULES[name])[0]
        with pytest.raises(InvalidSettingError, match=f"{name}="):
            PPOExt.load(path, **{name: value})


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda cls: cls.__name__)
def test_each_row_is_the_settings_check(algorithm: type):
    """The settings check of yml entries and ``-params`` names the key for every value its row rejects."""
    for name in ruled_arguments(algorithm):
        for value in invalid_values(name, ALGORITHM_RULES[name]):
            problems = entry_problems({name: value}, ZOO_NAME[algorithm], whole=False)
            assert problems and name in problems[0], (name, value, problems)
    assert "learning_rate=None is not allowed" in " ".join(entry_problems({"learning_rate": None}, ZOO_NAME[algorithm]))


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda cls: cls.__name__)
def test_each_policy_kwarg_row_is_the_policies_check(algorithm: type):
    """Every policy_kwargs value a row rejects fails at construction, naming the key (rows applied at construction)."""
    env = "CartPole-v1" if algorithm is MaskablePPOExt else "Pendulum-v1"
    policy = algorithm.policy_aliases[DEFAULT_POLICY[algorithm]]
    for key in policy_parameters(policy):
        rule = POLICY_KWARG_RULES.get(key)
        if rule is None or not rule.at_construction:
            continue
        for value in invalid_values(key, rule):
            if value is None or (algorithm is MaskablePPOExt and key == "squash_output"):
                continue  # None is the default of non-nullable booleans' callers; Maskable: no squashed head at all
            with pytest.raises(ValueError, match=f"{key}"):
                algorithm(DEFAULT_POLICY[algorithm], env, n_steps=8, batch_size=8, policy_kwargs={key: value})


@pytest.mark.parametrize("key", [key for key, rule in POLICY_KWARG_RULES.items() if rule.kind != "check"])
def test_each_policy_kwarg_row_is_the_settings_check(key: str):
    rule = POLICY_KWARG_RULES[key]
    policy = "MlpLstmPolicy" if "lstm" in key else "MlpPolicy"
    algo = "ppo_lstm_ext" if "lstm" in key else "ppo_ext"
    for value in invalid_values(key, rule):
        if value is None:
            continue
        problems = entry_problems({"policy": policy, "policy_kwargs": {key: value}}, algo, whole=False)
        assert problems and f"policy_kwargs.{key}" in problems[0], (key, value, problems)


def test_scheduler_ranges_derive_from_the_rows():
    """ParameterScheduler's range is the row's, or its stricter ``scheduled`` range; ints are judged rounded."""
    for name, rule in ALGORITHM_RULES.items():
        if rule.kind not in ("real", "int"):
            continue
        low, strict, high = rule.scheduled_bounds()
        if low is not None:
            assert scheduled_value_problem(name, low - 1.0) is not None, name
            assert (scheduled_value_problem(name, float(low)) is None) == (not strict), name
        if high is not None:
            assert scheduled_value_problem(name, high + 0.5) is not None, name
        assert scheduled_value_problem(name, math.inf) is not None, name
    assert scheduled_value_problem("learning_rate", 0.0) is not None  # stricter than the constructor's >= 0
    assert scheduled_value_problem("kl_adapt_factor", 1.0) is not None  # the row's own > 1
    assert scheduled_value_problem("n_epochs", 0.6) is None  # rounded to 1
    assert scheduled_value_problem("not_a_row", -5.0) is None
    with pytest.raises(InvalidSettingError, match=r"would set kl_adapt_tolerance=0\.5"):
        ParameterScheduler({"kl_adapt_tolerance": {"kind": "constant", "value": 0.5}})


def test_cross_rules_apply_when_their_arguments_are_given():
    check_arguments({"kl_target": 0.01})  # kl_coef not given: no cross rule
    with pytest.raises(InvalidSettingError, match="needs kl_coef > 0"):
        check_arguments({"kl_target": 0.01, "kl_coef": 0.0})
    with pytest.raises(InvalidSettingError, match="must lie within kl_coef_bounds"):
        check_arguments({"kl_target": 0.01, "kl_coef": 10.0, "kl_coef_bounds": (1.0, 2.0)})
    with pytest.raises(InvalidSettingError, match="needs clip_range_vf"):
        check_arguments({"vf_clip_mode": "max", "clip_range_vf": None})
    with pytest.raises(InvalidSettingError, match=r"n_steps \* n_envs = 1"):
        check_arguments({"n_steps": 1}, n_envs=1)
    with pytest.raises(InvalidSettingError, match="batch_size=1 is invalid with normalize_advantage"):
        check_arguments({"batch_size": 1})
    check_arguments({"batch_size": 1, "normalize_advantage": False})


# --- the import graph -------------------------------------------------------------------------------


def _is_import_call(func: ast.expr) -> bool:
    """``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)``."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def _imports(path: Path) -> set[str]:
    """The package modules a module imports anywhere in its body (functions included), string imports too."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    submodules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sb3_ppo_ext":
            if node.module == "sb3_ppo_ext":
                for alias in node.names:
                    found.add(f"sb3_ppo_ext.{alias.name}" if alias.name in submodules else "sb3_ppo_ext")
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "sb3_ppo_ext"}
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            argument = node.args[0]
            if isinstance(argument, ast.Constant) and str(argument.value).startswith("sb3_ppo_ext"):
                found.add(str(argument.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.match(r"sb3_ppo_ext[\w.]*:\w", node.value):
            found.add(node.value.split(":")[0])  # "module:attribute" strings that code imports by name
    return found


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def test_the_package_has_no_import_cycle_and_nothing_imports_upward():
    """Modules form a DAG (string imports included); only the entry points import the package's top level."""
    graph = {_module_name(path): _imports(path) for path in PACKAGE.rglob("*.py")}
    graph = {
        module: {target for target in targets if target in graph and target != module} for module, targets in graph.items()
    }
    entry_points = {"sb3_ppo_ext", "sb3_ppo_ext.__main__"}
    upward = sorted(module for module, targets in graph.items() if "sb3_ppo_ext" in targets and module not in entry_points)
    assert upward == []
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                raise AssertionError(f"import cycle: {' -> '.join([*trail, module, target])}")
            if target not in state:
                visit(target, [*trail, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    # the table sits lowest: it imports nothing from the package
    assert graph["sb3_ppo_ext.validation"] == set()


def test_the_registry_holds_classes_and_functions():
    from sb3_ppo_ext import samplers, settings

    assert settings.ALGORITHMS["ppo_ext"].algorithm is PPOExt
    assert settings.ALGORITHMS["ppo_lstm_ext"].sampler is samplers.sample_recurrent_zoo_params
    assert settings.ALGORITHMS["ppo_mask_ext"].converter is samplers.convert_zoo_params


def test_box_only_rules_do_not_need_a_box_space():
    """The table judges values, not spaces: a squashed head on a discrete space is the policy's own error."""
    with pytest.raises(ValueError, match="squash_output=True needs a Box action space"):
        PPOExt("MlpPolicy", "CartPole-v1", policy_kwargs={"squash_output": True})
    assert isinstance(PPOExt("MlpPolicy", "Pendulum-v1", n_steps=8, batch_size=8).action_space, spaces.Box)
