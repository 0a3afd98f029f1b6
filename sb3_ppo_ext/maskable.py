"""MaskablePPOExt: sb3-contrib's MaskablePPO (invalid-action masking) with PPOExt's extensions."""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib import MaskablePPO
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.vec_env import VecEnv

from sb3_ppo_ext.buffers import PiOldMaskableDictRolloutBuffer, PiOldMaskableRolloutBuffer
from sb3_ppo_ext.engine import ExtUpdateEngine, extension_arguments, flat_observations, flat_rollout, index_observations
from sb3_ppo_ext.envs import masks_of, without_masks
from sb3_ppo_ext.parameters import check_arguments
from sb3_ppo_ext.policies import (  # the policies live in sb3_ppo_ext.policies; these names keep old files loading
    MaskablePPOExtCnnPolicy,
    MaskablePPOExtMultiInputPolicy,
    MaskablePPOExtPolicy,
)
from sb3_ppo_ext.reliability import ModelFiles

SelfMaskablePPOExt = TypeVar("SelfMaskablePPOExt", bound="MaskablePPOExt")


class MissingActionMasksWarning(UserWarning):
    """
    :meth:`MaskablePPOExt.predict` acted without action masks (none given, none carried by the
    observation) for a model whose masks are in play: its last ``learn`` used them, or, before any
    ``learn``, its env provides ``action_masks()``. The action may be one the env forbids.
    """


def mask_blocks(action_space: spaces.Space) -> np.ndarray:
    """
    The sizes of the blocks of one flat action mask, one block per sub-action: ``[n]`` for
    ``Discrete(n)``, ``nvec`` for ``MultiDiscrete``, ``[2] * n`` for ``MultiBinary(n)`` (a mask
    value per outcome of each binary action, as sb3-contrib's ``MaskableBernoulliDistribution``).

    :param action_space: a masked action space
    :return: the block sizes (their sum is the mask's length)
    """
    if isinstance(action_space, spaces.Discrete):
        return np.array([action_space.n])
    if isinstance(action_space, spaces.MultiDiscrete):
        return np.asarray(action_space.nvec).ravel()
    if isinstance(action_space, spaces.MultiBinary):
        return np.full(math.prod(action_space.shape), 2)
    raise ValueError(f"action masks need a Discrete, MultiDiscrete or MultiBinary action space, got {action_space}")


def check_action_masks(masks: Any, action_space: spaces.Space, n_rows: int, where: str) -> None:
    """
    ``ValueError`` unless ``masks`` is one flat mask per row that fits ``action_space`` and allows
    an action in every block (every sub-action of MultiDiscrete and MultiBinary spaces).

    The one check of masks, in rollouts and in ``predict``: a shape ``(n_rows, mask_size)`` (or
    ``(mask_size,)`` for one row), booleans or numbers that are 0 or 1. Upstream reshapes any
    array of the right size (a transposed mask too) and samples a row that allows nothing
    uniformly. A few numpy operations on the whole array; no loop over rows.

    :param masks: the action masks (array-like)
    :param action_space: the masked action space
    :param n_rows: the number of observations (environments) the masks are for
    :param where: where the masks come from, for the message
    """
    blocks = mask_blocks(action_space)
    size = int(blocks.sum())
    array = np.asarray(masks.detach().cpu() if isinstance(masks, th.Tensor) else masks)
    expected = f"expected {n_rows} mask(s) of {size} booleans each, of shape ({n_rows}, {size})" + (
        f" or ({size},)" if n_rows == 1 else ""
    )
    if array.dtype == object and any(value is None for value in array.flat):
        raise ValueError(f"{where}: action_masks hold None for the action space {action_space}: {expected}")
    if array.dtype != bool and array.dtype.kind not in "iuf":
        raise ValueError(f"{where}: action_masks of dtype {array.dtype} for the action space {action_space}: {expected}")
    if array.shape != (n_rows, size) and not (n_rows == 1 and array.shape == (size,)):
        raise ValueError(
            f"{where}: action_masks of shape {array.shape} do not fit the action space {action_space}: {expected}"
        )
    if array.dtype != bool:
        if not np.isin(array, (0, 1)).all():
            raise ValueError(
                f"{where}: action_masks of dtype {array.dtype} hold values other than 0 and 1 "
                f"(e.g. {array[~np.isin(array, (0, 1))].flat[0].item()!r}): {expected}"
            )
        array = array != 0
    starts = np.cumsum(blocks) - blocks
    allowed = np.maximum.reduceat(array.reshape(n_rows, size), starts, axis=1)
    if not allowed.all():
        row, block = (int(index[0]) for index in np.nonzero(~allowed))
        if len(blocks) == 1:
            raise ValueError(f"{where}: action_masks row {row} allows no action of {action_space}: expected at least one True")
        span = f"{starts[block]}:{starts[block] + blocks[block]}"
        raise ValueError(
            f"{where}: action_masks row {row} allows no value of sub-action {block} (mask positions {span}) of "
            f"{action_space}: expected at least one True per sub-action"
        )


