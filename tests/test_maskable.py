"""MaskablePPOExt (sb3_ppo_ext.maskable): each fault of an action mask is a ValueError naming action_masks.

In rollouts and in ``predict``.
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import MASK_ENVS, MASK_TINY, TINY_ONE_BATCH, ImageEnv, masked_kl_by_hand, quiet, weights
from masked_zoo_envs import OneValidActionEnv
from sb3_contrib import MaskablePPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete, InvalidActionEnvMultiBinary, InvalidActionEnvMultiDiscrete
from sb3_contrib.common.maskable.evaluation import evaluate_policy as maskable_evaluate_policy
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

from sb3_ppo_ext import MaskablePPOExt, PPOExt
from sb3_ppo_ext.callbacks import KLAdaptiveLR, ParameterScheduler, TrainingHealthGuard
from sb3_ppo_ext.distributions import analytic_kl, torch_distributions
from sb3_ppo_ext.envs import MaskedObservations, masks_of
from sb3_ppo_ext.maskable import MissingActionMasksWarning
from sb3_ppo_ext.reliability import ModelFileError


class FaultyMasks(gym.Wrapper):
    """The env's own masks for three steps, then ``fault(masks)``; records every action it receives."""

    def __init__(self, env: gym.Env, fault):
        super().__init__(env)
        self.fault, self.received = fault, []

    def step(self, action):
        self.received.append(action)
        return self.env.step(action)

    def action_masks(self):
        masks = np.asarray(self.env.unwrapped.action_masks())
        return masks if len(self.received) < 3 else self.fault(masks)


def _masked_env(space: str) -> gym.Env:

    if space == "multidiscrete":
        return InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=1)
    if space == "multibinary":
        return InvalidActionEnvMultiBinary(dims=4, n_invalid_actions=1)
    return InvalidActionEnvDiscrete(dim=12, n_invalid_actions=2)


MASK_FAULTS = {  # name -> (action space, fault, message)
    "no action": ("discrete", np.zeros_like, r"action_masks row 0 allows no action of Discrete\(12\)"),
    "transposed": ("discrete", lambda m: m.reshape(-1, 1), r"action_masks of shape \(1, 12, 1\).*expected 1 mask\(s\) of 12"),
    "strings": ("discrete", lambda m: m.astype(str), r"action_masks of dtype <U5.*expected 1 mask\(s\) of 12 booleans"),
    "other numbers": ("discrete", lambda m: m * 2, r"action_masks of dtype int64 hold values other than 0 and 1 \(e\.g\. 2\)"),
    "resized": ("discrete", lambda m: m[:-1], r"action_masks of shape \(1, 11\).*expected 1 mask\(s\) of 12"),
    "None": ("discrete", lambda m: None, r"action_masks hold None.*expected 1 mask\(s\) of 12"),
    "no value of a MultiDiscrete block": (
        "multidiscrete",
        lambda m: np.concatenate([m[:3], np.zeros(4, dtype=bool)]),
        r"action_masks row 0 allows no value of sub-action 1 \(mask positions 3:7\) of MultiDiscrete\(\[3 4\]\)",
    ),
    "no value of a binary action": (
        "multibinary",
        lambda m: np.concatenate([m[:2], [False, False], m[4:]]),
        r"action_masks row 0 allows no value of sub-action 1 \(mask positions 2:4\) of MultiBinary\(4\)",
    ),
}


@pytest.mark.parametrize("fault", list(MASK_FAULTS))
def test_a_bad_mask_in_a_rollout_stops_it_before_the_env_gets_an_action(fault: str):
    space, change, message = MASK_FAULTS[fault]

    env = FaultyMasks(_masked_env(space), change)
    model = MaskablePPOExt("MlpPolicy", env, **TINY_ONE_BATCH)
    with pytest.raises(ValueError, match=r"env\.action_masks\(\) during the rollout: " + message):
        model.learn(64)
    assert len(env.received) == 3  # no action was chosen with the bad masks


