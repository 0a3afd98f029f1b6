"""Optuna search space of PPOExt, MaskablePPOExt and RecurrentPPOExt, for rl-zoo3 (``-optimize``) or plain Optuna."""

from __future__ import annotations

import inspect
import math
import warnings
from typing import TYPE_CHECKING, Any

from sb3_ppo_ext import validation
from sb3_ppo_ext.ppo_ext import PPOExt
from sb3_ppo_ext.validation import InvalidSettingError, check_choice, linear_schedule_start, to_algorithm_kwargs

if TYPE_CHECKING:
    import optuna

NET_ARCHS = {
    "tiny": dict(pi=[64], vf=[64]),
    "small": dict(pi=[64, 64], vf=[64, 64]),
    "medium": dict(pi=[256, 256], vf=[256, 256]),
}
N_EPOCHS = [1, 4, 5, 10, 20]
TARGET_KLS = [None, 0.01, 0.02, 0.05]
CLIP_RANGES = [0.1, 0.2, 0.3, 0.4]
CLIP_RANGES_VF = [0.1, 0.2, 0.5, 1.0, 10.0]
SDE_SAMPLE_FREQS = [-1, 4, 16]
LR_VF_RATIOS = (0.25, 8.0)  # the critic's learning rate over the actor's, sampled log-uniformly with separate_lr
LSTM_HIDDEN_SIZES = [16, 32, 64, 128]
N_LSTM_LAYERS = [1, 2]
# How the critic reads the history: its own LSTM, the actor's (not trained by the value loss), or none.
CRITIC_MEMORIES = {
    "own_lstm": dict(enable_critic_lstm=True, shared_lstm=False),
    "shared_lstm": dict(enable_critic_lstm=False, shared_lstm=True),
    "mlp": dict(enable_critic_lstm=False, shared_lstm=False),
}
# Values of the parameters added to the space after studies were run with it (replayed as before).
REPLAY_DEFAULTS: dict[str, object] = {"action_dist": "gaussian", "separate_lr": False}


def _sample_rollout(trial: optuna.trial.BaseTrial, n_envs: int = 1) -> dict[str, Any]:
    n_steps_pow = trial.suggest_int("n_steps_pow", 5, 11)  # 32 .. 2048 steps per env
    if n_envs == 1:  # minibatches no larger than the rollout, so that the batch always divides it
        batch_size = 2 ** min(trial.suggest_int("batch_size_pow", 5, 9), n_steps_pow)  # 32 .. 512
    else:  # a share of the n_steps * n_envs rollout (1 .. 256 minibatches, each of at least n_envs rows)
        n_envs = trial.suggest_int("n_envs", n_envs, n_envs)  # recorded: the params replay without the entry
        batch_size = 2**n_steps_pow * n_envs // 2 ** min(trial.suggest_int("n_minibatches_pow", 0, 8), n_steps_pow)
    one_minus_gamma = trial.suggest_float("one_minus_gamma", 1e-4, 0.1, log=True)
    one_minus_gae_lambda = trial.suggest_float("one_minus_gae_lambda", 1e-4, 0.1, log=True)
    values = {
        "n_steps": 2**n_steps_pow,
        "batch_size": batch_size,
        "n_epochs": trial.suggest_categorical("n_epochs", N_EPOCHS),
        "gamma": 1 - one_minus_gamma,
        "gae_lambda": 1 - one_minus_gae_lambda,
    }
    for key in ("n_steps", "batch_size", "gamma", "gae_lambda"):
        trial.set_user_attr(key, values[key])
    return values


def _sample_optimizer(trial: optuna.trial.BaseTrial) -> dict[str, Any]:
    learning_rate = trial.suggest_float("learning_rate", 1e-5, 2e-3, log=True)
    linear = trial.suggest_categorical("lr_schedule", ["constant", "linear"]) == "linear"
    return {
        "learning_rate": f"lin_{learning_rate}" if linear else learning_rate,
        "max_grad_norm": trial.suggest_float("max_grad_norm", 0.3, 2.0),
        "ent_coef": trial.suggest_float("ent_coef", 1e-8, 0.1, log=True),
        "target_kl": trial.suggest_categorical("target_kl", TARGET_KLS),
    }


