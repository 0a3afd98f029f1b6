"""The entries that train on EnvPool (``ppo_ext_envpool.yml``) as a ``--conf-file`` module for rl-zoo3."""

from __future__ import annotations

from typing import Any

from sb3_ppo_ext.settings import HYPERPARAMS_DIR, read_entries

PPO_EXT_ENVPOOL_YML = HYPERPARAMS_DIR / "ppo_ext_envpool.yml"


def __getattr__(name: str) -> Any:
    """``hyperparams``, the attribute rl-zoo3 reads: the file's entries, read afresh (rl-zoo3 updates them in place)."""
    if name == "hyperparams":
        return read_entries(PPO_EXT_ENVPOOL_YML)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
