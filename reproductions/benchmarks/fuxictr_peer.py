"""FuxiCTR's BST as a peer of ``repro bench bst``, built from FuxiCTR's own parts.

FuxiCTR (``fuxictr`` on PyPI) is never a dependency of this repository: ``scripts/bench_env.sh``
installs it into a separate environment (``.venv-bench``), where ``repro bench bst`` measures our
BST against this peer; elsewhere the peer is skipped with one line saying so (``available``).

The wheel ships FuxiCTR's layers and its ``BaseModel``, not its BST: that model lives in the
FuxiCTR repository's model zoo (``model_zoo/BST``). So the peer is built here the way that model
is, from the wheel's parts:

- ``fuxictr.pytorch.models.BaseModel`` (the peer subclasses it: its ``get_inputs`` moves every
  feature of the batch dict to the device, its ``reset_parameters`` initialises the layers) and a
  ``fuxictr.features.FeatureMap`` describing the features: ``user_id``, one field per profile
  feature, ``item_id``, ``cate_id`` (categorical) and ``click_history`` / ``cate_history``
  (sequences sharing the item and category tables), padding id 0 everywhere;
- ``fuxictr.pytorch.layers.FeatureEmbeddingDict``: one embedding lookup per feature, into a dict;
- the model zoo's sequence part: the target's [item | category] embedding appended to the
  history's as the last token; a boolean attention mask of shape (B x heads, T, T) built per
  batch from ``click_history == 0`` (the diagonal left open, so every token sees itself); a
  trainable position table (T, width) initialised with sin-cos values, repeated over the batch and
  concatenated to the tokens; post-LN blocks of ``torch.nn.MultiheadAttention`` (called with its
  defaults, so it also returns the head-averaged attention weights), dropout, residual,
  LayerNorm, then a LeakyReLU feed-forward, dropout, residual, LayerNorm; target-token pooling;
- ``fuxictr.pytorch.layers.MLP_Block`` over [the other features' embeddings | the pooled token].

Two choices make the shape ours (``reproductions/bst/configs/bst.yaml``): each feature's
embedding width is ours (FuxiCTR's feature map allows a width per feature; the model zoo's BST
assumes one width for all), and the feed-forward is as wide as ours (4 x the token width; the
model zoo's BST fixes it to the token width; its ``TransformerBlock`` takes any). With them both
sides have the same widths, heads, blocks, feed-forward and MLP; the parameter counts differ only
in the position tables (our 24 time-delta buckets x 16 against FuxiCTR's (L + 1) x 16).

The forward returns logits (B,), the MLP without its sigmoid, so that the benchmark's training
step (binary cross-entropy on logits, AdamW) is the same on both sides; FuxiCTR's own
``train_step`` puts the sigmoid in the model and the log in the loss, and clips gradients.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

VERSION = "2.3.10"  #: the fuxictr release this peer was written and measured against
INSTALL_HINT = ("scripts/bench_env.sh creates .venv-bench with fuxictr (and this repository); run "
                ".venv-bench/bin/repro bench bst ...")
DATASET_ID = "repro_bench_bst"


def available() -> str | None:
    """None when FuxiCTR's parts import, else why they do not (one line)."""
    try:
        import fuxictr.features  # noqa: F401
        import fuxictr.pytorch.layers  # noqa: F401
        import fuxictr.pytorch.models  # noqa: F401
    except Exception as err:  # not installed, or installed without what it needs
        return f"{type(err).__name__}: {err}".splitlines()[0]
    return None


def version() -> str:
    import fuxictr

    return fuxictr.__version__


def skip_line() -> str | None:
    """The one line the benchmark prints when the peer cannot run; None when it can."""
    reason = available()
    if reason is None:
        return None
    return f"FuxiCTR peer skipped ({reason}): {INSTALL_HINT}"


# --------------------------------------------------------------------------------------------- features
def profile_names(kwargs: dict) -> list[str]:
    return [f"profile_{f}" for f in range(len(kwargs.get("profile_sizes", ())))]


