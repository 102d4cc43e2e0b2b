"""``bench bst``: BST training against an ``nn.TransformerEncoder`` BST and FuxiCTR's BST; AUC/GAUC throughput.

1. **Training.** Samples/s and peak memory of ``models.ctr.BST`` (``reproductions/bst/configs/
   bst.yaml``'s keywords: width 64, 8 heads, feed-forward 256, dropout 0.2, post-LN, MLP
   1024-512-256) over sequence lengths (20, 50, 100, 200) x transformer blocks (1, 2, 3), against
   ``TorchEncoderBST``: the same embeddings, position feature and MLP head with the blocks replaced
   by ``torch.nn.TransformerEncoder`` (batch_first, the same d_model, heads, feed-forward width and
   activation, post-LN, dropout 0.2 after attention and after the feed-forward, none on the
   attention weights or inside the feed-forward, as BST's block; a key-padding mask), the form
   public PyTorch BST implementations take. Both have the same parameter count and, with the
   weights copied over (``copy_block_weights``), the same outputs (tested); with target pooling
   our last block computes the target token alone, the reference every token in every layer. The
   step is BCE on the logits (as ``lightning_modules.ctr.CTRModule``), backward, AdamW, on the
   same random batches (left-padded histories of random length). Target: ours >= 1.0x the reference
   (geometric mean over the grid; PASS/FAIL per shape too). ``--peers`` holds ``torch_encoder``
   (the default).
2. **Against FuxiCTR's BST** (``--peers`` holds ``fuxictr``, the default). A BST built from
   FuxiCTR's own layers the way its model zoo's BST is (``fuxictr_peer``: FuxiCTR's wheel has no
   BST), at our shape (the same embedding widths, heads, blocks, feed-forward and MLP). Per sequence
   length and block count, on the same random batches (renamed to FuxiCTR's feature names): a
   training step (forward, backward, AdamW; BCE on logits on both sides) and an inference forward
   (eval, ``torch.inference_mode``), each as paired A/B rounds of the two alone (alternating the
   order every round). With target pooling a third model runs in the same rounds: ours with the
   target-only last block switched off (``BST.last_block_target_only = False``), so the ratio splits
   into equal work (every-token x FuxiCTR: both compute every token) and the shortcut
   (target-only x every-token), which only target pooling allows and which FuxiCTR could adopt
   too. Reported: samples/s, the median of the per-round ratios and their spread (min-max), for
   the total and both parts. Target: training >= 1.2x FuxiCTR's at every shape (PASS/FAIL, on the
   total). FuxiCTR is never a
   dependency of this repository: ``scripts/bench_env.sh`` creates ``.venv-bench`` with it, and
   ``.venv-bench/bin/repro bench bst ...`` runs this part; without it the part is skipped with one
   line saying so.
3. **Evaluation.** AUC and GAUC of 10^6 predictions over 10^4 users, fed in batches of 4096 as
   evaluation does: ``lightning_modules.metrics.GroupAUROC`` and torchmetrics ``BinaryAUROC``
   (update + compute) against scikit-learn: ``roc_auc_score`` on all predictions (AUC) and
   ``roc_auc_score`` per user in a Python loop, impressions-weighted (GAUC), on the users with the
   lowest ids (``--ref-users``, 1000 by default; GroupAUROC is timed on that subset too, so the
   ratio compares equal work). The values must agree (GAUC to 1e-9, AUC to 1e-5).
"""

from __future__ import annotations

import argparse
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.ctr import BST, masked_mean
from lightning_modules.model_stats import count_parameters
from reproductions.benchmarks import fuxictr_peer
from reproductions.benchmarks.common import (
    Alternation, InferenceStep, Measurement, BenchReport, Table, TrainStep, add_run_args, alternate, bce_with_logits, compare, config_net,
    fmt_flops, fmt_fraction, fmt_mib, fmt_rate, fmt_ratio, int_list, measure_rate, median, memory_method,
    paired_ratios, pass_fail, read_config, run_settings, setup_run,
)

NAME = "bst"
HELP = ("BST vs an nn.TransformerEncoder BST (target >= 1.0x) and FuxiCTR's BST (training >= 1.2x; where fuxictr is "
        "installed) over sequence length and blocks; AUC/GAUC throughput")
