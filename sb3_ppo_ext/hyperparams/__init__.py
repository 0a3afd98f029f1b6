"""The hyperparameter files shipped with sb3_ppo_ext (rl-zoo3 format).

Reading and checking them is :mod:`sb3_ppo_ext.settings`'s job.
"""

from __future__ import annotations

from sb3_ppo_ext.settings import HYPERPARAMS_DIR, PPO_EXT_YML, check_entry, load_hyperparams
from sb3_ppo_ext.validation import InvalidSettingError

# The name this module's errors had before sb3_ppo_ext.settings owned the checks.
HyperparamsError = InvalidSettingError

__all__ = ["HYPERPARAMS_DIR", "PPO_EXT_YML", "HyperparamsError", "check_entry", "load_hyperparams"]
