"""
The package's speed components, each the same operations on the same tensors as the calls it stands for (bit for bit,
tested), with less Python per call; each gives way to the plain call wherever that would run a hook, a user's
patch or a module of another kind:

- :func:`with_foreach_adam`: SB3's Adam built multi-tensor (fused in the fast mode);
- :class:`OptimizerStep`: the update's ``zero_grad``, ``clip_grad_norm_`` and Adam step, the Adam state of a
  multi-tensor group in flat buffers (:class:`FlatAdamGroup`);
- :func:`lean_call` and :func:`lean_lstm`: SB3's layers and ``nn.LSTM`` through the functions their ``forward`` calls;
- :class:`ActingPlan` (:class:`ArrayPlan` in the fast mode): a rollout collection's networks as tensors and functions;
- :func:`direct_step` and :func:`direct_scores`: a rollout step and a minibatch's scores without distribution objects.

A component is switched off by replacing its name here (``scripts/ablation.py``); the policies and the engine
reach each one through this module.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, cast

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

if TYPE_CHECKING:
    from sb3_ppo_ext.policies import PPOExtActorCriticPolicy


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


def with_foreach_adam(kwargs: dict[str, object], fused: bool = False) -> dict[str, object]:
    """
    A policy's keyword arguments with ``optimizer_kwargs["foreach"] = True`` (``fused`` instead with ``fused``,
    the fast mode's: not bit for bit) for SB3's default Adam, unless ``foreach`` or ``fused`` is given. SB3's
    ``eps=1e-5``, which it gives Adam only without ``optimizer_kwargs``, is kept where it applies.
    """
    if kwargs.get("optimizer_class", th.optim.Adam) is not th.optim.Adam:
        return kwargs
    optimizer_kwargs = kwargs.get("optimizer_kwargs")
    if optimizer_kwargs is None:
        optimizer_kwargs = {"eps": 1e-5}
    elif not isinstance(optimizer_kwargs, dict) or {"foreach", "fused"} & set(optimizer_kwargs):
        return kwargs
    return {**kwargs, "optimizer_kwargs": {**optimizer_kwargs, ("fused" if fused else "foreach"): True}}


# The settings of an Adam group the lean step reproduces, and its two implementations by (foreach, fused).
_LEAN_ADAM_GROUP = dict(
    amsgrad=False, maximize=False, capturable=False, differentiable=False, weight_decay=0, decoupled_weight_decay=False
)
_LEAN_ADAM_MODES = {(True, None): "foreach", (True, False): "foreach", (None, True): "fused", (False, True): "fused"}
_TORCH_DIR = os.path.dirname(th.__file__) + os.sep


def _adam_mode(group: dict) -> str | None:
    """``"foreach"`` or ``"fused"``: the implementation an Adam group runs, where the lean step reproduces it."""
    if any(group.get(key) != value for key, value in _LEAN_ADAM_GROUP.items()):
        return None
    if not all(type(value) is float for value in (group["lr"], group["eps"], *group["betas"])):
        return None  # a tensor learning rate or beta: torch's own arithmetic
    return _LEAN_ADAM_MODES.get((group.get("foreach"), group.get("fused")))


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
        th.optim.Optimizer.zero_grad, th.optim.Adam.step, adam.adam, adam._multi_tensor_adam, adam._fused_adam,
        th.nn.utils.clip_grad_norm_, clip_grad._get_total_norm, clip_grad._clip_grads_with_norm_,
    )  # fmt: skip
    return all(torchs_own(function) for function in functions) and not profiler._is_profiler_enabled


def _runs_optimizer_hooks(optimizer: th.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` would run a hook (its own, or one registered for every optimizer)."""
    return bool(
        optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or torch_optimizer._global_optimizer_pre_hooks
        or torch_optimizer._global_optimizer_post_hooks
    )


def _foreach_moments_and_params(
    params: list[th.Tensor], grads: list[th.Tensor], exp_avgs: list[th.Tensor], exp_avg_sqs: list[th.Tensor],
    steps: list[th.Tensor], lr: float, beta1: float, beta2: float, eps: float,
) -> None:  # fmt: skip
    """torch's ``_multi_tensor_adam`` (no optional branch) on one group's tensors."""
    th._foreach_add_(steps, th.tensor(1.0, device="cpu"), alpha=1.0)
    th._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    th._foreach_mul_(exp_avg_sqs, beta2)
    th._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    counts = [step.item() for step in steps]
    step_size = [(lr / (1 - beta1**count)) * -1 for count in counts]
    bias_correction2_sqrt = [(1 - beta2**count) ** 0.5 for count in counts]
    exp_avg_sq_sqrt = th._foreach_sqrt(exp_avg_sqs)
    th._foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt)
    th._foreach_add_(exp_avg_sq_sqrt, eps)
    th._foreach_addcdiv_(params, exp_avgs, exp_avg_sq_sqrt, step_size)


