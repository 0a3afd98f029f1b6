"""The hyperparameter files shipped with sb3_ppo_ext (rl-zoo3 format)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HYPERPARAMS_DIR = Path(__file__).resolve().parent
PPO_EXT_YML = HYPERPARAMS_DIR / "ppo_ext.yml"


def load_hyperparams(env_id: str, path: str | Path = PPO_EXT_YML) -> dict[str, Any]:
    """
    The settings for ``env_id`` from a hyperparameter file, or its ``default`` entry.

    Parsed with ``yaml.safe_load``: nothing in the file is executed.

    :param env_id: gymnasium environment id
    :param path: yml file in rl-zoo3's format
    :return: a fresh dict of settings
    """
    with open(path) as file:
        entries = yaml.safe_load(file)
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: expected a mapping of env ids to settings, got {type(entries).__name__}")
    if env_id in entries:
        return dict(entries[env_id])
    if "default" in entries:
        return dict(entries["default"])
    raise KeyError(f"{path}: no entry for {env_id!r} and no 'default' entry")
