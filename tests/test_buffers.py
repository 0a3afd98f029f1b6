"""The rollout buffers that carry pi_old (sb3_ppo_ext.buffers)."""

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from helpers import TINY, copy_changes
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.buffers import (
    PiOldBuffer,
    PiOldDictRolloutBuffer,
    PiOldMaskableDictRolloutBuffer,
    PiOldMaskableRolloutBuffer,
    PiOldRecurrentDictRolloutBuffer,
    PiOldRecurrentRolloutBuffer,
    PiOldRolloutBuffer,
)
from sb3_ppo_ext.distributions import distributions_from_parameters
from sb3_ppo_ext.validation import InvalidSettingError

LSTM = dict(lstm_hidden_size=8, net_arch=[8])


class DictObsEnv(gym.Env):
    observation_space = spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.Box(-1, 1, (1,))})
    action_space = spaces.Box(-1, 1, (1,))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), float(-abs(action[0])), False, bool(self.np_random.random() < 0.1), {}


class MaskedEnv(InvalidActionEnvDiscrete):
    """sb3-contrib's masked test env, its states drawn from a seeded action space (reproducible runs)."""

    def __init__(self):
        super().__init__(dim=4, n_invalid_actions=1)
        self.action_space.seed(0)


class MaskedDictEnv(MaskedEnv):
    def __init__(self):
        super().__init__()
        self.observation_space = spaces.Dict({"x": self.observation_space})

    def reset(self, seed=None, options=None):
        obs, info = super().reset(seed=seed)
        return {"x": obs}, info

    def step(self, action):
        obs, *rest = super().step(action)
        return {"x": obs}, *rest


def quiet(model):
    model.set_logger(configure(None, []))
    return model


def build(family, dict_obs=False, **kwargs):
    if family == "ppo":
        env = make_vec_env(DictObsEnv if dict_obs else "Pendulum-v1", n_envs=2, seed=0)
        return quiet(PPOExt("MultiInputPolicy" if dict_obs else "MlpPolicy", env, **TINY, **kwargs))
    if family == "maskable":
        env = MaskedDictEnv() if dict_obs else MaskedEnv()  # one env, as sb3-contrib's tests
        return quiet(MaskablePPOExt("MultiInputPolicy" if dict_obs else "MlpPolicy", env, **TINY, **kwargs))
    env = make_vec_env(DictObsEnv if dict_obs else "Pendulum-v1", n_envs=2, seed=0)
    policy = "MultiInputLstmPolicy" if dict_obs else "MlpLstmPolicy"
    return quiet(RecurrentPPOExt(policy, env, policy_kwargs=LSTM, **TINY, **kwargs))


EXPECTED = {
    ("ppo", False): PiOldRolloutBuffer,
    ("ppo", True): PiOldDictRolloutBuffer,
    ("maskable", False): PiOldMaskableRolloutBuffer,
    ("maskable", True): PiOldMaskableDictRolloutBuffer,
    ("recurrent", False): PiOldRecurrentRolloutBuffer,
    ("recurrent", True): PiOldRecurrentDictRolloutBuffer,
}


@pytest.mark.parametrize("family", ["ppo", "maskable", "recurrent"])
@pytest.mark.parametrize("dict_obs", [False, True])
def test_each_family_hands_pi_old_to_a_buffer_that_carries_it(family, dict_obs):
    """
    With the KL penalty, every sample of a rollout carries pi_old: the policy's distribution on it before the
    update, in the buffer's flattened row order (padded sequences' valid steps for the recurrent buffers).
    """
    model = build(family, dict_obs, kl_coef=0.5)
    assert type(model.rollout_buffer) is EXPECTED[family, dict_obs]
    checked = []
    original = model.train

    def train():
        buffer = model.rollout_buffer
        assert not buffer.carries_pi_old  # a new rollout: nothing carried yet
        before = model._rollout_distributions()  # the policy has not changed yet
        original()
        assert buffer.carries_pi_old
        carried = distributions_from_parameters(buffer.distribution_kinds, [th.as_tensor(a) for a in buffer.old_distribution])
        for got, want in zip(carried, before, strict=True):
            for name in ("loc", "scale", "logits"):
                if hasattr(want, name):
                    assert th.equal(getattr(got, name), getattr(want, name)), name
        checked.append(before[0].batch_shape[0])

    model.train = train
    model.learn(2 * model.n_steps * model.n_envs)
    assert checked == [model.n_steps * model.n_envs] * 2
    assert "train/kl_penalty" in model.logger.name_to_value


# (family, upstream's buffer class, the class that replaces it)
UPSTREAM_BUFFERS = [
    ("ppo", RolloutBuffer, PiOldRolloutBuffer),
    ("ppo", DictRolloutBuffer, PiOldDictRolloutBuffer),
    ("maskable", MaskableRolloutBuffer, PiOldMaskableRolloutBuffer),
    ("maskable", MaskableDictRolloutBuffer, PiOldMaskableDictRolloutBuffer),
]
DICT_BUFFERS = (DictRolloutBuffer, MaskableDictRolloutBuffer)


