"""GAUC: the impressions-weighted mean of per-user AUC (DIN paper, Zhou et al. 2018, Eq. 1).

    GAUC = sum_u n_u * AUC_u / sum_u n_u,

over the users u whose impressions hold both labels (users with one class have no AUC and are
skipped, in the numerator and in the weights). torchmetrics has no such metric: its
``RetrievalAUROC`` is an unweighted per-query mean and scores queries without positives as 0.

Per-user AUC is the Mann-Whitney statistic with tied scores given their average rank, so it
equals ``sklearn.metrics.roc_auc_score`` user by user; all users are computed at once (two
sorts and a few scatter-adds, no Python loop over users).

How much of the data GAUC speaks for depends on the split: with one test impression per user
(leave-one-out) no user holds both labels and GAUC is NaN; :meth:`GroupAUROC.coverage` gives
the users and impressions it used beside the totals, so a results file says it.

``rela_impr``: RelaImpr against a baseline's AUC (DIN, BST), the reports' column too.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat
from torchmetrics.utilities.prints import rank_zero_warn


def rela_impr(auc_model: float, auc_base: float) -> float:
    """RelaImpr in percent (Yan et al. 2014, as used by DIN and BST):
    ((AUC_model - 0.5) / (AUC_base - 0.5) - 1) * 100."""
    if auc_base <= 0.5:
        raise ValueError(f"auc_base={auc_base!r} must be above 0.5 for RelaImpr to be defined")
    return ((auc_model - 0.5) / (auc_base - 0.5) - 1.0) * 100.0


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


class GroupAUROC(Metric):
    """GAUC as a torchmetrics Metric (DIN paper Eq. 1; see the module docstring).

    ``update(preds, target, groups)``: scores or probabilities (N,), labels (N,) in {0, 1},
    group (user) ids (N,). The state is the concatenation of all three (``dist_reduce_fx='cat'``),
    so under DDP every process computes GAUC over all impressions, never an average of
    per-process GAUCs (a user's impressions may be split over processes). ``compute()`` returns
    NaN, with a warning, when no group holds both labels. :meth:`coverage` counts what that
    value used.

    Memory grows with the impressions seen (3 numbers each), as for an exact AUROC.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("preds", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")
        self.add_state("groups", default=[], dist_reduce_fx="cat")
        self._coverage: dict[str, int] | None = None

    def update(self, preds: torch.Tensor, target: torch.Tensor, groups: torch.Tensor) -> None:
        preds, target, groups = preds.detach().flatten(), target.detach().flatten(), groups.detach().flatten()
        if not (preds.shape == target.shape == groups.shape):
            raise ValueError(
                f"preds, target and groups must have the same length, got {tuple(preds.shape)}, "
                f"{tuple(target.shape)}, {tuple(groups.shape)}"
            )
        self.preds.append(preds.float())
        self.target.append(target.long())
        self.groups.append(groups.long())

    def compute(self) -> torch.Tensor:
        preds, target, groups = (dim_zero_cat(x) for x in (self.preds, self.target, self.groups))
        gauc, _, _, counts, valid = group_auroc(preds, target, groups, return_per_group=True)
        self._coverage = {"impressions": int(counts.sum()), "users": int(counts.numel()),
                          "gauc_impressions": int(counts[valid].sum()), "gauc_users": int(valid.sum())}
        if torch.isnan(gauc):
            rank_zero_warn("GroupAUROC: no group has both labels; GAUC is undefined (NaN)", UserWarning)
        return gauc.float()

    def coverage(self) -> dict[str, int]:
        """What the GAUC value stands on: ``impressions`` and ``users`` (distinct groups) seen, and
        ``gauc_impressions`` and ``gauc_users``, those of the users with both labels (the rest
        have no AUC and are left out).

        Counted over every process's impressions: it calls :meth:`compute`, which torchmetrics
        syncs across processes and caches until the next ``update`` or ``reset``, so the counts
        are those of the GAUC value returned, and asking for both costs one gather.
        """
        self.compute()
        return dict(self._coverage)
