"""Does ``torch.compile`` pay for itself in a PPO update on this machine? Compile time against time saved per minibatch.

Times one PPO minibatch step (forward through SB3's ``MlpExtractor`` and heads, the package's
clipped surrogate and value losses, backward, gradient clipping, SB3's default Adam) eagerly and
with the loss ``torch.compile``d, in process CPU time, one torch thread. The compiled function
is the whole loss as plain tensor code, without SB3's distribution objects (which break a graph),
so the figure is an upper bound on what compiling the package's update could save. Reported:
the compile time (the first call, forward and backward), the eager and compiled time per
minibatch, and the minibatch steps after which the compile time is paid back.

    python scripts/compile_probe.py                      # rl-zoo3's Hopper-v5 network and batch
    python scripts/compile_probe.py --obs 3 --actions 1 --net 64 --batch 64   # Pendulum-v1's
"""

from __future__ import annotations

import argparse
import math
import time

import torch as th
from stable_baselines3.common.torch_layers import MlpExtractor
from torch import nn

from sb3_ppo_ext import losses

LOG_SQRT_TWO_PI = math.log(math.sqrt(2 * math.pi))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--obs", type=int, default=11, help="observation size (Hopper-v5: 11)")
    parser.add_argument("--actions", type=int, default=3, help="action size (Hopper-v5: 3)")
    parser.add_argument("--net", type=int, default=256, help="width of both hidden layers of each network")
    parser.add_argument("--batch", type=int, default=32, help="minibatch size (rl-zoo3's Hopper entry: 32)")
    parser.add_argument("--steps", type=int, default=2000, help="timed minibatch steps per variant")
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    th.manual_seed(0)
    extractor = MlpExtractor(args.obs, dict(pi=[args.net] * 2, vf=[args.net] * 2), nn.ReLU, device="cpu")
    action_net, value_net = nn.Linear(args.net, args.actions), nn.Linear(args.net, 1)
    log_std = nn.Parameter(th.zeros(args.actions))
    parameters = [*extractor.parameters(), *action_net.parameters(), *value_net.parameters(), log_std]
    optimizer = th.optim.Adam(parameters, lr=3e-4, eps=1e-5, foreach=True)

    def loss_of(obs, actions, old_log_prob, advantages, returns):
        latent_pi, latent_vf = extractor(obs)
        mean, scale = action_net(latent_pi), log_std.exp().expand(len(obs), args.actions)
        log_prob = (-((actions - mean) ** 2) / (2 * scale**2) - scale.log() - LOG_SQRT_TWO_PI).sum(dim=1)
        ratio = th.exp(log_prob - old_log_prob)
        values = value_net(latent_vf).flatten()
        value_loss = losses.value_loss(values, values.detach(), returns)
        return losses.clipped_surrogate_loss(advantages, ratio, 0.2) + 0.5 * value_loss

    batch = (
        th.randn(args.batch, args.obs),
        th.randn(args.batch, args.actions),
        th.randn(args.batch),
        th.randn(args.batch),
        th.randn(args.batch),
    )

    def step(function) -> None:
        optimizer.zero_grad()
        function(*batch).backward()
        th.nn.utils.clip_grad_norm_(parameters, 0.5)
        optimizer.step()

    def per_step(function) -> float:
        for _ in range(50):
            step(function)
        start = time.process_time()
        for _ in range(args.steps):
            step(function)
        return (time.process_time() - start) / args.steps

    eager = per_step(loss_of)
    compiled_loss = th.compile(loss_of)
    start = time.perf_counter()
    step(compiled_loss)
    compile_s = time.perf_counter() - start
    compiled = per_step(compiled_loss)
    saved = eager - compiled
    shape = f"{args.obs}-{args.net}-{args.net}-{args.actions}"
    print(f"network {shape} (actor and critic), batch {args.batch}, torch {th.__version__}")
    print(f"compile time (first call, wall clock): {compile_s:.1f} s")
    print(f"eager: {eager * 1e3:.3f} ms per minibatch step, compiled: {compiled * 1e3:.3f} ms ({eager / compiled:.2f}x)")
    if saved > 0:
        print(f"the compile time is paid back after {compile_s / saved:,.0f} minibatch steps")
    else:
        print("the compiled step is not faster: the compile time is never paid back")


if __name__ == "__main__":
    main()
