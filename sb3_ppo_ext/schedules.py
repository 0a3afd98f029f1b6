"""Schedules as values: :class:`ParameterSchedule`, applied to a model by :class:`sb3_ppo_ext.callbacks.ParameterScheduler`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sb3_ppo_ext.validation import InvalidSettingError, check_choice, check_real, optional_real

SCHEDULE_KINDS = ("constant", "linear", "cosine", "step", "piecewise")
SCHEDULE_UNITS = ("progress", "timesteps")


class ParameterSchedule:
    """
    A value as a function of ``x``: the fraction of training done (``by="progress"``, 0 to 1) or
    ``model.num_timesteps`` (``by="timesteps"``); a plain dict of these keywords describes one in yml.
    ``linear`` goes from ``start`` at ``x <= begin`` to ``end`` at ``x >= finish``; ``cosine`` between the same
    ends as ``end + (start - end) * (1 + cos(pi * t)) / 2``; ``step`` takes ``values[i]``, ``i`` the number of
    ``boundaries <= x``; ``piecewise`` interpolates linearly through ``points``, constant beyond them.

    :param kind: One of ``constant``, ``linear``, ``cosine``, ``step``, ``piecewise``
    :param by: ``progress`` (default) or ``timesteps``
    :param value: The ``constant`` value
    :param start: First value of ``linear`` / ``cosine``
    :param end: Last value of ``linear`` / ``cosine``
    :param begin: ``x`` where ``linear`` / ``cosine`` leave ``start`` (default 0)
    :param finish: ``x`` where they reach ``end`` (default 1 by progress; required by timesteps)
    :param values: The ``step`` values, one more than ``boundaries``
    :param boundaries: The ``x`` where ``step`` moves to the next value, increasing
    :param points: The ``piecewise`` ``[x, y]`` points, ``x`` increasing
    """

    def __init__(
        self,
        kind: str,
        by: str = "progress",
        value: float | None = None,
        start: float | None = None,
        end: float | None = None,
        begin: float = 0.0,
        finish: float | None = None,
        values: Sequence[float] | None = None,
        boundaries: Sequence[float] | None = None,
        points: Sequence[Sequence[float]] | None = None,
    ):
        self.kind = check_choice("kind", kind, SCHEDULE_KINDS)
        self.by = check_choice("by", by, SCHEDULE_UNITS)
        given = dict(value=value, start=start, end=end, finish=finish, values=values, boundaries=boundaries, points=points)
        needed = {
            "constant": ("value",),
            "linear": ("start", "end", "finish"),
            "cosine": ("start", "end", "finish"),
            "step": ("values", "boundaries"),
            "piecewise": ("points",),
        }[kind]
        for name, item in given.items():
            if item is not None and name not in needed:
                raise InvalidSettingError(f"{name}={item!r} is invalid for kind={kind!r}: it takes {needed}")
        if kind in ("linear", "cosine") and finish is None:
            if by == "timesteps":
                raise InvalidSettingError(
                    f"finish=None is invalid for kind={kind!r}, by='timesteps': give the timestep of `end`"
                )
            finish = 1.0
        self.value = optional_real("value", value)
        self.start = optional_real("start", start)
        self.end = optional_real("end", end)
        self.begin = check_real("begin", begin)
        self.finish = optional_real("finish", finish)
        if kind in ("linear", "cosine"):
            if self.start is None or self.end is None:
                raise InvalidSettingError(
                    f"start={start!r}, end={end!r} are invalid for kind={kind!r}: both are required numbers"
                )
            assert self.finish is not None
            if self.finish <= self.begin:
                raise InvalidSettingError(f"finish={finish!r} is invalid: expected finish > begin={begin!r}")
        if kind == "constant" and self.value is None:
            raise InvalidSettingError("value=None is invalid for kind='constant': expected a number")
        self.values: list[float] = []
        self.boundaries: list[float] = []
        if kind == "step":
            self.values = [check_real("values[]", item) for item in self._sequence("values", values)]
            self.boundaries = [check_real("boundaries[]", item) for item in self._sequence("boundaries", boundaries)]
            if len(self.values) != len(self.boundaries) + 1:
                raise InvalidSettingError(
                    f"values={values!r} is invalid: expected one more value than boundaries ({len(self.boundaries)})"
                )
            self._check_increasing("boundaries", self.boundaries)
        self.points: list[tuple[float, float]] = []
        if kind == "piecewise":
            for point in self._sequence("points", points):
                if not isinstance(point, (list, tuple)) or len(point) != 2:
                    raise InvalidSettingError(f"points={points!r} is invalid: expected [x, y] pairs, got {point!r}")
                self.points.append((check_real("points[][0]", point[0]), check_real("points[][1]", point[1])))
            if not self.points:
                raise InvalidSettingError("points=[] is invalid: expected at least one [x, y] pair")
            self._check_increasing("points", [x for x, _ in self.points])

    @staticmethod
    def _sequence(name: str, items: object) -> list[Any]:
        if not isinstance(items, (list, tuple)):
            raise InvalidSettingError(f"{name}={items!r} is invalid: expected a list")
        return list(items)

    @staticmethod
    def _check_increasing(name: str, xs: list[float]) -> None:
        if any(b <= a for a, b in itertools.pairwise(xs)):
            raise InvalidSettingError(f"{name}={xs!r} is invalid: the x values must be strictly increasing")

    @classmethod
    def from_spec(
        cls, name: str, spec: ParameterSchedule | Mapping[str, Any] | Callable[[float], float]
    ) -> ParameterSchedule | Callable[[float], float]:
        """
        A schedule from a :class:`ParameterSchedule`, a dict of its keywords, or an SB3-style callable of the
        progress remaining (returned as is).

        :param name: The scheduled attribute, for error messages
        :param spec: The schedule's description
        """
        if isinstance(spec, ParameterSchedule) or (callable(spec) and not isinstance(spec, Mapping)):
            return spec
        if not isinstance(spec, Mapping):
            raise InvalidSettingError(
                f"schedules[{name!r}]={spec!r} is invalid: expected a dict such as {{kind: linear, start: .., end: ..}}"
            )
        if "kind" not in spec:
            raise InvalidSettingError(f"schedules[{name!r}]={dict(spec)!r} is invalid: it needs a 'kind' in {SCHEDULE_KINDS}")
        try:
            return cls(**spec)
        except TypeError as error:
            raise InvalidSettingError(f"schedules[{name!r}]={dict(spec)!r} is invalid: {error}") from None
        except ValueError as error:
            raise InvalidSettingError(f"schedules[{name!r}]: {error}") from None

    def __call__(self, x: float) -> float:
        """:param x: Fraction of training done (``by="progress"``) or timesteps (``by="timesteps"``)"""
        if self.kind == "constant":
            return float(self.value)  # type: ignore[arg-type]
        if self.kind == "step":
            return self.values[int(np.searchsorted(self.boundaries, x, side="right"))]
        if self.kind == "piecewise":
            return float(np.interp(x, [px for px, _ in self.points], [py for _, py in self.points]))
        assert self.start is not None and self.end is not None and self.finish is not None
        t = min(max((x - self.begin) / (self.finish - self.begin), 0.0), 1.0)
        if self.kind == "linear":
            return self.start + (self.end - self.start) * t
        return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * t))

    def extremes(self) -> tuple[float, float]:
        """``(min, max)`` of the values the schedule takes over all ``x`` (the values at its breakpoints)."""
        if self.kind == "constant":
            values = [float(self.value)]  # type: ignore[arg-type]
        elif self.kind == "step":
            values = self.values
        elif self.kind == "piecewise":
            values = [y for _, y in self.points]
        else:
            values = [self.start, self.end]  # type: ignore[list-item]
        return min(values), max(values)

    def __repr__(self) -> str:
        fields = {key: value for key, value in vars(self).items() if value not in (None, [])}
        return "ParameterSchedule(" + ", ".join(f"{key}={value!r}" for key, value in fields.items()) + ")"


__all__ = ["SCHEDULE_KINDS", "SCHEDULE_UNITS", "ParameterSchedule"]
