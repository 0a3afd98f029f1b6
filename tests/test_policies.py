"""The package's policies: what they add to upstream's on the hot path (foreach Adam, one finite check in forward)."""

import contextlib

import numpy as np
import pytest
import torch as th
from helpers import copy_changes
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from torch import nn

from sb3_ppo_ext import MaskablePPOExt, PPOExt, RecurrentPPOExt
from sb3_ppo_ext.policies import RecurrentPPOExtPolicy
from sb3_ppo_ext.speed import lean_call, lean_lstm, runs_hooks, with_foreach_adam


def test_with_foreach_adam_keeps_sb3s_eps_and_the_users_choices():
    assert with_foreach_adam({}) == {"optimizer_kwargs": {"eps": 1e-5, "foreach": True}}
    # SB3 drops eps=1e-5 once optimizer_kwargs are given: so does this (bit for bit with upstream).
    assert with_foreach_adam({"optimizer_kwargs": {"betas": (0.8, 0.9)}}) == {
        "optimizer_kwargs": {"betas": (0.8, 0.9), "foreach": True}
    }
    assert with_foreach_adam({"optimizer_kwargs": {"foreach": False}}) == {"optimizer_kwargs": {"foreach": False}}
    assert with_foreach_adam({"optimizer_class": th.optim.SGD}) == {"optimizer_class": th.optim.SGD}


@pytest.mark.parametrize(
    "cls, policy, env", [(PPOExt, "MlpPolicy", "Pendulum-v1"), (RecurrentPPOExt, "MlpLstmPolicy", "Pendulum-v1")]
)
def test_policies_build_foreach_adam_with_sb3s_eps(cls, policy, env):
    model = cls(policy, env, n_steps=16, batch_size=16)
    (group,) = model.policy.optimizer.param_groups
    assert group["foreach"] is True and group["eps"] == 1e-5
    stock = PPO("MlpPolicy", env).policy.optimizer.param_groups[0]
    assert stock["eps"] == group["eps"] and stock["foreach"] is None  # upstream: the per-tensor loop on CPU


def test_maskable_policy_builds_foreach_adam():
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete

    model = MaskablePPOExt("MlpPolicy", InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1), n_steps=16, batch_size=16)
    assert model.policy.optimizer.param_groups[0]["foreach"] is True
    env = InvalidActionEnvDiscrete(dim=4, n_invalid_actions=1)
    fast = MaskablePPOExt("MlpPolicy", env, n_steps=16, batch_size=16, policy_kwargs=dict(fast=True))
    assert fast.policy.optimizer.param_groups[0]["fused"] is True and fast.policy.fast is True
    fast.learn(32)


def test_forward_raises_for_a_non_finite_log_prob_and_leaves_torchs_checks_on():
    model = PPOExt("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    obs = th.as_tensor(np.array([[1.0, 0.0, 0.5], [np.nan, 0.0, 0.0]], dtype=np.float32))
    with pytest.raises(ValueError, match="non-finite log-probability of the sampled actions"), th.no_grad():
        model.policy(obs)
    assert th.distributions.Distribution._validate_args is True  # restored after the raise
    actions, values, log_prob = model.policy(obs[:1])
    assert th.isfinite(log_prob).all() and actions.shape == (1, 1) and values.shape == (1, 1)


def test_a_sb3_whose_squash_output_reads_another_attribute_is_an_error_at_construction(monkeypatch):
    """SB3's collection rescales (not clips) when policy.squash_output is true; it must read what the head sets."""
    from stable_baselines3.common.policies import BasePolicy

    monkeypatch.setattr(BasePolicy, "squash_output", property(lambda self: getattr(self, "_squashes", False)))
    with pytest.raises(RuntimeError, match="does not read the _squash_output attribute"):
        PPOExt("MlpPolicy", "Pendulum-v1")
    PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(squash_output=False))  # nothing to rescale: fine


def test_the_policies_live_in_policies_and_keep_their_old_import_paths():
    """Model files that name the policy classes under sb3_ppo_ext.maskable / .recurrent load."""
    from sb3_ppo_ext import maskable, policies, recurrent

    for name in ("MaskablePPOExtPolicy", "MaskablePPOExtCnnPolicy", "MaskablePPOExtMultiInputPolicy"):
        assert getattr(maskable, name) is getattr(policies, name) and getattr(policies, name).__module__ == policies.__name__
    for name in ("RecurrentPPOExtPolicy", "RecurrentPPOExtCnnPolicy", "RecurrentPPOExtMultiInputPolicy"):
        assert getattr(recurrent, name) is getattr(policies, name)
    assert MaskablePPOExt.policy_aliases["MlpPolicy"] is policies.MaskablePPOExtPolicy
    assert RecurrentPPOExt.policy_aliases["MlpLstmPolicy"] is policies.RecurrentPPOExtPolicy


