"""Model size and cost, measured the same way for every run so results are comparable."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (all, or only those with requires_grad)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def count_flops(module: nn.Module, example: torch.Tensor | dict) -> int:
    """Forward FLOPs for ``example`` (a batch of one gives FLOPs per sample).

    Counted by ``torch.utils.flop_counter`` (a multiply-add is 2 FLOPs). Attention runs on the
    math backend while counting, because the fused CPU kernel is invisible to the counter and
    its QK^T and AV products would be missed. The module is put in eval mode (no dropout, no
    BatchNorm statistics update) and restored; no gradients are recorded.
    """
    was_training = module.training
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    if isinstance(example, dict):
        example = {k: v.to(device) for k, v in example.items()}
    else:
        example = example.to(device)
    module.eval()
    try:
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            module(example)
    finally:
        module.train(was_training)
    return int(counter.get_total_flops())
