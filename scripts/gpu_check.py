"""CPU vs accelerator check: each objective and head gives the same losses on a fixed batch, and trains.

For each configuration, one rollout is collected on the CPU; the same weights and the same batch
are then evaluated by the update engine's ``minibatch_losses`` on the CPU and on ``--device``
(default ``cuda``), and every loss term is compared. Then a few updates run end to end on the
device. PPOExt, MaskablePPOExt (masked KL) and RecurrentPPOExt (squashed LSTM head, padded
sequences) are each checked.
Exits non-zero on any mismatch.

    python scripts/gpu_check.py                  # needs a CUDA device
    python scripts/gpu_check.py --device cpu     # self-check of the script on a CPU-only machine
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import numpy as np
import torch as th
from sb3_contrib.common.envs import InvalidActionEnvMultiDiscrete
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.distributions import distribution_parameters, distributions_from_parameters, index_distribution
from sb3_ppo_ext.engine import Minibatch

BASE = dict(n_steps=64, batch_size=32, n_epochs=2, seed=0)
# "gaussian" entropy keeps the comparison deterministic (the "mc" estimate draws from each device's RNG).
SQUASH = dict(policy_kwargs=dict(entropy_estimator="gaussian", net_arch=[32]))
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "squashed + clip": ("Pendulum-v1", dict(**SQUASH)),
    "squashed + adaptive KL (PPO1)": ("Pendulum-v1", dict(clip_range=None, kl_coef=1.0, kl_target=0.01, **SQUASH)),
    "squashed + clip + KL + value clip max": (
        "Pendulum-v1",
        dict(kl_coef=0.5, clip_range_vf=0.2, vf_clip_mode="max", **SQUASH),
    ),
    "squashed, state-dependent std": (
        "Pendulum-v1",
        dict(policy_kwargs=dict(entropy_estimator="gaussian", state_dependent_std=True)),
    ),
    "squashed gSDE + KL": ("Pendulum-v1", dict(use_sde=True, kl_coef=0.5, **SQUASH)),
    "Gaussian (no squash) + clip + value clip": (
        "Pendulum-v1",
        dict(clip_range_vf=0.2, policy_kwargs=dict(squash_output=False)),
    ),
    "categorical + clip + KL": ("CartPole-v1", dict(kl_coef=1.0, kl_target=0.01)),
    "MaskablePPOExt: masked MultiDiscrete + clip + KL + value clip": (
        "InvalidActionEnvMultiDiscrete",
        dict(algorithm=MaskablePPOExt, kl_coef=1.0, clip_range_vf=0.2),
    ),
    "RecurrentPPOExt: squashed LSTM + clip + KL + value clip max": (
        "Pendulum-v1",
        dict(
            algorithm=RecurrentPPOExt,
            policy="MlpLstmPolicy",
            kl_coef=0.5,
            clip_range_vf=0.2,
            vf_clip_mode="max",
            policy_kwargs=dict(entropy_estimator="gaussian", net_arch=[32], lstm_hidden_size=16),
        ),
    ),
}
TERMS = (
    "loss",
    "policy_gradient_loss",
    "value_loss",
    "entropy_loss",
    "approx_kl",
    "kl_penalty",
    "clip_fraction",
    "clip_fraction_vf",
)


def _to(value: Any, device: th.device) -> Any:
    """``value`` (a minibatch: tensors in named tuples, tuples and dicts) on ``device``."""
    if isinstance(value, th.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {key: _to(item, device) for key, item in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_to(item, device) for item in value))
    if isinstance(value, tuple):
        return tuple(_to(item, device) for item in value)
    return value


def _losses(model: BaseAlgorithm, batch: Minibatch, before: dict, after: dict) -> dict[str, float]:
    """Loss terms of the policy ``after`` one update, against the rollout policy ``before`` (carried by the batch)."""
    if model.kl_coef > 0:  # type: ignore[attr-defined]
        old = distributions_from_parameters(model.rollout_buffer.distribution_kinds, batch.samples.old_distribution)
        batch = batch._replace(
            old_distributions=old if batch.valid is None else [index_distribution(d, batch.valid) for d in old]
        )
    model.policy.load_state_dict(after)
    model.policy.set_training_mode(True)
    clip_range_vf = 0.2 if model.clip_range_vf is not None else None  # type: ignore[attr-defined]
    clip_range = 0.2 if model.clip_range else None  # type: ignore[attr-defined]
    terms = model.minibatch_losses(batch, clip_range, clip_range_vf, model.kl_coef)  # type: ignore[attr-defined]
    return {key: float(value.item()) for key, value in terms.items() if value.dim() == 0}


def _build(env_id: str, kwargs: dict[str, Any], device: str) -> BaseAlgorithm:
    kwargs = dict(kwargs)
    algorithm, policy = kwargs.pop("algorithm", PPOExt), kwargs.pop("policy", "MlpPolicy")
    env = (
        (lambda: InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2))
        if env_id == "InvalidActionEnvMultiDiscrete"
        else env_id
    )
    return algorithm(policy, make_vec_env(env, n_envs=2, seed=0), device=device, **BASE, **kwargs)


def check(name: str, env_id: str, kwargs: dict[str, Any], device: str, rtol: float) -> bool:
    cpu = _build(env_id, kwargs, "cpu")
    _, callback = cpu._setup_learn(BASE["n_steps"] * 2, callback=None)
    callback.on_training_start(locals(), globals())
    assert isinstance(callback, BaseCallback)
    cpu.collect_rollouts(cpu.env, callback, cpu.rollout_buffer, n_rollout_steps=cpu.n_steps)  # type: ignore[arg-type]
    if cpu.kl_coef > 0:  # type: ignore[attr-defined]  # pi_old, as the update hands it to the buffer
        cpu.rollout_buffer.set_old_distribution(*distribution_parameters(cpu._rollout_distributions()))  # type: ignore[attr-defined]
    batch = next(cpu._minibatches())  # type: ignore[attr-defined]  # a real minibatch, pi_old's parameters (and padding)
    rollout = copy.deepcopy(cpu.rollout_buffer)
    before = copy.deepcopy(cpu.policy.state_dict())
    cpu.train()  # one update, so that ratios, KL and clipping are not trivially 1, 0 and 0
    after = copy.deepcopy(cpu.policy.state_dict())

    other = _build(env_id, kwargs, device)
    other.rollout_buffer, rollout.device = rollout, other.device  # the same rollout, read onto the device
    expected, got = _losses(cpu, batch, before, after), _losses(other, _to(batch, other.device), before, after)
    ok = True
    for key in TERMS:
        if key in expected:
            close = np.isclose(got[key], expected[key], rtol=rtol, atol=1e-6)
            ok &= bool(close)
            print(f"  {key:22s} cpu={expected[key]: .6e}  {device}={got[key]: .6e}  {'ok' if close else 'MISMATCH'}")
    other.learn(BASE["n_steps"] * 2 * 3)
    trained = all(th.isfinite(p).all() for p in other.policy.parameters())
    print(f"  3 updates on {device}: {'finite parameters' if trained else 'NON-FINITE PARAMETERS'}")
    return ok and trained


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rtol", type=float, default=1e-4)
    args = parser.parse_args()
    if args.device.startswith("cuda") and not th.cuda.is_available():
        print("no CUDA device available: nothing checked")
        return 2
    th.set_num_threads(1)
    results = {}
    for name, (env_id, kwargs) in CONFIGS.items():
        print(f"{name} ({env_id})")
        results[name] = check(name, env_id, kwargs, args.device, args.rtol)
    failed = [name for name, ok in results.items() if not ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed" + (f": {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
