"""
The update's optimizer step (``zero_grad``, ``clip_grad_norm_``, ``Adam.step``) with less overhead per minibatch.

:class:`OptimizerStep` runs the three calls of SB3's PPO minibatch step. For SB3's default optimizer as the
package's policies build it (``torch.optim.Adam`` with ``foreach=True``, or ``fused=True`` in the fast mode;
no AMSGrad, weight decay, maximize, capturable or differentiable mode, no hooks) it runs the same tensor
operations as torch's functions, in the same order, without their per-call Python work (profiling scopes,
argument checks, per-parameter state lookups): the same gradients, norms, moments and parameters, bit for
bit. A test compares them with the installed torch over many steps and fails if a torch release changes its
arithmetic. Any other optimizer or setting, a ``step`` or ``zero_grad`` set on the optimizer instance, an optimizer hook
(its own or torch's global ones), Adam's first step (which creates its state), and any of torch's three functions
replaced by code that is not torch's (a user's patch of ``Adam.step``, ``Optimizer.zero_grad``,
``torch.nn.utils.clip_grad_norm_`` or the functions these call: torch's functional ``adam`` and its
implementations, ``clip_grad``'s total norm and scaling), and torch's profiler running, goes through torch's own
calls, as under SB3's PPO. These are checked once per update.

On the multi-tensor path, a parameter group's Adam state also moves into flat buffers (:class:`FlatAdamGroup`):
each parameter's ``exp_avg``, ``exp_avg_sq`` and ``step`` in ``optimizer.state`` become views of one buffer each,
holding the same values, so that the moment updates run as one operation on the buffer instead of one per
parameter (torch's multi-tensor functions loop over the tensors on a CPU). Those operations act on each element
alone, but a kernel's vector loop and its scalar tail could round differently, and the tails fall elsewhere in
one buffer than in the separate tensors; so before a layout is first used, :func:`flat_adam_is_exact` runs both
forms on random values of the group's sizes and the flat one is taken only where every bit agrees (on this
device, dtype and build of torch). State replaced from outside (``optimizer.load_state_dict``, as ``load`` and
``set_parameters`` do, or an assignment) or a different set of parameters with gradients is noticed at the next
step, which then runs per parameter, and the following step lays the buffers out afresh; so are step counts
that differ (torch's own ``optimizer.step()`` on some of the parameters), for as long as they differ. The
parameters themselves and their gradients stay where they are (the gradients are copied into a flat buffer
once per step).
"""

from __future__ import annotations

import functools
import os
import weakref
from typing import NamedTuple

import torch as th
from torch.optim import optimizer as torch_optimizer

# The settings of an Adam parameter group that the lean step reproduces (any other value: torch's step),
# and its two implementations: multi-tensor (foreach, SB3's default as this package's policies build it)
# and fused (the fast mode's).
_LEAN_ADAM_GROUP = dict(
    amsgrad=False,
    maximize=False,
    capturable=False,
    differentiable=False,
    weight_decay=0,
    decoupled_weight_decay=False,
)
_LEAN_ADAM_MODES = {(True, None): "foreach", (True, False): "foreach", (None, True): "fused", (False, True): "fused"}


def _adam_mode(group: dict) -> str | None:
    """``"foreach"`` or ``"fused"``: the implementation an Adam parameter group runs, where the lean step reproduces it."""
    if any(group.get(key) != value for key, value in _LEAN_ADAM_GROUP.items()):
        return None
    if not all(type(value) is float for value in (group["lr"], group["eps"], *group["betas"])):
        return None  # a tensor (or a numpy) learning rate or beta: torch's own arithmetic
    return _LEAN_ADAM_MODES.get((group.get("foreach"), group.get("fused")))


_TORCH_DIR = os.path.dirname(th.__file__) + os.sep


