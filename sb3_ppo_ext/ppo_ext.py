"""PPOExt: SB3's PPO with a squashed Gaussian head, both value-clip forms, a KL penalty and diagnostics."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule

from sb3_ppo_ext.buffers import PiOldDictRolloutBuffer, PiOldRolloutBuffer
from sb3_ppo_ext.engine import ExtUpdateEngine, NonFiniteLossError, extension_arguments
from sb3_ppo_ext.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_ppo_ext.reliability import ModelFiles
from sb3_ppo_ext.validation import ALGORITHM_RULES, check_arguments

SelfPPOExt = TypeVar("SelfPPOExt", bound="PPOExt")


class PPOExt(ModelFiles, ExtUpdateEngine, PPO):
    """
    Proximal Policy Optimization with the extensions SB3's PPO lacks; a drop-in for ``PPO``: an exact tanh-squashed
    Gaussian head for ``Box`` actions, on by default (``policy_kwargs=dict(squash_output=False)`` restores stock PPO's
    Gaussian-plus-clip); the value loss clipped in SB3's or PPO2's max form; PPO1's KL penalty with a fixed or
    adaptive coefficient, alone or with the clipped surrogate (Schulman et al. 2017, sections 3-4); diagnostics
    averaged over every minibatch of every epoch, under ``train/``. PPO1 is ``clip_range=None, kl_coef=1.0,
    kl_target=0.01``; the defaults are PPO2. Paper: https://arxiv.org/abs/1707.06347

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy, ...)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function of the current progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size
    :param n_epochs: Number of epoch when optimizing the surrogate loss
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator
    :param clip_range: Clipping parameter of the surrogate (float or schedule), or ``None`` to turn clipping off
    :param clip_range_vf: Clipping parameter for the value function (float or schedule), or ``None`` (default)
    :param vf_clip_mode: With ``clip_range_vf``: ``"clipped"`` (SB3's form) or ``"max"`` (PPO2's
        ``mean(max((V-R)^2, (V_clip-R)^2))``); both on SB3's scale (MSE without 0.5)
    :param normalize_advantage: Whether to normalize or not the advantage
    :param ent_coef: Entropy coefficient for the loss calculation
    :param vf_coef: Value function coefficient for the loss calculation
    :param kl_coef: Initial ``beta`` of the KL penalty ``beta * KL(pi_old || pi)`` (analytic); 0 (default): off
    :param kl_target: ``d_targ`` of the adaptive coefficient, or ``None`` for a fixed ``beta``: after each update,
        a mean KL below ``d_targ / kl_adapt_tolerance`` divides ``beta`` by ``kl_adapt_factor``, one above
        ``d_targ * kl_adapt_tolerance`` multiplies it. Needs ``kl_coef > 0``.
    :param kl_adapt_factor: Multiplicative step of the adaptive coefficient (paper: 2), > 1
    :param kl_adapt_tolerance: Tolerance band of the adaptive coefficient (paper: 1.5), > 1
    :param kl_coef_bounds: ``(min, max)`` within which the adaptive ``beta`` is kept
    :param max_grad_norm: The maximum value for the gradient clipping
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE) instead of action noise
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE (-1: at the rollout's start)
    :param rollout_buffer_class: Rollout buffer class to use (``None``: chosen by the observation space). Upstream's
        classes become their subclass in :mod:`sb3_ppo_ext.buffers`, which carries ``pi_old`` for the KL penalty;
        a class of your own is kept, and refused with ``kl_coef > 0``
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation
    :param target_kl: Limit the KL divergence between updates (SB3's early stop on ``approx_kl``), ``None``: no limit
    :param stats_window_size: Window size for the rollout logging (episodes averaged)
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation (``squash_output``,
        ``action_dist="beta"``, ``learning_rates={"pi": ..., "vf": ...}``, ...: see the policy)
    :param verbose: Verbosity level: 0 for no output, 1 for info messages, 2 for debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run ("auto": the GPU if possible)
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    _pi_old_buffer_classes = (PiOldRolloutBuffer, PiOldDictRolloutBuffer)
    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }
    policy: ActorCriticPolicy
    clip_range: Schedule | None  # type: ignore[assignment]

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int = 2048,
        batch_size: int = 64,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        clip_range: float | Schedule | None = 0.2,
        clip_range_vf: float | Schedule | None = None,
        vf_clip_mode: str = "clipped",
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        kl_coef: float = 0.0,
        kl_target: float | None = None,
        kl_adapt_factor: float = 2.0,
        kl_adapt_tolerance: float = 1.5,
        kl_coef_bounds: tuple[float, float] = (1e-4, 1e4),
        max_grad_norm: float = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        rollout_buffer_class: type[RolloutBuffer] | None = None,
        rollout_buffer_kwargs: dict[str, Any] | None = None,
        target_kl: float | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ):
        extensions = extension_arguments(vf_clip_mode, kl_coef, kl_target, kl_adapt_factor, kl_adapt_tolerance, kl_coef_bounds)
        # Upstream's arguments that have a row in the parameter table, checked with the extensions' before upstream's asserts.
        upstream = {name: value for name, value in locals().items() if name in ALGORITHM_RULES and name not in extensions}
        check_arguments({**upstream, **extensions})
        super().__init__(
            policy,
            env,
            **upstream,
            rollout_buffer_class=rollout_buffer_class,
            rollout_buffer_kwargs=rollout_buffer_kwargs,
            tensorboard_log=tensorboard_log,
            policy_kwargs=policy_kwargs,
            verbose=verbose,
            seed=seed,
            device=device,
            _init_setup_model=False,
        )
        self._init_extensions(**extensions)

        if _init_setup_model:
            self._setup_model()

    def _maybe_recommend_cpu(self, mlp_class_name: str = "ActorCriticPolicy") -> None:
        """SB3's recommendation to train an MLP policy on the CPU, which recognises the MLP policy by its class name."""
        if self.policy_class is MlpPolicy:
            mlp_class_name = MlpPolicy.__name__
        super()._maybe_recommend_cpu(mlp_class_name)

    def learn(
        self: SelfPPOExt,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "PPOExt",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfPPOExt:
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )


__all__ = ["NonFiniteLossError", "PPOExt"]