class FlatAdamGroup:
    """
    One Adam group's state in flat buffers: each parameter's ``exp_avg``, ``exp_avg_sq`` and ``step`` in
    ``optimizer.state`` become views of one buffer each (the same values), and :meth:`step` runs torch's
    multi-tensor arithmetic as one operation on each buffer. Used only where :func:`flat_adam_is_exact`.

    :param params: the group's parameters with gradients (contiguous, one device and dtype, each with Adam's
        state and the same step count)
    :param state: ``optimizer.state``
    """

    def __init__(self, params: list[th.Tensor], state: dict) -> None:
        self.params, self.state = params, state
        sizes = [p.numel() for p in params]
        self.exp_avg = th.cat([state[p]["exp_avg"].reshape(-1) for p in params])
        self.exp_avg_sq = th.cat([state[p]["exp_avg_sq"].reshape(-1) for p in params])
        self.steps = th.stack([state[p]["step"] for p in params])
        self.grad = th.empty(sum(sizes), dtype=params[0].dtype, device=params[0].device)
        self.denominator = th.empty_like(self.grad)
        self.exp_avg_views = [view.view_as(p) for view, p in zip(self.exp_avg.split(sizes), params, strict=True)]
        self.exp_avg_sq_views = [view.view_as(p) for view, p in zip(self.exp_avg_sq.split(sizes), params, strict=True)]
        self.denominator_views = [view.view_as(p) for view, p in zip(self.denominator.split(sizes), params, strict=True)]
        self.step_views = list(self.steps.unbind())
        views = zip(params, self.exp_avg_views, self.exp_avg_sq_views, self.step_views, strict=True)
        for p, exp_avg, exp_avg_sq, step in views:
            state[p].update(exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, step=step)
        self._one = th.tensor(1.0, device="cpu")

    @staticmethod
    def layout_possible(params: list[th.Tensor], state: dict) -> bool:
        """Whether these parameters' state fits the layout (see ``params``)."""
        if not params or len({(p.device, p.dtype) for p in params}) != 1 or not all(p.is_contiguous() for p in params):
            return False
        for p in params:
            entry = state.get(p)
            if not entry or any(not isinstance(entry.get(key), th.Tensor) for key in ("exp_avg", "exp_avg_sq", "step")):
                return False
            moments = (entry["exp_avg"], entry["exp_avg_sq"])
            if any(m.shape != p.shape or m.dtype != p.dtype or m.device != p.device for m in moments):
                return False
            if entry["step"].dim() != 0 or entry["step"].device.type != "cpu":
                return False
        return len({float(state[p]["step"]) for p in params}) == 1

    def intact(self, params: list[th.Tensor], state: dict) -> bool:
        """Whether these parameters with gradients and ``optimizer.state`` still hold this layout's views."""
        if state is not self.state or len(params) != len(self.params):
            return False
        views = zip(params, self.params, self.exp_avg_views, self.exp_avg_sq_views, self.step_views, strict=True)
        for p, own, exp_avg, exp_avg_sq, step in views:
            entry = state.get(p)
            if p is not own or entry is None or entry.get("step") is not step:
                return False
            if entry.get("exp_avg") is not exp_avg or entry.get("exp_avg_sq") is not exp_avg_sq:
                return False
        return True

    def step(self, grads: list[th.Tensor], lr: float, beta1: float, beta2: float, eps: float) -> bool:
        """One Adam step of the group, or ``False`` (nothing changed) where the step counts differ."""
        counts = self.steps.tolist()
        if min(counts) != max(counts):
            return False
        th.cat([grad.reshape(-1) for grad in grads], out=self.grad)
        self.steps.add_(self._one, alpha=1.0)
        self.exp_avg.lerp_(self.grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2)
        self.exp_avg_sq.addcmul_(self.grad, self.grad, value=1 - beta2)
        count = self.step_views[0].item()
        th.sqrt(self.exp_avg_sq, out=self.denominator)
        self.denominator.div_((1 - beta2**count) ** 0.5)
        self.denominator.add_(eps)
        th._foreach_addcdiv_(self.params, self.exp_avg_views, self.denominator_views, (lr / (1 - beta1**count)) * -1)
        return True


