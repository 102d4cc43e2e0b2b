"""``SGDAdamW``: one optimiser that updates some parameter groups by SGD with Nesterov momentum and
the rest by AdamW.

Why: a hybrid's convolutional stem with BatchNorm learns fastest with the fast CIFAR-10 CNNs'
recipe (SGD, Nesterov momentum, a high rate, a higher one still for the BatchNorm biases: K. Jordan's
airbench), while a transformer needs Adam's per-parameter scaling. Two optimisers would need
Lightning's manual optimisation, and each scheduler, checkpoint and clipping path would have to
know about both; one ``torch.optim.Optimizer`` whose groups carry their rule keeps every one of
them as it is: ``LambdaLR`` scales each group's own initial rate, the state saves and restores
with the usual ``state_dict``, gradient clipping sees one optimiser.

A group's ``rule`` is ``adamw`` (the default) or ``sgd``. Both follow PyTorch's own optimisers
step for step (``torch.optim.AdamW`` without amsgrad; ``torch.optim.SGD`` with ``momentum``,
``nesterov``, no dampening and weight decay added to the gradient, so it runs through the
momentum as in SGD), which the tests check against them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal, Optional

import torch
from torch.optim import Optimizer

from utils.choices import check_choice, choices

Rule = Literal["adamw", "sgd"]
RULES = choices(Rule)


class SGDAdamW(Optimizer):
    """AdamW on the groups whose ``rule`` is ``adamw`` (the default), SGD with momentum on those whose
    ``rule`` is ``sgd``.

    Args:
        params: parameters or groups; a group may set any of the keywords below for itself.
        lr: the rate of groups that do not set their own.
        betas, eps, weight_decay: AdamW's (decoupled decay: ``p *= 1 - lr * weight_decay``);
            for SGD groups ``weight_decay`` is PyTorch SGD's (added to the gradient).
        momentum, nesterov: SGD's.
        rule: the default rule of groups that do not set one.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.9,
        nesterov: bool = True,
        rule: Rule = "adamw",
    ) -> None:
        if lr <= 0:
            raise ValueError(f"lr={lr!r} must be positive")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum!r} must be in [0, 1)")
        check_choice("rule", rule, Rule)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, momentum=momentum,
                        nesterov=nesterov, rule=rule)  # fmt: skip
        super().__init__(params, defaults)
        for group in self.param_groups:
            check_choice("rule", group["rule"], Rule)
            if group["rule"] == "sgd" and group["nesterov"] and group["momentum"] <= 0:
                raise ValueError("an SGD group with nesterov=True needs momentum > 0")

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if group["rule"] == "sgd":
                self._sgd(group, params)
            else:
                self._adamw(group, params)
        return loss

    def _sgd(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, momentum, decay, nesterov = group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]
        for p in params:
            d_p = p.grad if decay == 0 else p.grad.add(p, alpha=decay)
            if momentum > 0:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = d_p.detach().clone()
                else:
                    buf.mul_(momentum).add_(d_p)
                d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
            p.add_(d_p, alpha=-lr)

    def _adamw(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            step = float(state["step"])
            if decay:
                p.mul_(1 - lr * decay)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(p.grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            bias1, bias2 = 1 - beta1**step, 1 - beta2**step
            denom = (exp_avg_sq.sqrt() / (bias2**0.5)).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-lr / bias1)
