"""sb3_ppo_ext: PPOExt, MaskablePPOExt, RecurrentPPOExt and a callback suite for Stable-Baselines3 / sb3-contrib.

Importing this package imports neither rl_zoo3 nor optuna.
"""

from sb3_ppo_ext.distributions import TanhSquashedDistribution
from sb3_ppo_ext.maskable import MaskablePPOExt
from sb3_ppo_ext.policies import CnnPolicy, MlpPolicy, MultiInputPolicy, PPOExtActorCriticPolicy
from sb3_ppo_ext.ppo_ext import NonFiniteLossError, PPOExt
from sb3_ppo_ext.recurrent import RecurrentPPOExt

__version__ = "0.1.0"

__all__ = [
    "CnnPolicy",
    "MaskablePPOExt",
    "MlpPolicy",
    "MultiInputPolicy",
    "NonFiniteLossError",
    "PPOExt",
    "PPOExtActorCriticPolicy",
    "RecurrentPPOExt",
    "TanhSquashedDistribution",
    "__version__",
]
