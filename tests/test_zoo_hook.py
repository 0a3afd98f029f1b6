"""The rl-zoo3 startup hook (sb3_ppo_ext_zoo_hook): its switch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "value, on",
    [
        *[(value, True) for value in ("", "0", "false", "False", "no", "off")],
        *[(value, False) for value in ("1", "true", " Yes ", "ON")],
    ],
)
def test_zoo_hook_switch_takes_only_true_values(monkeypatch: pytest.MonkeyPatch, value: str, on: bool):
    """SB3_PPO_EXT_NO_ZOO_HOOK=false leaves the hook on, in the module and in the .pth line alike."""
    import types

    import sb3_ppo_ext_zoo_hook as hook

    monkeypatch.setenv(hook.DISABLE_ENV_VAR, value)
    assert hook.enabled() is on
    calls = []
    fake = types.ModuleType("sb3_ppo_ext_zoo_hook")
    fake.install = lambda: calls.append("install")
    monkeypatch.setitem(sys.modules, "sb3_ppo_ext_zoo_hook", fake)
    line = (Path(__file__).resolve().parent.parent / "sb3_ppo_ext_zoo_hook.pth").read_text().strip()
    exec(line, {})  # what site.addpackage does with a .pth line that starts with "import"
    assert calls == (["install"] if on else [])
