"""Speed ablation: each speed component of the Ext classes switched off alone, timed beside stock and the full Ext.

Every variant runs in the same process, interleaved (``scripts/throughput.py``'s ``run``: process CPU time, one
torch thread, the order reversed every other repeat), so each figure is a ratio to stock PPO (or sb3-contrib's
RecurrentPPO) measured side by side. A component is switched off by replacing its name in ``sb3_ppo_ext.speed``
(the rollout tensor cache: in ``sb3_ppo_ext.buffers``), for that variant's ``learn`` only, with the plain call it
stands for (this script's replacements; the package has no switches):

    python scripts/ablation.py --workload hopper --steps 4096 --repeats 7
    python scripts/ablation.py --workload cartpole --steps 8192 --repeats 7
    python scripts/ablation.py --workload hopper-batched --steps 16384 --repeats 5
    python scripts/ablation.py --workload recurrent --steps 2048 --repeats 5
    python scripts/ablation.py --workload hopper --steps 4096 --repeats 7 --fast   # the fast mode's components
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator
from unittest import mock

import throughput  # scripts/throughput.py, beside this script
import torch as th

from sb3_ppo_ext import RecurrentPPOExt, buffers, policies, speed
from sb3_ppo_ext.ppo_ext import PPOExt


class _TorchsStep:
    """SB3's three optimizer calls as upstream's ``train`` makes them (what ``OptimizerStep`` replaces)."""

    def __init__(self, optimizer: th.optim.Optimizer, parameters: list[th.Tensor], max_norm: float) -> None:
        self.optimizer, self.parameters, self.max_norm = optimizer, parameters, max_norm

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def clip(self) -> th.Tensor:
        return th.nn.utils.clip_grad_norm_(self.parameters, self.max_norm)

    def step(self) -> None:
        self.optimizer.step()


def _upstream_samples(self, batch_inds, env=None):  # type: ignore[no-untyped-def]
    """A minibatch as upstream's ``_get_samples`` converts it, row by row (no rollout-wide tensor cache)."""
    samples = super(buffers.PiOldBuffer, self)._get_samples(batch_inds, env)
    old = tuple(self.to_torch(array[batch_inds]) for array in self.old_distribution) if self.carries_pi_old else None
    return self.samples_class(*samples, old)


def _upstream_sequences(self, features, lstm_states, episode_starts, lstm):  # type: ignore[no-untyped-def]
    """The LSTM over padded sequences step by step, as upstream's ``_process_sequence`` runs it (no sequence pass)."""
    return self._process_sequence(features, lstm_states, episode_starts, lstm)


# component -> the replacements that switch it off
ABLATIONS: dict[str, Callable[[], list]] = {
    "lean optimizer step": lambda: [mock.patch.object(speed, "OptimizerStep", _TorchsStep)],
    "flat Adam buffers": lambda: [mock.patch.object(speed, "flat_adam_group", lambda *_: None)],  # torch's Adam.step
    "acting plan": lambda: [mock.patch.object(speed.ActingPlan, "of", classmethod(lambda cls, policy: None))],
    "lean layers": lambda: [mock.patch.object(speed, "lean_call", lambda module, x: module(x))],
    "direct scoring": lambda: [mock.patch.object(speed, "direct_scores", lambda *_, **__: None)],
    "direct acting (the plan unused)": lambda: [mock.patch.object(speed, "direct_step", lambda *_, **__: None)],
    "rollout tensor cache": lambda: [mock.patch.object(buffers.PiOldBuffer, "_get_samples", _upstream_samples)],
    "lean_lstm": lambda: [mock.patch.object(speed, "lean_lstm", lambda lstm, x, states, weights=None: lstm(x, states))],
    # the fast mode's own components (--fast); its third, fused Adam, is switched off by passing foreach=True
    "NumPy acting step": lambda: [mock.patch.object(speed, "array_step", lambda *_, **__: None)],
    "LSTM sequence pass": lambda: [mock.patch.object(policies.RecurrentPPOExtPolicy, "_sequence_pass", _upstream_sequences)],
}
PPO_COMPONENTS = [name for name in ABLATIONS if name not in ("lean_lstm", "NumPy acting step", "LSTM sequence pass")]
RECURRENT_COMPONENTS = ["lean optimizer step", "flat Adam buffers", "lean_lstm"]


@contextlib.contextmanager
def switched_off(component: str) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for patch in ABLATIONS[component]():
            stack.enter_context(patch)
        yield


def ablated(base: type, component: str) -> type:
    """``base`` whose ``learn`` runs with ``component`` switched off."""

    def learn(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        with switched_off(component):
            return base.learn(self, *args, **kwargs)

    return type(f"{base.__name__}Without{component.title().replace(' ', '')}", (base,), {"learn": learn})


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(throughput.WORKLOADS), required=True)
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--components", nargs="+", help="only these components (default: all that apply)")
    parser.add_argument("--fast", action="store_true", help="the fast mode's components instead (fused Adam and its own step)")
    parser.add_argument("--json", metavar="PATH", help="also write the measurements to PATH")
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    family, env_id, n_envs, normalize, hyperparams = throughput.WORKLOADS[args.workload]
    family_variants, policy, _ = throughput.FAMILIES[family]
    reference = next(iter(family_variants))
    ext = RecurrentPPOExt if family == "recurrent" else PPOExt
    off = dict(policy_kwargs=dict(squash_output=False))
    components = args.components or (RECURRENT_COMPONENTS if family == "recurrent" else PPO_COMPONENTS)
    variants = {reference: family_variants[reference], f"{ext.__name__}, squash off": (ext, off)}
    if args.fast:
        fast = dict(policy_kwargs=dict(squash_output=False, fast=True))
        own_step = "LSTM sequence pass" if family == "recurrent" else "NumPy acting step"
        unfused = dict(policy_kwargs=dict(fast["policy_kwargs"], optimizer_kwargs=dict(eps=1e-5, foreach=True)))
        variants.update(
            {
                f"{ext.__name__}, fast": (ext, fast),
                "fast without fused Adam": (ext, unfused),
                f"fast without the {own_step}": (ablated(ext, own_step), fast),
            }
        )
        components = []
    for component in components:
        variants[f"without {component}"] = (ablated(ext, component), off)
    cpu, _ = throughput.run(env_id, args.steps, n_envs, args.repeats, hyperparams, 1, variants, policy, normalize)
    summary = throughput.summarize(cpu)
    full = summary[f"{ext.__name__}, squash off"]["median_of_paired_ratios"]
    print(f"{args.workload}: {env_id}, {n_envs} envs, {args.steps} steps x {args.repeats} repeats")
    print("| variant | env-steps per CPU-s (median) | x stock (median paired) | share of the full Ext's speed |")
    print("|---|---|---|---|")
    for name, entry in summary.items():
        ratio = entry["median_of_paired_ratios"]
        print(f"| {name} | {entry['median']:.0f} | {ratio:.3f} | {ratio / full:.3f} |")
    result = {"workload": args.workload, "steps": args.steps, "repeats": args.repeats, "cpu": cpu, "summary": summary}
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(result, stream, indent=1, default=str)
    return result


if __name__ == "__main__":
    main()
