"""Rollout buffers that carry ``pi_old`` (its parameters, set by the engine) as ``samples.old_distribution``.

Each gives the same minibatches as the upstream class it extends, field for field.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch as th
from sb3_contrib.common.maskable.buffers import (
    MaskableDictRolloutBuffer,
    MaskableDictRolloutBufferSamples,
    MaskableRolloutBuffer,
    MaskableRolloutBufferSamples,
)
from sb3_contrib.common.recurrent.buffers import RecurrentDictRolloutBuffer, RecurrentRolloutBuffer
from sb3_contrib.common.recurrent.type_aliases import RecurrentDictRolloutBufferSamples, RecurrentRolloutBufferSamples
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.type_aliases import DictRolloutBufferSamples, RolloutBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

# A samples field as the buffers convert it: an array or tensor, or a dict (observations) or tuple (pi_old) of them.
Field = Any


def _with_old_distribution(samples_class: type) -> type:
    """A ``NamedTuple`` class with the fields of ``samples_class`` and ``old_distribution`` last."""
    fields = [(name, Field) for name in samples_class._fields]  # type: ignore[attr-defined]
    return NamedTuple(f"PiOld{samples_class.__name__}", [*fields, ("old_distribution", Field)])  # type: ignore[return-value]


class PiOldBuffer:
    """What the buffers of this module add to their upstream class (placed first in their bases)."""

    # Attributes of the upstream buffer, declared for type checkers.
    buffer_size: int
    n_envs: int
    pos: int
    full: bool
    generator_ready: bool
    device: th.device

    # upstream's samples fields, then ``old_distribution`` (a tuple of parameter tensors; ``None`` without pi_old)
    samples_class: type

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self.distribution_kinds: tuple[str, ...] | None = None
        self.old_distribution: list[np.ndarray] = []
        self._tensors: dict[str, Field] | None = None

    def set_old_distribution(self, kinds: tuple[str, ...], tensors: tuple[th.Tensor, ...]) -> None:
        """
        ``pi_old`` for every row of the (flattened) rollout, returned with each minibatch from now on.

        :param kinds: the distributions' kinds (:func:`sb3_ppo_ext.distributions.distribution_parameters`)
        :param tensors: their parameters, one row per rollout row in the flattened row order
        """
        n_rows = self.buffer_size * self.n_envs
        if any(len(tensor) != n_rows for tensor in tensors):
            raise ValueError(f"pi_old needs one row per rollout row ({n_rows}), got {[len(t) for t in tensors]}")
        self.distribution_kinds = kinds
        self.old_distribution = [tensor.detach().cpu().numpy() for tensor in tensors]
        if self._tensors is not None:
            self._tensors.pop("old_distribution", None)

    @property
    def carries_pi_old(self) -> bool:
        """Whether :meth:`set_old_distribution` gave ``pi_old`` for this rollout."""
        return self.distribution_kinds is not None

    def _tensor_fields(self) -> dict[str, Field]:
        """The flattened rollout as upstream's ``_get_samples`` converts it, one array per samples field."""
        raise NotImplementedError

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> Any:
        """Upstream's samples of the rows ``batch_inds`` with ``old_distribution``, from tensors made once per rollout."""
        if env is not None or not self.generator_ready:
            samples = super()._get_samples(batch_inds, env)  # type: ignore[misc]
            old = tuple(self.to_torch(array[batch_inds]) for array in self.old_distribution) if self.carries_pi_old else None  # type: ignore[attr-defined]
            return self.samples_class(*samples, old)
        return self._rows(th.as_tensor(batch_inds, device=self.device))

    def _rows(self, rows: th.Tensor | slice) -> Any:
        """Samples of the rows ``rows`` of the rollout's tensors (a slice: views, no copy)."""
        if self._tensors is None:
            self._tensors = {name: _to_torch(self, value) for name, value in self._tensor_fields().items()}
        if self.carries_pi_old and "old_distribution" not in self._tensors:
            self._tensors["old_distribution"] = _to_torch(self, tuple(self.old_distribution))
        picked = {name: _index(value, rows) for name, value in self._tensors.items()}
        picked.setdefault("old_distribution", None)
        return self.samples_class(**picked)

    def prepare_rollout(self) -> None:
        """Flatten the rollout as the first ``get`` does, leaving numpy's global random state as it was."""
        if self.generator_ready:
            return
        state = np.random.get_state()
        try:
            generator = self.get(1)  # type: ignore[attr-defined]
            next(generator)
            generator.close()
        finally:
            np.random.set_state(state)

    def rollout_samples(self, chunk: int, stride: int = 1) -> Iterator[Any]:
        """Every ``stride``-th row of the rollout (flattened order) as samples of up to ``chunk`` rows, no random draws."""
        self.prepare_rollout()
        n_rows, span = self.buffer_size * self.n_envs, chunk * stride
        for start in range(0, n_rows, span):
            yield self._rows(slice(start, min(start + span, n_rows), stride))


def _to_torch(buffer: Any, value: Field) -> Field:
    """``buffer.to_torch`` of an array, or of each array of a dict or a tuple."""
    if isinstance(value, dict):
        return {key: buffer.to_torch(array) for key, array in value.items()}
    if isinstance(value, tuple):
        return tuple(buffer.to_torch(array) for array in value)
    return buffer.to_torch(value)


def _index(value: Field, rows: th.Tensor | slice) -> Field:
    """Rows of a tensor, or of each tensor of a dict or a tuple."""
    if isinstance(value, dict):
        return {key: tensor[rows] for key, tensor in value.items()}
    if isinstance(value, tuple):
        return tuple(tensor[rows] for tensor in value)
    return value[rows]


