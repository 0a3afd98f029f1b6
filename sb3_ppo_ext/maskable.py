"""MaskablePPOExt: sb3-contrib's MaskablePPO (invalid-action masking) with PPOExt's extensions."""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.buffers import MaskableRolloutBufferSamples
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from sb3_contrib.common.maskable.utils import is_masking_supported
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_ext.buffers import PiOldMaskableDictRolloutBuffer, PiOldMaskableRolloutBuffer
from sb3_ppo_ext.engine import ExtUpdateEngine, extension_arguments, flat_observations, flat_rollout, index_observations
from sb3_ppo_ext.envs import masks_of, without_masks
from sb3_ppo_ext.policies import MaskablePPOExtCnnPolicy, MaskablePPOExtMultiInputPolicy, MaskablePPOExtPolicy
from sb3_ppo_ext.reliability import ModelFiles
from sb3_ppo_ext.validation import ALGORITHM_RULES, check_arguments

SelfMaskablePPOExt = TypeVar("SelfMaskablePPOExt", bound="MaskablePPOExt")


class MissingActionMasksWarning(UserWarning):
    """``MaskablePPOExt.predict`` acted without action masks for a model that acts with them."""


def check_action_masks(masks: npt.ArrayLike | th.Tensor, action_space: spaces.Space, n_rows: int, where: str) -> None:
    """
    ``ValueError`` unless ``masks`` holds one flat mask per row, shape ``(n_rows, mask_size)`` (or ``(mask_size,)``
    for one row), of booleans or 0/1 numbers, that allows an action in every sub-action's block (a block of ``n``
    per ``Discrete(n)`` and ``MultiDiscrete`` entry, of 2 per ``MultiBinary`` action).

    :param masks: the action masks (array-like)
    :param action_space: the masked action space
    :param n_rows: the number of observations (environments) the masks are for
    :param where: where the masks come from, for the message
    """
    if isinstance(action_space, spaces.Discrete):
        blocks = np.array([action_space.n])
    elif isinstance(action_space, spaces.MultiDiscrete):
        blocks = np.asarray(action_space.nvec).ravel()
    else:  # MultiBinary, the last space sb3-contrib masks
        blocks = np.full(math.prod(action_space.shape or ()), 2)
    size = int(blocks.sum())
    array = np.asarray(masks.detach().cpu() if isinstance(masks, th.Tensor) else masks)
    one = f" or ({size},)" if n_rows == 1 else ""
    expected = f"expected {n_rows} mask(s) of {size} booleans each, of shape ({n_rows}, {size}){one}"
    problem = f"{where}: action_masks"
    if array.dtype == object and any(value is None for value in array.flat):
        raise ValueError(f"{problem} hold None for the action space {action_space}: {expected}")
    if array.dtype != bool and array.dtype.kind not in "iuf":
        raise ValueError(f"{problem} of dtype {array.dtype} for the action space {action_space}: {expected}")
    if array.shape != (n_rows, size) and not (n_rows == 1 and array.shape == (size,)):
        raise ValueError(f"{problem} of shape {array.shape} do not fit the action space {action_space}: {expected}")
    if array.dtype != bool:
        other = array[~np.isin(array, (0, 1))]
        if other.size:
            raise ValueError(
                f"{problem} of dtype {array.dtype} hold values other than 0 and 1 (e.g. {other[0].item()!r}): {expected}"
            )
        array = array != 0
    starts = np.cumsum(blocks) - blocks
    allowed = np.maximum.reduceat(array.reshape(n_rows, size), starts, axis=1)
    if not allowed.all():
        row, block = (int(index[0]) for index in np.nonzero(~allowed))
        if len(blocks) == 1:
            raise ValueError(f"{problem} row {row} allows no action of {action_space}: expected at least one True")
        raise ValueError(
            f"{problem} row {row} allows no value of sub-action {block} (mask positions {starts[block]}:"
            f"{starts[block] + blocks[block]}) of {action_space}: expected at least one True per sub-action"
        )