def _sample_objective(trial: optuna.trial.BaseTrial) -> dict[str, Any]:
    """Clipped surrogate, KL penalty (fixed or adaptive beta), or both."""
    objective = trial.suggest_categorical("objective", ["clip", "kl", "clip+kl"])
    values: dict[str, Any] = {"clip_range": None, "kl_coef": 0.0, "kl_target": None}
    if "clip" in objective:
        values["clip_range"] = trial.suggest_categorical("clip_range", CLIP_RANGES)
    if "kl" in objective:
        values["kl_coef"] = trial.suggest_float("kl_coef", 0.01, 10.0, log=True)
        if trial.suggest_categorical("kl_adaptive", [True, False]):
            values["kl_target"] = trial.suggest_float("kl_target", 0.001, 0.05, log=True)
    return values


def _sample_value_loss(trial: optuna.trial.BaseTrial) -> dict[str, Any]:
    vf_clip = trial.suggest_categorical("vf_clip", ["none", "clipped", "max"])
    if vf_clip == "none":
        return {"clip_range_vf": None, "vf_clip_mode": "clipped"}
    return {"clip_range_vf": trial.suggest_categorical("clip_range_vf", CLIP_RANGES_VF), "vf_clip_mode": vf_clip}


def _sample_policy(trial: optuna.trial.BaseTrial, continuous: bool) -> dict[str, Any]:
    """``policy_kwargs`` plus ``use_sde`` / ``sde_sample_freq`` (the latter two only for Box actions)."""
    policy_kwargs: dict[str, Any] = {
        "net_arch": NET_ARCHS[trial.suggest_categorical("net_arch", list(NET_ARCHS))],
        "activation_fn": trial.suggest_categorical("activation_fn", ["tanh", "relu"]),
        "ortho_init": trial.suggest_categorical("ortho_init", [True, False]),
    }
    if not continuous:
        return {"policy_kwargs": policy_kwargs}
    squash = trial.suggest_categorical("squash", [True, False])
    # The head: squashed Gaussian or Beta (both bounded, "squash"), or the clipped Gaussian.
    if squash and trial.suggest_categorical("action_dist", list(validation.ACTION_DISTS)) == "beta":
        policy_kwargs.update(squash_output=True, action_dist="beta")  # no std settings: the Beta's spread is its own
        return {"use_sde": False, "policy_kwargs": policy_kwargs}
    exploration = trial.suggest_categorical("exploration", ["gaussian", "state_dependent_std", "gsde"])
    values: dict[str, Any] = {"use_sde": exploration == "gsde"}
    if exploration == "gsde":
        values["sde_sample_freq"] = trial.suggest_categorical("sde_sample_freq", SDE_SAMPLE_FREQS)
    policy_kwargs["squash_output"] = squash
    policy_kwargs["state_dependent_std"] = exploration == "state_dependent_std"
    # Inside the default log_std_bounds (-5, 2) of the state-dependent std.
    policy_kwargs["log_std_init"] = trial.suggest_float("log_std_init", -3.0, 1.0)
    if squash:
        policy_kwargs["entropy_estimator"] = trial.suggest_categorical("entropy_estimator", ["mc", "gaussian", "sample"])
    return {**values, "policy_kwargs": policy_kwargs}


def _network_learning_rates(learning_rate: float | str, ratio: float) -> dict[str, float | str]:
    """``policy_kwargs["learning_rates"]``: the actor at ``learning_rate``, the critic at ``ratio`` times it."""
    start = linear_schedule_start(learning_rate)
    if start is not None:  # "lin_<x>"
        return {"pi": learning_rate, "vf": f"lin_{start * ratio}"}
    return {"pi": learning_rate, "vf": float(learning_rate) * ratio}


