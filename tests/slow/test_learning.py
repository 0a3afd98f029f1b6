"""Learning quality (slow): run with ``python -m pytest -m slow``."""

from sb3_ppo_ext.__main__ import main


def test_squashed_ppo_ext_solves_pendulum_in_100k_steps():
    """Squashed PPOExt with the shipped Pendulum-v1 settings: mean deterministic return >= -250
    within 100k steps for at least 2 of 3 seeds."""
    returns = [main(["--env", "Pendulum-v1", "--timesteps", "100000", "--seed", str(seed)]) for seed in range(3)]
    assert sum(r >= -250 for r in returns) >= 2, returns
