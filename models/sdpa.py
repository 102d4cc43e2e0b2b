"""``scaled_dot_product_attention`` that keeps CPU bf16/fp16 inputs off the slow kernel.

On a CPU, PyTorch's reduced-precision SDPA kernel (what ``torch.autocast("cpu", bfloat16)`` sends
q, k and v to) is several times slower than its fp32 kernel at the small head sizes of these
models: 7.6x for the Fashion-MNIST ViT's attention, which made the whole bf16 training step 0.40x
of fp32 although its matrix products ran 1.8x faster (``repro bench precision`` measures both and
shows the per-op split). So on a CPU, bf16/fp16 q, k, v (and a float mask) go through the fp32
kernel, outside autocast, and the output is cast back: more precise than the bf16 kernel, and the
rest of the step keeps its bf16 speed. Every other device and dtype calls PyTorch's function as is.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

_REDUCED = (torch.bfloat16, torch.float16)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, ...)``, in fp32 for reduced-precision CPU inputs
    (see the module docstring); (B, heads, Tq, d) x (B, heads, Tk, d) -> (B, heads, Tq, d_v)."""
    if q.device.type != "cpu" or q.dtype not in _REDUCED:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.float()
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask,
                                             dropout_p=dropout_p, is_causal=is_causal)
    return out.to(q.dtype)