@pytest.mark.parametrize("protocol", [2, 4])
def test_model_family_reads_the_policy_class_from_the_pickle_without_running_it(protocol):
    """Files name their policy class in sb3_ppo_ext.policies now, in sb3_ppo_ext.maskable / .recurrent before."""
    import base64
    import pickle

    from sb3_ppo_ext import policies
    from sb3_ppo_ext.reliability import model_family

    def data(cls, module=None):
        serialized = base64.b64encode(pickle.dumps(cls, protocol=protocol)).decode()
        return {"policy_class": {":serialized:": serialized, "__module__": module or cls.__module__}}

    assert model_family(data(policies.MaskablePPOExtMultiInputPolicy)) == "MaskablePPO"
    assert model_family(data(policies.RecurrentPPOExtCnnPolicy)) == "RecurrentPPO"
    assert model_family(data(policies.MaskablePPOExtPolicy, module="sb3_ppo_ext.maskable")) == "MaskablePPO"  # older files
    not_a_pickle = {"policy_class": {":serialized:": "not base64!", "__module__": "sb3_ppo_ext.policies"}}
    assert model_family(not_a_pickle) == "unknown"


@pytest.mark.parametrize("cls, policy", [(PPOExt, "MlpPolicy"), (RecurrentPPOExt, "MlpLstmPolicy")])
def test_fast_mode_runs_fused_adam_trains_close_to_the_default_and_is_saved(cls, policy, tmp_path):
    """fast=True: fused Adam, the same updates to float rounding (not bit for bit), restored by load."""
    trained = {}
    for fast in (False, True):
        model = cls(policy, make_vec_env("Pendulum-v1", n_envs=2, seed=0), n_steps=32, batch_size=32, n_epochs=2, seed=0,
                    policy_kwargs=dict(fast=fast))  # fmt: skip
        group = model.policy.optimizer.param_groups[0]
        assert (group["fused"], group["foreach"]) == ((True, None) if fast else (None, True)) and group["eps"] == 1e-5
        model.learn(128)
        trained[fast] = model.policy.parameters_to_vector()
    np.testing.assert_allclose(trained[True], trained[False], rtol=0, atol=1e-4)
    model.save(tmp_path / "fast")
    loaded = cls.load(tmp_path / "fast")
    assert loaded.policy.fast is True and loaded.policy.optimizer.param_groups[0]["fused"] is True
    with pytest.raises(ValueError, match="fast"):
        cls(policy, "Pendulum-v1", policy_kwargs=dict(fast="yes"))


def test_fast_sequence_pass_equals_upstreams_step_by_step_loop():
    """RecurrentPPOExt's fast mode runs each padded sequence in one LSTM call: upstream's values to float rounding."""
    env = make_vec_env("Pendulum-v1", n_envs=3, seed=0)
    model = RecurrentPPOExt("MlpLstmPolicy", env, n_steps=64, batch_size=50, seed=0, policy_kwargs=dict(lstm_hidden_size=8))
    model.learn(192)  # episodes of 200 steps: minibatches with episode starts inside and sequences of unequal length
    policy = model.policy
    compared = 0
    for samples in model.rollout_buffer.get(50):
        actions = samples.actions
        policy.fast = False
        slow = policy.evaluate_actions_and_distribution(
            samples.observations, actions, samples.lstm_states, samples.episode_starts, False
        )
        policy.fast = True
        fast = policy.evaluate_actions_and_distribution(
            samples.observations, actions, samples.lstm_states, samples.episode_starts, False
        )
        valid = samples.mask > 1e-8
        for got, want in zip(fast[:2], slow[:2], strict=True):
            th.testing.assert_close(got.flatten()[valid], want.flatten()[valid], rtol=1e-5, atol=1e-5)
        compared += int(samples.episode_starts.sum() > 0)
    assert compared > 0  # some minibatch had a sequence that starts an episode (upstream's loop case)


def _upstream_forward(policy, obs, deterministic, masks=None):
    """The step through upstream's forward (SB3's or sb3-contrib's)."""
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
    from stable_baselines3.common.policies import ActorCriticPolicy

    with th.no_grad():
        if masks is None and not isinstance(policy, MaskableActorCriticPolicy):
            return ActorCriticPolicy.forward(policy, obs, deterministic)
        return MaskableActorCriticPolicy.forward(policy, obs, deterministic, action_masks=masks)


