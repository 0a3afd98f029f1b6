"""
Speed components: the same operations as the calls they stand for (bit for bit) with less Python per call, giving way
to the plain call wherever that would run a hook, a user's patch or another module. Each is switched off by replacing
its name here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.distributions import StateDependentNoiseDistribution
from stable_baselines3.common.preprocessing import is_image_space
from stable_baselines3.common.torch_layers import FlattenExtractor, MlpExtractor
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as torch_module
from torch.optim import optimizer as torch_optimizer

from sb3_ppo_ext.distributions import (
    direct_categorical,
    direct_gaussian,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_log_prob_constant,
    gaussian_scale_terms,
    gaussian_step_from_noise,
    log_tanh_jacobian_sum,
    squashed_log_prob,
)

# A policy of sb3_ppo_ext.policies (which imports this module): its heads' attributes are read as they are.
Policy = Any


class Step(NamedTuple):
    """A rollout step's actions, values and log-probabilities, as ``forward`` returns them."""

    actions: th.Tensor
    values: th.Tensor
    log_prob: th.Tensor


class Scores(NamedTuple):
    """A minibatch's values, log-probabilities of its actions and entropy (``None``: estimated from samples)."""

    values: th.Tensor
    log_prob: th.Tensor
    entropy: th.Tensor | None


# ---- Adam and the optimizer step --------------------------------------------------------------------------


def with_foreach_adam(kwargs: dict[str, Any], fused: bool = False) -> dict[str, Any]:
    """A policy's kwargs with SB3's default Adam ``foreach=True`` (or ``fused=True``) unless either is given."""
    if kwargs.get("optimizer_class", th.optim.Adam) is not th.optim.Adam:
        return kwargs
    optimizer_kwargs = kwargs.get("optimizer_kwargs")
    if optimizer_kwargs is None:
        optimizer_kwargs = {"eps": 1e-5}
    elif not isinstance(optimizer_kwargs, dict) or {"foreach", "fused"} & set(optimizer_kwargs):
        return kwargs
    return {**kwargs, "optimizer_kwargs": {**optimizer_kwargs, ("fused" if fused else "foreach"): True}}


# The settings of an Adam group whose multi-tensor step the flat buffers reproduce (others: torch's step).
_LEAN_ADAM_GROUP = dict(
    amsgrad=False, maximize=False, capturable=False, differentiable=False, weight_decay=0, decoupled_weight_decay=False
)
_TORCH_DIR = os.path.dirname(th.__file__) + os.sep
_STATE = ("exp_avg", "exp_avg_sq", "step")  # Adam's state of a parameter


def _lean_adam_group(group: dict) -> bool:
    """Whether a group runs torch's multi-tensor Adam with no optional branch and float settings."""
    if any(group.get(key) != value for key, value in _LEAN_ADAM_GROUP.items()) or group.get("fused"):
        return False
    return group.get("foreach") is True and all(type(v) is float for v in (group["lr"], group["eps"], *group["betas"]))


def torchs_own(function: object) -> bool:
    """Whether ``function`` and every function it wraps (``__wrapped__``) is torch's own code, not a user's replacement."""
    while function is not None:
        code = getattr(function, "__code__", None)
        if code is None or not code.co_filename.startswith(_TORCH_DIR):
            return False
        function = getattr(function, "__wrapped__", None)
    return True


def _torchs_functions() -> bool:
    """Whether every function SB3's three optimizer calls run through is torch's own, and torch's profiler is off."""
    from torch.autograd import profiler
    from torch.nn.utils import clip_grad
    from torch.optim import adam

    functions = (
        th.optim.Optimizer.zero_grad, th.optim.Adam.step, adam.adam, adam._multi_tensor_adam,
        th.nn.utils.clip_grad_norm_, clip_grad._get_total_norm, clip_grad._clip_grads_with_norm_,
    )  # fmt: skip
    return all(torchs_own(function) for function in functions) and not profiler._is_profiler_enabled


