"""The hyperparameter files shipped with sb3_ppo_ext (rl-zoo3 format); :mod:`sb3_ppo_ext.settings` reads and checks them."""

from sb3_ppo_ext.settings import HYPERPARAMS_DIR, PPO_EXT_YML, load_hyperparams

__all__ = ["HYPERPARAMS_DIR", "PPO_EXT_YML", "load_hyperparams"]
