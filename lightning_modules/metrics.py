"""GAUC as a torchmetrics Metric: the impressions-weighted mean of per-user AUC (DIN paper, Zhou et
al. 2018, Eq. 1), computed by ``utils.ranking.group_auroc`` (the definition is there).
torchmetrics has no such metric: its ``RetrievalAUROC`` is an unweighted per-query mean and
scores queries without positives as 0.

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

from utils.ranking import group_auroc


def rela_impr(auc_model: float, auc_base: float) -> float:
    """RelaImpr in percent (Yan et al. 2014, as used by DIN and BST):
    ((AUC_model - 0.5) / (AUC_base - 0.5) - 1) * 100."""
    if auc_base <= 0.5:
        raise ValueError(f"auc_base={auc_base!r} must be above 0.5 for RelaImpr to be defined")
    return ((auc_model - 0.5) / (auc_base - 0.5) - 1.0) * 100.0


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
