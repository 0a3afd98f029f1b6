"""RecurrentPPOExt: sb3-contrib's RecurrentPPO (LSTM policies) with PPOExt's extensions."""

from __future__ import annotations

import contextlib
from copy import deepcopy
from typing import Any, ClassVar, TypeVar, cast

import torch as th
from gymnasium import spaces
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.buffers import RecurrentDictRolloutBuffer, RecurrentRolloutBuffer
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from sb3_contrib.common.recurrent.type_aliases import RecurrentRolloutBufferSamples
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_ext.buffers import PI_OLD_BUFFERS
from sb3_ppo_ext.engine import ExtUpdateEngine, extension_arguments
from sb3_ppo_ext.policies import RecurrentPPOExtCnnPolicy, RecurrentPPOExtMultiInputPolicy, RecurrentPPOExtPolicy
from sb3_ppo_ext.reliability import ModelFiles
from sb3_ppo_ext.validation import ALGORITHM_RULES, check_arguments

SelfRecurrentPPOExt = TypeVar("SelfRecurrentPPOExt", bound="RecurrentPPOExt")


class RecurrentPPOExt(ModelFiles, ExtUpdateEngine, RecurrentPPO):  # type: ignore[misc]  # upstream: batch_size int | None
    """
    sb3-contrib's ``RecurrentPPO`` with PPOExt's extensions (squashed head on by default for ``Box`` actions,
    KL penalty, both value-clip forms, ``clip_range=None``, ``train/`` diagnostics over the unpadded steps).
    With ``policy_kwargs=dict(squash_output=False)`` and ``kl_coef=0`` it trains bit for bit like
    ``RecurrentPPO`` (a one-sample minibatch is not advantage-normalised, as in SB3's PPO).

    :param policy: The policy model to use (MlpLstmPolicy, CnnLstmPolicy, MultiInputLstmPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, constant or a function of the progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size (in steps; sequences are cut and padded by the buffer)
    :param n_epochs: Number of epoch when optimizing the surrogate loss
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator
    :param clip_range: Clipping parameter of the surrogate objective (float or schedule), ``None``: no clipping
    :param clip_range_vf: Clipping parameter for the value function (float or schedule), or ``None``
    :param vf_clip_mode: With ``clip_range_vf``: ``"clipped"`` (SB3's form) or ``"max"`` (PPO2's form)
    :param normalize_advantage: Whether to normalize or not the advantage
    :param ent_coef: Entropy coefficient for the loss calculation
    :param vf_coef: Value function coefficient for the loss calculation
    :param kl_coef: Initial coefficient ``beta`` of the KL penalty; 0 (default) turns it off
    :param kl_target: ``d_targ`` of the adaptive coefficient, or ``None`` for a fixed ``beta``
    :param kl_adapt_factor: Multiplicative step of the adaptive coefficient (paper: 2), > 1
    :param kl_adapt_tolerance: Tolerance band of the adaptive coefficient (paper: 1.5), > 1
    :param kl_coef_bounds: ``(min, max)`` within which the adaptive ``beta`` is kept
    :param max_grad_norm: The maximum value for the gradient clipping
    :param use_sde: Whether to use generalized State Dependent Exploration (gSDE)
    :param sde_sample_freq: Sample a new noise matrix every n steps when using gSDE (-1: once per rollout)
    :param target_kl: Limit the KL divergence between updates (SB3's early stop), ``None`` for no limit
    :param stats_window_size: Window size for the rollout logging
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: arguments of the policy: the LSTM's, the heads' and per-network learning rates
    :param verbose: Verbosity level: 0 for no output, 1 for info messages, 2 for debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run.
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    # Imported here, the policy classes also load model files that name them in this module.
    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpLstmPolicy": RecurrentPPOExtPolicy,
        "CnnLstmPolicy": RecurrentPPOExtCnnPolicy,
        "MultiInputLstmPolicy": RecurrentPPOExtMultiInputPolicy,
    }
    _model_families: ClassVar[frozenset[str]] = frozenset({"RecurrentPPO"})

    def __init__(
        self,
        policy: str | type[RecurrentActorCriticPolicy],
        env: GymEnv | str,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int = 128,
        batch_size: int = 128,
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

    def _evaluate_samples(
        self, samples: RecurrentRolloutBufferSamples, actions: th.Tensor, need_distribution: bool
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Distribution | None]:
        obs, states, starts = samples.observations, samples.lstm_states, samples.episode_starts
        if isinstance(self.policy, RecurrentPPOExtPolicy):
            return self.policy.evaluate_actions_and_distribution(
                obs, actions, states, starts, entropy_requires_grad=self.ent_coef != 0
            )
        # An upstream RecurrentActorCriticPolicy (a RecurrentPPO file): a second actor pass yields the distribution.
        values, log_prob, entropy = self.policy.evaluate_actions(obs, actions, states, starts)
        distribution = self.policy.get_distribution(obs, states.pi, starts)[0] if need_distribution else None
        return values, log_prob, entropy, distribution

    def _valid_samples(self, samples: RecurrentRolloutBufferSamples) -> th.Tensor:
        return samples.mask > 1e-8  # the buffer's mask of the real (unpadded) steps, as upstream's train reads it

    def _samples_distribution(
        self, policy: RecurrentActorCriticPolicy, samples: RecurrentRolloutBufferSamples
    ) -> Distribution:
        states = cast(tuple[th.Tensor, th.Tensor], samples.lstm_states.pi)  # upstream types it tuple[Tensor, ...]
        if isinstance(policy, RecurrentPPOExtPolicy) and policy.fast:  # the fast mode's sequence pass
            return policy.sequence_distribution(samples.observations, states, samples.episode_starts)
        return policy.get_distribution(samples.observations, states, samples.episode_starts)[0]

    def _setup_model(self) -> None:
        """Upstream's ``_setup_model``, its recurrent buffer replaced by the subclass that carries ``pi_old``."""
        super()._setup_model()
        buffer = self.rollout_buffer
        self.rollout_buffer = PI_OLD_BUFFERS[type(buffer)](
            buffer.buffer_size,
            buffer.observation_space,
            buffer.action_space,
            buffer.hidden_state_shape,
            buffer.device,
            gamma=buffer.gamma,
            gae_lambda=buffer.gae_lambda,
            n_envs=buffer.n_envs,
        )

    def _collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """Upstream's ``collect_rollouts``, or with a squashed head :meth:`_collect_squashed_rollouts` (marked as such)."""
        if not self.policy.squash_output:
            return super()._collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        marked = self.policy.ext_collection() if isinstance(self.policy, RecurrentPPOExtPolicy) else contextlib.nullcontext()
        with marked:
            return self._collect_squashed_rollouts(env, callback, rollout_buffer, n_rollout_steps)

    def _collect_squashed_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """
        Upstream's ``collect_rollouts`` with one change: the env receives ``policy.unscale_action(u)`` of the
        stored pre-squash sample ``u`` (upstream clips ``u``). A test compares this copy with the installed upstream's.
        """
        assert isinstance(rollout_buffer, (RecurrentRolloutBuffer, RecurrentDictRolloutBuffer)), (
            f"{rollout_buffer} doesn't support recurrent policy"
        )
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        n_steps = 0
        rollout_buffer.reset()
        if self.use_sde:
            self.policy.reset_noise(env.num_envs)
        callback.on_rollout_start()
        lstm_states = deepcopy(self._last_lstm_states)
        while n_steps < n_rollout_steps:
            if self.use_sde and self.sde_sample_freq > 0 and n_steps % self.sde_sample_freq == 0:
                self.policy.reset_noise(env.num_envs)
            with th.no_grad():
                obs_tensor = obs_as_tensor(self._last_obs, self.device)  # type: ignore[arg-type]
                episode_starts = th.tensor(self._last_episode_starts, dtype=th.float32, device=self.device)
                actions, values, log_probs, lstm_states = self.policy(obs_tensor, lstm_states, episode_starts)
            actions = actions.cpu().numpy()
            clipped_actions = self.policy.unscale_action(actions)  # the one change
            new_obs, rewards, dones, infos = env.step(clipped_actions)
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            n_steps += 1
            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)
            for idx, done_ in enumerate(dones):
                if (
                    done_
                    and infos[idx].get("terminal_observation") is not None
                    and infos[idx].get("TimeLimit.truncated", False)
                ):
                    terminal_obs = self.policy.obs_to_tensor(infos[idx]["terminal_observation"])[0]
                    with th.no_grad():
                        terminal_lstm_state = (
                            lstm_states.vf[0][:, idx : idx + 1, :].contiguous(),
                            lstm_states.vf[1][:, idx : idx + 1, :].contiguous(),
                        )
                        episode_starts = th.tensor([False], dtype=th.float32, device=self.device)
                        terminal_value = self.policy.predict_values(terminal_obs, terminal_lstm_state, episode_starts)[0]
                    rewards[idx] += self.gamma * terminal_value
            rollout_buffer.add(
                self._last_obs,
                actions,
                rewards,
                self._last_episode_starts,
                values,
                log_probs,
                lstm_states=self._last_lstm_states,  # type: ignore[arg-type]
            )
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_episode_starts = dones
            self._last_lstm_states = lstm_states
        with th.no_grad():
            episode_starts = th.tensor(dones, dtype=th.float32, device=self.device)
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device), lstm_states.vf, episode_starts)  # type: ignore[arg-type,union-attr]
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        callback.on_rollout_end()
        return True

    def learn(
        self: SelfRecurrentPPOExt,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "RecurrentPPOExt",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfRecurrentPPOExt:
        return super().learn(total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, progress_bar)


__all__ = ["RecurrentPPOExt"]