def torchs_own(function: object) -> bool:
    """Whether ``function`` and every function it wraps (``__wrapped__``) is torch's own code, not a user's replacement."""
    while function is not None:
        code = getattr(function, "__code__", None)
        if code is None or not code.co_filename.startswith(_TORCH_DIR):
            return False
        function = getattr(function, "__wrapped__", None)
    return True


def _torchs_functions() -> bool:
    """
    Whether every function SB3's three calls run through is torch's own code (no user's patch at any layer:
    ``Optimizer.zero_grad``, ``Adam.step`` and the functional ``adam`` it dispatches to, ``clip_grad_norm_`` and
    the two functions it calls), and torch's profiler is off (the lean calls have no profiling scopes).
    """
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
    """torch's ``_multi_tensor_adam`` (no optional branch) on one group's tensors, as the lean step runs it."""
    th._foreach_add_(steps, th.tensor(1.0, device="cpu"), alpha=1.0)  # torch adds a CPU tensor to the CPU counters
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
    One Adam parameter group's state in flat buffers: each parameter's ``exp_avg``, ``exp_avg_sq`` and ``step``
    in ``optimizer.state`` replaced by a view of one buffer each (the same values), and :meth:`step` running
    torch's multi-tensor Adam arithmetic on the buffers, one operation for all the parameters where torch runs
    one per parameter (see the module docstring for when it is bit for bit and how that is checked).

    :param params: the group's parameters that have gradients, in the group's order (contiguous, one device and
        dtype, each with Adam's state and the same step count)
    :param state: ``optimizer.state``
    """

    def __init__(self, params: list[th.Tensor], state: dict) -> None:
        self.params = params
        self.state = state
        sizes = [p.numel() for p in params]
        like = params[0]
        self.exp_avg = th.cat([state[p]["exp_avg"].reshape(-1) for p in params])
        self.exp_avg_sq = th.cat([state[p]["exp_avg_sq"].reshape(-1) for p in params])
        self.steps = th.stack([state[p]["step"] for p in params])
        self.grad = th.empty(sum(sizes), dtype=like.dtype, device=like.device)
        self.denominator = th.empty_like(self.grad)
        self.exp_avg_views = [view.view_as(p) for view, p in zip(self.exp_avg.split(sizes), params, strict=True)]
        self.exp_avg_sq_views = [view.view_as(p) for view, p in zip(self.exp_avg_sq.split(sizes), params, strict=True)]
        self.denominator_views = [view.view_as(p) for view, p in zip(self.denominator.split(sizes), params, strict=True)]
        self.step_views = list(self.steps.unbind())
        for p, exp_avg, exp_avg_sq, step in zip(
            params, self.exp_avg_views, self.exp_avg_sq_views, self.step_views, strict=True
        ):
            state[p].update(exp_avg=exp_avg, exp_avg_sq=exp_avg_sq, step=step)
        self._one = th.tensor(1.0, device="cpu")

    @staticmethod
    def layout_possible(params: list[th.Tensor], state: dict) -> bool:
        """Whether :class:`FlatAdamGroup` can hold these parameters' state (see ``params`` of the class)."""
        if not params or len({(p.device, p.dtype) for p in params}) != 1 or not all(p.is_contiguous() for p in params):
            return False
        for p in params:
            entry = state.get(p)
            if not entry or any(not isinstance(entry.get(key), th.Tensor) for key in ("exp_avg", "exp_avg_sq", "step")):
                return False
            if entry["exp_avg"].shape != p.shape or entry["exp_avg_sq"].shape != p.shape or entry["step"].dim() != 0:
                return False
            if {entry["exp_avg"].dtype, entry["exp_avg_sq"].dtype} != {p.dtype} or entry["step"].device.type != "cpu":
                return False
            if entry["exp_avg"].device != p.device or entry["exp_avg_sq"].device != p.device:
                return False
        return len({float(state[p]["step"]) for p in params}) == 1

    def intact(self, params: list[th.Tensor], state: dict) -> bool:
        """Whether these parameters with gradients and ``optimizer.state`` are still the ones laid out here."""
        if state is not self.state or len(params) != len(self.params):
            return False
        for p, own, exp_avg, exp_avg_sq, step in zip(
            params, self.params, self.exp_avg_views, self.exp_avg_sq_views, self.step_views, strict=True
        ):
            entry = state.get(p)
            if p is not own or entry is None:
                return False
            if entry.get("exp_avg") is not exp_avg or entry.get("exp_avg_sq") is not exp_avg_sq:
                return False
            if entry.get("step") is not step:
                return False
        return True

    def step(self, grads: list[th.Tensor], lr: float, beta1: float, beta2: float, eps: float) -> bool:
        """
        One Adam step of the group (``grads``: the parameters' gradients, in order), or ``False`` (nothing
        changed) where the step counts differ (an ``optimizer.step()`` of torch's own stepped only some of them).
        """
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
    Whether :meth:`FlatAdamGroup.step` gives exactly the bits of torch's multi-tensor arithmetic for parameters of
    these sizes, here: both forms run three steps from the same random parameters, moments and gradients (their
    magnitudes spread over many binades), and every parameter, moment and step count is compared bit for bit.
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
                _foreach_moments_and_params(
                    params, grads, [state[p]["exp_avg"] for p in params], [state[p]["exp_avg_sq"] for p in params],
                    [state[p]["step"] for p in params], 3e-4, 0.9, 0.999, 1e-5,
                )  # fmt: skip
        runs.append([t for p in params for t in (p, state[p]["exp_avg"], state[p]["exp_avg_sq"], state[p]["step"])])
    return all(_same_bits(a, b) for a, b in zip(*runs, strict=True))


def _same_bits(a: th.Tensor, b: th.Tensor) -> bool:
    """Bitwise equality (``torch.equal`` counts ``-0.0`` and ``0.0`` as equal, and NaN as unequal to itself)."""
    if a.dtype.is_floating_point and a.element_size() in (2, 4, 8):
        bits = {2: th.int16, 4: th.int32, 8: th.int64}[a.element_size()]
        return a.dtype == b.dtype and th.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return th.equal(a, b)


class _Layout(NamedTuple):
    """A parameter group's flat layout (``flat``), or why it has none: refused for these parameters and step counters."""

    group: dict
    flat: FlatAdamGroup | None
    state: dict | None = None
    params: list[th.Tensor] | None = None
    steps: list | None = None


# Each optimizer's flat layouts by parameter group index.
_FLAT_GROUPS: weakref.WeakKeyDictionary[th.optim.Optimizer, dict[int, _Layout]] = weakref.WeakKeyDictionary()


class OptimizerStep:
    """
    One update's ``optimizer.zero_grad()``, ``clip_grad_norm_(parameters, max_norm)`` and ``optimizer.step()``
    (see the module docstring for when they take the lean path).

    :param optimizer: the policy's optimizer
    :param parameters: the parameters whose gradients are clipped (the policy's, as SB3's PPO clips them)
    :param max_norm: ``max_grad_norm``
    """

    def __init__(self, optimizer: th.optim.Optimizer, parameters: list[th.Tensor], max_norm: float) -> None:
        self.optimizer, self.parameters, self.max_norm = optimizer, parameters, float(max_norm)
        self.optimized = [p for group in optimizer.param_groups for p in group["params"]]
        layouts = {(p.device, p.dtype) for p in parameters}
        torchs = _torchs_functions()
        self._lean_clip = torchs and len(layouts) == 1 and all(type(p) in (th.Tensor, th.nn.Parameter) for p in parameters)
        # A step or zero_grad set on the optimizer instance (a user's wrapper, as for stock PPO) is called as it is.
        patched = vars(optimizer)
        self._lean_zero_grad = (
            type(optimizer).zero_grad is th.optim.Optimizer.zero_grad and "zero_grad" not in patched and torchs
        )
        self._lean_adam = (
            type(optimizer) is th.optim.Adam
            and "step" not in patched
            and torchs
            and all(_adam_mode(group) is not None for group in optimizer.param_groups)
            and all(not p.is_complex() and type(p) in (th.Tensor, th.nn.Parameter) for p in self.optimized)
            and all(len({(p.device, p.dtype) for p in group["params"]}) <= 1 for group in optimizer.param_groups)
            and getattr(optimizer, "grad_scale", None) is None
            and getattr(optimizer, "found_inf", None) is None
        )
        self._layouts = _FLAT_GROUPS.setdefault(optimizer, {})  # Adam's flat buffers, kept from update to update

    def zero_grad(self) -> None:
        """``optimizer.zero_grad()`` (torch's default, ``set_to_none=True``): every optimized gradient set to ``None``."""
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
            self._layouts.clear()  # torch's step may change the state's tensors: laid out afresh afterwards
            self.optimizer.step()

    @th.no_grad()
    def _adam_step(self) -> bool:
        """
        torch's multi-tensor Adam (``_multi_tensor_adam`` without its optional branches) on every group, or
        ``False`` (nothing changed) where a parameter with a gradient has no state yet (Adam's first step
        creates it) or a gradient is sparse; a group mixing devices or dtypes is refused once, in ``__init__``.
        """
        state = self.optimizer.state
        work = []
        for index, group in enumerate(self.optimizer.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [state.get(p) for p in params]
            grads = [p.grad for p in params]
            if any(not s for s in states) or any(g is None or g.is_sparse for g in grads):
                return False
            work.append((index, group, params, grads, states))
        for index, group, params, grads, states in work:
            beta1, beta2 = group["betas"]
            lr, eps = group["lr"], group["eps"]
            fused = _adam_mode(group) == "fused"
            if not fused:
                flat = self._flat_group(index, group, params)
                if flat is not None and flat.step(grads, lr, beta1, beta2, eps):
                    continue
            exp_avgs = [s["exp_avg"] for s in states]  # type: ignore[index]
            exp_avg_sqs = [s["exp_avg_sq"] for s in states]  # type: ignore[index]
            steps = [s["step"] for s in states]  # type: ignore[index]
            if fused:  # _fused_adam: the step counters, then one kernel
                th._foreach_add_(steps, 1)
                th._fused_adam_(
                    params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr, beta1=beta1, beta2=beta2,
                    weight_decay=0.0, eps=eps, maximize=False, grad_scale=None, found_inf=None,
                )  # fmt: skip
                continue
            _foreach_moments_and_params(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps)
        return True

    def _flat_group(self, index: int, group: dict, params: list[th.Tensor]) -> FlatAdamGroup | None:
        """
        The flat layout of a multi-tensor group for this step, or ``None`` (this step runs per parameter): a
        layout that no longer matches is dropped, and a new one is made at the step after (every parameter's
        state then holds the same step count again, unless the set of parameters with gradients keeps changing).
        """
        state, layouts = self.optimizer.state, self._layouts
        entry = layouts.get(index)
        if entry is not None:
            if entry.flat is not None:
                if entry.group is group and entry.flat.intact(params, state):
                    return entry.flat
                del layouts[index]
                return None
            # refused for these parameters and step counters (different counts stay different): not tried again
            if entry.group is group and entry.state is state and _same_objects(entry.params or [], params):
                if _same_objects(entry.steps or [], [state[p].get("step") for p in params]):
                    return None
        if not FlatAdamGroup.layout_possible(params, state) or not flat_adam_is_exact(
            tuple(p.numel() for p in params), params[0].dtype, params[0].device
        ):
            layouts[index] = _Layout(group, None, state, params, [state[p].get("step") for p in params])
            return None
        flat = FlatAdamGroup(params, state)
        layouts[index] = _Layout(group, flat)
        return flat


def _same_objects(first: list, second: list) -> bool:
    """Whether two lists hold the same objects (identity, not equality), in the same order."""
    return len(first) == len(second) and all(a is b for a, b in zip(first, second, strict=True))