@pytest.mark.parametrize("family, given, expected", UPSTREAM_BUFFERS)
def test_upstreams_own_buffer_classes_are_replaced_and_saved_as_such(family, given, expected, tmp_path):
    model = build(family, given in DICT_BUFFERS, rollout_buffer_class=given)
    assert type(model.rollout_buffer) is expected
    model.save(tmp_path / "model")
    cls = type(model)
    assert type(cls.load(tmp_path / "model", env=model.get_env()).rollout_buffer) is expected


class OwnBuffer(RolloutBuffer):
    """A user's own buffer class: kept as it is."""


class OwnMaskableBuffer(MaskableRolloutBuffer):
    pass


@pytest.mark.parametrize("family, own", [("ppo", OwnBuffer), ("maskable", OwnMaskableBuffer)])
def test_a_users_buffer_class_is_kept_and_refused_only_with_the_kl_penalty(family, own):
    """
    A user's own buffer class trains as the package's buffer does (the update's KL measured on a pass over its
    flattened rollout); the KL penalty, whose minibatches need pi_old, refuses it with a clear error.
    """
    logged = {}
    for name, kwargs in (("ours", {}), ("own", {"rollout_buffer_class": own})):
        model = build(family, **kwargs)
        model.learn(64)
        assert isinstance(model.rollout_buffer, PiOldBuffer) == (name == "ours")
        logged[name] = dict(model.logger.name_to_value)
    assert logged["own"]["train/kl"] == pytest.approx(logged["ours"]["train/kl"], rel=1e-4, abs=1e-9)
    with pytest.raises(InvalidSettingError, match=rf"rollout_buffer_class={own.__name__}.*kl_coef=1.0"):
        build(family, kl_coef=1.0, rollout_buffer_class=own)


def test_prepare_rollout_draws_no_random_numbers():
    model = build("ppo")
    model.learn(32)
    buffer = model.rollout_buffer
    buffer.generator_ready = False  # as after a collection (learn's update flattened it)
    buffer.observations = buffer.observations.reshape(32, 2, -1)
    for name in ("actions", "values", "log_probs", "advantages", "returns"):
        setattr(buffer, name, getattr(buffer, name).reshape(32, 2, -1))
    state = np.random.get_state()
    samples = list(buffer.rollout_samples(40))
    assert [len(s.actions) for s in samples] == [40, 24]
    after = np.random.get_state()
    assert all(np.array_equal(a, b) for a, b in zip(state[1:2], after[1:2], strict=True))
    assert state[2] == after[2]


def test_recurrent_collection_copy_matches_the_installed_upstream():
    """
    RecurrentPPOExt's squashed collection is a copy of the installed RecurrentPPO.collect_rollouts with one
    change (the env receives ``policy.unscale_action`` of the sample instead of the clipped sample): any other
    difference, e.g. a new sb3-contrib release changing the method, fails here.
    """
    removed, added = copy_changes(RecurrentPPO.collect_rollouts, RecurrentPPOExt._collect_squashed_rollouts)
    assert removed == [
        "clipped_actions = actions",
        "if isinstance(self.action_space, spaces.Box):",
        "clipped_actions = np.clip(actions, self.action_space.low, self.action_space.high)",
    ], (removed, added)
    assert added == ["clipped_actions = self.policy.unscale_action(actions)"], (removed, added)


def test_recurrent_buffer_is_replaced_with_upstreams_arguments():
    model = build("recurrent")
    stock = RecurrentPPO("MlpLstmPolicy", model.get_env(), policy_kwargs=LSTM, **TINY)
    ours, theirs = model.rollout_buffer, stock.rollout_buffer
    for name in ("buffer_size", "n_envs", "hidden_state_shape", "gamma", "gae_lambda", "device", "obs_shape", "action_dim"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert isinstance(ours, type(theirs))


@pytest.mark.parametrize("family, upstream, expected", UPSTREAM_BUFFERS)
def test_minibatches_from_the_tensor_rollout_equal_the_installed_upstreams(family, upstream, expected):
    """
    The buffers convert the rollout to tensors once and index minibatches from them: every field equals what
    the installed upstream's ``_get_samples`` builds from the same rows (a new or changed field fails here).
    """
    model = build(family, upstream in DICT_BUFFERS, kl_coef=0.5)
    assert type(model.rollout_buffer) is expected
    model.learn(model.n_steps * model.n_envs)
    buffer = model.rollout_buffer
    assert buffer.generator_ready
    rows = np.random.default_rng(0).permutation(buffer.buffer_size * buffer.n_envs)[:11]
    ours, theirs = buffer._get_samples(rows), upstream._get_samples(buffer, rows)
    assert ours._fields == (*theirs._fields, "old_distribution")
    for name in theirs._fields:
        want, got = getattr(theirs, name), getattr(ours, name)
        pairs = [(got[key], want[key]) for key in want] if isinstance(want, dict) else [(got, want)]
        for got_tensor, want_tensor in pairs:
            assert got_tensor.dtype == want_tensor.dtype and got_tensor.device == want_tensor.device, name
            assert th.equal(got_tensor, want_tensor), name
    for got, array in zip(ours.old_distribution, buffer.old_distribution, strict=True):
        assert th.equal(got, th.as_tensor(array[rows]))
