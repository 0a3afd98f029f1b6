"""The benchmark's data: the algorithms (variants of yml entries), the suites (envs, budgets, seeds) and what they compare.

The runner (:mod:`benchmarks.runner`) trains what :data:`ALGOS` and :data:`SUITES` name; the report
(:mod:`benchmarks.report`) compares each suite by the kind it is (:data:`MASKED_SUITES`, ...), its pairs
(:data:`VARIANT_PAIRS`, :data:`SUITE_PAIRS`) and :data:`THRESHOLDS`, and reads each suite's runs from its
record (:func:`record_path`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]  # the checkout: its git history names the runs' commits

# name -> (rl-zoo3 algo, overrides of the yml entry, description). "policy_kwargs" overrides are
# merged into the entry's policy_kwargs (see _zoo_overrides).
ALGOS: dict[str, tuple[str, dict[str, Any], str]] = {
    "ppo": ("ppo", {}, "stock SB3 PPO, rl-zoo3's ppo.yml entry"),
    "trpo": ("trpo", {}, "sb3-contrib TRPO, rl-zoo3's trpo.yml entry"),
    "ppo_ext_clip": (
        "ppo_ext",
        {},
        "PPOExt, the shipped ppo_ext.yml entry as it is (squashed head + clip unless a # Tuned entry says otherwise)",
    ),
    "ppo_ext_kl": (
        "ppo_ext",
        {"clip_range": None, "kl_coef": 1.0, "kl_target": 0.01},
        "PPOExt, squashed head + adaptive KL penalty (clip_range: None, kl_coef: 1.0, kl_target: 0.01)",
    ),
    "ppo_ext_gauss": (
        "ppo_ext",
        {"policy_kwargs": {"squash_output": False}},
        "PPOExt, Gaussian head + clip (policy_kwargs.squash_output: False, without the squashed head's own settings)",
    ),
    "ppo_ext_beta": (
        "ppo_ext",
        {"use_sde": False, "policy_kwargs": {"action_dist": "beta"}},
        "PPOExt, Beta head + clip (policy_kwargs.action_dist: beta, use_sde: False; without the Gaussian heads' "
        "own settings: log_std_init, gSDE)",
    ),
    # The Gaussian heads without gSDE, where the shipped entry uses it (Pendulum-v1): the Beta head cannot
    # use gSDE, so these rows separate the head's effect from the noise model's.
    "ppo_ext_gauss_nosde": (
        "ppo_ext",
        {"use_sde": False, "policy_kwargs": {"squash_output": False}},
        "PPOExt, Gaussian head + clip without gSDE (policy_kwargs.squash_output: False, use_sde: False)",
    ),
    "ppo_ext_clip_nosde": (
        "ppo_ext",
        {"use_sde": False},
        "PPOExt, squashed head + clip without gSDE (use_sde: False)",
    ),
    "ppo_ext_tanh": (
        "ppo_ext",
        {"policy_kwargs": {"activation_fn": "tanh"}},
        "PPOExt, squashed head + clip with tanh hidden activations (policy_kwargs.activation_fn: tanh)",
    ),
    # PPOExt's fast mode: fused Adam; not bit for bit, so its learning curves are compared with the
    # default's at 10 seeds ("fast" suite).
    "ppo_ext_fast": (
        "ppo_ext",
        {"policy_kwargs": {"fast": True}},
        "PPOExt, the shipped entry with fast mode on (policy_kwargs.fast: True)",
    ),
    # RecurrentPPOExt's fast mode (fused Adam and the LSTM over whole sequences in one call) against its
    # default at 10 seeds ("fast-lstm" suite).
    "ppo_lstm_ext": ("ppo_lstm_ext", {}, "RecurrentPPOExt, the shipped ppo_lstm_ext.yml entry as it is"),
    "ppo_lstm_ext_fast": (
        "ppo_lstm_ext",
        {"policy_kwargs": {"fast": True}},
        "RecurrentPPOExt, the shipped entry with fast mode on (policy_kwargs.fast: True)",
    ),
    "ppo_ext_tuned": (
        "ppo_ext",
        {},
        "PPOExt, a candidate entry (--candidate FILE: a tuning study's best trial) instead of the shipped one",
    ),
    "ppo_ext_envpool": (
        "ppo_ext",
        {},
        "PPOExt, the shipped ppo_ext_envpool.yml entry: trains on EnvPool's batched envs, evaluates on gymnasium's env",
    ),
    # Masked tasks: stock PPO at the shipped ppo_mask_ext.yml entry's settings (it never sees the masks),
    # MaskablePPOExt as shipped, and with the adaptive KL penalty between masked distributions instead of clipping.
    "ppo_unmasked": ("ppo", {}, "stock SB3 PPO (no masks), the shipped ppo_mask_ext.yml entry's settings"),
    "ppo_mask_ext": ("ppo_mask_ext", {}, "MaskablePPOExt, the shipped ppo_mask_ext.yml entry as it is"),
    "ppo_mask_ext_kl": (
        "ppo_mask_ext",
        {"clip_range": None, "kl_coef": 1.0, "kl_target": 0.01},
        "MaskablePPOExt, adaptive KL penalty (clip_range: None, kl_coef: 1.0, kl_target: 0.01)",
    ),
}
# Algorithms of rl-zoo3 trained with the settings of a yml shipped here (by the --algo whose file it is).
SHIPPED_SETTINGS = {"ppo_unmasked": "ppo_mask_ext"}
# Variants whose entries come from another shipped yml (in sb3_ppo_ext/hyperparams/) than their --algo's own.
CONF_FILES = {"ppo_ext_envpool": "ppo_ext_envpool.yml"}
# Settings of the squashed head alone, left out when a variant turns the head off (a tuned entry
# may set them; PPOExt raises for them on a Gaussian head, whose entropy has a closed form).
SQUASHED_HEAD_ONLY = ("entropy_estimator",)
# Settings of the Gaussian heads (their std and exploration noise), left out when a variant takes the
# Beta head, which rejects them (its spread is its own; gSDE is a Gaussian noise model).
GAUSSIAN_HEAD_ONLY = ("entropy_estimator", "log_std_init", "state_dependent_std", "log_std_bounds", "full_std", "use_expln")
# Algorithms whose settings come from rl-zoo3's own yml files (the rest from the shipped ppo_ext.yml).
ZOO_OWN = ("ppo", "trpo")
# A candidate entry (a yml of entries by env id, as `scripts/zoo_study.py best` writes them) runs as
# CANDIDATE beside the shipped entry as it is (SHIPPED), on seeds the study never trained with.
CANDIDATE = "ppo_ext_tuned"
SHIPPED = "ppo_ext_clip"


@dataclasses.dataclass(frozen=True)
class EnvBudget:
    """One env of a suite: env-step budget, seeds, evaluation interval."""

    env: str
    steps: int
    seeds: int
    eval_freq: int
    algos: tuple[str, ...] | None = None  # None: every requested algorithm
    first_seed: int = 0


# Locomotion at the budget users train at: Hopper for the five algorithms, Walker2d for stock PPO, TRPO
# and the PPOExt variant that did best on Hopper. That was ppo_ext_tanh (IQM 1018.9 of 5 seeds); the
# Walker2d-v5 entry keeps SB3's default policy (64x64, tanh activations), where ppo_ext_tanh is the same
# configuration as ppo_ext_clip, so Walker2d runs ppo_ext_clip: the shipped entry as it is.
MUJOCO_1M_HOPPER = ("ppo", "trpo", "ppo_ext_clip", "ppo_ext_kl", "ppo_ext_tanh")
MUJOCO_1M_WALKER = ("ppo", "trpo", "ppo_ext_clip")

MASKED = ("ppo_unmasked", "ppo_mask_ext", "ppo_mask_ext_kl")

# The three heads at the shipped settings: SB3's clipped Gaussian, the squashed Gaussian (the
# shipped entry as it is) and the Beta head, on bounded-action tasks, 10 seeds each; where the shipped
# entry explores with gSDE (Pendulum-v1), also both Gaussian heads without it.
HEADS = ("ppo_ext_gauss", "ppo_ext_clip", "ppo_ext_beta")
HEADS_GSDE = (*HEADS, "ppo_ext_gauss_nosde", "ppo_ext_clip_nosde")

# Fast mode against the default, the shipped entry otherwise, 10 seeds on three tasks.
FAST = ("ppo_ext_clip", "ppo_ext_fast")
FAST_LSTM = ("ppo_lstm_ext", "ppo_lstm_ext_fast")

# Time to a score in CPU-seconds: the batched EnvPool entries, evaluated on gymnasium's env with 10 episodes
# every 50k steps (about every 10 CPU-seconds); beside them stock PPO at rl-zoo3's v4 settings and the 1-env entries.
TIME_TO_SCORE = ("ppo_ext_envpool",)
TIME_TO_SCORE_REFERENCES = ("ppo", "ppo_ext_clip")
# Four tasks at 300k steps (Pendulum at 100k); "pendulum" is its first row alone.
SUITE_300K = ("ppo", "ppo_ext_clip", "ppo_ext_kl", "ppo_ext_gauss")
SUITES: dict[str, list[EnvBudget]] = {
    "pendulum": [EnvBudget("Pendulum-v1", 100_000, 5, 10_000, SUITE_300K)],
    "300k": [
        EnvBudget("Pendulum-v1", 100_000, 5, 10_000, SUITE_300K),
        EnvBudget("LunarLanderContinuous-v3", 300_000, 3, 20_000, SUITE_300K),
        EnvBudget("Hopper-v5", 300_000, 3, 20_000, SUITE_300K),
        EnvBudget("HalfCheetah-v5", 300_000, 3, 20_000, SUITE_300K),
    ],
    "mujoco-1m": [
        EnvBudget("Hopper-v5", 1_000_000, 5, 20_000, MUJOCO_1M_HOPPER),
        EnvBudget("Walker2d-v5", 1_000_000, 3, 20_000, MUJOCO_1M_WALKER),
    ],
    # A tuned entry earns its place on fresh seeds: the Hopper-v5 study's best trial against the shipped
    # entry at 1M steps, on seeds 100-104 (the study's workers seeded their envs with seeds below 20).
    "tuned-1m": [EnvBudget("Hopper-v5", 1_000_000, 5, 20_000, (SHIPPED, CANDIDATE), first_seed=100)],
    # The three Box heads (clipped Gaussian, squashed Gaussian, Beta) at the shipped settings.
    "heads": [
        EnvBudget("Pendulum-v1", 100_000, 10, 10_000, HEADS_GSDE),
        # The shipped entry's own budget (20k steps; at n_steps 8 a 300k-step run costs ~8 CPU-minutes).
        EnvBudget("MountainCarContinuous-v0", 20_000, 10, 2_000, HEADS),
        EnvBudget("LunarLanderContinuous-v3", 300_000, 10, 20_000, HEADS),
    ],
    # Fast mode's learning curves against the default's.
    "fast": [
        EnvBudget("Pendulum-v1", 100_000, 10, 10_000, FAST),
        EnvBudget("LunarLanderContinuous-v3", 300_000, 10, 20_000, FAST),
        # A second task on the fast mode's NumPy rollout step (a state-independent Gaussian head; Pendulum's gSDE
        # stays in torch): Hopper's first 100k steps, where the returns still climb.
        EnvBudget("Hopper-v5", 100_000, 10, 10_000, FAST),
    ],
    # The same question for RecurrentPPOExt, on the partially observed tasks of its shipped entries (their budget).
    "fast-lstm": [
        # 20 seeds: at 10 its IQM CIs parted at one evaluation of 11.
        EnvBudget("PendulumNoVel-v1", 100_000, 20, 10_000, FAST_LSTM),
        EnvBudget("CartPoleNoVel-v1", 100_000, 10, 10_000, FAST_LSTM),
    ],
    # Masking through the zoo (--algo ppo_mask_ext): evaluations of MaskablePPOExt are masked (the
    # evaluation callback reads the masks from the eval env), stock PPO's are its own greedy actions.
    "masked": [
        EnvBudget("Taxi-v4", 200_000, 5, 20_000, MASKED),
        EnvBudget("InvalidActionEnvDiscrete-v0", 20_000, 5, 2_000, MASKED),
    ],
}
SUITES["time-to-score"] = [
    EnvBudget("Hopper-v5", 3_000_000, 10, 50_000, TIME_TO_SCORE),  # 3M steps took 356-405 CPU-seconds
    EnvBudget("Walker2d-v5", 2_000_000, 5, 50_000, TIME_TO_SCORE),
    EnvBudget("HalfCheetah-v5", 3_000_000, 5, 50_000, TIME_TO_SCORE),  # 3M steps took 698-732 CPU-seconds
    EnvBudget("Ant-v5", 3_000_000, 5, 50_000, TIME_TO_SCORE),  # 3M steps took 757-800 CPU-seconds
]
# The comparisons, at their own 1M-step budgets and seeds (5 each).
SUITES["time-to-score-references"] = [
    EnvBudget(env, 1_000_000, 5, 50_000, TIME_TO_SCORE_REFERENCES)
    for env in ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5")
]
# The targets of the time-to-score report (return on gymnasium's env) and the CPU budgets it reads returns at.
SCORE_TARGETS = {"Hopper-v5": 3000.0, "Walker2d-v5": 4500.0, "HalfCheetah-v5": 5000.0, "Ant-v5": 3000.0}
CPU_BUDGETS = (300.0, 600.0, 1200.0)
# The candidate file a suite validates, relative to the repository (--candidate replaces it).
SUITE_CANDIDATES = {"tuned-1m": "docs/benchmarks/study/candidates.yml"}

# --- what the report compares and judges ---------------------------------------------------------

STOCK = "ppo"
TRPO = "trpo"
# Stock PPO on the masked tasks (suite masked): the shipped ppo_mask_ext.yml settings, no masks.
UNMASKED = "ppo_unmasked"
# The references every other algorithm (a PPOExt variant) is compared with.
BASELINES = (STOCK, TRPO)
# Further (variant, reference) pairs compared when both ran: a candidate entry against the shipped
# one; on the masked tasks each masked variant against stock PPO without masks, and the KL penalty
# against the clipped objective.
VARIANT_PAIRS = (
    (CANDIDATE, SHIPPED),
    ("ppo_mask_ext", UNMASKED),
    ("ppo_mask_ext_kl", UNMASKED),
    ("ppo_mask_ext_kl", "ppo_mask_ext"),
)


# The committed evidence: one record file of finished runs per suite (the report's default input and --keep-data).
RECORDS = Path("docs/benchmarks/records")


def record_path(suite: str) -> Path:
    """The suite's record file, relative to the repository: ``docs/benchmarks/records/<suite>.jsonl``."""
    return RECORDS / f"{suite}.jsonl"