@functools.lru_cache(maxsize=64)
def flat_adam_is_exact(sizes: tuple[int, ...], dtype: th.dtype, device: th.device) -> bool:
    """
    Whether :meth:`FlatAdamGroup.step` gives exactly torch's multi-tensor bits for parameters of these sizes here (a
    kernel's vector loop and scalar tail may round differently, and the tails fall elsewhere in one buffer): both
    forms run three steps from the same random values, spread over many binades, and every bit is compared.
    """
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
        state = {
            p: dict(exp_avg=m.clone(), exp_avg_sq=v.clone(), step=th.tensor(7.0))
            for p, m, v in zip(params, *start[1:], strict=True)
        }
        group = FlatAdamGroup(params, state) if flat else None
        for grads in gradients:
            if group is not None:
                group.step(grads, 3e-4, 0.9, 0.999, 1e-5)
            else:
                moments = ([state[p][key] for p in params] for key in ("exp_avg", "exp_avg_sq", "step"))
                _foreach_moments_and_params(params, grads, *moments, 3e-4, 0.9, 0.999, 1e-5)
        runs.append([t for p in params for t in (p, state[p]["exp_avg"], state[p]["exp_avg_sq"], state[p]["step"])])
    return all(_same_bits(a, b) for a, b in zip(*runs, strict=True))


def _same_bits(a: th.Tensor, b: th.Tensor) -> bool:
    """Bitwise equality (``torch.equal`` counts ``-0.0`` and ``0.0`` as equal, and NaN as unequal to itself)."""
    if a.dtype.is_floating_point and a.element_size() in (2, 4, 8):
        bits = {2: th.int16, 4: th.int32, 8: th.int64}[a.element_size()]
        return a.dtype == b.dtype and th.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return th.equal(a, b)


class OptimizerStep:
    """
    One update's ``optimizer.zero_grad()``, ``clip_grad_norm_(parameters, max_norm)`` and ``optimizer.step()``.
    For SB3's Adam as the policies build it (foreach or fused; no AMSGrad, weight decay, maximize, capturable
    or differentiable mode) they run torch's tensor operations in torch's order without its per-call Python
    work: the same gradients, norms, moments and parameters, bit for bit. Any other optimizer or setting, a
    ``step`` or ``zero_grad`` set on the instance, an optimizer hook (its own or global), Adam's first step, a
    replacement of any function below SB3's three calls, and torch's profiler take torch's own calls.

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
            and all(_adam_mode(group) is not None for group in optimizer.param_groups)
            and all(not p.is_complex() for p in self.optimized)
            and all(len({(p.device, p.dtype) for p in group["params"]}) <= 1 for group in optimizer.param_groups)
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
            self._layouts.clear()  # torch's step may replace the state's tensors
            self.optimizer.step()

    @th.no_grad()
    def _adam_step(self) -> bool:
        """torch's Adam on every group, or ``False`` (nothing changed): a parameter without state yet, or a sparse gradient."""
        state = self.optimizer.state
        groups = [(group, [p for p in group["params"] if p.grad is not None]) for group in self.optimizer.param_groups]
        if any(not state.get(p) or cast(th.Tensor, p.grad).is_sparse for _, params in groups for p in params):
            return False
        for index, (group, params) in enumerate(groups):
            if not params:
                continue
            grads = [cast(th.Tensor, p.grad) for p in params]
            (beta1, beta2), lr, eps = group["betas"], group["lr"], group["eps"]
            moments = [[state[p][key] for p in params] for key in ("exp_avg", "exp_avg_sq", "step")]
            if _adam_mode(group) == "fused":  # _fused_adam: the step counters, then one kernel
                th._foreach_add_(moments[2], 1)
                th._fused_adam_(
                    params, grads, moments[0], moments[1], [], moments[2], amsgrad=False, lr=lr, beta1=beta1,
                    beta2=beta2, weight_decay=0.0, eps=eps, maximize=False, grad_scale=None, found_inf=None,
                )  # fmt: skip
                continue
            flat = flat_adam_group(self._layouts, index, params, state)
            if flat is None or not flat.step(grads, lr, beta1, beta2, eps):
                _foreach_moments_and_params(params, grads, *moments, lr, beta1, beta2, eps)
        return True


