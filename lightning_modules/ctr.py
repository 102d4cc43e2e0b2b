"""CTR training logic for the BST reproduction: loss, AUC / GAUC / logloss per stage, optimiser.

The network is injected (``CTRModule(net=BST(...))``): any ``nn.Module`` mapping a batch dict
(keys in ``models/ctr.py``) to click logits (B,). The loss is binary cross-entropy on the logits
(the sigmoid of the paper's output layer lives in the loss, for numerical stability);
``predict_step`` returns probabilities.

Metrics, one object per stage (val, test), logged as ``stage/name``:
- ``auc``: torchmetrics ``BinaryAUROC`` over all impressions (exact, no thresholds);
- ``gauc``: :class:`lightning_modules.metrics.GroupAUROC`, grouped by ``batch['user']``;
- ``logloss``: the mean BCE as a ``MeanMetric`` (sum and count synced, so exact under DDP).
All three are Metric objects: their states are synced across processes by torchmetrics at
epoch end, never averaged per process. ``train/loss`` is an averageable scalar
(``sync_dist=True``).

Beside GAUC, what it stands on (``GroupAUROC.coverage``, counted over all processes):
``impressions`` and ``users`` in the split, ``gauc_impressions`` and ``gauc_users`` of the users
with both labels (the only ones GAUC scores). With one test impression per user GAUC covers
nobody; the counts make that visible in the results file. They are logged once per evaluation,
as float64 (exact beyond float32's 2**24), with ``sync_dist`` and a ``max`` reduction: every
process holds the same gathered counts, so the reduction keeps them as they are (a sum would
multiply them by the number of processes), and Lightning has no unsynced epoch value to warn of.

Defaults: AdamW (PyTorch's fused kernel where the parameters allow it), lr 1e-3, no weight decay,
constant rate after an optional linear warm-up.
The paper's lr 0.01 (Sec. 4.1 settings, unverified) is for its setting (batch 256, Taobao scale, an unspecified
optimiser); with Adam-type optimisers on the synthetic and MovieLens data 1e-3 is the stable
choice. Weight decay, when set, applies to the weight matrices of Linear layers only, never to
embeddings (sparse ids would be shrunk on every step whether seen or not), norms or biases.

The optimiser, schedule, lr scaling (``lr_scaling`` / ``base_batch_size``), ``compile`` and the
model statistics are ``lightning_modules.base.TrainingModule``'s, as for ``ImageClassifier``;
this module adds the loss, the metrics, the choice of Adam or AdamW, the schedule after warm-up
(constant or cosine), its weight-decay groups and the check of the net's vocabularies against
the data's.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAUROC

from lightning_modules.base import Schedule, TrainingModule
from lightning_modules.metrics import GroupAUROC
from utils.choices import check_choice, choices

OptimizerName = Literal["adamw", "adam"]
OPTIMIZERS = choices(OptimizerName)


def fusable(params) -> bool:
    """True if PyTorch's fused Adam/AdamW kernel takes these parameters: plain floating-point
    tensors, all on one CPU or CUDA device (not sharded tensors, such as FSDP's)."""
    params = [p for p in params if p.requires_grad]
    devices = {p.device for p in params}
    return (bool(params) and len(devices) == 1 and next(iter(devices)).type in ("cpu", "cuda")
            and all(type(p) is nn.Parameter and p.is_floating_point() for p in params))


def check_feature_sizes(net_sizes: dict, data_sizes: dict) -> None:
    """Raise ValueError if the net's vocabularies cannot hold the data's ids.

    Compares the keys both dicts have: each net size must be >= the data's (the net may be
    larger); ``profile_sizes`` must have as many fields, each large enough.
    """
    problems = []
    for key, need in data_sizes.items():
        if key not in net_sizes:
            continue
        have = net_sizes[key]
        if key == "profile_sizes":
            have, need = list(have), list(need)
            if len(have) != len(need):
                problems.append(f"profile_sizes has {len(have)} fields but the data has {len(need)}: set profile_sizes={need}")
            elif any(h < n for h, n in zip(have, need)):
                problems.append(f"profile_sizes={have} but the data needs at least {need}")
        elif have < need:
            problems.append(f"{key}={have} but the data needs {key} >= {need}")
    if problems:
        raise ValueError(
            "the net was built too small for the data (sizes count id 0 = padding): " + "; ".join(problems)
            + f". The data's feature_sizes: {data_sizes}"
        )


class CTRModule(TrainingModule):
    """Train and evaluate a CTR net (BST, WDL, WDL(+Seq), DIN, ...) on dict batches.

    Args:
        net: maps a batch to logits (B,); should expose ``feature_sizes`` (checked against the
            DataModule's at setup).
        optimizer: ``adamw`` | ``adam`` (Adam with the same parameter groups; with weight
            decay, Adam's is the coupled L2 form).
        warmup_steps: linear warm-up length in optimiser steps.
        schedule: ``constant`` | ``cosine`` (to ``lr * min_lr_ratio`` at the last step).
        **kwargs: ``TrainingModule``'s ``lr``, ``weight_decay`` (default 0; on Linear weight
            matrices only), ``betas``, ``min_lr_ratio``, ``lr_scaling``, ``base_batch_size``,
            ``compile``, ``compile_mode``.
    """

    monitor = ("val/auc", "max")

    def __init__(
        self,
        net: nn.Module,
        *,
        optimizer: OptimizerName = "adamw",
        warmup_steps: int = 0,
        schedule: Schedule = "constant",
        **kwargs: Any,
    ) -> None:
        check_choice("optimizer", optimizer, OptimizerName)
        check_choice("schedule", schedule, Schedule)
        super().__init__(net, warmup_steps=warmup_steps, **kwargs)
        # One metric object per stage, so states never mix across stages.
        self.val_auc, self.test_auc = BinaryAUROC(), BinaryAUROC()
        self.val_gauc, self.test_gauc = GroupAUROC(), GroupAUROC()
        self.val_logloss, self.test_logloss = MeanMetric(), MeanMetric()

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.net(batch)

    # ---------------------------------------------------------------- setup
    def inspect_data(self, datamodule) -> dict[str, torch.Tensor] | None:
        """The net's vocabularies must hold the data's ids; the data's example batch of one for the FLOPs."""
        data_sizes = getattr(datamodule, "feature_sizes", None)
        net_sizes = getattr(self.net, "feature_sizes", None)
        if isinstance(data_sizes, dict) and isinstance(net_sizes, dict):
            check_feature_sizes(net_sizes, data_sizes)
        if self.flops_per_sample is None and hasattr(datamodule, "example_batch"):
            try:
                return datamodule.example_batch(1)
            except Exception as err:  # FLOPs are a report nicety, never a reason to stop a run
                warnings.warn(f"could not count FLOPs: {err}", stacklevel=2)
        return None

    # ---------------------------------------------------------------- steps
    def _step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self(batch)
        labels = batch["label"].float()
        losses = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="none")
        return logits, labels, losses

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        _, _, losses = self._step(batch)
        loss = losses.mean()
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True,
                 batch_size=losses.numel())
        self.log_lr()
        return loss

    def _evaluate(self, batch: dict[str, torch.Tensor], stage: str) -> None:
        logits, labels, losses = self._step(batch)
        probs = torch.sigmoid(logits.detach().float())
        auc, gauc, logloss = (getattr(self, f"{stage}_{name}") for name in ("auc", "gauc", "logloss"))
        auc.update(probs, labels.long())
        gauc.update(probs, labels.long(), batch["user"])
        logloss.update(losses.detach())
        kwargs = dict(on_step=False, on_epoch=True, batch_size=losses.numel())
        self.log(f"{stage}/auc", auc, prog_bar=True, **kwargs)
        self.log(f"{stage}/gauc", gauc, **kwargs)
        self.log(f"{stage}/logloss", logloss, **kwargs)

    def _reset(self, stage: str) -> None:
        # Fresh states at every evaluation start, created in the loop's own grad mode: a
        # stand-alone validate() runs under inference_mode, fit's validation does not, and
        # states left as inference tensors would refuse fit's in-place updates.
        for name in ("auc", "gauc", "logloss"):
            getattr(self, f"{stage}_{name}").reset()

    def _log_coverage(self, stage: str) -> None:
        """``stage/impressions``, ``users``, ``gauc_impressions``, ``gauc_users`` of this evaluation."""
        gauc = getattr(self, f"{stage}_gauc")
        if gauc.update_count == 0:  # no batch ran (e.g. limit_val_batches=0): nothing to count
            return
        for name, count in gauc.coverage().items():
            value = torch.tensor(float(count), dtype=torch.float64, device=self.device)
            self.log(f"{stage}/{name}", value, on_step=False, on_epoch=True, reduce_fx="max", sync_dist=True)

    def on_validation_epoch_start(self) -> None:
        self._reset("val")

    def on_test_epoch_start(self) -> None:
        self._reset("test")

    def on_validation_epoch_end(self) -> None:
        self._log_coverage("val")

    def on_test_epoch_end(self) -> None:
        self._log_coverage("test")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        """Click probabilities with the user (and label, when the batch has one)."""
        out = {"prob": torch.sigmoid(self(batch).float()), "user": batch["user"]}
        if "label" in batch:
            out["label"] = batch["label"]
        return out

    # ---------------------------------------------------------------- optimiser
    def parameter_groups(self) -> list[dict]:
        """Linear weight matrices (decayed) and everything else (embeddings, norms, biases: not)."""
        decay, no_decay, seen = [], [], set()
        for module in self.net.modules():
            for name, param in module.named_parameters(recurse=False):
                if not param.requires_grad or id(param) in seen:
                    continue
                seen.add(id(param))
                (decay if isinstance(module, nn.Linear) and name == "weight" else no_decay).append(param)
        return [{"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    def optimizer_class(self) -> type[torch.optim.Optimizer]:
        """Adam or AdamW, with PyTorch's fused kernel (``fused=True``) where every parameter can take it:
        one update of all tensors instead of a dozen small operations per tensor (the same update; on a
        CPU the config's BST trains about 10% faster at batch 256)."""
        cls = torch.optim.AdamW if self.hparams.optimizer == "adamw" else torch.optim.Adam
        return partial(cls, fused=True) if fusable(self.net.parameters()) else cls

    def lr_schedule(self) -> dict[str, Any] | None:
        """Warm-up, then ``schedule``; no scheduler at all for a constant rate without warm-up."""
        h = self.hparams
        if h.warmup_steps == 0 and h.schedule == "constant":
            return None
        total = int(self.trainer.estimated_stepping_batches) if h.schedule == "cosine" else 0
        return dict(warmup_steps=h.warmup_steps, total_steps=total, schedule=h.schedule, min_lr_ratio=h.min_lr_ratio)