def observation_rows(observation: Any, observation_space: spaces.Space) -> int:
    """
    How many observations ``observation`` holds, as the policy batches it (``reshape(-1, *shape)``):
    its size over the size of one observation, whatever the layout (channel-last images included).

    :param observation: an observation or a batch of them (a dict for ``Dict`` spaces)
    :param observation_space: the model's observation space
    :return: the number of observations (1 for an unbatched one)
    """
    if isinstance(observation, dict) and isinstance(observation_space, spaces.Dict):
        key = next(iter(observation))
        observation, observation_space = observation[key], observation_space[key]
    return max(1, np.size(observation) // max(1, int(np.prod(observation_space.shape or ()))))


class MaskablePPOExt(ModelFiles, ExtUpdateEngine, MaskablePPO):  # type: ignore[misc]  # upstream: batch_size int | None
    """
    sb3-contrib's ``MaskablePPO`` (invalid-action masking; Discrete, MultiDiscrete and MultiBinary
    actions) with PPOExt's extensions: the KL penalty of PPO1 (analytic KL between the *masked*
    distributions: masked actions have probability 0 under both policies and add nothing), both
    value-clip forms, ``clip_range=None`` and the full ``train/`` diagnostics. Drop-in: with the
    defaults (``kl_coef=0``) it trains bit for bit like ``MaskablePPO`` with the same seed (one
    deliberate difference: a one-sample minibatch is not advantage-normalised, as in SB3's PPO).

    The environment provides ``action_masks()`` (or is wrapped in sb3-contrib's ``ActionMasker``);
    ``predict(obs, action_masks=...)`` as upstream; a ``predict`` without masks for a model trained with them
    issues a :class:`MissingActionMasksWarning` (at every such call; Python's warning filters decide how often it
    shows). Masks are checked on every rollout step and in
    ``predict`` (:func:`check_action_masks`): a mask of the wrong shape or dtype, or one that allows no
    action (for MultiDiscrete and MultiBinary: no value of a sub-action), is a ``ValueError``.

    :param policy: The policy model to use (MlpPolicy, CnnPolicy, MultiInputPolicy)
    :param env: The environment to learn from (if registered in Gym, can be str)
    :param learning_rate: The learning rate, it can be a function of the current progress remaining (from 1 to 0)
    :param n_steps: The number of steps to run for each environment per update
    :param batch_size: Minibatch size
    :param n_epochs: Number of epoch when optimizing the surrogate loss
    :param gamma: Discount factor
    :param gae_lambda: Factor for trade-off of bias vs variance for Generalized Advantage Estimator
    :param clip_range: Clipping parameter of the surrogate objective; a positive float, a schedule, or
        ``None`` to turn clipping off
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
    :param rollout_buffer_class: Rollout buffer class to use. If ``None``, it will be automatically selected.
        ``None`` and upstream's own classes become their subclass in :mod:`sb3_ppo_ext.buffers`, which carries
        ``pi_old`` with each sample for the KL penalty (the same rollout otherwise); a class of your own is kept, and
        refused with ``kl_coef > 0``.
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

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MaskablePPOExtPolicy,
        "CnnPolicy": MaskablePPOExtCnnPolicy,
        "MultiInputPolicy": MaskablePPOExtMultiInputPolicy,
    }
    _model_families: ClassVar[frozenset[str]] = frozenset({"MaskablePPO"})

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
        # The arguments upstream's constructor takes and the extensions' own, each checked by its row of the
        # parameter table (sb3_ppo_ext.parameters) before upstream's asserts see them.
        upstream: dict[str, Any] = dict(
            learning_rate=learning_rate,
            n_steps=n_steps,
            batch_size=batch_size,
            n_epochs=n_epochs,
            gamma=gamma,
            gae_lambda=gae_lambda,
            clip_range=clip_range,
            clip_range_vf=clip_range_vf,
            normalize_advantage=normalize_advantage,
            ent_coef=ent_coef,
            vf_coef=vf_coef,
            max_grad_norm=max_grad_norm,
            target_kl=target_kl,
            stats_window_size=stats_window_size,
        )
        extensions = extension_arguments(vf_clip_mode, kl_coef, kl_target, kl_adapt_factor, kl_adapt_tolerance, kl_coef_bounds)
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

    # ---- seams of the update engine -------------------------------------------------------------

    def _evaluate_samples(
        self, samples: Any, actions: th.Tensor, need_distribution: bool
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None, Any]:
        masks = samples.action_masks
        if hasattr(self.policy, "evaluate_actions_and_distribution"):
            return self.policy.evaluate_actions_and_distribution(
                samples.observations, actions, action_masks=masks, entropy_requires_grad=self.ent_coef != 0
            )
        # An upstream MaskableActorCriticPolicy (a MaskablePPO file): a second actor pass yields the distribution.
        values, log_prob, entropy = self.policy.evaluate_actions(samples.observations, actions, action_masks=masks)
        distribution = self.policy.get_distribution(samples.observations, action_masks=masks) if need_distribution else None
        return values, log_prob, entropy, distribution

    _pi_old_buffer_classes = (PiOldMaskableRolloutBuffer, PiOldMaskableDictRolloutBuffer)

    def _samples_distribution(self, policy: Any, samples: Any) -> Any:
        return policy.get_distribution(samples.observations, action_masks=samples.action_masks)

    def _flat_rollout_distributions(self) -> list[th.distributions.Distribution]:
        buffer = self.rollout_buffer
        obs = flat_observations(buffer)
        masks = buffer.to_torch(flat_rollout(buffer, buffer.action_masks))
        return self._chunked_distributions(
            buffer.buffer_size * buffer.n_envs,
            lambda index: self.policy.get_distribution(index_observations(obs, index), action_masks=masks[index]),
        )

    # ---- masks ----------------------------------------------------------------------------------

    def _collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
        use_masking: bool = True,
    ) -> bool:
        """
        Upstream's ``collect_rollouts``, with every step's masks checked by :func:`check_action_masks`
        before the policy applies them (so before the env receives an action): a forward pre-hook of
        the policy, for the collection only, sees the ``action_masks`` upstream passes to ``policy(obs)``.
        """
        action_space = self.action_space

        def check(module: th.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            masks = kwargs.get("action_masks")
            if masks is not None:  # None: use_masking=False
                obs = args[0] if args else kwargs["obs"]
                first = next(iter(obs.values())) if isinstance(obs, dict) else obs
                check_action_masks(masks, action_space, len(first), "env.action_masks() during the rollout")

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
        Upstream's ``predict``, with a ``ValueError`` (:func:`check_action_masks`) for ``action_masks``
        that do not fit the action space and the number of observations, or that allow no action.
        Without ``action_masks``, the masks that ``observation`` carries are used (observations of
        :class:`sb3_ppo_ext.envs.MaskedObservations`, for loops that pass no masks, such as rl-zoo3's
        ``enjoy``). With neither, the action is unmasked, as upstream's; if the model's masks are in
        play (its last ``learn`` used them, or, before any ``learn``, its env provides
        ``action_masks()``), the call issues a :class:`MissingActionMasksWarning`.

        :param observation: the input observation
        :param state: The last hidden states (unused: the policy is not recurrent)
        :param episode_start: The last episode starts (unused)
        :param deterministic: Whether or not to return deterministic actions.
        :param action_masks: the actions' masks, one per observation (``None``: the masks the
            observation carries, if any, else no masking)
        :return: the model's action and the next hidden state
        """
        if action_masks is None:
            action_masks = masks_of(observation)
            if action_masks is None and self._masks_in_play():
                warnings.warn(
                    f"{type(self).__name__}.predict was given no action_masks (and the observation carries none) for a "
                    "model that acts with masks (trained with them, or on an env that provides action_masks()): the action "
                    "may be one the env forbids. Pass predict(obs, "
                    "action_masks=get_action_masks(vec_env)) (sb3_contrib.common.maskable.utils), evaluate with "
                    "sb3_contrib.common.maskable.evaluation.evaluate_policy or MaskableEvalCallback, or, for a loop that "
                    "cannot pass masks, step a sb3_ppo_ext.envs.MaskedObservations VecEnv (outermost) and hand its "
                    "observations to predict unchanged (a copy, a slice or a wrapper above it drops the masks)",
                    MissingActionMasksWarning,
                    stacklevel=2,
                )
        observation = without_masks(observation)
        # (obs, info) from a Gym reset: upstream's predict raises its own error for it.
        gym_pair = isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict)
        if action_masks is not None and not gym_pair:
            n_rows = observation_rows(observation, self.observation_space)
            check_action_masks(action_masks, self.action_space, n_rows, f"{type(self).__name__}.predict")
        return super().predict(observation, state, episode_start, deterministic, action_masks=action_masks)

    # The use_masking of the model's last learn (saved with it); None before any learn.
    trained_with_masks: bool | None = None

    def _masks_in_play(self) -> bool:
        """Whether the model acts with masks: its last ``learn`` used them, or, before any ``learn``, its env has them."""
        if self.trained_with_masks is not None:
            return self.trained_with_masks
        from sb3_contrib.common.maskable.utils import is_masking_supported

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
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            use_masking=use_masking,
            progress_bar=progress_bar,
        )


MlpPolicy = MaskablePPOExtPolicy
CnnPolicy = MaskablePPOExtCnnPolicy
MultiInputPolicy = MaskablePPOExtMultiInputPolicy

__all__ = [
    "MaskablePPOExt",
    "MissingActionMasksWarning",
    "check_action_masks",
]