def _direct_and_upstream(model, obs, deterministic, masks=None, plan=False):
    from sb3_ppo_ext import speed

    kwargs = {} if masks is None else {"action_masks": masks}
    calls = []
    direct_functions = {name: getattr(speed, name) for name in ("direct_gaussian", "direct_categorical")}
    th.manual_seed(7)
    with pytest.MonkeyPatch.context() as patch:
        for name, function in direct_functions.items():
            patch.setattr(speed, name, lambda *a, _f=function, **k: calls.append(1) or _f(*a, **k))
        with th.no_grad(), model.policy.acting() if plan else contextlib.nullcontext():
            assert (model.policy._acting_plan is not None) == plan
            direct = model.policy(obs, deterministic, **kwargs)
    direct_state = th.get_rng_state()
    th.manual_seed(7)
    upstream = _upstream_forward(model.policy, obs, deterministic, masks)
    assert calls == [1], "forward did not take the direct path"
    assert all(th.equal(a, b) and a.dtype == b.dtype for a, b in zip(direct, upstream, strict=True))
    assert th.equal(direct_state, th.get_rng_state())  # the same random draws


@pytest.mark.parametrize(
    "env_id, policy_kwargs",
    [
        ("Pendulum-v1", dict(squash_output=False)),
        ("Pendulum-v1", dict()),  # the squashed default
        ("Pendulum-v1", dict(state_dependent_std=True)),
        ("Pendulum-v1", dict(squash_output=False, state_dependent_std=True, log_std_init=-1.0)),
        ("CartPole-v1", dict()),
        ("Pendulum-v1", dict(use_sde=True)),  # gSDE under the squashed head
        ("Pendulum-v1", dict(use_sde=True, squash_output=False)),
        ("Pendulum-v1", dict(use_sde=True, squash_output=False, full_std=False, use_expln=True)),
    ],
    ids=[
        "gaussian",
        "squashed",
        "squashed_state_std",
        "gaussian_state_std",
        "categorical",
        "sde_squashed",
        "sde",
        "sde_expln",
    ],
)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize("plan", [False, True], ids=["modules", "acting_plan"])
def test_forward_without_distribution_objects_is_upstreams_bit_for_bit(env_id, policy_kwargs, deterministic, n_envs, plan):
    """
    The direct rollout step, with the networks called as modules or run from the acting plan (as in a
    collection): upstream's actions, values, log-probabilities, random draws and pi_old parameters.
    """
    env = make_vec_env(env_id, n_envs=n_envs, seed=0)
    policy_kwargs = dict(policy_kwargs)
    use_sde = policy_kwargs.pop("use_sde", False)
    model = PPOExt("MlpPolicy", env, policy_kwargs=policy_kwargs, use_sde=use_sde, seed=0)
    with th.no_grad():  # a head whose outputs are not all zero: the comparison covers the arithmetic
        for parameter in model.policy.parameters():
            parameter.add_(0.3 * th.randn_like(parameter))
    obs = th.as_tensor(env.reset(), dtype=th.float32)
    _direct_and_upstream(model, obs, deterministic, plan=plan)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("plan", [False, True], ids=["modules", "acting_plan"])
def test_maskable_forward_without_distribution_objects_is_upstreams_bit_for_bit(masked, deterministic, plan):
    from sb3_contrib.common.envs import InvalidActionEnvDiscrete

    env = make_vec_env(lambda: InvalidActionEnvDiscrete(dim=6, n_invalid_actions=3), n_envs=3, seed=0)
    model = MaskablePPOExt("MlpPolicy", env, seed=0)
    obs = th.as_tensor(env.reset(), dtype=th.float32)
    masks = np.stack(env.env_method("action_masks")) if masked else None
    _direct_and_upstream(model, obs, deterministic, masks, plan=plan)


def test_heads_without_a_direct_step_run_upstreams_forward():
    """The Beta head, MultiDiscrete and the LSTM policies sample through upstream's distribution objects."""
    from sb3_contrib.common.envs import InvalidActionEnvMultiDiscrete

    cases = [
        (PPOExt, "MlpPolicy", "Pendulum-v1", dict(policy_kwargs=dict(action_dist="beta"))),
        (MaskablePPOExt, "MlpPolicy", InvalidActionEnvMultiDiscrete(dims=[3, 4], n_invalid_actions=2), dict()),
        (RecurrentPPOExt, "MlpLstmPolicy", "CartPole-v1", dict()),
    ]
    for cls, policy, env_id, kwargs in cases:
        model = cls(policy, env_id, n_steps=16, batch_size=16, **kwargs)
        model.learn(16)
        assert model.policy.direct_head() is None, (cls.__name__, kwargs)


def _lean_networks() -> list[nn.Module]:
    th.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh()),
        nn.Linear(5, 3),
        nn.Sequential(nn.Linear(5, 8), nn.ELU(), nn.Sequential(nn.Linear(8, 4), nn.ReLU(inplace=True))),  # called as modules
        nn.Sequential(),
    ]


