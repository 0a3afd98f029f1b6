"""ParameterSchedule (sb3_ppo_ext.schedules): where it lives and what it imports."""

from __future__ import annotations

import pytest
from helpers import modules_after_imports

from sb3_ppo_ext.callbacks import (
    ParameterSchedule,
)


def test_parameter_schedule_lives_in_its_own_module():
    from sb3_ppo_ext import callbacks, schedules

    assert callbacks.ParameterSchedule is schedules.ParameterSchedule
    assert schedules.ParameterSchedule("linear", start=1.0, end=3.0).extremes() == (1.0, 3.0)
    loaded = modules_after_imports()["sb3_ppo_ext.schedules"]  # the first import of a fresh interpreter
    assert "sb3_ppo_ext.schedules" in loaded
    assert "sb3_ppo_ext.callbacks" not in loaded  # imports stay one-way: schedules -> validation


def test_schedule_formulas():
    linear = ParameterSchedule("linear", start=1.0, end=0.0)
    assert [linear(x) for x in (0.0, 0.25, 1.0, 2.0)] == [1.0, 0.75, 0.0, 0.0]
    cosine = ParameterSchedule("cosine", start=1.0, end=0.0, begin=100, finish=300, by="timesteps")
    assert cosine(0) == 1.0 and cosine(200) == pytest.approx(0.5) and cosine(300) == pytest.approx(0.0)
    step = ParameterSchedule("step", values=[3, 2, 1], boundaries=[0.5, 0.8])
    assert [step(x) for x in (0.0, 0.5, 0.79, 0.8, 1.0)] == [3, 2, 2, 1, 1]
    piecewise = ParameterSchedule("piecewise", points=[[0.0, 0.0], [0.5, 1.0], [1.0, 0.5]])
    assert [piecewise(x) for x in (-1.0, 0.25, 0.75, 2.0)] == [0.0, 0.5, 0.75, 0.5]
