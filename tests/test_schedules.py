"""ParameterSchedule (sb3_ppo_ext.schedules): where it lives and what it imports."""

from __future__ import annotations

import subprocess
import sys


def test_parameter_schedule_lives_in_its_own_module():
    from sb3_ppo_ext import callbacks, schedules

    assert callbacks.ParameterSchedule is schedules.ParameterSchedule
    assert schedules.ParameterSchedule("linear", start=1.0, end=3.0).extremes() == (1.0, 3.0)
    probe = "import sys, sb3_ppo_ext.schedules; print(sorted(m for m in sys.modules if m.startswith('sb3_ppo_ext.')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "sb3_ppo_ext.callbacks" not in loaded  # imports stay one-way: schedules -> validation