@pytest.mark.parametrize("index", range(4))
def test_lean_call_is_the_modules_call_bit_for_bit_values_and_gradients(index):
    network = _lean_networks()[index]
    x = th.randn(7, 5, generator=th.Generator().manual_seed(1))
    results = []
    for call in (lambda n, v: n(v), lean_call):
        network.zero_grad()
        inputs = x.clone().requires_grad_(True)
        out = call(network, inputs)
        out.square().sum().backward()
        results.append((out.detach(), inputs.grad, [p.grad.clone() for p in network.parameters()]))
    (out_a, grad_a, params_a), (out_b, grad_b, params_b) = results
    assert th.equal(out_a, out_b) and th.equal(grad_a, grad_b)
    assert all(th.equal(a, b) for a, b in zip(params_a, params_b, strict=True))


def test_lean_call_runs_the_hooks_of_a_layer_and_of_every_module():
    """A network with a hook, or any hook registered for every module, is called the usual way: the hooks run."""
    network = _lean_networks()[0]
    x = th.randn(2, 5)
    assert not runs_hooks(network[0])
    seen = []
    handle = network[2].register_forward_hook(lambda module, args, output: seen.append("own"))
    assert runs_hooks(network[2]) and not runs_hooks(network)
    lean_call(network, x)
    handle.remove()
    for register in (nn.modules.module.register_module_forward_hook, nn.modules.module.register_module_forward_pre_hook):
        handle = register(lambda module, *args: seen.append("global") if module is network[0] else None)
        # torch keeps the hooks for every module where runs_hooks reads them (fails if a torch release moves them)
        assert runs_hooks(network[0])
        lean_call(network, x)
        handle.remove()
    assert seen == ["own", "global", "global"] and not runs_hooks(network[0])


def test_recurrent_sequence_copy_matches_the_installed_upstream():
    """
    The recurrent policy's ``_process_sequence`` is sb3-contrib's with one change (the states are multiplied by
    ``1 - episode_start`` only at steps where some sequence starts): any other difference fails here.
    """
    removed, added = copy_changes(RecurrentActorCriticPolicy._process_sequence, RecurrentPPOExtPolicy._process_sequence)
    assert removed == [
        "if th.all(episode_starts == 0.0):",
        "lstm_output, lstm_states = lstm(features_sequence, lstm_states)",
        "for features, episode_start in zip(features_sequence, episode_starts, strict=True):",
        "hidden, lstm_states = lstm(features.unsqueeze(dim=0), ((1.0 - episode_start).view(1, n_seq, 1) * lstm_states[0], "
        "(1.0 - episode_start).view(1, n_seq, 1) * lstm_states[1]))",
    ], (removed, added)
    assert added == [
        "resets = (episode_starts != 0.0).any(dim=1).tolist()",
        "if not any(resets):",
        "lstm_output, lstm_states = speed.lean_lstm(lstm, features_sequence, lstm_states)",
        "weights = speed.lstm_weights(lstm)",
        "for features, episode_start, reset in zip(features_sequence, episode_starts, resets, strict=True):",
        "if reset:",
        "lstm_states = ((1.0 - episode_start).view(1, n_seq, 1) * lstm_states[0], "
        "(1.0 - episode_start).view(1, n_seq, 1) * lstm_states[1])",
        "hidden, lstm_states = speed.lean_lstm(lstm, features.unsqueeze(dim=0), lstm_states, weights)",
    ], (removed, added)


@pytest.mark.parametrize(
    "kwargs",
    [dict(), dict(num_layers=2, dropout=0.3), dict(batch_first=True), dict(bidirectional=True), dict(bias=False)],
    ids=["plain", "two_layers_dropout", "batch_first", "bidirectional", "no_bias"],
)
def test_lean_lstm_is_the_modules_call_bit_for_bit(kwargs):
    """Values, gradients and dropout's random draws of ``lean_lstm``: the module's own, in training mode."""
    lstm = nn.LSTM(4, 5, **kwargs)
    generator = th.Generator().manual_seed(0)
    layers = lstm.num_layers * (2 if lstm.bidirectional else 1)
    x = th.randn(3, 6, 4, generator=generator)
    states = tuple(th.randn(layers, 6 if not lstm.batch_first else 3, 5, generator=generator) for _ in range(2))
    results = []
    for call in (lambda *args: lstm(*args), lambda *args: lean_lstm(lstm, *args)):
        lstm.zero_grad()
        th.manual_seed(1)
        inputs = x.clone().requires_grad_(True)
        initial = tuple(state.clone().requires_grad_(True) for state in states)
        output, (h, c) = call(inputs, initial)
        (output.square().sum() + h.sum() + 2 * c.sum()).backward()
        grads = [inputs.grad, *(state.grad for state in initial), *(p.grad.clone() for p in lstm.parameters())]
        results.append([output.detach(), h.detach(), c.detach(), *grads, th.get_rng_state()])
    assert all(th.equal(a, b) for a, b in zip(*results, strict=True))