def observation_rows(observation: Any, observation_space: spaces.Space) -> int:
    """How many observations ``observation`` holds as the policy batches it: its size over one observation's."""
    if isinstance(observation, dict) and isinstance(observation_space, spaces.Dict):
        key = next(iter(observation))
        observation, observation_space = observation[key], observation_space[key]
    return max(1, np.size(observation) // max(1, int(np.prod(observation_space.shape or ()))))


class MaskablePPOExt(ModelFiles, ExtUpdateEngine, MaskablePPO):  # type: ignore[misc]  # upstream: batch_size int | None
    """
    sb3-contrib's ``MaskablePPO`` with PPOExt's extensions (KL penalty between the masked distributions, both
    value-clip forms, ``clip_range=None``, ``train/`` diagnostics). With ``kl_coef=0`` it trains bit for bit like
    ``MaskablePPO`` (a one-sample minibatch is not advantage-normalised, as in SB3's PPO). Masks are checked
    (:func:`check_action_masks`) on every rollout step and in ``predict``, which warns
    (:class:`MissingActionMasksWarning`) when called without masks for a model that acts with them.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, constant or a function of the progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size
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
    :param rollout_buffer_class: Rollout buffer class; ``None`` and upstream's become their subclass carrying
        ``pi_old``; a class of your own is kept (and refused with ``kl_coef > 0``)
    :param rollout_buffer_kwargs: Keyword arguments to pass to the rollout buffer on creation
    :param target_kl: Limit the KL divergence between updates (SB3's early stop), ``None`` for no limit
    :param stats_window_size: Window size for the rollout logging
    :param tensorboard_log: the log location for tensorboard (if None, no logging)
    :param policy_kwargs: additional arguments to be passed to the policy on creation
    :param verbose: Verbosity level: 0 for no output, 1 for info messages, 2 for debug messages
    :param seed: Seed for the pseudo random generators
    :param device: Device (cpu, cuda, ...) on which the code should be run.
    :param _init_setup_model: Whether or not to build the network at the creation of the instance
    """

    # Imported here, the policy classes also load model files that name them in this module.
    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MaskablePPOExtPolicy,
        "CnnPolicy": MaskablePPOExtCnnPolicy,
        "MultiInputPolicy": MaskablePPOExtMultiInputPolicy,
    }
    _model_families: ClassVar[frozenset[str]] = frozenset({"MaskablePPO"})
    _pi_old_buffer_classes = (PiOldMaskableRolloutBuffer, PiOldMaskableDictRolloutBuffer)
    trained_with_masks: bool | None = None  # the use_masking of the last learn (saved with the model)

    def __init__(
        self,
        policy: str | type[MaskableActorCriticPolicy],
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

    def _evaluate_samples(
        self, samples: MaskableRolloutBufferSamples, actions: th.Tensor, need_distribution: bool
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Distribution | None]:
        obs, masks = samples.observations, samples.action_masks
        if isinstance(self.policy, MaskablePPOExtPolicy):
            return self.policy.evaluate_actions_and_distribution(
                obs, actions, action_masks=masks, entropy_requires_grad=self.ent_coef != 0
            )
        # An upstream MaskableActorCriticPolicy (a MaskablePPO file): a second actor pass yields the distribution.
        values, log_prob, entropy = self.policy.evaluate_actions(obs, actions, action_masks=masks)
        return values, log_prob, entropy, self.policy.get_distribution(obs, action_masks=masks) if need_distribution else None

    def _samples_distribution(self, policy: MaskableActorCriticPolicy, samples: MaskableRolloutBufferSamples) -> Distribution:
        return policy.get_distribution(samples.observations, action_masks=samples.action_masks)  # type: ignore[arg-type]

    def _flat_rollout_distributions(self, stride: int = 1) -> list[th.distributions.Distribution]:
        buffer = self.rollout_buffer
        obs = flat_observations(buffer)
        masks = buffer.to_torch(flat_rollout(buffer, buffer.action_masks))
        return self._chunked_distributions(
            buffer.buffer_size * buffer.n_envs,
            lambda index: self.policy.get_distribution(index_observations(obs, index), action_masks=masks[index]),
            stride,
        )

    def _collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
        use_masking: bool = True,
    ) -> bool:
        """Upstream's ``collect_rollouts``; a forward pre-hook checks the masks it passes to ``policy(obs)``."""

        def check(module: th.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            masks = kwargs.get("action_masks")
            if masks is not None:  # None: use_masking=False
                obs = args[0] if args else kwargs["obs"]
                first = next(iter(obs.values())) if isinstance(obs, dict) else obs
                check_action_masks(masks, self.action_space, len(first), "env.action_masks() during the rollout")

        handle = self.policy.register_forward_pre_hook(check, with_kwargs=True)
        try:
            return super()._collect_rollouts(env, callback, rollout_buffer, n_rollout_steps, use_masking)
        finally:
            handle.remove()

    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """
        Upstream's ``predict``, its ``action_masks`` checked (:func:`check_action_masks`). Without them, the
        masks the observation carries (:class:`sb3_ppo_ext.envs.MaskedObservations`); with neither, unmasked, and
        a :class:`MissingActionMasksWarning` where the model acts with masks (its last ``learn`` used them, or,
        before any ``learn``, its env provides ``action_masks()``).

        :param observation: the input observation
        :param state: The last hidden states (unused: the policy is not recurrent)
        :param episode_start: The last episode starts (unused)
        :param deterministic: Whether or not to return deterministic actions.
        :param action_masks: the actions' masks, one per observation
        :return: the model's action and the next hidden state
        """
        if action_masks is None:
            action_masks = masks_of(observation)
            if action_masks is None and self._masks_in_play():
                warnings.warn(
                    f"{type(self).__name__}.predict was given no action_masks (and the observation carries none) for a "
                    "model that acts with masks: the action may be one the env forbids. Pass predict(obs, "
                    "action_masks=get_action_masks(vec_env)) (sb3_contrib.common.maskable.utils), evaluate with "
                    "sb3_contrib's maskable evaluate_policy or MaskableEvalCallback, or step a "
                    "sb3_ppo_ext.envs.MaskedObservations VecEnv (outermost) and hand its observations to predict unchanged",
                    MissingActionMasksWarning,
                    stacklevel=2,
                )
        observation = without_masks(observation)
        gym_pair = isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict)
        if action_masks is not None and not gym_pair:  # (obs, info) of a Gym reset: upstream's predict refuses it
            n_rows = observation_rows(observation, self.observation_space)
            check_action_masks(action_masks, self.action_space, n_rows, f"{type(self).__name__}.predict")
        return super().predict(observation, state, episode_start, deterministic, action_masks=action_masks)

    def _masks_in_play(self) -> bool:
        """Whether the model acts with masks: its last ``learn`` used them, or, before any ``learn``, its env has them."""
        if self.trained_with_masks is not None:
            return self.trained_with_masks
        return self.env is not None and is_masking_supported(self.env)

    def learn(  # type: ignore[override]
        self: SelfMaskablePPOExt,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "MaskablePPOExt",
        reset_num_timesteps: bool = True,
        use_masking: bool = True,
        progress_bar: bool = False,
    ) -> SelfMaskablePPOExt:
        self.trained_with_masks = use_masking
        return super().learn(
            total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, use_masking, progress_bar
        )


__all__ = ["MaskablePPOExt", "MissingActionMasksWarning", "check_action_masks"]
