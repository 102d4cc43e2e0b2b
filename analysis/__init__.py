"""Probes on trained ViTs (ViT paper Fig. 6, 7 and 11); definitions in docs/papers.md.

- ``attention``: capture per-layer attention weights (B, heads, T, T) from our ViT, a hybrid or
  any timm VisionTransformer (``capture_attention``, ``attention_weights``); the token layout and
  the grid-to-pixel factor (patch size, or a hybrid's CNN stride).
- ``distance``: mean attention distance per (layer, head) in pixels; class token dropped and the
  rows renormalised (or ``class_token="zero"``).
- ``rollout``: attention rollout R = Â_L ... Â_1, Â = rows-renormalised(fused heads + I).
- ``posemb``: cosine similarity of the patches' position embeddings (every absolute kind).
- ``filters``: principal components of the patch-embedding filters.
- ``figures``: the PNG figures; ``callback``: ``AttentionDistanceCallback`` for the end of fit.

The command is ``repro analyze`` (``reproductions/commands/analyze.py``).
"""