@pytest.mark.parametrize("fault", [name for name in MASK_FAULTS if name != "None"])  # predict(action_masks=None): unmasked
def test_a_bad_mask_in_predict_is_the_same_error(fault: str):
    space, change, message = MASK_FAULTS[fault]

    env = _masked_env(space)
    model = MaskablePPOExt("MlpPolicy", env, **TINY_ONE_BATCH)
    obs, _ = env.reset(seed=0)
    bad = np.stack([change(np.asarray(env.action_masks()))])  # as the rollout stacks one env's masks
    with pytest.raises(ValueError, match=r"MaskablePPOExt\.predict: " + message):
        model.predict(obs, action_masks=bad)


def test_predict_names_the_row_of_a_batch_and_refuses_a_transposed_batch_mask():

    env = _masked_env("discrete")
    model = MaskablePPOExt("MlpPolicy", env, **TINY_ONE_BATCH)
    obs, _ = env.reset(seed=0)
    masks = np.stack([env.action_masks()] * 2)
    model.predict(np.stack([obs] * 2), action_masks=masks.astype(np.float32))  # 0/1 numbers are masks too
    with pytest.raises(ValueError, match=r"action_masks of shape \(12, 2\).*expected 2 mask\(s\) of 12 booleans each"):
        model.predict(np.stack([obs] * 2), action_masks=masks.T)  # the right size: upstream reshapes it
    masks[1] = False
    with pytest.raises(ValueError, match=r"action_masks row 1 allows no action"):
        model.predict(np.stack([obs] * 2), action_masks=masks)


@pytest.mark.parametrize("env_name", list(MASK_ENVS))
@pytest.mark.parametrize("extra", [{}, dict(clip_range_vf=0.1, target_kl=0.005, ent_coef=0.01)], ids=["plain", "vf_kl_ent"])
def test_maskable_trains_bit_for_bit_like_maskable_ppo(env_name, extra):
    trained = []
    for cls in (MaskablePPO, MaskablePPOExt):
        model = cls("MlpPolicy", MASK_ENVS[env_name](), **MASK_TINY, **extra)
        model.learn(192)
        trained.append(weights(model))
    assert th.equal(*trained)


@pytest.mark.parametrize("scale", [1.0, 60.0])
def test_masked_kl_matches_a_hand_computation_and_is_finite(scale):
    from sb3_contrib.common.maskable.distributions import MaskableCategoricalDistribution

    gen = th.Generator().manual_seed(0)
    p_logits, q_logits = scale * th.randn(32, 6, generator=gen), scale * th.randn(32, 6, generator=gen)
    mask = th.rand(32, 6, generator=gen) > 0.4
    mask[:, 0] = True
    dists = []
    for logits in (p_logits, q_logits):
        dist = MaskableCategoricalDistribution(6).proba_distribution(logits)
        dist.apply_masking(mask)
        dists.append(torch_distributions(dist))
    kl = analytic_kl(*dists)
    assert th.isfinite(kl).all()
    th.testing.assert_close(kl.double(), masked_kl_by_hand(p_logits, q_logits, mask), rtol=1e-4, atol=1e-5)
    assert th.equal(analytic_kl(dists[0], dists[0]), th.zeros(32))


@pytest.mark.parametrize("env_name", list(MASK_ENVS))
def test_maskable_kl_penalty_and_diagnostics(env_name):
    model = quiet(
        MaskablePPOExt(
            "MlpPolicy", MASK_ENVS[env_name](), kl_coef=1.0, kl_target=0.01, clip_range_vf=0.2, vf_clip_mode="max", **MASK_TINY
        )
    )
    model.learn(128)
    logged = model.logger.name_to_value
    for key in (
        "train/kl",
        "train/kl_max",
        "train/kl_penalty",
        "train/kl_coef",
        "train/clip_fraction",
        "train/clip_fraction_vf",
    ):
        assert np.isfinite(logged[key]), key
    assert model.current_kl_coef != 1.0  # the beta rule ran
    # The logged KL is the masked KL(pi_old || pi_new): 0 for the policy against itself after the update.
    assert 0 < logged["train/kl"] <= logged["train/kl_max"]


def test_maskable_frozen_policy_has_zero_kl_penalty():
    model = quiet(MaskablePPOExt("MlpPolicy", MASK_ENVS["multidiscrete"](), kl_coef=1.0, learning_rate=0.0, **MASK_TINY))
    model.learn(64)
    assert model.logger.name_to_value["train/kl_penalty"] == 0.0
    assert model.logger.name_to_value["train/kl"] == 0.0