def feature_specs(kwargs: dict, seq_len: int) -> OrderedDict:
    """FuxiCTR feature specs of our BST's features, with our vocabularies and embedding widths."""
    item_dim, category_dim = kwargs.get("item_dim", 32), kwargs.get("category_dim", 16)
    specs: OrderedDict = OrderedDict()

    def categorical(source: str, vocab: int, dim: int) -> dict:
        return {"type": "categorical", "source": source, "vocab_size": vocab, "embedding_dim": dim, "padding_idx": 0}

    if kwargs.get("n_users"):
        specs["user_id"] = categorical("user", kwargs["n_users"], kwargs.get("user_dim", 16))
    for name, size in zip(profile_names(kwargs), kwargs.get("profile_sizes", ())):
        specs[name] = categorical("user", size, kwargs.get("profile_dim", 8))
    specs["item_id"] = categorical("item", kwargs["n_items"], item_dim)
    specs["cate_id"] = categorical("item", kwargs["n_categories"], category_dim)
    specs["click_history"] = {"type": "sequence", "source": "user", "vocab_size": kwargs["n_items"],
                              "embedding_dim": item_dim, "padding_idx": 0, "max_len": seq_len,
                              "share_embedding": "item_id"}
    specs["cate_history"] = {"type": "sequence", "source": "user", "vocab_size": kwargs["n_categories"],
                             "embedding_dim": category_dim, "padding_idx": 0, "max_len": seq_len,
                             "share_embedding": "cate_id"}
    return specs


def feature_map(kwargs: dict, seq_len: int):
    from fuxictr.features import FeatureMap

    fmap = FeatureMap(DATASET_ID, data_dir="")
    fmap.features = feature_specs(kwargs, seq_len)
    fmap.labels = ["label"]
    fmap.num_fields = fmap.get_num_fields()
    fmap.set_column_index()
    return fmap


def fuxictr_batch(batch: dict[str, torch.Tensor], kwargs: dict) -> dict[str, torch.Tensor]:
    """Our batch (``models.ctr_batch``) under FuxiCTR's feature names (the same ids, left padding 0)."""
    out = {}
    if kwargs.get("n_users"):
        out["user_id"] = batch["user"]
    for f, name in enumerate(profile_names(kwargs)):
        out[name] = batch["user_features"][:, f].contiguous()
    out["item_id"] = batch["target_item"]
    out["cate_id"] = batch["target_category"]
    out["click_history"] = batch["hist_items"]
    out["cate_history"] = batch["hist_categories"]
    return out


# --------------------------------------------------------------------------------------------- model
class SequenceBlock(nn.Module):
    """One post-LN block of FuxiCTR's BST: MultiheadAttention (default call: weights returned too),
    dropout, residual, LayerNorm; LeakyReLU feed-forward, dropout, residual, LayerNorm."""

    def __init__(self, dim: int, ffn_dim: int, num_heads: int, attn_dropout: float, dropout: float) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, num_heads=num_heads, dropout=attn_dropout, batch_first=True)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.LeakyReLU(), nn.Linear(ffn_dim, dim))
        self.dropout1, self.dropout2 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x, attn_mask=attn_mask)
        s = self.layer_norm1(self.dropout1(attended) + x)
        return self.layer_norm2(self.dropout2(self.ffn(s)) + s)


class SequenceTransformer(nn.Module):
    """FuxiCTR's behaviour transformer: a trainable sin-cos position table (T, position_dim)
    repeated over the batch and concatenated to the tokens, then the blocks."""

    def __init__(self, *, tokens: int, dim: int, position_dim: int, ffn_dim: int, num_heads: int, blocks: int,
                 attn_dropout: float, dropout: float) -> None:
        super().__init__()
        self.position = nn.Parameter(sincos_table(tokens, position_dim))
        self.blocks = nn.ModuleList(SequenceBlock(dim, ffn_dim, num_heads, attn_dropout, dropout)
                                    for _ in range(blocks))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, self.position.unsqueeze(0).repeat(x.shape[0], 1, 1)], dim=-1)
        for block in self.blocks:
            x = block(x, attn_mask)
        return x