def sample_zoo_form(
    trial: optuna.trial.BaseTrial, continuous: bool = True, recurrent: bool = False, n_envs: int = 1
) -> dict[str, Any]:
    """
    One configuration in rl-zoo3's yml form; derived values are recorded with ``trial.set_user_attr``.

    :param trial: an Optuna trial (or ``optuna.trial.FixedTrial`` to replay a trial's params)
    :param continuous: whether the action space is ``Box`` (adds the action-head parameters)
    :param recurrent: whether to add RecurrentPPOExt's LSTM knobs (size, layers, the critic's memory)
    :param n_envs: the envs of a rollout (with more than one, the minibatch is sampled as a share of the rollout)
    """
    form = {
        **_sample_rollout(trial, n_envs),
        **_sample_optimizer(trial),
        **_sample_objective(trial),
        **_sample_value_loss(trial),
    }
    form.update(_sample_policy(trial, continuous))
    if trial.suggest_categorical("separate_lr", [False, True]):
        ratio = trial.suggest_float("lr_vf_ratio", LR_VF_RATIOS[0], LR_VF_RATIOS[1], log=True)
        form["policy_kwargs"]["learning_rates"] = _network_learning_rates(form["learning_rate"], ratio)
    if recurrent:
        form["policy_kwargs"].update(
            lstm_hidden_size=trial.suggest_categorical("lstm_hidden_size", LSTM_HIDDEN_SIZES),
            n_lstm_layers=trial.suggest_categorical("n_lstm_layers", N_LSTM_LAYERS),
            **CRITIC_MEMORIES[trial.suggest_categorical("critic_memory", list(CRITIC_MEMORIES))],
        )
    return form


def sample_ppo_ext_params(trial: optuna.Trial, continuous: bool = True, n_envs: int = 1) -> dict[str, Any]:
    """PPOExt keyword arguments sampled from ``trial`` (``continuous``: Box actions; ``n_envs`` per rollout)."""
    return to_algorithm_kwargs(sample_zoo_form(trial, continuous, n_envs=n_envs))


def _replay(params: dict[str, Any], recurrent: bool = False) -> dict[str, Any]:
    """The sampler on a FixedTrial of ``params`` (action-head parameters exist only in trials on a Box action space)."""
    import optuna

    trial = optuna.trial.FixedTrial({**REPLAY_DEFAULTS, **params})
    return sample_zoo_form(trial, continuous="squash" in params, recurrent=recurrent, n_envs=params.get("n_envs", 1))


def ppo_ext_kwargs_from_params(params: dict[str, Any]) -> dict[str, Any]:
    """PPOExt keyword arguments from a finished trial's ``params`` (e.g. ``study.best_trial.params``)."""
    return to_algorithm_kwargs(_replay(params))


def _ruled(name: str, value: Any) -> Any:
    """``value``, after its row of the rule table judged it (``policy_kwargs.<key>``: the policies' row)."""
    key = name.removeprefix("policy_kwargs.")
    rule = validation.POLICY_KWARG_RULES[key] if key != name else validation.ALGORITHM_RULES[key]
    rule.judge(name, value)
    return value


def _power_of_two(name: str, value: Any, low: int, high: int) -> int:
    exponent = math.log2(value) if validation.is_int(value) and value > 0 else -1.0
    if not exponent.is_integer() or not low <= exponent <= high:
        raise InvalidSettingError(f"{name}={value!r} is not a power of 2 between {2**low} and {2**high} (the search space's)")
    return int(exponent)