CONFIG = "reproductions/bst/configs/bst.yaml"
TARGET = 1.0
PEER_TARGET = 1.2  #: our BST's training samples/s over FuxiCTR's BST's, at every shape
GAUC_TOLERANCE = 1e-9
AUC_TOLERANCE = 1e-5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=CONFIG, help=f"BST config whose net keywords are used (default {CONFIG})")
    parser.add_argument("--seq-lens", dest="seq_lens", type=int_list, default=[20, 50, 100, 200])
    parser.add_argument("--blocks", type=int_list, default=[1, 2, 3])
    parser.add_argument("--amp", choices=["none", "bf16"], default="none", help="autocast dtype (default fp32)")
    parser.add_argument("--peers", type=peer_list, default=list(PEER_NAMES),
                        help="comma-separated: torch_encoder (the nn.TransformerEncoder BST grid), fuxictr "
                             "(FuxiCTR's BST, training and inference; skipped with one line where fuxictr is not "
                             f"installed). Default {','.join(PEER_NAMES)}")
    parser.add_argument("--skip-inference", dest="skip_inference", action="store_true",
                        help="FuxiCTR comparison: training only")
    parser.add_argument("--n-preds", dest="n_preds", type=int, default=1_000_000, help="predictions to evaluate")
    parser.add_argument("--n-users", dest="n_users", type=int, default=10_000, help="users (GAUC groups)")
    parser.add_argument("--ref-users", dest="ref_users", type=int, default=1_000,
                        help="users the per-user scikit-learn loop (and GroupAUROC beside it) is timed on")
    parser.add_argument("--eval-batch", dest="eval_batch", type=int, default=4096, help="predictions per update")
    parser.add_argument("--skip-eval", dest="skip_eval", action="store_true", help="only the training table")
    add_run_args(parser, rounds=3, steps=3, warmup=1, batch_size=64)


# --------------------------------------------------------------------------------------------- models
def bst_kwargs(config_path: str = CONFIG) -> dict:
    class_path, kwargs = config_net(read_config(config_path))
    if class_path.rpartition(".")[2] != "BST":
        raise ValueError(f"{config_path} configures {class_path}, not models.ctr.BST")
    return kwargs


def our_bst(kwargs: dict, seq_len: int, blocks: int, seed: int = 0) -> BST:
    torch.manual_seed(seed)
    return BST(**{**kwargs, "seq_len": seq_len, "num_blocks": blocks})


class TorchEncoderBST(nn.Module):
    """BST with ``torch.nn.TransformerEncoder`` in place of its blocks (the reference).

    Built from a ``BST``: a copy of its embeddings, position feature and MLP head (``self.bst``,
    without blocks) and a post-LN ``TransformerEncoder`` with one layer per BST block, shaped as
    BST's block: d_model = BST's width, the same heads, feed-forward width and LeakyReLU slope,
    dropout after attention and after the feed-forward (BST's ``dropout``), BST's attention-weight
    dropout (``attn_dropout``, 0 by default) and no dropout inside the feed-forward (BST has none
    there; ``TransformerEncoderLayer`` would add one). Parameters: ``in_proj`` = BST's ``qkv``,
    ``out_proj`` = ``proj``, ``linear1``/``linear2`` = ``ffn``, the two LayerNorms: the same count.
    """

    def __init__(self, bst: BST) -> None:
        super().__init__()
        block = bst.blocks[0]
        ffn_in, act, _ = block.ffn
        layer = nn.TransformerEncoderLayer(
            d_model=bst.dim, nhead=block.num_heads, dim_feedforward=ffn_in.out_features, dropout=block.dropout.p,
            activation=partial(F.leaky_relu, negative_slope=act.negative_slope), batch_first=True, norm_first=False,
        )
        layer.self_attn.dropout = block.attn_dropout  # on the attention weights, as BST's attn_dropout
        layer.dropout = nn.Dropout(0.0)  # inside the feed-forward: BST has none
        self.encoder = nn.TransformerEncoder(layer, num_layers=len(bst.blocks), enable_nested_tensor=False)
        blocks, bst.blocks = bst.blocks, nn.ModuleList()
        try:
            self.bst = copy.deepcopy(bst)  # embeddings, position feature, head; no blocks
        finally:
            bst.blocks = blocks

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x, mask = self.bst.embed_sequence(batch)
        x = self.encoder(x, src_key_padding_mask=~mask)
        pooled = x[:, -1] if self.bst.seq_pooling == "target" else masked_mean(x, mask)
        h = torch.cat([pooled, self.bst.features.other(batch)], dim=-1)
        return self.bst.head(h).squeeze(-1)