def test_lean_lstm_leaves_hooks_subclasses_and_other_inputs_to_the_module():
    calls = []

    class OwnLSTM(nn.LSTM):
        def forward(self, *args, **kwargs):
            calls.append("subclass")
            return super().forward(*args, **kwargs)

    lstm = nn.LSTM(4, 5)
    states = (th.zeros(1, 2, 5), th.zeros(1, 2, 5))
    handle = lstm.register_forward_hook(lambda *args: calls.append("hook"))
    lean_lstm(lstm, th.randn(3, 2, 4), states)
    handle.remove()
    lean_lstm(lstm, th.randn(3, 2, 4), states)  # no hook: torch.lstm directly
    lean_lstm(OwnLSTM(4, 5), th.randn(3, 2, 4), states)
    with pytest.raises(RuntimeError, match="hx and cx should also be 2-D"):  # the module's own check and message
        lean_lstm(lstm, th.randn(3, 4), states)
    assert calls == ["hook", "subclass"]


@pytest.mark.parametrize("starts", ["none", "first_step", "first_and_inside", "inside_only"])
def test_recurrent_sequence_pass_is_upstreams_bit_for_bit_values_and_gradients(starts):
    n_seq, length, n_features = 3, 6, 4
    generator = th.Generator().manual_seed(0)
    lstm = nn.LSTM(n_features, 5)
    features = th.randn(n_seq * length, n_features, generator=generator)
    episode_starts = th.zeros(n_seq, length)
    if starts in ("first_step", "first_and_inside"):
        episode_starts[[0, 2], 0] = 1.0
    if starts in ("first_and_inside", "inside_only"):
        episode_starts[1, 3] = 1.0
    states = tuple(th.randn(1, n_seq, 5, generator=generator) for _ in range(2))
    results = []
    for process in (RecurrentActorCriticPolicy._process_sequence, RecurrentPPOExtPolicy._process_sequence):
        lstm.zero_grad()
        inputs = features.clone().requires_grad_(True)
        initial = tuple(state.clone().requires_grad_(True) for state in states)
        output, (h, c) = process(inputs, initial, episode_starts.flatten(), lstm)
        (output.square().sum() + h.sum() + 2 * c.sum()).backward()
        grads = [inputs.grad, *(state.grad for state in initial), *(p.grad.clone() for p in lstm.parameters())]
        results.append([output.detach(), h.detach(), c.detach(), *grads])
    assert all(th.equal(a, b) for a, b in zip(*results, strict=True))


@pytest.mark.parametrize("fast", [False, True], ids=["default", "fast"])
@pytest.mark.parametrize("policy_kwargs", [dict(squash_output=False), dict()], ids=["gaussian", "squashed"])
def test_acting_plan_follows_parameters_changed_within_a_collection(policy_kwargs, fast):
    """
    What the acting plan computes once per collection (the weights' transposed views, the Gaussian's scale
    terms; the fast mode's NumPy arrays and head) follows a parameter changed within the collection, in place
    (``.data`` too, which no version counter sees) or given new memory, and a batch of another size: every
    step is upstream's, bit for bit (the fast mode's: to float rounding). With autograd on, a step inside
    the collection records upstream's graph.
    """
    env = make_vec_env("Pendulum-v1", n_envs=3, seed=0)
    policy = PPOExt("MlpPolicy", env, policy_kwargs=dict(policy_kwargs, fast=fast), seed=0).policy

    def same(a, b):
        return th.allclose(a, b, rtol=1e-5, atol=1e-5) if fast else th.equal(a, b)

    obs = th.as_tensor(env.reset(), dtype=th.float32)
    first_layer = policy.mlp_extractor.policy_net[0]

    def new_memory(tensor, value=None):  # the same values in new memory where value is None
        tensor.data = tensor.data.clone() if value is None else th.full_like(tensor, value)

    changes = [
        lambda: None,
        lambda: policy.log_std.data.add_(0.25),
        lambda: policy.action_net.weight.data.mul_(1.5),
        lambda: new_memory(policy.action_net.weight, 0.05),
        lambda: new_memory(policy.log_std, -0.7),
        lambda: new_memory(policy.log_std),
        lambda: policy.log_std.data.add_(0.5),  # in the new memory
        lambda: new_memory(first_layer.weight),
        lambda: first_layer.weight.data.mul_(-1.0),
        lambda: new_memory(policy.value_net.bias, 0.3),
    ]
    with th.no_grad(), policy.acting():
        plan = policy._acting_plan
        for change in changes:
            change()
            for batch in (obs, obs[:1], obs):  # each change's first step has the batch size of the step before
                th.manual_seed(3)
                direct = policy(batch)
                th.manual_seed(3)
                upstream = _upstream_forward(policy, batch, False)
                assert all(same(a, b) for a, b in zip(direct, upstream, strict=True))
            # the derived forms took these steps
            assert plan.array_head is not None if fast else plan._addmm is not None and plan.head is not None
        with th.enable_grad():
            th.manual_seed(3)
            direct = policy(obs)
            th.manual_seed(3)
            upstream = _upstream_forward(policy, obs, False)
            assert all(th.equal(a.detach(), b) for a, b in zip(direct, upstream, strict=True))
            direct[2].sum().backward()
            assert policy.log_std.grad is not None and first_layer.weight.grad is not None