def _rollout_fields(buffer: Any, actions: np.ndarray) -> dict[str, Field]:
    """The fields every rollout buffer's samples share, from the flattened rollout (as upstream's ``_get_samples``)."""
    observations = buffer.observations
    return {
        "observations": dict(observations) if isinstance(observations, dict) else observations,
        "actions": actions,
        "old_values": buffer.values.flatten(),
        "old_log_prob": buffer.log_probs.flatten(),
        "advantages": buffer.advantages.flatten(),
        "returns": buffer.returns.flatten(),
    }


class _SB3Fields:
    """SB3's rollout buffers cast the actions to float32 (MultiBinary's int8 included)."""

    def _tensor_fields(self) -> dict[str, Field]:
        return _rollout_fields(self, self.actions.astype(np.float32, copy=False))  # type: ignore[attr-defined]


class _MaskableFields:
    """sb3-contrib's masked buffers keep the actions' dtype and add the masks."""

    def _tensor_fields(self) -> dict[str, Field]:
        fields = _rollout_fields(self, self.actions)  # type: ignore[attr-defined]
        fields["action_masks"] = self.action_masks.reshape(-1, self.mask_dims)  # type: ignore[attr-defined]
        return fields


class PiOldRolloutBuffer(_SB3Fields, PiOldBuffer, RolloutBuffer):
    """SB3's ``RolloutBuffer`` carrying ``pi_old`` (see :class:`PiOldBuffer`)."""

    samples_class = _with_old_distribution(RolloutBufferSamples)


class PiOldDictRolloutBuffer(_SB3Fields, PiOldBuffer, DictRolloutBuffer):
    """SB3's ``DictRolloutBuffer`` carrying ``pi_old`` (see :class:`PiOldBuffer`)."""

    samples_class = _with_old_distribution(DictRolloutBufferSamples)


class PiOldMaskableRolloutBuffer(_MaskableFields, PiOldBuffer, MaskableRolloutBuffer):
    """sb3-contrib's ``MaskableRolloutBuffer`` carrying ``pi_old`` (see :class:`PiOldBuffer`)."""

    samples_class = _with_old_distribution(MaskableRolloutBufferSamples)


class PiOldMaskableDictRolloutBuffer(_MaskableFields, PiOldBuffer, MaskableDictRolloutBuffer):
    """sb3-contrib's ``MaskableDictRolloutBuffer`` carrying ``pi_old`` (see :class:`PiOldBuffer`)."""

    samples_class = _with_old_distribution(MaskableDictRolloutBufferSamples)


class _RecurrentPiOld(PiOldBuffer):
    """The recurrent buffers' samples are padded sequences: ``pi_old``'s parameters are padded likewise."""

    def _get_samples(self, batch_inds: np.ndarray, env_change: np.ndarray, env: VecNormalize | None = None) -> Any:  # type: ignore[override]
        samples = super(PiOldBuffer, self)._get_samples(batch_inds, env_change, env)  # type: ignore[misc]
        old = None
        if self.carries_pi_old:  # ``pad``: this minibatch's padding, set by upstream's ``_get_samples``
            n_padded = len(samples.mask)
            old = tuple(
                self.pad(array[batch_inds]).reshape((n_padded, *array.shape[1:]))  # type: ignore[attr-defined]
                for array in self.old_distribution
            )
        return self.samples_class(*samples, old)

    def rollout_samples(self, chunk: int, stride: int = 1) -> Iterator[Any]:
        """The whole rollout as one sample of padded sequences (an LSTM pass is neither cut nor thinned), no random draws."""
        self.prepare_rollout()
        env_change = np.zeros((self.buffer_size, self.n_envs))
        env_change[0, :] = 1.0  # a new sequence where each environment's steps begin, as upstream's ``get``
        yield self._get_samples(np.arange(self.buffer_size * self.n_envs), self.swap_and_flatten(env_change))  # type: ignore[attr-defined]


class PiOldRecurrentRolloutBuffer(_RecurrentPiOld, RecurrentRolloutBuffer):  # type: ignore[misc]  # upstream's add and _get_samples differ from its bases'
    """sb3-contrib's ``RecurrentRolloutBuffer`` carrying ``pi_old`` (see :class:`PiOldBuffer`)."""

    samples_class = _with_old_distribution(RecurrentRolloutBufferSamples)


class PiOldRecurrentDictRolloutBuffer(_RecurrentPiOld, RecurrentDictRolloutBuffer):  # type: ignore[misc]  # upstream's add and _get_samples differ from its bases'
    """sb3-contrib's ``RecurrentDictRolloutBuffer`` carrying ``pi_old`` (see :class:`PiOldBuffer`)."""

    samples_class = _with_old_distribution(RecurrentDictRolloutBufferSamples)


# Upstream's buffer classes -> the subclass carrying pi_old that replaces each (the same rollout otherwise).
PI_OLD_BUFFERS: dict[type, type] = {
    RolloutBuffer: PiOldRolloutBuffer,
    DictRolloutBuffer: PiOldDictRolloutBuffer,
    MaskableRolloutBuffer: PiOldMaskableRolloutBuffer,
    MaskableDictRolloutBuffer: PiOldMaskableDictRolloutBuffer,
    RecurrentRolloutBuffer: PiOldRecurrentRolloutBuffer,
    RecurrentDictRolloutBuffer: PiOldRecurrentDictRolloutBuffer,
}

__all__ = [
    "PI_OLD_BUFFERS",
    "PiOldBuffer",
    "PiOldDictRolloutBuffer",
    "PiOldMaskableDictRolloutBuffer",
    "PiOldMaskableRolloutBuffer",
    "PiOldRecurrentDictRolloutBuffer",
    "PiOldRecurrentRolloutBuffer",
    "PiOldRolloutBuffer",
]