def test_masked_actions_are_never_taken_or_predicted():
    env = MASK_ENVS["discrete"]()
    model = MaskablePPOExt("MlpPolicy", env, kl_coef=0.5, **MASK_TINY)
    model.learn(128)
    obs, _ = env.reset(seed=1)
    for _ in range(20):
        masks = env.action_masks()
        action, _ = model.predict(obs, action_masks=masks)
        assert masks[int(action)]
        obs, *_ = env.step(action)
    stored = model.rollout_buffer.actions.reshape(-1).astype(int)
    masks = model.rollout_buffer.action_masks.reshape(-1, 12)
    assert masks[np.arange(len(stored)), stored].all()
    mean_reward, _ = maskable_evaluate_policy(model, MASK_ENVS["discrete"](), n_eval_episodes=2, warn=False)
    assert np.isfinite(mean_reward)


def test_maskable_bad_input():
    with pytest.raises(ValueError, match="squash_output=True"):
        MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), policy_kwargs=dict(squash_output=True))
    with pytest.raises(ValueError, match="kl_target"):
        MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), kl_target=0.01)
    with pytest.raises(ValueError, match="vf_clip_mode"):
        MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), vf_clip_mode="huber")
    model = MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), **MASK_TINY)
    obs, _ = model.env.reset(), None
    with pytest.raises(ValueError, match=r"action_masks of shape \(5,\).*12"):
        model.predict(obs, action_masks=np.ones(5, dtype=bool))


class WrongMaskEnv(InvalidActionEnvDiscrete):
    def action_masks(self):
        return super().action_masks()[:-1]


def test_env_masks_of_the_wrong_size_are_a_clear_error():
    model = MaskablePPOExt("MlpPolicy", WrongMaskEnv(dim=12, n_invalid_actions=6), **MASK_TINY)
    with pytest.raises(ValueError, match=r"env.action_masks\(\).*expected 1 mask\(s\) of 12"):
        model.learn(64)


def test_maskable_save_load_and_upstream_files(tmp_path):
    model = MaskablePPOExt("MlpPolicy", MASK_ENVS["discrete"](), kl_coef=1.0, kl_target=0.01, **MASK_TINY)
    model.learn(64)
    model.save(tmp_path / "ext")
    loaded = MaskablePPOExt.load(tmp_path / "ext", env=MASK_ENVS["discrete"]())
    assert loaded.current_kl_coef == model.current_kl_coef and loaded.kl_target == 0.01
    assert th.equal(weights(loaded), weights(model))
    loaded.learn(64, reset_num_timesteps=False)

    upstream = MaskablePPO("MlpPolicy", MASK_ENVS["discrete"](), **MASK_TINY)
    upstream.learn(64)
    upstream.save(tmp_path / "upstream")
    from_upstream = MaskablePPOExt.load(tmp_path / "upstream", env=MASK_ENVS["discrete"]())
    assert type(from_upstream.policy) is MaskableActorCriticPolicy and from_upstream.kl_coef == 0
    assert th.equal(weights(from_upstream), weights(upstream))
    quiet(from_upstream).learn(64, reset_num_timesteps=False)  # upstream policy, engine's update

    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=16).save(tmp_path / "ppo")
    with pytest.raises(ModelFileError, match="MaskablePPOExt"):
        MaskablePPOExt.load(tmp_path / "ppo")
    with pytest.raises(ModelFileError):
        PPOExt.load(tmp_path / "upstream")


def test_env_masks_are_checked_without_an_extra_env_call():
    env = make_vec_env(MASK_ENVS["discrete"], n_envs=1, seed=0)
    calls = []
    original = env.env_method

    def env_method(name, *args, **kwargs):
        calls.append(name)
        return original(name, *args, **kwargs)

    env.env_method = env_method
    model = MaskablePPOExt("MlpPolicy", env, **MASK_TINY)
    model.learn(3 * 64)
    assert calls.count("action_masks") == 3 * 64  # upstream's one per step: its masks are the ones checked
    model.save(io.BytesIO())  # the checked env is not part of a saved model