@pytest.mark.parametrize(
    "policy_kwargs, built",
    [
        (dict(), True),
        (dict(net_arch=dict(pi=[8, 8], vf=[4]), activation_fn=nn.ReLU, share_features_extractor=False), True),
        (dict(activation_fn=nn.ELU), False),  # a layer outside the plan's: called as modules
        (dict(net_arch=[]), True),  # no hidden layers: the heads on the features
    ],
    ids=["default", "unshared_relu", "elu", "no_hidden_layers"],
)
def test_acting_plan_is_built_only_for_sb3s_standard_networks(policy_kwargs, built):
    from sb3_ppo_ext.speed import ActingPlan

    model = PPOExt("MlpPolicy", "CartPole-v1", policy_kwargs=policy_kwargs)
    assert (ActingPlan.of(model.policy) is not None) == built
    obs = th.as_tensor(np.stack([model.observation_space.sample() for _ in range(3)]))
    _direct_and_upstream(model, obs, False, plan=False)
    if built:
        _direct_and_upstream(model, obs, False, plan=True)


def test_acting_plan_is_not_built_for_scaled_images_dict_or_multidiscrete_observations():
    from gymnasium import spaces

    from sb3_ppo_ext.policies import PPOExtActorCriticPolicy
    from sb3_ppo_ext.speed import ActingPlan

    image = spaces.Box(0, 255, (36, 36, 1), dtype=np.uint8)
    for space, normalize in ((image, True), (image, False)):
        policy = PPOExtActorCriticPolicy(
            space, spaces.Discrete(2), lambda _: 1e-3, normalize_images=normalize, net_arch=[4]
        )  # MlpPolicy on an image: SB3 scales it by 255 when normalize_images is on
        assert (ActingPlan.of(policy) is not None) == (not normalize)
    model = PPOExt("MultiInputPolicy", _dict_env(), n_steps=8, batch_size=8)
    assert ActingPlan.of(model.policy) is None
    multi_discrete = PPOExtActorCriticPolicy(spaces.MultiDiscrete([2, 3]), spaces.Discrete(2), lambda _: 1e-3, net_arch=[4])
    assert ActingPlan.of(multi_discrete) is None


def _dict_env():
    import gymnasium as gym
    from gymnasium import spaces

    class DictEnv(gym.Env):
        observation_space = spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.Box(-1, 1, (3,))})
        action_space = spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {}

        def step(self, action):
            return self.observation_space.sample(), 0.0, False, False, {}

    return DictEnv()


def test_a_hook_registered_during_a_collection_runs_and_the_plan_lives_for_the_collection():
    """The plan runs the networks only while no hook would run; a hook added mid-collection runs at the next step."""
    from stable_baselines3.common.callbacks import BaseCallback

    from sb3_ppo_ext.speed import ActingPlan

    model = PPOExt("MlpPolicy", "Pendulum-v1", n_steps=16, batch_size=16, n_epochs=1, seed=0)
    seen, planned, collected = [], [], []
    original_step = ActingPlan.step

    class AddHook(BaseCallback):
        def _on_step(self) -> bool:
            policy = self.model.policy
            planned.append(policy._acting_plan is not None and not policy._forward_hooks)  # pi_old needs no hook
            if self.num_timesteps == 8:
                policy.mlp_extractor.value_net[0].register_forward_hook(lambda module, args, output: seen.append(1))
            return True

        def _on_rollout_end(self) -> None:
            collected.append(len(seen))  # the hook's calls in the collection (the update calls the network too)

    def counting_step(plan, obs):
        planned.append("plan")
        return original_step(plan, obs)

    ActingPlan.step = counting_step
    try:
        model.learn(16, callback=AddHook())
    finally:
        ActingPlan.step = original_step
    assert planned == ["plan", True] * 8 + [True] * 8  # after the hook, the modules are called
    # 8 steps after the hook, and the last observation's value (predict_values) at the rollout's end
    assert collected == [9] and model.policy._acting_plan is None


