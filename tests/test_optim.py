"""The lean optimizer step: torch's zero_grad, clip_grad_norm_ and multi-tensor Adam, bit for bit, or torch's own calls."""

import copy
import io

import pytest
import torch as th
from torch import nn
from torch.optim import optimizer as torch_optimizer

from sb3_ppo_ext import speed
from sb3_ppo_ext.speed import OptimizerStep, _runs_optimizer_hooks


class _Network(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
        self.unused = nn.Linear(2, 2)  # never in the loss: its gradients stay None

    def forward(self, x: th.Tensor) -> th.Tensor:
        return self.body(x)


def _network() -> nn.Module:
    th.manual_seed(0)
    return _Network()


def _groups(network: nn.Module, two_groups: bool) -> list[dict]:
    if not two_groups:
        return [dict(params=list(network.parameters()))]
    first = list(network.body[0].parameters())
    return [dict(params=first, lr=1e-2), dict(params=[p for p in network.parameters() if all(p is not q for q in first)])]


def _train(network, optimizer, steps, lean: bool, max_norm: float) -> list[th.Tensor]:
    parameters = list(network.parameters())
    stepper = OptimizerStep(optimizer, parameters, max_norm)
    generator = th.Generator().manual_seed(1)
    norms = []
    for _ in range(steps):
        x = th.randn(32, 5, generator=generator)
        if lean:
            stepper.zero_grad()
        else:
            optimizer.zero_grad()
        (network(x) ** 3).mean().backward()
        norms.append(stepper.clip() if lean else th.nn.utils.clip_grad_norm_(parameters, max_norm))
        if lean:
            stepper.step()
        else:
            optimizer.step()
        for group in optimizer.param_groups:  # a schedule, as SB3 sets it before each update
            group["lr"] = group["lr"] * 0.99
    return norms


def _state(network, optimizer):
    tensors = [p.detach().clone() for p in network.parameters()]
    for p in network.parameters():
        if p in optimizer.state:
            tensors += [t.clone() for t in optimizer.state[p].values() if isinstance(t, th.Tensor)]
        tensors.append(th.zeros(0) if p.grad is None else p.grad.clone())
    return tensors


@pytest.mark.parametrize("two_groups", [False, True], ids=["one_group", "two_groups"])
@pytest.mark.parametrize("max_norm", [0.05, 100.0], ids=["clipping", "not_clipping"])
@pytest.mark.parametrize("mode", ["foreach", "fused"])
def test_lean_step_is_torchs_zero_grad_clip_and_adam_bit_for_bit(two_groups, max_norm, mode):
    """SB3's default Adam as the policies build it (foreach; the fast mode's fused Adam: torch's step): torch's results."""
    results = []
    for lean in (False, True):
        network = _network()
        optimizer = th.optim.Adam(_groups(network, two_groups), lr=3e-3, eps=1e-5, **{mode: True})
        norms = _train(network, optimizer, 40, lean, max_norm)
        results.append((th.stack(norms), _state(network, optimizer)))
    (norms_torch, state_torch), (norms_lean, state_lean) = results
    assert th.equal(norms_torch, norms_lean)
    assert len(state_torch) == len(state_lean)
    assert all(th.equal(a, b) for a, b in zip(state_torch, state_lean, strict=True))
    assert OptimizerStep(optimizer, list(network.parameters()), max_norm)._lean_adam == (mode == "foreach")  # fused: torch's


@pytest.mark.parametrize(
    "make",
    [
        lambda params: th.optim.Adam(params, amsgrad=True, foreach=True),
        lambda params: th.optim.Adam(params, weight_decay=0.1, foreach=True),
        lambda params: th.optim.Adam(params, foreach=False),
        lambda params: th.optim.Adam(params, maximize=True, foreach=True),
        lambda params: th.optim.AdamW(params, foreach=True),
        lambda params: th.optim.SGD(params, lr=0.1, momentum=0.9),
    ],
    ids=["amsgrad", "weight_decay", "for_loop", "maximize", "adamw", "sgd"],
)
def test_other_optimizers_and_settings_take_torchs_own_step(make):
    results = []
    for lean in (False, True):
        network = _network()
        optimizer = make(list(network.parameters()))
        norms = _train(network, optimizer, 10, lean, 0.5)
        results.append((th.stack(norms), _state(network, optimizer)))
    assert not OptimizerStep(optimizer, list(network.parameters()), 0.5)._lean_adam
    assert th.equal(results[0][0], results[1][0])
    assert all(th.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


def test_optimizer_hooks_run_and_an_own_zero_grad_is_called():
    """A step hook (the optimizer's own or one for every optimizer) runs: such a step is torch's."""
    network = _network()
    optimizer = th.optim.Adam(network.parameters(), foreach=True)
    _train(network, optimizer, 2, True, 0.5)  # past the first step: the lean path applies
    stepper = OptimizerStep(optimizer, list(network.parameters()), 0.5)
    calls = []
    for name, register in (
        ("own", optimizer.register_step_pre_hook),
        ("every optimizer's", torch_optimizer.register_optimizer_step_post_hook),
    ):
        handle = register(lambda *args, name=name: calls.append(name))
        # torch keeps the hooks where the lean step looks for them (fails if a torch release moves them)
        assert _runs_optimizer_hooks(optimizer)
        (network(th.randn(4, 5)) ** 2).mean().backward()
        stepper.step()
        handle.remove()
    assert calls == ["own", "every optimizer's"] and not _runs_optimizer_hooks(optimizer)

    class OwnZeroGrad(th.optim.Adam):
        cleared = 0

        def zero_grad(self, set_to_none: bool = True) -> None:
            OwnZeroGrad.cleared += 1
            super().zero_grad(set_to_none)

    own = OwnZeroGrad(network.parameters(), foreach=True)
    OptimizerStep(own, list(network.parameters()), 0.5).zero_grad()
    assert OwnZeroGrad.cleared == 1 and all(p.grad is None for p in network.parameters())


def test_a_step_or_zero_grad_set_on_the_optimizer_instance_is_called():
    """A user's wrapper on the instance (as one would wrap stock PPO's optimizer) runs: the step is torch's calls."""
    network = _network()
    optimizer = th.optim.Adam(network.parameters(), foreach=True)
    _train(network, optimizer, 2, True, 0.5)
    calls = []
    step, zero_grad = optimizer.step, optimizer.zero_grad
    optimizer.step = lambda *args, **kwargs: (calls.append("step"), step(*args, **kwargs))[1]
    optimizer.zero_grad = lambda *args, **kwargs: (calls.append("zero_grad"), zero_grad(*args, **kwargs))[1]
    _train(network, optimizer, 3, True, 0.5)
    assert calls == ["zero_grad", "step"] * 3


def _shares_one_buffer(tensors: list[th.Tensor]) -> bool:
    return len({t.untyped_storage().data_ptr() for t in tensors}) == 1


def test_multi_tensor_adam_state_lives_in_flat_buffers_with_the_same_bits():
    """After Adam's first step each group's moments and step counts are views of one buffer each (fewer kernels)."""
    network = _network()
    optimizer = th.optim.Adam(_groups(network, True), lr=3e-3, eps=1e-5, foreach=True)
    _train(network, optimizer, 3, True, 0.5)
    for group in optimizer.param_groups:
        trained = [p for p in group["params"] if p.grad is not None]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert _shares_one_buffer([optimizer.state[p][key] for p in trained])
    # what torch.save writes of it loads into a fresh optimizer and goes on exactly as the original
    buffer = io.BytesIO()
    th.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    copy = _network()
    copy.load_state_dict(network.state_dict())
    copy_optimizer = th.optim.Adam(_groups(copy, True), lr=3e-3, eps=1e-5, foreach=True)
    copy_optimizer.load_state_dict(th.load(buffer))
    _train(network, optimizer, 5, False, 0.5)
    _train(copy, copy_optimizer, 5, True, 0.5)
    assert all(th.equal(a, b) for a, b in zip(_state(network, optimizer), _state(copy, copy_optimizer), strict=True))


def test_state_loaded_from_outside_and_new_gradients_are_followed():
    """
    ``optimizer.load_state_dict`` (SB3's ``load``/``set_parameters``) between updates, and a parameter that starts
    to get gradients: the lean steps go on bit for bit with torch's, each on the state the optimizer holds now.
    """
    results = []
    for lean in (False, True):
        network = _network()
        optimizer = th.optim.Adam(network.parameters(), lr=3e-3, eps=1e-5, foreach=True)
        _train(network, optimizer, 4, lean, 0.5)
        earlier = copy.deepcopy(optimizer.state_dict())
        _train(network, optimizer, 4, lean, 0.5)
        optimizer.load_state_dict(earlier)  # moments and step counts four steps old, new tensors
        loaded = [optimizer.state[p]["exp_avg"] for p in network.body.parameters()]
        _train(network, optimizer, 3, lean, 0.5)
        if lean:  # laid out afresh from the loaded state
            now = [optimizer.state[p]["exp_avg"] for p in network.body.parameters()]
            assert _shares_one_buffer(now) and not any(a is b for a, b in zip(now, loaded, strict=True))
        # the user's own optimizer.step() on the first layer only (the others have no gradients): its step
        # counts run ahead of the others', which the flat layout notices
        optimizer.zero_grad()
        network.body[0](th.randn(4, 5)).square().sum().backward()
        optimizer.step()
        _train(network, optimizer, 3, lean, 0.5)
        unused = network.unused
        network.forward = lambda x, unused=unused, body=network.body: body(x) + unused(x[:, :2]).sum()
        _train(network, optimizer, 6, lean, 0.5)  # its step counts trail the others': per parameter from now on
        results.append(_state(network, optimizer))
    assert all(th.equal(a, b) for a, b in zip(*results, strict=True))


def test_a_flat_layout_whose_bits_differ_is_not_used(monkeypatch):
    """Where the flat arithmetic does not match torch's bit for bit here, every step runs per parameter."""
    monkeypatch.setattr(speed, "flat_adam_is_exact", lambda *args: False)
    network = _network()
    optimizer = th.optim.Adam(network.parameters(), lr=3e-3, eps=1e-5, foreach=True)
    _train(network, optimizer, 3, True, 0.5)
    assert not _shares_one_buffer([optimizer.state[p]["exp_avg"] for p in network.body.parameters()])


def test_the_exactness_check_compares_bits():
    assert speed.flat_adam_is_exact((3, 17, 64, 1), th.float32, th.device("cpu"))
    assert not speed._same_bits(th.tensor([0.0]), th.tensor([-0.0]))
    assert speed._same_bits(th.tensor([float("nan")]), th.tensor([float("nan")]))


def test_torchs_own_tells_torchs_functions_from_a_users_replacements():
    import functools

    assert speed.torchs_own(th.optim.Adam.step) and speed.torchs_own(th.nn.utils.clip_grad_norm_)
    assert speed.torchs_own(th.optim.Optimizer.zero_grad)

    @functools.wraps(th.optim.Adam.step)
    def wrapper(*args, **kwargs):
        return th.optim.Adam.step(*args, **kwargs)

    assert not speed.torchs_own(wrapper)
    assert not speed.torchs_own(lambda: None)
    # a user's function wrapped by torch's own decorator (Optimizer wraps a class's step with its profile hook)
    assert not speed.torchs_own(th.optim.Optimizer.profile_hook_step(wrapper))