def params_from_zoo_entry(entry: dict[str, Any], continuous: bool = True) -> dict[str, Any]:
    """
    The trial ``params`` that :func:`convert_zoo_params` replays to a yml entry's values (keys outside the space left out);
    a value outside the space is an :class:`InvalidSettingError`, except ``ent_coef: 0.0`` (the space's ``1e-8``).

    :param entry: settings in rl-zoo3's yml form
    :param continuous: whether the env's action space is ``Box``
    """
    defaults = {name: parameter.default for name, parameter in inspect.signature(PPOExt).parameters.items()}
    merged = {**defaults, **entry}
    learning_rate = merged["learning_rate"]
    linear = isinstance(learning_rate, str) and learning_rate.startswith("lin_")
    clip_range = merged["clip_range"]
    kl_coef = float(merged["kl_coef"])
    if clip_range is not None and not isinstance(clip_range, (int, float)):
        raise InvalidSettingError(f"clip_range={clip_range!r}: the search space has constant clip ranges only")
    params: dict[str, Any] = {
        "n_steps_pow": _power_of_two("n_steps", merged["n_steps"], 5, 11),
        **_minibatch_params(merged["n_steps"], merged["batch_size"], entry.get("n_envs", 1)),
        # Rounded: 1 - 0.9999 is 9.99999999999889e-05 in floating point, below the space's 1e-4.
        "one_minus_gamma": round(1.0 - float(merged["gamma"]), 12),
        "one_minus_gae_lambda": round(1.0 - float(merged["gae_lambda"]), 12),
        "n_epochs": check_choice("n_epochs", merged["n_epochs"], N_EPOCHS),
        "learning_rate": float(learning_rate[len("lin_") :]) if linear else float(learning_rate),
        "lr_schedule": "linear" if linear else "constant",
        "max_grad_norm": float(merged["max_grad_norm"]),
        "ent_coef": max(float(merged["ent_coef"]), 1e-8),
        "target_kl": check_choice("target_kl", merged["target_kl"], TARGET_KLS),
        "objective": "+".join(name for name, on in (("clip", clip_range is not None), ("kl", kl_coef > 0)) if on),
    }
    if not params["objective"]:
        raise InvalidSettingError("clip_range=None with kl_coef=0: the entry has no policy objective")
    if clip_range is not None:
        params["clip_range"] = check_choice("clip_range", clip_range, CLIP_RANGES)
    if kl_coef > 0:
        params["kl_coef"] = kl_coef
        params["kl_adaptive"] = merged["kl_target"] is not None
        if params["kl_adaptive"]:
            params["kl_target"] = float(merged["kl_target"])
    clip_range_vf = merged["clip_range_vf"]
    params["vf_clip"] = "none" if clip_range_vf is None else merged["vf_clip_mode"]
    if clip_range_vf is not None:
        params["clip_range_vf"] = check_choice("clip_range_vf", clip_range_vf, CLIP_RANGES_VF)
    policy_kwargs = dict(merged["policy_kwargs"] or {})
    net_arch = policy_kwargs.get("net_arch", NET_ARCHS["small"])
    names = [name for name, arch in NET_ARCHS.items() if arch == net_arch]
    if not names:
        raise InvalidSettingError(f"policy_kwargs.net_arch={net_arch!r} is not one of the search space's {NET_ARCHS}")
    activation = validation.activation_class(policy_kwargs.get("activation_fn", "tanh"))
    params["net_arch"] = names[0]
    params["activation_fn"] = check_choice("activation_fn", activation.__name__.lower(), ["tanh", "relu"])
    params["ortho_init"] = _ruled("policy_kwargs.ortho_init", policy_kwargs.get("ortho_init", True))
    params.update(_learning_rate_params(policy_kwargs.get("learning_rates"), learning_rate))
    if not continuous:
        return params
    squash = _ruled("policy_kwargs.squash_output", policy_kwargs.get("squash_output", True))
    params["squash"] = squash is not False
    action_dist = _ruled("policy_kwargs.action_dist", policy_kwargs.get("action_dist", "gaussian"))
    if params["squash"]:
        params["action_dist"] = action_dist
    if action_dist != "beta":  # the Gaussian head's exploration
        if _ruled("use_sde", merged["use_sde"]):
            params["exploration"] = "gsde"
            params["sde_sample_freq"] = check_choice("sde_sample_freq", merged["sde_sample_freq"], SDE_SAMPLE_FREQS)
        else:
            state_dependent = _ruled("policy_kwargs.state_dependent_std", policy_kwargs.get("state_dependent_std", False))
            params["exploration"] = "state_dependent_std" if state_dependent else "gaussian"
        params["log_std_init"] = float(policy_kwargs.get("log_std_init", 0.0))
        if params["squash"]:
            params["entropy_estimator"] = policy_kwargs.get("entropy_estimator") or "mc"
    _check_in_space(params, continuous)
    return params