@pytest.mark.parametrize(
    "policy_kwargs",
    [
        dict(squash_output=False),
        dict(),  # squashed, Monte Carlo entropy
        dict(entropy_estimator="gaussian"),
        dict(entropy_estimator="sample"),
        dict(squash_output=False, net_arch=dict(pi=[8], vf=[4]), activation_fn=nn.ReLU, share_features_extractor=False),
        dict(squash_output=False, use_sde=True),
        dict(use_sde=True),  # squashed gSDE, Monte Carlo entropy
        dict(squash_output=False, use_sde=True, full_std=False, use_expln=True),
    ],
    ids=["gaussian", "squashed_mc", "squashed_gaussian", "squashed_sample", "unshared", "sde", "squashed_sde", "sde_expln"],
)
@pytest.mark.parametrize("entropy_requires_grad", [True, False])
def test_direct_evaluation_is_the_distributions_bit_for_bit(policy_kwargs, entropy_requires_grad):
    """Values, log-probabilities, entropy, gradients and random draws of the evaluation without distribution objects."""
    policy_kwargs = dict(policy_kwargs)
    use_sde = policy_kwargs.pop("use_sde", False)
    model = PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=policy_kwargs, use_sde=use_sde, seed=0)
    policy = model.policy
    assert policy.direct_head() == ("sde" if use_sde else "gaussian")
    with th.no_grad():
        for parameter in policy.parameters():
            parameter.add_(0.3 * th.randn_like(parameter))
    obs = th.as_tensor(np.stack([model.observation_space.sample() for _ in range(6)]))
    actions = th.randn(6, 1)
    results = []
    for direct in (False, True):
        policy.optimizer.zero_grad()
        th.manual_seed(3)
        values, log_prob, entropy, dist = policy.evaluate_actions_and_distribution(
            obs, actions, entropy_requires_grad, need_distribution=not direct
        )
        assert (dist is None) == direct
        loss = values.sum() + log_prob.sum() + (0.0 if entropy is None or not entropy.requires_grad else entropy.sum())
        loss.backward()
        grads = [th.zeros(0) if p.grad is None else p.grad.clone() for p in policy.parameters()]
        outputs = [values, log_prob] + ([] if entropy is None else [entropy])
        results.append((outputs, grads, th.get_rng_state(), entropy is None))
    (outputs_a, grads_a, rng_a, none_a), (outputs_b, grads_b, rng_b, none_b) = results
    assert none_a == none_b and len(outputs_a) == len(outputs_b)
    assert all(th.equal(a.detach(), b.detach()) for a, b in zip(outputs_a, outputs_b, strict=True))
    assert all(th.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))
    assert th.equal(rng_a, rng_b)


def test_direct_evaluation_leaves_other_heads_and_own_scoring_to_the_distribution(monkeypatch):
    from stable_baselines3.common.policies import ActorCriticPolicy

    from sb3_ppo_ext.policies import PPOExtActorCriticPolicy

    def scored_directly(policy, obs):
        return policy.evaluate_actions_and_distribution(obs, th.zeros(2, 1), need_distribution=False)[3] is None

    cases = [
        ("Pendulum-v1", dict(policy_kwargs=dict(action_dist="beta"))),
        ("Pendulum-v1", dict(policy_kwargs=dict(state_dependent_std=True))),
        ("CartPole-v1", dict()),
    ]
    for env_id, kwargs in cases:
        model = PPOExt("MlpPolicy", env_id, **kwargs)
        obs = th.as_tensor(np.stack([model.observation_space.sample() for _ in range(2)]))
        assert not scored_directly(model.policy, obs), (env_id, kwargs)
    model = PPOExt("MlpPolicy", "Pendulum-v1")
    obs = th.as_tensor(np.stack([model.observation_space.sample() for _ in range(2)]))
    assert scored_directly(model.policy, obs)
    monkeypatch.setattr(
        PPOExtActorCriticPolicy, "_get_action_dist_from_latent", ActorCriticPolicy._get_action_dist_from_latent
    )
    assert not scored_directly(model.policy, obs)  # replaced on the class: its own distribution scores