def flat_adam_group(
    layouts: dict[int, FlatAdamGroup], index: int, params: list[th.Tensor], state: dict
) -> FlatAdamGroup | None:
    """
    The flat layout of group ``index`` for this step, kept in ``layouts``: laid out afresh where the state was
    replaced (``load_state_dict``) or the parameters with gradients changed; ``None`` (per parameter) where it cannot be.
    """
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
    return bool(
        torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
        or torch_module._global_backward_hooks
        or torch_module._global_backward_pre_hooks
        or th.jit.is_tracing()
    )


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


def lean_call(module: nn.Module, x: th.Tensor) -> th.Tensor:
    """
    ``module(x)`` for SB3's layers (``nn.Sequential`` of ``nn.Linear`` and ``ReLU``/``Tanh``) through the functions
    their ``forward`` calls, without ``nn.Module.__call__``: the same values and autograd graph. Any other module,
    and any module that would run a hook, is called.
    """
    if _runs_global_hooks() or _runs_own_hooks(module):
        return module(x)
    if type(module) is nn.Sequential:
        for layer in module:
            x = lean_call(layer, x)
        return x
    step = _layer_step(module)
    if step is None:
        return module(x)
    return F.linear(x, *step) if type(step) is tuple else step(x)  # type: ignore[misc, operator]


def lean_lstm(
    lstm: nn.LSTM, x: th.Tensor, states: tuple[th.Tensor, th.Tensor], weights: list[th.Tensor] | None = None
) -> tuple[th.Tensor, tuple[th.Tensor, th.Tensor]]:
    """
    ``lstm(x, states)`` as sb3-contrib calls it (3-D input, both states): the ``torch.lstm`` call of
    ``nn.LSTM.forward`` without its per-call checks. A subclass, a module that would run hooks and any other
    input go through the module.

    :param weights: :func:`lstm_weights` of ``lstm``, where the caller made them once for several calls
    """
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


class Addmm(NamedTuple):
    """An ``nn.Linear`` with a bias as ``F.linear`` runs it on a 2-D input: ``addmm(bias, input, weight.t())``."""

    bias: th.Tensor
    weight_t: th.Tensor


def _run_steps(steps: tuple, x: th.Tensor) -> th.Tensor:
    for step in steps:
        kind = type(step)
        if kind is Addmm:
            x = th.addmm(step[0], x, step[1])
        elif kind is tuple:
            x = F.linear(x, *step)
        else:
            x = step(x)
    return x


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


class ActingPlan:
    """
    A policy's networks for one rollout collection (``policy.acting()``): the tensors and functions SB3's
    ``FlattenExtractor``, ``MlpExtractor`` and linear heads run, in order, for a step without ``nn.Module.__call__``
    per layer. Built only for exactly those modules on a ``Box`` (not a scaled image), ``Discrete`` or ``MultiBinary``
    observation space; used only while none of its modules would run a hook (checked at each step).
    """

    def __init__(
        self, modules: tuple[nn.Module, ...], networks: list[tuple[LayerStep, ...]], one_hot: int | None = None
    ) -> None:
        self.modules, self.networks, self.one_hot = modules, networks, one_hot
        self.tensors = [t for steps in networks for step in steps if type(step) is tuple for t in step if t is not None]
        self._pointers = [t.data_ptr() for t in self.tensors]
        self._addmm: list[tuple] | None = None
        self._arrays: ArrayPlan | bool | None = False  # not built yet
        #: the Gaussian head's scale, computed once per collection (:func:`step_scale`)
        self.head: StepScale | None = None

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
            cpu32 = all(t.device.type == "cpu" and t.dtype == th.float32 for t in self.tensors)
            self._arrays = ArrayPlan(self) if cpu32 and self.one_hot is None else None
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


