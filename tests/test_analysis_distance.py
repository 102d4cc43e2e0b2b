"""analysis/distance.py: mean attention distance against answers computed independently."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from analysis.attention import TokenLayout
from analysis.distance import (
    MeanAttentionDistance,
    attention_distance,
    format_summary,
    mean_attention_distance,
    summarize,
    uniform_distance,
)
from models.vit import ViT


def brute_force_uniform(rows: int, cols: int, py: float, px: float) -> float:
    """Mean over all (query, key) patch pairs, self-pairs included, of the pixel distance."""
    cells = list(itertools.product(range(rows), range(cols)))
    total = sum(math.hypot(py * (r1 - r2), px * (c1 - c2)) for (r1, c1), (r2, c2) in itertools.product(cells, cells))
    return total / len(cells) ** 2


def weights(layers, batch, heads, tokens, fill) -> torch.Tensor:
    return fill(torch.empty(layers, batch, heads, tokens, tokens))


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("class_token", ["drop", "zero"])
def test_identity_attention_has_distance_zero(prefix, class_token):
    layout = TokenLayout(prefix, (3, 4), (16.0, 16.0))
    eye = torch.eye(layout.num_tokens).expand(2, 5, 3, -1, -1)
    meter = MeanAttentionDistance(layout, class_token=class_token)
    meter.update(eye)
    assert torch.equal(meter.compute(), torch.zeros(2, 3, dtype=torch.float64))


@pytest.mark.parametrize("grid,pixels", [((4, 4), (16.0, 16.0)), ((3, 5), (8.0, 4.0)), ((14, 14), (16.0, 16.0))])
def test_uniform_attention_over_the_patches_gives_the_mean_pairwise_distance(grid, pixels):
    layout = TokenLayout(0, grid, pixels)
    n = layout.num_patches
    uniform = torch.full((1, 2, 3, n, n), 1.0 / n)
    mad = MeanAttentionDistance(layout)
    mad.update(uniform)
    expected = brute_force_uniform(*grid, *pixels)
    torch.testing.assert_close(mad.compute(), torch.full((1, 3), expected, dtype=torch.float64))
    assert uniform_distance(layout) == pytest.approx(expected)


def test_class_token_conventions():
    """Uniform over all T tokens: 'drop' renormalises to uniform over the patches; 'zero' scales
    by the patch mass N / T; dropping without renormalising would also give N / T (biased low)."""
    layout = TokenLayout(1, (4, 4), (16.0, 16.0))
    t = layout.num_tokens
    uniform = torch.full((1, 1, 2, t, t), 1.0 / t)
    expected = brute_force_uniform(4, 4, 16.0, 16.0)
    drop = attention_distance(uniform, layout, class_token="drop")
    zero = attention_distance(uniform, layout, class_token="zero")
    torch.testing.assert_close(drop, torch.full_like(drop, expected))
    torch.testing.assert_close(zero, torch.full_like(zero, expected * 16 / 17))
    # however much a query looks at the class token, 'drop' measures where it looks among the patches
    a = uniform.clone()
    a[..., 1:, 0] = 0.9
    a[..., 1:, 1:] = 0.1 / 16
    torch.testing.assert_close(attention_distance(a, layout, class_token="drop"), drop)
    with pytest.raises(ValueError, match="class_token='keep'"):
        attention_distance(a, layout, class_token="keep")


def test_a_hand_worked_query():
    """2x2 grid, 10-pixel patches: patch 0 puts 0.5 on itself, 0.25 on its right neighbour and
    0.25 on the diagonal one: 0.25 * 10 + 0.25 * 10 * sqrt(2). Other queries: identity."""
    layout = TokenLayout(0, (2, 2), (10.0, 10.0))
    a = torch.eye(4)
    a[0] = torch.tensor([0.5, 0.25, 0.0, 0.25])
    got = attention_distance(a[None, None], layout)
    assert got.item() == pytest.approx((2.5 + 2.5 * math.sqrt(2)) / 4)


def test_streaming_equals_one_pass_and_averages_over_images():
    layout = TokenLayout(1, (2, 3), (4.0, 4.0))
    w = torch.rand(3, 10, 2, 7, 7).softmax(-1)
    one = MeanAttentionDistance(layout)
    one.update(w)
    many = MeanAttentionDistance(layout)
    for chunk in w.split(3, dim=1):
        many.update(list(chunk))  # a list of per-layer tensors works too
    torch.testing.assert_close(many.compute(), one.compute())
    per_image = attention_distance(w, layout)  # (L, B, H)
    torch.testing.assert_close(one.compute(), per_image.mean(dim=1))
    assert many.num_images == 10


def test_token_count_must_match_the_layout():
    with pytest.raises(ValueError, match="does not match the layout"):
        attention_distance(torch.rand(1, 1, 1, 9, 9), TokenLayout(1, (3, 3), (1.0, 1.0)))


def test_model_distance_is_bounded_and_summarised():
    torch.manual_seed(0)
    model = ViT(img_size=8, in_chans=1, num_classes=3, patch_size=2, embed_dim=16, depth=3, num_heads=2).eval()
    x = torch.randn(10, 1, 8, 8)
    mad = mean_attention_distance(model, [x[:4], x[4:]], num_images=7, batch_size=3)
    assert mad.shape == (3, 2)
    far = 2 * math.hypot(3, 3)  # the largest distance on a 4x4 grid of 2-pixel patches
    assert torch.all(mad >= 0) and torch.all(mad <= far)
    # same as the first 7 images at once
    torch.testing.assert_close(mean_attention_distance(model, x, num_images=7), mad)
    rows = summarize(mad)
    assert [r["layer"] for r in rows] == [1, 2, 3]
    assert rows[0]["min"] <= rows[0]["mean"] <= rows[0]["max"] and len(rows[0]["heads"]) == 2
    assert "layer    mean     min     max" in format_summary(mad)


def _layers(*rows):
    return [{"layer": i + 1, "mean": sum(r) / len(r), "min": min(r), "max": max(r), "heads": list(r)}
            for i, r in enumerate(rows)]


def test_locality_reads_the_papers_two_observations():
    from analysis.distance import locality
    uniform = 14.44
    paper_like = locality(_layers([4.0, 14.0, 13.0], [14.0, 14.5, 15.0]), uniform)
    assert (paper_like["local_heads"], paper_like["grows_with_depth"], paper_like["verdict"]) == (1, True, "holds")
    flat = locality(_layers([14.0, 14.5], [14.5, 14.6]), uniform)  # nearly uniform everywhere: grows a little
    assert (flat["local_heads"], flat["verdict"]) == (0, "partly")
    neither = locality(_layers([14.0, 15.0], [13.0, 13.5]), uniform)
    assert neither["verdict"] == "does not hold" and not neither["grows_with_depth"]
    local_only = locality(_layers([10.0, 15.0], [9.0, 10.0]), uniform)
    assert (local_only["local_heads"], local_only["verdict"]) == (1, "partly")
    # the threshold is a fraction of uniform attention: 10.8 px is local at 0.75 x 14.44 = 10.83
    assert locality(_layers([10.8, 15.0]), uniform)["local_heads"] == 1
    assert locality(_layers([10.9, 15.0]), uniform)["local_heads"] == 0
    with pytest.raises(ValueError, match="no layers"):
        locality([], uniform)