@torch.no_grad()
def copy_block_weights(bst: BST, ref: TorchEncoderBST) -> None:
    """Give the reference BST's weights (blocks and the rest), so both compute the same function."""
    ref.bst.load_state_dict({k: v for k, v in bst.state_dict().items() if not k.startswith("blocks.")})
    for block, layer in zip(bst.blocks, ref.encoder.layers, strict=True):
        layer.self_attn.in_proj_weight.copy_(block.qkv.weight)
        layer.self_attn.in_proj_bias.copy_(block.qkv.bias)
        layer.self_attn.out_proj.weight.copy_(block.proj.weight)
        layer.self_attn.out_proj.bias.copy_(block.proj.bias)
        layer.linear1.load_state_dict(block.ffn[0].state_dict())
        layer.linear2.load_state_dict(block.ffn[2].state_dict())
        layer.norm1.load_state_dict(block.norm1.state_dict())
        layer.norm2.load_state_dict(block.norm2.state_dict())


def random_batch(kwargs: dict, batch_size: int, seq_len: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch in ``models/ctr.py``'s format within the config's vocabularies: histories of random
    length 1..seq_len, left-padded with 0; position buckets >= 2 on real items."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda high, *shape: torch.randint(1, high, shape, generator=g)  # noqa: E731
    lengths = torch.randint(1, seq_len + 1, (batch_size,), generator=g)
    mask = torch.arange(seq_len)[None, :] >= (seq_len - lengths)[:, None]
    profile = [ids(size, batch_size) for size in kwargs.get("profile_sizes", ())]
    return {
        "user": ids(kwargs.get("n_users") or 2, batch_size),
        "user_features": torch.stack(profile, 1) if profile else torch.zeros(batch_size, 0, dtype=torch.long),
        "target_item": ids(kwargs["n_items"], batch_size),
        "target_category": ids(kwargs["n_categories"], batch_size),
        "hist_items": ids(kwargs["n_items"], batch_size, seq_len) * mask,
        "hist_categories": ids(kwargs["n_categories"], batch_size, seq_len) * mask,
        "hist_positions": torch.randint(2, kwargs.get("n_position_buckets", 24), (batch_size, seq_len), generator=g) * mask,
        "hist_mask": mask,
        "label": torch.randint(0, 2, (batch_size,), generator=g).float(),
    }


def ctr_batches(kwargs: dict, batch_size: int, seq_len: int) -> list[tuple[dict, torch.Tensor]]:
    return [(b, b["label"]) for b in (random_batch(kwargs, batch_size, seq_len, seed) for seed in (0, 1))]


def training_grid(kwargs: dict, *, seq_lens: list[int], blocks: list[int], batch_size: int, device: torch.device,
                  amp_dtype: torch.dtype | None, rounds: int, steps: int, warmup: int, matmul_dtype=torch.float32):
    """Our BST and the reference at every (sequence length, blocks), alternated: (Alternation, rows)."""
    train_steps, shapes = {}, []
    for L in seq_lens:
        batches = ctr_batches(kwargs, batch_size, L)
        for b in blocks:
            ours = our_bst(kwargs, L, b)
            ref = TorchEncoderBST(our_bst(kwargs, L, b))
            train_steps[f"L{L} b{b} ours"] = TrainStep(ours, batches, bce_with_logits, device=device, amp_dtype=amp_dtype)
            train_steps[f"L{L} b{b} ref"] = TrainStep(ref, batches, bce_with_logits, device=device, amp_dtype=amp_dtype)
            shapes.append((L, b))
    cmp = compare(train_steps, rounds=rounds, steps_per_measure=steps, warmup=warmup, device=device,
                  matmul_dtype=matmul_dtype)
    rows = []
    for L, b in shapes:
        ours, ref = cmp[f"L{L} b{b} ours"], cmp[f"L{L} b{b} ref"]
        rows.append({"seq_len": L, "blocks": b, "ours": ours.to_json(), "reference": ref.to_json(),
                     "ratio": ours.median / ref.median,
                     "paired_ratios": [a / c for a, c in zip(ours.rates, ref.rates)]})
    return cmp, rows


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def training_table(rows: list[dict], title: str, notes: list[str], peak_flops: float | None = None) -> Table:
    """The grid's table; with ``peak_flops`` (FLOP/s) also both sides' model FLOPs utilisation."""
    mfu = ["BST MFU", "reference MFU"] if peak_flops else []
    table = Table(title, ["seq_len", "blocks", "params", "MFLOPs/sample", "BST samples/s", "reference samples/s",
                          "BST x reference", f">= {TARGET:g}x", *mfu, "BST peak MiB", "reference peak MiB"])
    for r in rows:
        ours, ref = r["ours"], r["reference"]
        utilisation = [fmt_fraction(ours["flops_per_sec"] / peak_flops),
                       fmt_fraction(ref["flops_per_sec"] / peak_flops)] if peak_flops else []
        table.add(r["seq_len"], r["blocks"], f"{ours['params']:,}" + ("" if ours["params"] == ref["params"] else
                                                                      f" / {ref['params']:,}"),
                  fmt_flops(ours["forward_flops"]), fmt_rate(ours["median"]), fmt_rate(ref["median"]),
                  fmt_ratio(r["ratio"]), pass_fail(r["ratio"], TARGET), *utilisation, fmt_mib(ours["peak_bytes"]),
                  fmt_mib(ref["peak_bytes"]))
    table.notes += notes
    return table


# --------------------------------------------------------------------------------------------- peers
PEER_NAMES = ("torch_encoder", "fuxictr")


def peer_list(text: str) -> list[str]:
    """'torch_encoder,fuxictr' -> the names (argparse type)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEER_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: use a comma-separated subset of {','.join(PEER_NAMES)}")
    return names


@dataclass
class Peer:
    """A third-party BST: ``skip_line()`` (None when it can run, else the one line printed instead),
    ``version()``, ``build(kwargs, seq_len, blocks, device)`` and ``batch(our_batch, kwargs)`` (its
    input format)."""

    label: str
    skip_line: Callable[[], str | None]
    version: Callable[[], str]
    build: Callable[[dict, int, int, torch.device], nn.Module]
    batch: Callable[[dict, dict], dict]


FUXICTR = Peer(
    label="FuxiCTR BST",
    skip_line=fuxictr_peer.skip_line,
    version=fuxictr_peer.version,
    build=lambda kwargs, seq_len, blocks, device: fuxictr_peer.fuxictr_bst(kwargs, seq_len, blocks, device=device),
    batch=fuxictr_peer.fuxictr_batch,
)


def paired_result(ours: Measurement, peer: Measurement) -> dict:
    """Ours against a peer measured in the same rounds: both sides, the ratio of medians, the
    per-round ratios, their median and spread (min, max)."""
    paired = paired_ratios(ours.rates, peer.rates)
    return {"ours": ours.to_json(), "peer": peer.to_json(), "ratio": ours.median / peer.median,
            "paired_ratios": paired, "median_paired_ratio": median(paired), "spread": [min(paired), max(paired)]}


def every_token_bst(kwargs: dict, seq_len: int, blocks: int) -> BST:
    """Our BST with the target-only last block switched off: every block computes every token."""
    model = our_bst(kwargs, seq_len, blocks)
    model.last_block_target_only = False
    return model


def split_result(measured: Alternation) -> dict:
    """The three ratios of one A/B/C comparison: ``total`` (ours as configured x the peer),
    ``equal_work`` (ours computing every token x the peer: the same work on both sides) and
    ``target_only`` (ours as configured x ours computing every token: the target-only last block
    alone). Without an ``every_token`` measurement (mean pooling: no shortcut) only ``total``."""
    result = {"total": paired_result(measured["ours"], measured["peer"])}
    if "every_token" in measured.items:
        result["equal_work"] = paired_result(measured["every_token"], measured["peer"])
        result["target_only"] = paired_result(measured["ours"], measured["every_token"])
    return result


def peer_grid(kwargs: dict, peer: Peer, *, seq_lens: list[int], blocks: list[int], batch_size: int,
              device: torch.device, amp_dtype: torch.dtype | None, rounds: int, steps: int, warmup: int,
              inference: bool = True) -> list[dict]:
    """Our BST and ``peer`` at every (sequence length, blocks): a training comparison, then an
    inference one, each over ``rounds`` rounds of each model alone (the order alternating). With
    target pooling a third model runs in the same rounds, ours computing every token in its last
    block too, so the ratio splits into equal work and the target-only shortcut (``split_result``).
    Rows: ``{"training": split_result, "inference": split_result}``."""
    rows = []
    timing = dict(rounds=rounds, steps_per_measure=steps, warmup=warmup, device=device, matmul_dtype=None,
                  count=False)
    split = kwargs.get("seq_pooling", "target") == "target"
    for L in seq_lens:
        batches = ctr_batches(kwargs, batch_size, L)
        theirs = [(peer.batch(x, kwargs), y) for x, y in batches]

        def models(b: int) -> dict[str, tuple[nn.Module, list]]:
            built = {"ours": (our_bst(kwargs, L, b), batches), "peer": (peer.build(kwargs, L, b, device), theirs)}
            if split:
                built["every_token"] = (every_token_bst(kwargs, L, b), batches)
            return built

        for b in blocks:
            built = models(b)
            row = {"seq_len": L, "blocks": b, "params": count_parameters(built["ours"][0]),
                   "peer_params": count_parameters(built["peer"][0])}
            print(f"[bst] vs {peer.label}: seq_len {L}, blocks {b}: training", flush=True)
            step = partial(TrainStep, loss_fn=bce_with_logits, device=device, amp_dtype=amp_dtype)
            row["training"] = split_result(compare({k: step(m, d) for k, (m, d) in built.items()}, **timing))
            if inference:
                print(f"[bst] vs {peer.label}: seq_len {L}, blocks {b}: inference", flush=True)
                infer_step = partial(InferenceStep, device=device, amp_dtype=amp_dtype)
                measured = compare({k: infer_step(m, d) for k, (m, d) in models(b).items()}, **timing)
                row["inference"] = split_result(measured)
            rows.append(row)
    return rows


def fmt_paired(result: dict) -> str:
    """'2.72x (2.15-2.85)': the median of the per-round ratios and their min-max."""
    low, high = result["spread"]
    return f"{fmt_ratio(result['median_paired_ratio'])} ({low:.2f}-{high:.2f})"


def peer_table(rows: list[dict], peer_label: str, title: str, notes: list[str]) -> Table:
    """Per shape and phase (training, inference): samples/s of each model, the total ratio and,
    with target pooling, its two parts (equal work, target-only shortcut), each as the median of
    the per-round ratios with their spread; the training target's PASS/FAIL on the total."""
    split = any("equal_work" in r["training"] for r in rows)
    columns = ["seq_len", "blocks", "phase", "params (BST / peer)", "BST samples/s"]
    if split:
        columns += ["BST every-token samples/s"]
    columns += [f"{peer_label} samples/s", f"BST x {peer_label} (spread)"]
    if split:
        columns += [f"equal work: every-token x {peer_label}", "target-only x every-token"]
    columns += [f">= {PEER_TARGET:g}x", "BST peak MiB", f"{peer_label} peak MiB"]
    table = Table(title, columns)
    for r in rows:
        for phase in ("training", "inference"):
            part = r.get(phase)
            if part is None:
                continue
            total = part["total"]
            cells = [r["seq_len"], r["blocks"], phase, f"{r['params']:,} / {r['peer_params']:,}",
                     fmt_rate(total["ours"]["median"])]
            if split:
                cells += [fmt_rate(part["equal_work"]["ours"]["median"]) if "equal_work" in part else "-"]
            cells += [fmt_rate(total["peer"]["median"]), fmt_paired(total)]
            if split:
                cells += ([fmt_paired(part["equal_work"]), fmt_paired(part["target_only"])] if "equal_work" in part
                          else ["-", "-"])
            training = phase == "training"
            cells += [pass_fail(total["median_paired_ratio"], PEER_TARGET) if training else "-",
                      fmt_mib(total["ours"]["peak_bytes"]) if training else "-",
                      fmt_mib(total["peer"]["peak_bytes"]) if training else "-"]
            table.add(*cells)
    table.notes += notes
    return table


def peer_verdict(rows: list[dict], peer_label: str) -> str:
    ratios = [r["training"]["total"]["median_paired_ratio"] for r in rows]
    worst = min(ratios)
    text = (f"{pass_fail(worst, PEER_TARGET)}: BST vs {peer_label}, training: {worst:.3f}x at the weakest shape "
            f"(target >= {PEER_TARGET:g}x at every shape; {sum(x >= PEER_TARGET for x in ratios)}/{len(ratios)} pass)")
    equal = [r["training"]["equal_work"]["median_paired_ratio"] for r in rows if "equal_work" in r["training"]]
    if equal:
        text += (f"; at equal work (ours computing every token) {min(equal):.3f}x-{max(equal):.3f}x, so the rest "
                 f"is the target-only last block, which only target pooling allows")
    infer = [r["inference"]["total"]["median_paired_ratio"] for r in rows if "inference" in r]
    if infer:
        text += f"; inference {min(infer):.3f}x-{max(infer):.3f}x"
    return text


# --------------------------------------------------------------------------------------------- evaluation
def eval_data(n_preds: int, n_users: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Predictions (float32 multiples of 2^-12, so ties occur and both sides see the same values),
    labels drawn from them with a per-user offset, users 0..n_users-1 uniformly."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, n_users, n_preds)
    preds = (np.round(rng.random(n_preds) * 4096) / 4096).astype(np.float32)
    offset = rng.normal(0.0, 1.0, n_users)[users]
    labels = (rng.random(n_preds) < 1 / (1 + np.exp(-(4 * (preds - 0.5) + offset)))).astype(np.int64)
    return {"preds": preds, "labels": labels, "users": users}


def ours_gauc(data: dict, batch: int, device: torch.device) -> float:
    from lightning_modules.metrics import GroupAUROC

    metric = GroupAUROC().to(device)
    p, y, u = (torch.from_numpy(data[k]).to(device) for k in ("preds", "labels", "users"))
    for i in range(0, len(p), batch):
        metric.update(p[i:i + batch], y[i:i + batch], u[i:i + batch])
    return float(metric.compute())


def ours_gauc_exact(data: dict, device: torch.device) -> float:
    """GroupAUROC's float64 value (``compute`` returns float32) for the agreement check."""
    from utils.ranking import group_auroc

    p, y, u = (torch.from_numpy(data[k]).to(device) for k in ("preds", "labels", "users"))
    return float(group_auroc(p.float(), y, u))


def ours_auc(data: dict, batch: int, device: torch.device) -> float:
    from torchmetrics.classification import BinaryAUROC

    metric = BinaryAUROC().to(device)
    p, y = (torch.from_numpy(data[k]).to(device) for k in ("preds", "labels"))
    for i in range(0, len(p), batch):
        metric.update(p[i:i + batch], y[i:i + batch])
    return float(metric.compute())


def reference_gauc(data: dict) -> float:
    """GAUC by scikit-learn, one ``roc_auc_score`` per user with both labels, weighted by impressions."""
    from sklearn.metrics import roc_auc_score

    order = np.argsort(data["users"], kind="stable")
    users, preds, labels = data["users"][order], data["preds"][order].astype(np.float64), data["labels"][order]
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    total = weight = 0.0
    for s, e in zip(starts, np.r_[starts[1:], len(users)]):
        y = labels[s:e]
        if 0 < y.sum() < len(y):
            total += roc_auc_score(y, preds[s:e]) * len(y)
            weight += len(y)
    return total / weight if weight else float("nan")


def reference_auc(data: dict) -> float:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(data["labels"], data["preds"].astype(np.float64)))


def subset(data: dict, n_users: int) -> dict[str, np.ndarray]:
    keep = data["users"] < n_users
    return {k: v[keep] for k, v in data.items()}


def evaluation(args, device: torch.device) -> tuple[dict, Table, list[str]]:
    data = eval_data(args.n_preds, args.n_users)
    small = subset(data, min(args.ref_users, args.n_users))
    n, n_small = len(data["preds"]), len(small["preds"])
    values: dict[str, float] = {}

    def timed(name: str, fn, items: int):
        """One whole evaluation per measurement (predictions/s); its value is kept for the agreement check."""
        def call() -> float:
            return measure_rate(lambda: values.__setitem__(name, fn()), steps=1, warmup=0, items_per_step=items,
                                device=device)
        return call

    candidates = {
        "GroupAUROC, all": timed("gauc_ours", lambda: ours_gauc(data, args.eval_batch, device), n),
        "GroupAUROC, subset": timed("gauc_ours_subset", lambda: ours_gauc(small, args.eval_batch, device), n_small),
        "sklearn per-user loop, subset": timed("gauc_reference_subset", lambda: reference_gauc(small), n_small),
        "BinaryAUROC, all": timed("auc_ours", lambda: ours_auc(data, args.eval_batch, device), n),
        "sklearn roc_auc_score, all": timed("auc_reference", lambda: reference_auc(data), n),
    }
    print(f"[bst] evaluation: {n:,} predictions, {args.n_users:,} users; per-user loop on {n_small:,}", flush=True)
    rates = alternate(candidates, args.rounds, unit="predictions/s")
    med = {k: median(v) for k, v in rates.items()}
    gauc_exact_subset = ours_gauc_exact(small, device)
    checks = {
        "gauc_subset_abs_diff": abs(gauc_exact_subset - values["gauc_reference_subset"]),
        "gauc_metric_float32_abs_diff": abs(values["gauc_ours_subset"] - values["gauc_reference_subset"]),
        "auc_abs_diff": abs(values["auc_ours"] - values["auc_reference"]),
    }
    agree = checks["gauc_subset_abs_diff"] <= GAUC_TOLERANCE and checks["auc_abs_diff"] <= AUC_TOLERANCE
    gauc_ratio = med["GroupAUROC, subset"] / med["sklearn per-user loop, subset"]
    auc_ratio = med["BinaryAUROC, all"] / med["sklearn roc_auc_score, all"]
    table = Table(f"AUC and GAUC evaluation throughput ({n:,} predictions, {args.n_users:,} users, {device.type})",
                  ["metric", "implementation", "predictions", "predictions/s", "x reference", "value"])
    table.add("GAUC", "GroupAUROC (update + compute)", f"{n:,}", fmt_rate(med["GroupAUROC, all"]), "-",
              f"{values['gauc_ours']:.6f}")
    table.add("GAUC", "GroupAUROC (update + compute)", f"{n_small:,}", fmt_rate(med["GroupAUROC, subset"]),
              fmt_ratio(gauc_ratio), f"{gauc_exact_subset:.9f}")
    table.add("GAUC", "sklearn roc_auc_score per user (loop)", f"{n_small:,}",
              fmt_rate(med["sklearn per-user loop, subset"]), fmt_ratio(1.0), f"{values['gauc_reference_subset']:.9f}")
    table.add("AUC", "torchmetrics BinaryAUROC (update + compute)", f"{n:,}", fmt_rate(med["BinaryAUROC, all"]),
              fmt_ratio(auc_ratio), f"{values['auc_ours']:.6f}")
    table.add("AUC", "sklearn roc_auc_score", f"{n:,}", fmt_rate(med["sklearn roc_auc_score, all"]), fmt_ratio(1.0),
              f"{values['auc_reference']:.6f}")
    table.notes += [
        f"updates of {args.eval_batch} predictions, as evaluation feeds them; subset: the {min(args.ref_users, args.n_users):,} "
        "users with the lowest ids (the per-user loop and GroupAUROC on the same predictions).",
        f"agreement: GAUC |diff| {checks['gauc_subset_abs_diff']:.1e} (float64; compute() returns float32: "
        f"{checks['gauc_metric_float32_abs_diff']:.1e}), AUC |diff| {checks['auc_abs_diff']:.1e}; "
        f"median of {args.rounds} alternating rounds.",
    ]
    verdicts = [
        f"{'AGREE' if agree else 'DISAGREE'}: GAUC {gauc_exact_subset:.9f} vs sklearn {values['gauc_reference_subset']:.9f}, "
        f"AUC {values['auc_ours']:.6f} vs sklearn {values['auc_reference']:.6f}",
        f"evaluation: GroupAUROC {gauc_ratio:,.1f}x the per-user sklearn loop; BinaryAUROC {auc_ratio:.2f}x sklearn "
        "roc_auc_score",
    ]
    result = {"n_preds": n, "n_users": args.n_users, "n_preds_subset": n_small, "ref_users": args.ref_users,
              "rates": rates, "medians": med, "values": values, "gauc_exact_subset": gauc_exact_subset,
              "checks": checks, "agree": agree, "gauc_ratio": gauc_ratio, "auc_ratio": auc_ratio}
    return result, table, verdicts


# --------------------------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> BenchReport:
    device = setup_run(args)
    kwargs = bst_kwargs(args.config)
    amp = torch.bfloat16 if args.amp == "bf16" else None
    result = {"settings": run_settings(args, device, amp=args.amp), "net": kwargs,
              "memory_method": memory_method(device)}
    tables, verdicts = [], []
    grid = dict(seq_lens=args.seq_lens, blocks=args.blocks, batch_size=args.batch_size, device=device, amp_dtype=amp,
                rounds=args.rounds, steps=args.steps, warmup=args.warmup)
    if "torch_encoder" in args.peers:
        print(f"[bst] training: seq_len {args.seq_lens} x blocks {args.blocks}, batch {args.batch_size}", flush=True)
        cmp, rows = training_grid(kwargs, **grid)
        overall = geometric_mean([r["ratio"] for r in rows])
        tables.append(training_table(rows, f"BST vs nn.TransformerEncoder BST, training samples/s (batch "
                                           f"{args.batch_size}, {device.type}{', bf16' if amp else ''})", [
            "reference: the same embeddings and MLP head, blocks = torch.nn.TransformerEncoder (post-LN, batch_first, "
            "same width, heads, feed-forward, dropout placement); params equal (else BST / reference).",
            f"peak MiB: {memory_method(device)}.",
            f"median of {args.rounds} alternating rounds x {args.steps} steps; {torch.get_num_threads()} thread(s); "
            f"geometric mean of BST x reference: {overall:.3f}x.",
        ]))
        verdicts.append(f"{pass_fail(overall, TARGET)}: BST vs nn.TransformerEncoder BST: {overall:.3f}x (geometric "
                        f"mean over {len(rows)} shapes; target >= {TARGET:g}x; per shape: "
                        f"{sum(r['ratio'] >= TARGET for r in rows)}/{len(rows)} pass)")
        result.update(training=rows, training_geomean_ratio=overall, training_pass=overall >= TARGET,
                      matmul_flops_per_sec=cmp.matmul)
    if "fuxictr" in args.peers:
        skip = FUXICTR.skip_line()
        if skip is not None:
            print(f"[bst] {skip}", flush=True)
            result["fuxictr"] = {"skipped": skip}
        else:
            version = FUXICTR.version()
            print(f"[bst] vs {FUXICTR.label} (fuxictr {version}): seq_len {args.seq_lens} x blocks "
                  f"{args.blocks}, batch {args.batch_size}", flush=True)
            rows = peer_grid(kwargs, FUXICTR, inference=not args.skip_inference, **grid)
            title = (f"BST vs FuxiCTR's BST (fuxictr {version}), samples/s (batch {args.batch_size}, "
                     f"{device.type}{', bf16' if amp else ''})")
            tables.append(peer_table(rows, "FuxiCTR", title, [
                "FuxiCTR's BST: built from FuxiCTR's layers as its model zoo's BST, at our widths "
                "(reproductions/benchmarks/fuxictr_peer.py); params differ only in the position tables.",
                "x FuxiCTR: median of the per-round ratios (each round measures every model once, the order alternating); spread: "
                "their min-max. Training: forward, BCE on logits, backward, AdamW; inference: eval forward under "
                "torch.inference_mode.",
                f"peak MiB (training step): {memory_method(device)}.",
                f"{args.rounds} rounds x {args.steps} steps (after {args.warmup} warm-up); "
                f"{torch.get_num_threads()} thread(s).",
            ]))
            verdicts.append(peer_verdict(rows, "FuxiCTR's BST"))
            result["fuxictr"] = {"skipped": None, "version": version, "rows": rows,
                                 "target": PEER_TARGET,
                                 "pass": all(r["training"]["total"]["median_paired_ratio"] >= PEER_TARGET for r in rows)}
    if not args.skip_eval:
        eval_result, eval_table, eval_verdicts = evaluation(args, device)
        result["evaluation"] = eval_result
        tables.append(eval_table)
        verdicts += eval_verdicts
    return BenchReport(NAME, result, tables, verdicts)