def _minibatch_params(n_steps: int, batch_size: Any, n_envs: Any) -> dict[str, int]:
    """The minibatch's params: ``batch_size_pow`` with one env, else ``n_envs`` and ``n_minibatches_pow``."""
    if n_envs == 1:
        return {"batch_size_pow": _power_of_two("batch_size", batch_size, 5, 9)}
    rollout = n_steps * validation.check_int("n_envs", n_envs, low=1)
    n_minibatches = rollout // batch_size if validation.is_int(batch_size) and batch_size > 0 else 0
    if n_minibatches * batch_size != rollout or n_minibatches > min(n_steps, 256):
        what = f"n_steps * n_envs = {rollout} divided by a power of 2 up to min(n_steps, 256) (the search space's)"
        raise InvalidSettingError(f"batch_size={batch_size!r} is not {what}")
    return {"n_envs": n_envs, "n_minibatches_pow": _power_of_two("n_steps * n_envs / batch_size", n_minibatches, 0, 8)}


def _learning_rate_params(learning_rates: Any, learning_rate: Any) -> dict[str, Any]:
    """``separate_lr`` / ``lr_vf_ratio`` of an entry's ``learning_rates`` (the actor's must be ``learning_rate``)."""
    if learning_rates is None:
        return {"separate_lr": False}

    def initial(rate: Any) -> tuple[bool, float]:
        start = linear_schedule_start(rate)
        return start is not None, float(rate) if start is None else start

    if not isinstance(learning_rates, dict) or set(learning_rates) != {"pi", "vf"}:
        raise InvalidSettingError(f"policy_kwargs.learning_rates={learning_rates!r}: expected {{'pi': ..., 'vf': ...}}")
    (pi_linear, pi), (vf_linear, vf), (linear, rate) = map(
        initial, (learning_rates["pi"], learning_rates["vf"], learning_rate)
    )
    if (pi_linear, pi) != (linear, rate) or vf_linear != linear:
        raise InvalidSettingError(
            f"policy_kwargs.learning_rates={learning_rates!r}: the search space has the actor at learning_rate="
            f"{learning_rate!r} and the critic at a multiple of it with the same schedule"
        )
    return {"separate_lr": True, "lr_vf_ratio": vf / pi}


def _check_in_space(params: dict[str, Any], continuous: bool) -> None:
    """Replay the sampler on ``params`` and check every value lies in its distribution."""
    import optuna

    trial = optuna.trial.FixedTrial(params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna warns about out-of-range fixed values; raised below
        sample_zoo_form(trial, continuous, n_envs=params.get("n_envs", 1))
    for name, distribution in trial.distributions.items():
        if not distribution._contains(distribution.to_internal_repr(params[name])):
            raise InvalidSettingError(f"{name}={params[name]!r} is outside the search space's {distribution}")


def sample_zoo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl-zoo3's ``HYPERPARAMS_SAMPLER`` of ``ppo_ext`` and ``ppo_mask_ext`` (``n_actions``: 0 unless the actions are Box)."""
    return sample_ppo_ext_params(trial, continuous=n_actions > 0, n_envs=n_envs)


def convert_zoo_params(params: dict[str, Any]) -> dict[str, Any]:
    """rl-zoo3's ``HYPERPARAMS_CONVERTER`` of ``ppo_ext`` and ``ppo_mask_ext``: yml-form settings."""
    return _replay(params)


def sample_recurrent_zoo_params(trial: optuna.Trial, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """rl-zoo3's ``HYPERPARAMS_SAMPLER["ppo_lstm_ext"]``: the space with the LSTM's knobs."""
    return to_algorithm_kwargs(sample_zoo_form(trial, continuous=n_actions > 0, recurrent=True, n_envs=n_envs))


def convert_recurrent_zoo_params(params: dict[str, Any]) -> dict[str, Any]:
    """rl-zoo3's ``HYPERPARAMS_CONVERTER["ppo_lstm_ext"]``: the sampler replayed on the trial's params."""
    return _replay(params, recurrent=True)