class ArrayPlan:
    """
    An :class:`ActingPlan` in NumPy, on arrays sharing the parameters' memory (CPU, float32): the fast mode's rollout
    step, to float rounding (NumPy's cost per tiny operation is a fraction of torch's).
    """

    def __init__(self, plan: ActingPlan) -> None:
        pi, vf, action, value = (tuple(_array_step(step) for step in steps) for steps in plan.networks)
        self.pi, self.vf = (*pi, *action), (*vf, *value)
        #: what the Gaussian head needs at every step, computed once per collection
        self.head: ArrayHead | None = None

    def step(self, obs: th.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """``(values, action head output)`` of the observations (a CPU tensor)."""
        features = obs.numpy().reshape(len(obs), -1).astype(np.float32, copy=False)
        return _run_array_steps(self.vf, features), _run_array_steps(self.pi, features)


# ---- rollout steps and minibatch scores without distribution objects ---------------------------------------


def step_outputs(policy: PPOExtActorCriticPolicy, obs: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """``(latent_pi, values, action head output)`` of a rollout step: through the acting plan where there is one."""
    plan = policy._acting_plan
    if plan is not None and plan.usable():
        return plan.step(obs)
    latent_pi, latent_vf = policy._latents(obs)
    return latent_pi, lean_call(policy.value_net, latent_vf), lean_call(policy.action_net, latent_pi)


def step_scale(policy: PPOExtActorCriticPolicy, head: th.Tensor) -> tuple[th.Tensor, tuple[th.Tensor, th.Tensor] | None]:
    """
    The state-independent Gaussian's scale (SB3: ``ones_like(head) * exp(log_std)``, the same values) and, in a
    collection's plan on a CPU without autograd, its log-probability terms: computed once and reused while
    ``log_std`` keeps its memory and bytes.
    """
    plan, log_std = policy._acting_plan, policy.log_std
    if plan is None or th.is_grad_enabled() or log_std.device.type != "cpu":
        return log_std.exp().expand_as(head), None
    cached = plan.head
    if cached is None or cached.shape != head.shape or not cached.log_std.unchanged():
        scale = log_std.exp().expand_as(head)
        cached = plan.head = StepScale(head.shape, TensorSnapshot(log_std), scale, gaussian_scale_terms(scale))
    return cached.scale, cached.terms


def sde_scale(policy: PPOExtActorCriticPolicy, latent_pi: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """gSDE's ``latent_sde`` and scale as SB3's ``StateDependentNoiseDistribution.proba_distribution`` computes them."""
    dist = cast(StateDependentNoiseDistribution, policy.action_dist)
    latent_sde = latent_pi if dist.learn_features else latent_pi.detach()
    return latent_sde, th.sqrt(th.mm(latent_sde**2, dist.get_std(policy.log_std) ** 2) + dist.epsilon)


def array_step(policy: PPOExtActorCriticPolicy, obs: th.Tensor, deterministic: bool) -> Step | None:
    """
    The fast mode's step of a state-independent Gaussian head (squashed or not): the networks in NumPy, torch's
    random draw, the log-probability from the draw. ``None`` outside a collection's plan, where the plan cannot
    run in NumPy, with autograd on or where a hook would run.
    """
    plan = policy._acting_plan
    if plan is None or th.is_grad_enabled() or not plan.usable():
        return None
    arrays = plan.arrays()
    if arrays is None:
        return None
    head = arrays.head
    if head is None or not head.log_std.unchanged():  # once per collection, unless log_std changes
        snapshot = TensorSnapshot(policy.log_std)
        log_half_range_sum = policy._log_half_range_sum if policy.squash_output else None
        constant = gaussian_log_prob_constant(snapshot.array, log_half_range_sum)
        head = arrays.head = ArrayHead(snapshot, np.exp(snapshot.array), constant)
    values, mean = arrays.step(obs)
    noise = None if deterministic else th.randn(mean.shape).numpy()  # the default step's draw
    actions, log_prob = gaussian_step_from_noise(mean, head.scale, noise, head.constant, policy.squash_output)
    log_prob_tensor = th.from_numpy(log_prob)
    if np.isfinite(log_prob.sum()):  # else forward's check raises
        policy.__dict__["_finite_log_prob"] = log_prob_tensor
    shape = (-1, *cast(spaces.Box, policy.action_space).shape)
    return Step(th.from_numpy(actions.reshape(shape)), th.from_numpy(values), log_prob_tensor)


def direct_step(
    policy: PPOExtActorCriticPolicy, obs: th.Tensor, deterministic: bool = False, action_masks: np.ndarray | None = None
) -> Step | None:
    """
    Upstream's ``forward`` for a head of :meth:`~sb3_ppo_ext.policies.CheckedForward.direct_head`, without SB3's and
    torch's distribution objects: the same actions, values, log-probabilities and random draws. ``None``: no such head.
    """
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
    return Step(actions.reshape((-1, *policy.action_space.shape)), values, log_prob)


def direct_scores(
    policy: PPOExtActorCriticPolicy, obs: th.Tensor, actions: th.Tensor, entropy_requires_grad: bool
) -> Scores | None:
    """
    A minibatch's scores for the Gaussian heads (``direct_head()`` ``"gaussian"`` or ``"sde"``, squashed or not)
    with the operations of SB3's and torch's distributions (and of the squashed head's), without building them:
    the same values, gradients and random draws. ``None`` for the other heads.
    """
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