def sincos_table(tokens: int, dim: int) -> torch.Tensor:
    position = torch.arange(tokens, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(tokens, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)
    return table


def padding_and_attention_masks(history: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FuxiCTR's masks, True = masked: padding (B, L + 1) from ``history == 0`` (the target token
    open) and the attention mask (B x heads, L + 1, L + 1): a padded key is masked for every
    query except itself."""
    B = history.shape[0]
    padding = torch.cat([history == 0, torch.zeros(B, 1, dtype=torch.bool, device=history.device)], dim=-1)
    T = padding.shape[1]
    masked = padding.unsqueeze(1).repeat(1, T, 1)
    off_diagonal = ~torch.eye(T, dtype=torch.bool, device=history.device).unsqueeze(0).expand_as(masked)
    masked = masked & off_diagonal
    return padding, masked.unsqueeze(1).repeat(1, num_heads, 1, 1).flatten(end_dim=1)


_CLASS = None


def _model_class():
    """``FuxiCTRBST`` (a ``BaseModel`` subclass), defined on first use so that importing this module
    never imports FuxiCTR."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from fuxictr.pytorch.layers import FeatureEmbeddingDict, MLP_Block
    from fuxictr.pytorch.models import BaseModel

    class FuxiCTRBST(BaseModel):
        """BST from FuxiCTR's parts (see the module docstring); ``forward(batch) -> logits (B,)``."""

        def __init__(self, fmap, *, num_heads: int, blocks: int, position_dim: int, ffn_dim: int,
                     dropout: float, attn_dropout: float, mlp_dims: list[int], mlp_dropout: float,
                     gpu: int = -1) -> None:
            super().__init__(fmap, model_id="BST", gpu=gpu, verbose=0, model_root="", metrics=["AUC"])
            self.num_heads = num_heads
            self.embedding_layer = FeatureEmbeddingDict(fmap, embedding_dim=position_dim)
            spec = fmap.features
            dim = spec["click_history"]["embedding_dim"] + spec["cate_history"]["embedding_dim"] + position_dim
            tokens = spec["click_history"]["max_len"] + 1
            self.transformer = SequenceTransformer(tokens=tokens, dim=dim, position_dim=position_dim,
                                                   ffn_dim=ffn_dim, num_heads=num_heads, blocks=blocks,
                                                   attn_dropout=attn_dropout, dropout=dropout)
            other = sum(s["embedding_dim"] for name, s in spec.items() if s["type"] != "sequence")
            self.dnn = MLP_Block(input_dim=other + dim, output_dim=1, hidden_units=list(mlp_dims),
                                 hidden_activations="LeakyReLU", output_activation=None,
                                 dropout_rates=mlp_dropout, batch_norm=False)
            self.reset_parameters()
            self.model_to_device()

        def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            X = self.get_inputs(inputs)
            emb = self.embedding_layer(X)
            target = torch.cat([emb["item_id"], emb["cate_id"]], dim=-1)
            sequence = torch.cat([emb["click_history"], emb["cate_history"]], dim=-1)
            tokens = torch.cat([sequence, target.unsqueeze(1)], dim=1)
            _, attn_mask = padding_and_attention_masks(X["click_history"], self.num_heads)
            pooled = self.transformer(tokens, attn_mask)[:, -1, :]  # target-token pooling
            for name in ("click_history", "cate_history"):
                emb.pop(name)
            emb["attn_0"] = pooled
            return self.dnn(torch.cat(list(emb.values()), dim=-1)).squeeze(-1)

    _CLASS = FuxiCTRBST
    return _CLASS


def fuxictr_bst(kwargs: dict, seq_len: int, blocks: int, *, device: torch.device | str = "cpu", seed: int = 0):
    """FuxiCTR's BST at the shape of our ``models.ctr.BST(**kwargs, seq_len=..., num_blocks=blocks)``."""
    if kwargs.get("position", "time_delta") == "none" or kwargs.get("seq_pooling", "target") != "target":
        raise ValueError("the FuxiCTR peer has a position feature and target pooling, as the config's BST")
    device = torch.device(device)
    torch.manual_seed(seed)
    dim = kwargs.get("item_dim", 32) + kwargs.get("category_dim", 16) + kwargs.get("position_dim", 16)
    gpu = (device.index or 0) if device.type == "cuda" else -1
    return _model_class()(
        feature_map(kwargs, seq_len), num_heads=kwargs.get("num_heads", 8), blocks=blocks,
        position_dim=kwargs.get("position_dim", 16), ffn_dim=kwargs.get("ffn_dim") or 4 * dim,
        dropout=kwargs.get("dropout", 0.2), attn_dropout=kwargs.get("attn_dropout", 0.0),
        mlp_dims=list(kwargs.get("mlp_dims", (1024, 512, 256))), mlp_dropout=kwargs.get("mlp_dropout", 0.0), gpu=gpu,
    )