def _runs_optimizer_hooks(optimizer: th.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` would run a hook (its own, or one registered for every optimizer)."""
    own = optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks
    return bool(own or torch_optimizer._global_optimizer_pre_hooks or torch_optimizer._global_optimizer_post_hooks)


class FlatAdamGroup:
    """
    One Adam group's ``exp_avg``, ``exp_avg_sq`` and ``step`` as views of one buffer each, one operation per buffer.

    :param params: the group's parameters with gradients (contiguous, one device and dtype, the same step count)
    :param state: ``optimizer.state``
    """

    def __init__(self, params: list[th.Tensor], state: dict) -> None:
        self.params, self.state, sizes = params, state, [p.numel() for p in params]
        self.exp_avg, self.exp_avg_sq = (th.cat([state[p][key].reshape(-1) for p in params]) for key in _STATE[:2])
        self.steps = th.stack([state[p]["step"] for p in params])
        self.grad = th.empty(sum(sizes), dtype=params[0].dtype, device=params[0].device)
        self.denominator = th.empty_like(self.grad)

        def views(flat: th.Tensor) -> list[th.Tensor]:
            return [view.view_as(p) for view, p in zip(flat.split(sizes), params, strict=True)]

        self.exp_avg_views, self.denominator_views = views(self.exp_avg), views(self.denominator)
        own = zip(self.exp_avg_views, views(self.exp_avg_sq), self.steps.unbind(), strict=True)
        self.entries = [dict(zip(_STATE, tensors, strict=True)) for tensors in own]
        for p, entry in zip(params, self.entries, strict=True):
            state[p].update(entry)
        self._one = th.tensor(1.0, device="cpu")

    @staticmethod
    def layout_possible(params: list[th.Tensor], state: dict) -> bool:
        """Whether these parameters' state fits the layout (see ``params``)."""
        if not params or len({(p.device, p.dtype) for p in params}) != 1 or not all(p.is_contiguous() for p in params):
            return False
        for p in params:
            exp_avg, exp_avg_sq, step = ((state.get(p) or {}).get(key) for key in _STATE)
            if not (isinstance(exp_avg, th.Tensor) and isinstance(exp_avg_sq, th.Tensor) and isinstance(step, th.Tensor)):
                return False
            if step.dim() != 0 or step.device.type != "cpu":
                return False
            if any(m.shape != p.shape or m.dtype != p.dtype or m.device != p.device for m in (exp_avg, exp_avg_sq)):
                return False
        return len({float(state[p]["step"]) for p in params}) == 1

    def intact(self, params: list[th.Tensor], state: dict) -> bool:
        """Whether these parameters with gradients and ``optimizer.state`` still hold this layout's views."""
        return (
            state is self.state
            and len(params) == len(self.params)
            and len(set(self.steps.tolist())) == 1  # torch's own step on some of them makes the counts differ
            and all(
                p is own and all(state.get(p, {}).get(key) is view for key, view in entry.items())
                for p, own, entry in zip(params, self.params, self.entries, strict=True)
            )
        )

    def step(self, grads: list[th.Tensor], lr: float, beta1: float, beta2: float, eps: float) -> None:
        """One Adam step of the group: torch's ``_multi_tensor_adam`` arithmetic, one operation per buffer."""
        th.cat([grad.reshape(-1) for grad in grads], out=self.grad)
        self.steps.add_(self._one, alpha=1.0)
        self.exp_avg.lerp_(self.grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2)
        self.exp_avg_sq.addcmul_(self.grad, self.grad, value=1 - beta2)
        count = self.entries[0]["step"].item()
        th.sqrt(self.exp_avg_sq, out=self.denominator)
        self.denominator.div_((1 - beta2**count) ** 0.5)
        self.denominator.add_(eps)
        th._foreach_addcdiv_(self.params, self.exp_avg_views, self.denominator_views, (lr / (1 - beta1**count)) * -1)


@functools.lru_cache(maxsize=64)
def flat_adam_is_exact(sizes: tuple[int, ...], dtype: th.dtype, device: th.device) -> bool:
    """Whether :meth:`FlatAdamGroup.step` gives torch's multi-tensor Adam's bits for these sizes (three steps compared)."""
    generator = th.Generator().manual_seed(0)

    def draw(scale: float, positive: bool = False) -> list[th.Tensor]:
        values = []
        for size in sizes:
            exponent = th.randint(-6, 2, (size,), generator=generator)
            value = th.randn(size, generator=generator, dtype=th.float64) * 10.0**exponent
            values.append((value.abs() if positive else value).mul(scale).to(dtype=dtype, device=device))
        return values

    start = draw(1.0), draw(1e-2), draw(1e-3, positive=True)
    gradients = [draw(1.0) for _ in range(3)]
    runs = []
    for flat in (False, True):
        params = [t.clone() for t in start[0]]
        adam = th.optim.Adam(params, lr=3e-4, betas=(0.9, 0.999), eps=1e-5, foreach=True)
        for p, m, v in zip(params, *start[1:], strict=True):
            adam.state[p] = dict(exp_avg=m.clone(), exp_avg_sq=v.clone(), step=th.tensor(7.0))
        group = FlatAdamGroup(params, adam.state) if flat else None
        for grads in gradients:
            if group is not None:
                group.step(grads, 3e-4, 0.9, 0.999, 1e-5)
                continue
            for p, grad in zip(params, grads, strict=True):
                p.grad = grad
            adam.step()
        runs.append([t for p in params for t in (p, *(adam.state[p][key] for key in _STATE))])
    return all(_same_bits(a, b) for a, b in zip(*runs, strict=True))


def _same_bits(a: th.Tensor, b: th.Tensor) -> bool:
    """Bitwise equality (``torch.equal`` counts ``-0.0`` and ``0.0`` as equal, and NaN as unequal to itself)."""
    if a.dtype.is_floating_point and a.element_size() in (2, 4, 8):
        bits = {2: th.int16, 4: th.int32, 8: th.int64}[a.element_size()]
        return a.dtype == b.dtype and th.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return th.equal(a, b)


class OptimizerStep:
    """
    One update's ``zero_grad()``, ``clip_grad_norm_`` and ``step()`` with torch's tensor operations (bit for bit), Adam
    on flat buffers; anything else (other optimizers, hooks, patches, the profiler) takes torch's own calls.

    :param optimizer: the policy's optimizer
    :param parameters: the parameters whose gradients are clipped
    :param max_norm: ``max_grad_norm``
    """

    def __init__(self, optimizer: th.optim.Optimizer, parameters: list[th.Tensor], max_norm: float) -> None:
        self.optimizer, self.parameters, self.max_norm = optimizer, parameters, float(max_norm)
        self.optimized = [p for group in optimizer.param_groups for p in group["params"]]
        torchs, patched = _torchs_functions(), vars(optimizer)
        plain = all(type(p) in (th.Tensor, th.nn.Parameter) for p in (*parameters, *self.optimized))
        self._lean_clip = torchs and plain and len({(p.device, p.dtype) for p in parameters}) == 1
        self._lean_zero_grad = (
            torchs and type(optimizer).zero_grad is th.optim.Optimizer.zero_grad and "zero_grad" not in patched
        )
        self._lean_adam = (
            torchs
            and plain
            and type(optimizer) is th.optim.Adam
            and "step" not in patched
            and all(_lean_adam_group(group) for group in optimizer.param_groups)
            and all(not p.is_complex() for p in self.optimized)
            and getattr(optimizer, "grad_scale", None) is None
            and getattr(optimizer, "found_inf", None) is None
        )
        self._layouts: dict[int, FlatAdamGroup] = {}  # by group index

    def zero_grad(self) -> None:
        """``optimizer.zero_grad()`` (``set_to_none=True``)."""
        if not self._lean_zero_grad:
            self.optimizer.zero_grad()
            return
        for parameter in self.optimized:
            parameter.grad = None

    @th.no_grad()
    def clip(self) -> th.Tensor:
        """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)``: the total norm, the gradients scaled in place."""
        grads = [p.grad for p in self.parameters if p.grad is not None]
        if not self._lean_clip or not grads or any(g.is_sparse for g in grads):
            return th.nn.utils.clip_grad_norm_(self.parameters, self.max_norm)
        total_norm = th.linalg.vector_norm(th.stack(th._foreach_norm(grads, 2.0)), 2.0)
        th._foreach_mul_(grads, th.clamp(self.max_norm / (total_norm + 1e-6), max=1.0))
        return total_norm

    def step(self) -> None:
        """``optimizer.step()``."""
        if not self._lean_adam or _runs_optimizer_hooks(self.optimizer) or not self._adam_step():
            self._layouts.clear()
            self.optimizer.step()

    @th.no_grad()
    def _adam_step(self) -> bool:
        """Adam on every group's flat buffers, or ``False`` (nothing changed) where a group has no flat layout."""
        work = []
        for index, group in enumerate(self.optimizer.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                if any(cast(th.Tensor, p.grad).is_sparse for p in params):
                    return False
                flat = flat_adam_group(self._layouts, index, params, self.optimizer.state)
                if flat is None:
                    return False
                work.append((group, params, flat))
        for group, params, flat in work:
            (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
            flat.step([cast(th.Tensor, p.grad) for p in params], lr, beta1, beta2, eps)
        return True


def flat_adam_group(
    layouts: dict[int, FlatAdamGroup], index: int, params: list[th.Tensor], state: dict
) -> FlatAdamGroup | None:
    """The flat layout of group ``index``, kept in ``layouts`` while intact; ``None``: torch's step."""
    flat = layouts.get(index)
    if flat is not None and flat.intact(params, state):
        return flat
    layouts.pop(index, None)
    if not FlatAdamGroup.layout_possible(params, state):
        return None
    if not flat_adam_is_exact(tuple(p.numel() for p in params), params[0].dtype, params[0].device):
        return None
    flat = layouts[index] = FlatAdamGroup(params, state)
    return flat


# ---- lean layers ----------------------------------------------------------------------------------------


def _runs_global_hooks() -> bool:
    """Whether torch holds a hook for every module (``register_module_forward_hook`` & co.) or ``torch.jit.trace`` runs."""
    hooks = torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
    return bool(hooks or torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks or th.jit.is_tracing())


def _runs_own_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks)


def runs_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` would run a hook (its own or a global one) or be traced (what ``Module.__call__`` reads)."""
    return _runs_global_hooks() or _runs_own_hooks(module)


# A layer's step: (weight, bias) of an nn.Linear (F.linear), or the function of a ReLU / Tanh.
LayerStep = tuple[th.Tensor, th.Tensor | None] | Callable[[th.Tensor], th.Tensor]


def _layer_step(module: nn.Module) -> LayerStep | None:
    """What a layer of SB3's networks computes (``nn.Linear``, ``ReLU`` not in place, ``Tanh``); ``None`` for others."""
    kind = type(module)
    if kind is nn.Linear:
        return cast(nn.Linear, module).weight, cast(nn.Linear, module).bias
    if kind is nn.ReLU and not cast(nn.ReLU, module).inplace:
        return th.relu
    return th.tanh if kind is nn.Tanh else None


def _plan_steps(module: nn.Module, modules: list[nn.Module]) -> list[LayerStep] | None:
    """The steps of a layer or an ``nn.Sequential`` of layers (each module appended to ``modules``); ``None`` for others."""
    modules.append(module)
    if type(module) is not nn.Sequential:
        step = _layer_step(module)
        return None if step is None else [step]
    steps: list[LayerStep] = []
    for layer in module:
        layer_steps = _plan_steps(layer, modules)
        if layer_steps is None:
            return None
        steps += layer_steps
    return steps


class Addmm(NamedTuple):
    """An ``nn.Linear`` with a bias as ``F.linear`` runs it on a 2-D input: ``addmm(bias, input, weight.t())``."""

    bias: th.Tensor
    weight_t: th.Tensor


def _run_steps(steps: tuple | list, x: th.Tensor) -> th.Tensor:
    for step in steps:
        kind = type(step)
        if kind is Addmm:
            x = th.addmm(step.bias, x, step.weight_t)
        elif kind is tuple:
            x = F.linear(x, *step)
        else:
            x = step(x)
    return x


def lean_call(module: nn.Module, x: th.Tensor) -> th.Tensor:
    """``module(x)`` for SB3's layers through their functions (same values and graph); others and hooks: ``module(x)``."""
    modules: list[nn.Module] = []
    steps = _plan_steps(module, modules)
    if steps is None or _runs_global_hooks() or any(_runs_own_hooks(m) for m in modules):
        return module(x)
    return _run_steps(steps, x)


def lean_lstm(
    lstm: nn.LSTM, x: th.Tensor, states: tuple[th.Tensor, th.Tensor], weights: list[th.Tensor] | None = None
) -> tuple[th.Tensor, tuple[th.Tensor, th.Tensor]]:
    """``lstm(x, states)`` through ``torch.lstm`` (3-D input); a subclass, hooks and other inputs go through the module."""
    if type(lstm) is not nn.LSTM or runs_hooks(lstm) or x.dim() != 3 or len(states) != 2 or states[0].dim() != 3:
        return lstm(x, states)
    output, hidden, cell = th.lstm(
        x, states, lstm_weights(lstm) if weights is None else weights, lstm.bias, lstm.num_layers,
        float(lstm.dropout), lstm.training, lstm.bidirectional, lstm.batch_first,
    )  # fmt: skip
    return output, (hidden, cell)


def lstm_weights(lstm: nn.LSTM) -> list[th.Tensor]:
    """The weights ``nn.LSTM.forward`` hands ``torch.lstm``, as its public ``all_weights`` lists them."""
    return [weight for layer in lstm.all_weights for weight in layer]


# ---- the acting plan ------------------------------------------------------------------------------------


class TensorSnapshot:
    """A CPU tensor's memory and bytes at one moment: ``unchanged()`` while it keeps both (``.data`` writes included)."""

    __slots__ = ("array", "contents", "pointer", "tensor")

    def __init__(self, tensor: th.Tensor) -> None:
        self.tensor, self.pointer = tensor, tensor.data_ptr()
        self.array: np.ndarray = tensor.detach().numpy()  # shares the tensor's memory
        self.contents = self.array.tobytes()

    def unchanged(self) -> bool:
        return self.tensor.data_ptr() == self.pointer and self.array.tobytes() == self.contents


class StepScale(NamedTuple):
    """The state-independent Gaussian's scale at a rollout step's shape and its log-probability terms, from ``log_std``."""

    shape: th.Size
    log_std: TensorSnapshot
    scale: th.Tensor
    terms: tuple[th.Tensor, th.Tensor]


class ArrayHead(NamedTuple):
    """What the fast mode's NumPy step of a Gaussian head needs at every step, from ``log_std``."""

    log_std: TensorSnapshot
    scale: np.ndarray
    constant: float


class ActingPlan:
    """
    A policy's SB3 ``FlattenExtractor``, ``MlpExtractor`` and linear heads as tensors and functions for one rollout
    collection (``policy.acting()``), used while none of its modules would run a hook.
    """

    def __init__(
        self, modules: tuple[nn.Module, ...], networks: list[tuple[LayerStep, ...]], one_hot: int | None = None
    ) -> None:
        self.modules, self.networks, self.one_hot = modules, networks, one_hot
        self.tensors = [t for steps in networks for step in steps if type(step) is tuple for t in step if t is not None]
        self._pointers = [t.data_ptr() for t in self.tensors]
        self._addmm: list[tuple] | None = None
        self._arrays: ArrayPlan | bool | None = False  # not built yet
        self.head: StepScale | None = None
        self.array_head: ArrayHead | None = None

    @classmethod
    def of(cls, policy: nn.Module) -> ActingPlan | None:
        """The plan of ``policy``'s networks, or ``None`` where one of them is another module (steps then call them)."""
        space = getattr(policy, "observation_space", None)
        one_hot = int(space.n) if isinstance(space, spaces.Discrete) else None
        image = isinstance(space, spaces.Box) and getattr(policy, "normalize_images", False) and is_image_space(space)
        if not isinstance(space, (spaces.Discrete, spaces.MultiBinary, spaces.Box)) or image:
            return None
        names = ("features_extractor", "pi_features_extractor", "vf_features_extractor")
        extractors = [getattr(policy, name, None) for name in names]
        extractor = getattr(policy, "mlp_extractor", None)
        if any(type(e) is not FlattenExtractor for e in extractors) or type(extractor) is not MlpExtractor:
            return None
        modules = [*cast(list[nn.Module], extractors), extractor, *(cast(FlattenExtractor, e).flatten for e in extractors)]
        heads = cast(list[nn.Module], [policy.action_net, policy.value_net])
        networks = [_plan_steps(network, modules) for network in (extractor.policy_net, extractor.value_net, *heads)]
        if any(steps is None for steps in networks):
            return None
        steps = [tuple(cast(list[LayerStep], network)) for network in networks]
        if any(len(head) != 1 or type(head[0]) is not tuple for head in steps[2:]):
            return None
        return cls(tuple({id(module): module for module in modules}.values()), steps, one_hot)

    def usable(self) -> bool:
        """Whether the networks' modules would run no hook; derived forms are rebuilt after ``weight.data = ...``."""
        if _runs_global_hooks():
            return False
        for module in self.modules:  # _runs_own_hooks, inlined: this runs at every step
            if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks:
                return False
        if any(t.data_ptr() != pointer for t, pointer in zip(self.tensors, self._pointers, strict=True)):
            self._pointers = [t.data_ptr() for t in self.tensors]
            self._addmm, self._arrays = None, False
        return True

    def step(self, obs: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """``(latent_pi, values, action head output)`` of the observations, as the modules compute them."""
        if self.one_hot is not None:  # preprocess_obs, then FlattenExtractor
            features = F.one_hot(obs.long(), num_classes=self.one_hot).float().flatten(1, -1)
        else:
            features = obs.float().flatten(1, -1)
        networks: list[tuple] = self.networks
        if not th.is_grad_enabled():  # the transposed views carry no autograd history
            if self._addmm is None:
                self._addmm = [
                    tuple(Addmm(step[1], step[0].t()) if type(step) is tuple and step[1] is not None else step for step in s)
                    for s in self.networks
                ]
            networks = self._addmm
        pi, vf, action, value = networks
        latent_pi = _run_steps(pi, features)
        return latent_pi, _run_steps(value, _run_steps(vf, features)), _run_steps(action, latent_pi)

    def arrays(self) -> ArrayPlan | None:
        """This plan in NumPy (the fast mode's), built on the first call; ``None`` where it cannot run there."""
        if self._arrays is False:
            self._arrays = None
            if self.one_hot is None and all(t.device.type == "cpu" and t.dtype == th.float32 for t in self.tensors):
                pi, vf, action, value = (tuple(_array_step(step) for step in steps) for steps in self.networks)
                self._arrays = ArrayPlan((*pi, *action), (*vf, *value))
        return cast("ArrayPlan | None", self._arrays)


_ARRAY_FUNCTIONS: dict[Callable, Callable[[np.ndarray], np.ndarray]] = {th.relu: lambda x: np.maximum(x, 0), th.tanh: np.tanh}


def _array_step(step: LayerStep) -> tuple | Callable[[np.ndarray], np.ndarray]:
    if type(step) is tuple:
        weight, bias = step
        return weight.detach().numpy().T, None if bias is None else bias.detach().numpy()
    return _ARRAY_FUNCTIONS[cast(Callable, step)]


def _run_array_steps(steps: tuple, x: np.ndarray) -> np.ndarray:
    for step in steps:
        if type(step) is tuple:
            x = x @ step[0]
            if step[1] is not None:
                x += step[1]
        else:
            x = step(x)
    return x


class ArrayPlan(NamedTuple):
    """An :class:`ActingPlan` in NumPy on arrays sharing the parameters' memory (CPU, float32): the fast mode's step."""

    pi: tuple
    vf: tuple

    def step(self, obs: th.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``(values, action head output)`` of the observations (a CPU tensor), to float rounding."""
        features = obs.numpy().reshape(len(obs), -1).astype(np.float32, copy=False)
        return _run_array_steps(self.vf, features), _run_array_steps(self.pi, features)


# ---- rollout steps and minibatch scores without distribution objects ---------------------------------------


def step_outputs(policy: Policy, obs: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """``(latent_pi, values, action head output)`` of a rollout step: through the acting plan where there is one."""
    plan = policy._acting_plan
    if plan is not None and plan.usable():
        return plan.step(obs)
    latent_pi, latent_vf = policy._latents(obs)
    return latent_pi, lean_call(policy.value_net, latent_vf), lean_call(policy.action_net, latent_pi)


def step_scale(policy: Policy, head: th.Tensor) -> tuple[th.Tensor, tuple[th.Tensor, th.Tensor] | None]:
    """The state-independent Gaussian's scale and (in a CPU plan without autograd) its cached log-probability terms."""
    plan, log_std = policy._acting_plan, policy.log_std
    if plan is None or th.is_grad_enabled() or log_std.device.type != "cpu":
        return log_std.exp().expand_as(head), None
    cached = plan.head
    if cached is None or cached.shape != head.shape or not cached.log_std.unchanged():
        scale = log_std.exp().expand_as(head)
        cached = plan.head = StepScale(head.shape, TensorSnapshot(log_std), scale, gaussian_scale_terms(scale))
    return cached.scale, cached.terms


def sde_scale(policy: Policy, latent_pi: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """gSDE's ``latent_sde`` and scale as SB3's ``StateDependentNoiseDistribution.proba_distribution`` computes them."""
    dist = cast(StateDependentNoiseDistribution, policy.action_dist)
    latent_sde = latent_pi if dist.learn_features else latent_pi.detach()
    return latent_sde, th.sqrt(th.mm(latent_sde**2, dist.get_std(policy.log_std) ** 2) + dist.epsilon)


def array_step(policy: Policy, obs: th.Tensor, deterministic: bool) -> Step | None:
    """The fast mode's NumPy step of a state-independent Gaussian head; ``None`` where it cannot run."""
    plan = policy._acting_plan
    if plan is None or th.is_grad_enabled() or not plan.usable():
        return None
    arrays = plan.arrays()
    if arrays is None:
        return None
    head = plan.array_head
    if head is None or not head.log_std.unchanged():
        snapshot = TensorSnapshot(policy.log_std)
        log_half_range_sum = policy._log_half_range_sum if policy.squash_output else None
        constant = gaussian_log_prob_constant(snapshot.array, log_half_range_sum)
        head = plan.array_head = ArrayHead(snapshot, np.exp(snapshot.array), constant)
    values, mean = arrays.step(obs)
    noise = None if deterministic else th.randn(mean.shape).numpy()  # the default step's draw
    actions, log_prob = gaussian_step_from_noise(mean, head.scale, noise, head.constant, policy.squash_output)
    log_prob_tensor = th.from_numpy(log_prob)
    if np.isfinite(log_prob.sum()):  # else forward's check raises
        policy.__dict__["_finite_log_prob"] = log_prob_tensor
    shape = (-1, *cast(spaces.Box, policy.action_space).shape)
    return Step(th.from_numpy(actions.reshape(shape)), th.from_numpy(values), log_prob_tensor)


def direct_step(
    policy: Policy, obs: th.Tensor, deterministic: bool = False, action_masks: np.ndarray | None = None
) -> Step | None:
    """Upstream's ``forward`` for a :meth:`direct_head` without distribution objects (the same bits and draws)."""
    kind = policy.direct_head()
    if kind is None:
        return None
    own_std = kind == "gaussian" and not policy.state_dependent_std
    if own_std and policy.fast:
        step = array_step(policy, obs, deterministic)
        if step is not None:
            return step
    latent_pi, values, head = step_outputs(policy, obs)
    if kind in ("categorical", "masked"):
        actions, log_prob = direct_categorical(head, deterministic, action_masks, masked=kind == "masked")
    else:
        noise = scale_terms = None
        if own_std:
            scale, scale_terms = step_scale(policy, head)
        elif kind == "gaussian":  # DiagGaussianDistribution.proba_distribution
            scale = policy._bounded_log_std(latent_pi).exp().expand_as(head)
        else:  # StateDependentNoiseDistribution.proba_distribution and sample
            latent_sde, scale = sde_scale(policy, latent_pi)
            noise = None if deterministic else cast(StateDependentNoiseDistribution, policy.action_dist).get_noise(latent_sde)
        log_half_range_sum = policy._log_half_range_sum if policy.squash_output else None
        actions, log_prob = direct_gaussian(head, scale, deterministic, log_half_range_sum, noise, scale_terms)
    return Step(actions.reshape((-1, *cast(tuple[int, ...], policy.action_space.shape))), values, log_prob)


def direct_scores(policy: Policy, obs: th.Tensor, actions: th.Tensor, entropy_requires_grad: bool) -> Scores | None:
    """A minibatch's scores for the Gaussian heads without distribution objects (same bits); ``None`` for others."""
    kind = policy.direct_head()
    if kind not in ("gaussian", "sde") or policy.state_dependent_std:
        return None
    latent_pi, latent_vf = policy._latents(obs)
    mean = lean_call(policy.action_net, latent_pi)
    scale = th.ones_like(mean) * policy.log_std.exp() if kind == "gaussian" else sde_scale(policy, latent_pi)[1]
    values = lean_call(policy.value_net, latent_vf)
    squash = policy.squash_output
    if squash:
        log_prob = squashed_log_prob(actions, mean, scale, policy._log_half_range_sum)
    else:
        log_prob = gaussian_log_prob(actions, mean, scale)
    with th.set_grad_enabled(entropy_requires_grad and th.is_grad_enabled()):
        if squash and policy.entropy_estimator == "sample":
            return Scores(values, log_prob, None)
        entropy = gaussian_entropy(scale)
        if squash and policy.entropy_estimator == "mc":  # TanhSquashedDistribution.entropy
            u = mean + th.empty(mean.shape, dtype=mean.dtype, device=mean.device).normal_() * scale  # Normal.rsample
            entropy = entropy + (log_tanh_jacobian_sum(u) + policy._log_half_range_sum)
    return Scores(values, log_prob, entropy)