def test_maskable_vec_normalize_and_callbacks(tmp_path):
    # The masked test envs have discrete observations: VecNormalize normalises their rewards only.
    venv = VecNormalize(make_vec_env(MASK_ENVS["multibinary"], n_envs=2, seed=0), norm_obs=False)
    model = MaskablePPOExt("MlpPolicy", venv, kl_coef=1.0, kl_target=0.01, **MASK_TINY)
    guard = TrainingHealthGuard(save_path=str(tmp_path / "guard"))
    schedule = ParameterScheduler({"ent_coef": dict(kind="linear", start=0.01, end=0.0)})
    callbacks = [KLAdaptiveLR(target_kl=0.01), guard, schedule]
    model.learn(256, callback=callbacks)
    assert model.ent_coef < 0.01 and model.policy.optimizer.param_groups[0]["lr"] != 3e-4  # both callbacks acted
    model.save(tmp_path / "model")
    loaded = MaskablePPOExt.load(tmp_path / "model", env=venv)
    assert th.equal(weights(loaded), weights(model)) and loaded.current_kl_coef == model.current_kl_coef


class DictImageEnv(ImageEnv):
    """A Dict observation holding a channel-last image and a vector."""

    observation_space = spaces.Dict(
        {"image": ImageEnv.observation_space, "vector": spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)}
    )


@pytest.mark.parametrize("env_class, policy", [(ImageEnv, "CnnPolicy"), (DictImageEnv, "MultiInputPolicy")])
def test_maskable_predict_and_evaluation_on_channel_last_images(env_class, policy):
    """predict(obs, action_masks=...) counts the observations as the policy batches them (after its transpose)."""
    from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

    model = MaskablePPOExt(policy, env_class(), n_steps=16, batch_size=8, n_epochs=1, seed=0)
    obs, _ = env_class().reset()
    masks = env_class().action_masks()
    action, _ = model.predict(obs, action_masks=masks)
    assert action.shape == () and masks[action]
    batch = {key: np.stack([value] * 2) for key, value in obs.items()} if isinstance(obs, dict) else np.stack([obs] * 2)
    actions, _ = model.predict(batch, action_masks=np.stack([masks] * 2))
    assert actions.shape == (2,) and masks[actions].all()
    with pytest.raises(ValueError, match=r"action_masks of shape \(3,\).*expected 2 mask\(s\)"):
        model.predict(batch, action_masks=masks)
    # sb3-contrib's evaluation passes the masks to predict with the env's channel-last observations.
    maskable_evaluate_policy(model, env_class(), n_eval_episodes=2, warn=False)
    evaluation = MaskableEvalCallback(env_class(), eval_freq=8, n_eval_episodes=2, warn=False, verbose=0)
    quiet(model).learn(16, callback=evaluation)
    assert evaluation.last_mean_reward == 1.0


# --- predict without masks ------------------------------------------------------------------