def test_a_policy_with_checked_forward_but_no_direct_head_steps_upstreams_way():
    """CheckedForward on a policy of no head of its own: upstream's forward, no acting plan, pi_old from action_dist."""
    from stable_baselines3.common.policies import ActorCriticPolicy

    from sb3_ppo_ext.policies import CheckedForward

    class Plain(CheckedForward, ActorCriticPolicy):
        pass

    model = PPOExt(Plain, "Pendulum-v1", n_steps=16, batch_size=16, n_epochs=1, seed=0)
    assert model.policy.direct_head() is None
    with model.policy.acting():
        assert model.policy._acting_plan is None
    model.learn(16)
    assert "train/kl" in model.logger.name_to_value


def _fast_and_default_steps(model, obs, deterministic):
    """One rollout step of ``model``'s policy in the fast mode and in the default mode, from the same RNG state."""
    policy, steps = model.policy, {}
    for fast in (True, False):
        policy.fast = fast
        th.manual_seed(3)
        with th.no_grad(), policy.acting():
            output = policy(obs, deterministic=deterministic)
        steps[fast] = (*output, th.rand(1))  # the RNG state after the step too
    policy.fast = True
    return steps[True], steps[False]


@pytest.mark.parametrize("squash", [False, True], ids=["gaussian", "squashed"])
@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("deterministic", [False, True])
def test_fast_mode_acts_in_numpy_as_the_default_step_does_to_float_rounding(squash, n_envs, deterministic, monkeypatch):
    """fast=True: a Gaussian head's rollout step in NumPy: the same draw, actions, values and log-probabilities to rounding."""
    from sb3_ppo_ext.speed import ArrayPlan

    calls = []
    original = ArrayPlan.step
    monkeypatch.setattr(ArrayPlan, "step", lambda plan, obs: calls.append(1) or original(plan, obs))
    env = make_vec_env("Pendulum-v1", n_envs=n_envs, seed=0)
    model = PPOExt(
        "MlpPolicy", env, n_steps=32, batch_size=32, seed=0,
        policy_kwargs=dict(fast=True, squash_output=squash, log_std_init=-0.5),
    )  # fmt: skip
    obs = th.as_tensor(env.reset())
    fast, default = _fast_and_default_steps(model, obs, deterministic)
    assert calls == [1]  # the fast step ran in NumPy once, the default one did not
    for got, want in zip(fast, default, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        th.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    model.learn(model.n_steps * n_envs)
    assert len(calls) > model.n_steps  # the rollout stepped in NumPy


def test_fast_mode_acts_with_torch_where_numpy_cannot_or_must_not():
    """The NumPy step runs only inside a collection, without autograd or hooks, for a state-independent Gaussian."""
    from sb3_ppo_ext.speed import ArrayPlan

    obs = th.as_tensor(np.zeros((2, 3), dtype=np.float32))
    sde = PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(fast=True, state_dependent_std=True, squash_output=False))
    discrete = PPOExt("MlpPolicy", "CartPole-v1", policy_kwargs=dict(fast=True))
    model = PPOExt("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(fast=True))
    policy = model.policy
    calls = []
    original = ArrayPlan.step
    ArrayPlan.step = lambda plan, obs: calls.append(1) or original(plan, obs)
    try:
        with th.no_grad():
            policy(obs)  # no collection, no plan
            for other, observation in ((sde, obs), (discrete, th.zeros((2, 4)))):
                with other.policy.acting():
                    other.policy(observation)
            with policy.acting():
                handle = policy.action_net.register_forward_hook(lambda *_: None)
                policy(obs)
                handle.remove()
        with policy.acting():
            policy(obs)  # autograd on
        assert calls == []
        with th.no_grad(), policy.acting():
            policy(obs)
        assert calls == [1]
    finally:
        ArrayPlan.step = original
    with th.no_grad(), policy.acting(), pytest.raises(ValueError, match="non-finite log-probability"):
        policy(th.full((2, 3), float("nan")))


def test_a_direct_policy_call_with_gradients_is_silent_as_upstreams(family):
    """``model.policy(obs)`` with autograd on (a user's own loop) warns no more than the upstream policy's call."""
    import warnings

    for algorithm in (family.upstream, family.algorithm):
        tiny = dict(family.tiny)
        if algorithm is RecurrentPPOExt:  # its squashed head warns outside its collection on purpose (SquashedActionsWarning)
            tiny["policy_kwargs"] = {**tiny["policy_kwargs"], "squash_output": False}
        model = algorithm(family.policy, family.make_env(), **tiny)
        obs, _ = model.policy.obs_to_tensor(model.observation_space.sample())
        kwargs = {}
        if family.name == "recurrent":
            states = model._last_lstm_states
            kwargs = dict(lstm_states=states, episode_starts=th.ones(1))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, values, log_prob, *_ = model.policy(obs, **kwargs)
            (values.sum() + log_prob.sum()).backward()
        assert [str(w.message) for w in caught] == [], algorithm.__name__
