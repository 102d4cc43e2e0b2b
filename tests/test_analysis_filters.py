"""analysis/filters.py: PCA of the patch-embedding filters."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from timm.layers import HybridEmbed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from analysis.filters import filter_pca, patch_filters
from models.vit import ViT


def test_first_two_components_span_a_known_subspace():
    """Filters mean + a_i u + b_i v (3 channels, 4x4 patches): the first two components span
    {u, v}; the others carry no variance."""
    g = torch.Generator().manual_seed(0)
    d, shape = 64, (3, 4, 4)
    basis = torch.linalg.qr(torch.randn(48, 2, generator=g, dtype=torch.float64))[0].T  # (2, 48) orthonormal
    coeffs = torch.randn(d, 2, generator=g, dtype=torch.float64) * torch.tensor([3.0, 1.0], dtype=torch.float64)
    mean = torch.randn(48, generator=g, dtype=torch.float64)
    conv = nn.Conv2d(3, d, kernel_size=4, stride=4)
    with torch.no_grad():
        conv.weight.copy_((mean + coeffs @ basis).reshape(d, *shape))
    pca = filter_pca(patch_filters(conv.weight), num_components=5)
    assert pca.components.shape == (5, *shape)
    comps = pca.components.reshape(5, -1).double()
    torch.testing.assert_close(comps @ comps.T, torch.eye(5, dtype=torch.float64), atol=1e-5, rtol=0)
    top2 = comps[:2]
    projected = basis @ top2.T @ top2  # the basis projected onto span(top2)
    torch.testing.assert_close(projected, basis, atol=1e-5, rtol=0)
    assert pca.explained_variance_ratio[:2].sum() == pytest.approx(1.0, abs=1e-5)
    assert pca.explained_variance_ratio[0] > pca.explained_variance_ratio[1]
    torch.testing.assert_close(pca.mean.reshape(-1).double(), conv.weight.detach().reshape(d, -1).mean(0).double(),
                               atol=1e-6, rtol=0)


def test_patch_filters_of_a_vit():
    model = ViT(img_size=8, in_chans=3, num_classes=3, patch_size=4, embed_dim=16, depth=1, num_heads=2)
    filters = patch_filters(model)
    assert filters.shape == (16, 3, 4, 4)
    pca = filter_pca(filters)  # asks for 28, has at most min(16, 48) = 16
    assert pca.components.shape == (16, 3, 4, 4)
    assert pca.explained_variance_ratio.sum() == pytest.approx(1.0, abs=1e-5)
    # sign convention: each component's largest entry in magnitude is positive
    flat = pca.components.reshape(16, -1)
    assert torch.all(flat.gather(1, flat.abs().argmax(1, keepdim=True)) > 0)


def test_hybrid_has_no_pixel_filters():
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
    model = VisionTransformer(img_size=8, patch_size=1, num_classes=3, embed_dim=16, depth=1, num_heads=2,
                              embed_layer=partial(HybridEmbed, backbone=cnn))
    with pytest.raises(ValueError, match="projects CNN features, not pixels"):
        patch_filters(model)