class DictOneValidAction(OneValidActionEnv):
    """OneValidAction-v0 with a Dict observation ``{"x": ...}``."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict({"x": self.observation_space})

    def reset(self, **kwargs):
        obs, info = super().reset(**kwargs)
        return {"x": obs}, info

    def step(self, action):
        obs, *rest = super().step(action)
        return ({"x": obs}, *rest)


@pytest.fixture(scope="module")
def masked_model_files(tmp_path_factory) -> dict[str, Path]:
    """Files of models trained with masks (``learn(use_masking=True)``), a Box and a Dict observation one."""
    folder = tmp_path_factory.mktemp("masked_models")
    for name, env, policy in (("box", OneValidActionEnv, "MlpPolicy"), ("dict", DictOneValidAction, "MultiInputPolicy")):
        model = MaskablePPOExt(policy, make_vec_env(env, n_envs=2, seed=0), **MASK_TINY)
        model.learn(64)
        model.save(folder / name)
    return {"box": folder / "box.zip", "dict": folder / "dict.zip"}


def _missing_mask_warnings(predict) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predict()
    return sum(issubclass(w.category, MissingActionMasksWarning) for w in caught)


# What users do to observations of MaskedObservations before predict: each either keeps the masks or drops them.
BOX_OBSERVATION_CHANGES = {
    "copy()": lambda obs: obs.copy(),
    "[:1]": lambda obs: obs[:1],
    "[0]": lambda obs: obs[0],
    "* 1": lambda obs: obs * 1,
    "astype": lambda obs: obs.astype(np.float64),
    "np.asarray": np.asarray,
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "pickle": lambda obs: pickle.loads(pickle.dumps(obs)),
}
DICT_OBSERVATION_CHANGES = {
    "copy()": lambda obs: obs.copy(),
    "dict()": dict,
    "{**obs}": lambda obs: {**obs},
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "pickle": lambda obs: pickle.loads(pickle.dumps(obs)),
}


@pytest.mark.parametrize(
    "kind, change",
    [("box", name) for name in BOX_OBSERVATION_CHANGES] + [("dict", name) for name in DICT_OBSERVATION_CHANGES],
)
def test_masks_that_fall_off_an_observation_are_never_dropped_silently(masked_model_files, kind: str, change: str):
    """Observations of MaskedObservations, changed: predict acts with the masks they still carry, or warns."""
    model = MaskablePPOExt.load(masked_model_files[kind])
    env_class = OneValidActionEnv if kind == "box" else DictOneValidAction
    obs = MaskedObservations(make_vec_env(env_class, n_envs=2, seed=1)).reset()
    changed = (BOX_OBSERVATION_CHANGES if kind == "box" else DICT_OBSERVATION_CHANGES)[change](obs)
    carried = masks_of(changed)
    assert _missing_mask_warnings(lambda: model.predict(changed, deterministic=True)) == (carried is None)
    if carried is not None:  # kept: the actions are the allowed ones
        actions, _ = model.predict(changed, deterministic=True)
        assert carried[np.arange(len(carried)), actions].all()


@pytest.mark.parametrize("wrapper", [lambda venv: VecNormalize(venv), lambda venv: VecFrameStack(venv, 1)])
def test_a_wrapper_above_masked_observations_makes_predict_warn(masked_model_files, wrapper):
    model = MaskablePPOExt.load(masked_model_files["box"])
    venv = wrapper(MaskedObservations(make_vec_env(OneValidActionEnv, n_envs=2, seed=1)))
    assert _missing_mask_warnings(lambda: evaluate_policy(model, venv, n_eval_episodes=1)) > 0  # each step's predict


def test_predict_without_masks_warns_at_every_call_of_a_model_that_acts_with_masks(masked_model_files, tmp_path):
    trained = MaskablePPOExt.load(masked_model_files["box"])
    assert trained.trained_with_masks is True and trained.env is None  # saved with the model
    obs = np.zeros((2, 1), dtype=np.float32)
    assert _missing_mask_warnings(lambda: trained.predict(obs)) == 1
    assert _missing_mask_warnings(lambda: trained.predict(obs)) == 1  # every call, not once per model
    assert _missing_mask_warnings(lambda: trained.predict(obs, action_masks=np.ones((2, 8), dtype=bool))) == 0
    trained.save(tmp_path / "again")
    assert _missing_mask_warnings(lambda: MaskablePPOExt.load(tmp_path / "again").predict(obs)) == 1
    # Before any learn: the env's masks decide.
    assert _missing_mask_warnings(lambda: MaskablePPOExt("MlpPolicy", OneValidActionEnv(), **MASK_TINY).predict(obs)) == 1
    unmasked_env = MaskablePPOExt("MlpPolicy", "CartPole-v1", **MASK_TINY)
    assert _missing_mask_warnings(lambda: unmasked_env.predict(np.zeros((2, 4), dtype=np.float32))) == 0


def test_predict_without_masks_is_silent_for_a_model_trained_without_them():
    model = MaskablePPOExt("MlpPolicy", make_vec_env(OneValidActionEnv, n_envs=2, seed=0), **MASK_TINY)
    model.learn(64, use_masking=False)
    assert model.trained_with_masks is False
    assert _missing_mask_warnings(lambda: model.predict(np.zeros((2, 1), dtype=np.float32))) == 0
    model.learn(64)
    assert _missing_mask_warnings(lambda: model.predict(np.zeros((2, 1), dtype=np.float32))) == 1
