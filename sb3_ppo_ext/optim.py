"""
The update's optimizer step (``zero_grad``, ``clip_grad_norm_``, ``Adam.step``) with less overhead per minibatch.

:class:`OptimizerStep` runs the three calls of SB3's PPO minibatch step. For SB3's default optimizer as the
package's policies build it (``torch.optim.Adam`` with ``foreach=True``, or ``fused=True`` in the fast mode;
no AMSGrad, weight decay, maximize, capturable or differentiable mode, no hooks) it runs the same tensor
operations as torch's functions, in the same order, without their per-call Python work (profiling scopes,
argument checks, per-parameter state lookups): the same gradients, norms, moments and parameters, bit for
bit. A test compares them with the installed torch over many steps and fails if a torch release changes its
arithmetic. Any other optimizer or setting, a ``step`` or ``zero_grad`` set on the optimizer instance, and
Adam's first step (which creates its state), goes through torch's own calls.
"""

from __future__ import annotations

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


def _runs_optimizer_hooks(optimizer: th.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` would run a hook (its own, or one registered for every optimizer)."""
    return bool(
        optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or torch_optimizer._global_optimizer_pre_hooks
        or torch_optimizer._global_optimizer_post_hooks
    )


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
        self._lean_clip = len(layouts) == 1 and all(type(p) in (th.Tensor, th.nn.Parameter) for p in parameters)
        # A step or zero_grad set on the optimizer instance (a user's wrapper, as for stock PPO) is called as it is.
        patched = vars(optimizer)
        self._lean_zero_grad = type(optimizer).zero_grad is th.optim.Optimizer.zero_grad and "zero_grad" not in patched
        self._lean_adam = (
            type(optimizer) is th.optim.Adam
            and "step" not in patched
            and all(_adam_mode(group) is not None for group in optimizer.param_groups)
            and all(not p.is_complex() and type(p) in (th.Tensor, th.nn.Parameter) for p in self.optimized)
            and all(len({(p.device, p.dtype) for p in group["params"]}) <= 1 for group in optimizer.param_groups)
            and getattr(optimizer, "grad_scale", None) is None
            and getattr(optimizer, "found_inf", None) is None
        )

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
        for group in self.optimizer.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [state.get(p) for p in params]
            grads = [p.grad for p in params]
            if any(not s for s in states) or any(g is None or g.is_sparse for g in grads):
                return False
            work.append((group, params, grads, states))
        one = th.tensor(1.0, device="cpu")  # torch adds a CPU tensor to the CPU step counters (alpha=1.0)
        for group, params, grads, states in work:
            beta1, beta2 = group["betas"]
            lr, eps = group["lr"], group["eps"]
            steps = [s["step"] for s in states]  # type: ignore[index]
            exp_avgs = [s["exp_avg"] for s in states]  # type: ignore[index]
            exp_avg_sqs = [s["exp_avg_sq"] for s in states]  # type: ignore[index]
            if _adam_mode(group) == "fused":  # _fused_adam: the step counters, then one kernel
                th._foreach_add_(steps, 1)
                th._fused_adam_(
                    params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr, beta1=beta1, beta2=beta2,
                    weight_decay=0.0, eps=eps, maximize=False, grad_scale=None, found_inf=None,
                )  # fmt: skip
                continue
            th._foreach_add_(steps, one, alpha=1.0)
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
        return True
