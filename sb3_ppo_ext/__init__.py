"""sb3_ppo_ext: PPOExt and a callback suite for Stable-Baselines3.

Importing this package imports neither rl_zoo3 nor optuna.
"""

from sb3_ppo_ext.distributions import TanhSquashedDistribution
from sb3_ppo_ext.policies import CnnPolicy, MlpPolicy, MultiInputPolicy, PPOExtActorCriticPolicy
from sb3_ppo_ext.ppo_ext import NonFiniteLossError, PPOExt

__version__ = "0.1.0"

__all__ = [
    "CnnPolicy",
    "MlpPolicy",
    "MultiInputPolicy",
    "NonFiniteLossError",
    "PPOExt",
    "PPOExtActorCriticPolicy",
    "TanhSquashedDistribution",
    "__version__",
]
