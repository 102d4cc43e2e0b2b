"""GAUC: the impressions-weighted mean of per-user AUC (DIN paper, Zhou et al. 2018, Eq. 1), one pure
function that the training layer's metric (``lightning_modules.metrics.GroupAUROC``) and the data
layer's ceiling (``datamodules.behavior.metrics``) both use.

    GAUC = sum_u n_u * AUC_u / sum_u n_u,

over the users u whose impressions hold both labels (users with one class have no AUC and are
skipped, in the numerator and in the weights). Per-user AUC is the Mann-Whitney statistic with
tied scores given their average rank, so it equals ``sklearn.metrics.roc_auc_score`` user by
user; all users are computed at once (two sorts and a few scatter-adds, no Python loop over users).
"""

from __future__ import annotations

import torch


def group_auroc(
    preds: torch.Tensor, target: torch.Tensor, groups: torch.Tensor, *, return_per_group: bool = False
):
    """GAUC of ``preds`` (N,) scores, ``target`` (N,) in {0, 1}, ``groups`` (N,) integer ids.

    Returns the weighted mean (a 0-dim float64 tensor; NaN when no group holds both classes).
    With ``return_per_group=True`` returns ``(gauc, group_ids, auc, counts, valid)``: per
    distinct group, its AUC (NaN where invalid), impressions and whether it has both classes.
    """
    preds = preds.detach().flatten().to(torch.float64)
    target = target.detach().flatten()
    groups = groups.detach().flatten().long()
    if not (preds.shape == target.shape == groups.shape):
        raise ValueError(f"preds, target and groups must have the same length, got {preds.shape}, {target.shape}, {groups.shape}")
    device = preds.device
    if preds.numel() == 0:
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=device)
        empty = torch.empty(0, device=device)
        return (nan, empty.long(), empty.double(), empty.long(), empty.bool()) if return_per_group else nan
    if ((target != 0) & (target != 1)).any():
        raise ValueError("target must hold only 0 and 1")
    target = target.to(torch.float64)

    # Sort by (group, score): a stable sort by score, then a stable sort by group.
    order = torch.argsort(preds, stable=True)
    order = order[torch.argsort(groups[order], stable=True)]
    g, p, y = groups[order], preds[order], target[order]
    n = g.numel()
    idx = torch.arange(n, device=device)

    new_group = torch.ones(n, dtype=torch.bool, device=device)
    new_group[1:] = g[1:] != g[:-1]
    gid = torch.cumsum(new_group, 0) - 1  # dense group index per element
    n_groups = int(gid[-1]) + 1
    group_start = idx[new_group]  # first sorted position of each group
    rank = (idx - group_start[gid]).to(torch.float64) + 1.0  # 1-based rank inside the group

    # Ties: every run of equal scores in a group gets the average rank of the run.
    new_run = new_group.clone()
    new_run[1:] |= p[1:] != p[:-1]
    rid = torch.cumsum(new_run, 0) - 1
    n_runs = int(rid[-1]) + 1
    run_sum = torch.zeros(n_runs, dtype=torch.float64, device=device).index_add_(0, rid, rank)
    run_len = torch.zeros(n_runs, dtype=torch.float64, device=device).index_add_(0, rid, torch.ones_like(rank))
    avg_rank = (run_sum / run_len)[rid]

    zeros = torch.zeros(n_groups, dtype=torch.float64, device=device)
    counts = zeros.clone().index_add_(0, gid, torch.ones_like(y))
    n_pos = zeros.clone().index_add_(0, gid, y)
    rank_sum_pos = zeros.clone().index_add_(0, gid, avg_rank * y)
    n_neg = counts - n_pos
    valid = (n_pos > 0) & (n_neg > 0)
    auc = (rank_sum_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    auc = torch.where(valid, auc, torch.full_like(auc, float("nan")))
    weight = counts * valid
    total = weight.sum()
    gauc = (torch.where(valid, auc, zeros) * weight).sum() / total if total > 0 else total.new_tensor(float("nan"))
    if return_per_group:
        return gauc, g[new_group], auc, counts.long(), valid
    return gauc