# The Optuna studies the report's tuning section lists by default (storage, study name).
STUDIES = (("sqlite:///docs/benchmarks/study/hopper-v5.db", "ppo_ext-hopper-500k"),)
# Suites that validate a candidate entry against the shipped one (judged by validation_section).
VALIDATION_SUITES = ("tuned-1m",)
# Suites of masked tasks (masked_section: masked against unmasked).
MASKED_SUITES = ("masked",)
# Suites comparing the Box action heads (judged by heads_section): each head against the others, and the
# Gaussian heads with their shipped gSDE against the same heads without it.
HEADS_SUITES = ("heads",)
HEAD_NAMES = {
    "ppo_ext_gauss": "clipped Gaussian",
    "ppo_ext_clip": "squashed Gaussian",
    "ppo_ext_beta": "Beta",
    "ppo_ext_gauss_nosde": "clipped Gaussian, no gSDE",
    "ppo_ext_clip_nosde": "squashed Gaussian, no gSDE",
}
# Suites comparing fast mode with the default (judged by fast_section): same learning curves or not.
# By suite: (fast mode, default).
FAST_PAIRS = {"fast": ("ppo_ext_fast", "ppo_ext_clip"), "fast-lstm": ("ppo_lstm_ext_fast", "ppo_lstm_ext")}
FAST_SUITES = tuple(FAST_PAIRS)
SUITE_PAIRS = {
    **{suite: (pair,) for suite, pair in FAST_PAIRS.items()},
    "heads": (
        ("ppo_ext_clip", "ppo_ext_gauss"),
        ("ppo_ext_beta", "ppo_ext_gauss"),
        ("ppo_ext_beta", "ppo_ext_clip"),
        ("ppo_ext_clip_nosde", "ppo_ext_gauss_nosde"),
        ("ppo_ext_beta", "ppo_ext_gauss_nosde"),
        ("ppo_ext_beta", "ppo_ext_clip_nosde"),
        ("ppo_ext_gauss", "ppo_ext_gauss_nosde"),
        ("ppo_ext_clip", "ppo_ext_clip_nosde"),
    ),
}
# Returns that mean "has learned the task": for Pendulum (no official threshold) a common choice,
# LunarLander's official one. Hopper's 1000 turned out to be the level of the alive bonus (about 1 per step for 1000
# steps), which a policy reaches by balancing in place: read it as "stays up", not as locomotion. HalfCheetah's is provisional.
THRESHOLDS = {
    "Pendulum-v1": -200.0,
    "LunarLanderContinuous-v3": 200.0,
    "Hopper-v5": 1000.0,
    "HalfCheetah-v5": 1000.0,
    "MountainCarContinuous-v0": 90.0,  # gymnasium's reward_threshold
}
