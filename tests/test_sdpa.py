"""models.sdpa: reduced-precision CPU attention through the fp32 kernel, everything else untouched."""

import torch
import torch.nn.functional as F

from models.sdpa import scaled_dot_product_attention


def _qkv(dtype, T=17, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, T, d, generator=g).to(dtype) for _ in range(3)]


def test_fp32_inputs_are_pytorchs_call_exactly():
    q, k, v = _qkv(torch.float32)
    bias = torch.randn(3, 4, 17, 17)
    assert torch.equal(scaled_dot_product_attention(q, k, v, attn_mask=bias), F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


def test_bf16_inputs_under_autocast_run_the_fp32_kernel_and_come_back_bf16():
    q, k, v = _qkv(torch.bfloat16)
    keep = torch.rand(3, 1, 1, 17, generator=torch.Generator().manual_seed(1)) > 0.3
    keep[..., -1] = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scaled_dot_product_attention(q, k, v, attn_mask=keep)
    assert out.dtype == torch.bfloat16
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=keep)
    assert torch.equal(out, ref.to(torch.bfloat16))  # the fp32 result of the same inputs, rounded once
    # PyTorch's own bf16 kernel is further from the fp32 answer than this
    own = F.scaled_dot_product_attention(q, k, v, attn_mask=keep).float()
    assert (out.float() - ref).abs().max() <= (own - ref).abs().max()


def test_a_bf16_float_mask_and_gradients_flow_back_in_bf16():
    q, k, v = (t.requires_grad_() for t in _qkv(torch.bfloat16))
    bias = torch.randn(3, 4, 17, 17).to(torch.bfloat16)
    out = scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.0)
    out.float().sum().backward()
    assert out.dtype == q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.bfloat16
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qf, kf, vf, attn_mask=bias.float()).sum().backward()
    assert torch.allclose(q.grad.float(), qf.grad, atol=2e-2, rtol=2e-2)
