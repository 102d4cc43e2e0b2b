"""Image classification training logic: loss, metrics per stage, optimiser and schedule.

The network is injected (``ImageClassifier(net=ViT(...))``); this module knows nothing about
architectures or data files. Recipe knobs are the ones the ViT paper and the strong small-data
recipes vary: AdamW, linear warm-up then cosine decay, label smoothing, no weight decay on
norms, biases, position embeddings and the class token.

Scale path (all opt-in, defaults leave a run as it was):
- ``compile``: ``torch.compile`` the net in place in ``configure_model`` (state_dict keys stay
  plain, so checkpoints move between compiled and uncompiled modules);
- ``channels_last``: the net's 4-D weights and every input batch in ``torch.channels_last``
  memory format (faster convolutions on GPUs for the CNN parts: ResNets, hybrid stems; a ViT only
  has its patch-embedding convolution and computes the same);
- ``lr_scaling`` with ``base_batch_size``: the learning rate follows the global batch
  (``lightning_modules.common.scaled_lr``); the effective rate is logged to the hparams and
  ``results.json``.
Under FSDP (``reproductions/vit/configs/overlays/fsdp.yaml``) the weight-decay groups are made
in ``configure_model``, before FSDP flattens the parameters, and norm clipping goes through
FSDP's own ``clip_grad_norm_``.
"""

from __future__ import annotations

import inspect

import torch
from lightning import LightningModule
from timm.optim import param_groups_weight_decay
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_modules.common import (
    check_compile_mode,
    check_lr_scaling,
    compile_in_place,
    log_effective_lr,
    resolve_lr,
    save_hparams_without_net,
    scheduled,
)
from lightning_modules.model_stats import count_flops, count_parameters


class ImageClassifier(LightningModule):
    """Train and evaluate any ``nn.Module`` that maps images (B, C, H, W) to logits (B, K).

    Args:
        net: the network; must have ``num_classes`` (timm models do).
        lr: peak learning rate (after warm-up), for the global batch as configured.
        weight_decay: AdamW decoupled weight decay; not applied to parameters with fewer than
            two dimensions (norms, biases) nor to those named in ``net.no_weight_decay()``
            (position embeddings, class token).
        betas: AdamW betas.
        warmup_fraction: fraction of all optimiser steps spent in linear warm-up.
        warmup_steps: if set, the warm-up length in steps (overrides ``warmup_fraction``).
        min_lr_ratio: the cosine schedule ends at ``lr * min_lr_ratio``.
        label_smoothing: cross-entropy label smoothing.
        lr_scaling: ``none`` (default: ``lr`` is used as given, for the config's global batch),
            ``linear`` or ``sqrt``: the optimiser gets ``lr * k`` or ``lr * sqrt(k)`` with
            ``k = global batch / base_batch_size``; the global batch is the DataModule's
            ``batch_size`` (already the global batch, split over devices x nodes) times
            ``accumulate_grad_batches``.
        base_batch_size: the global batch ``lr`` was tuned for (needed by ``linear``/``sqrt``).
        compile: ``torch.compile`` the net (in place, in ``configure_model``). Costs compile
            time at the first steps (about a minute on a CPU); pays off on GPUs.
        compile_mode: ``default`` | ``reduce-overhead`` | ``max-autotune`` |
            ``max-autotune-no-cudagraphs`` (torch.compile's ``mode``).
        channels_last: keep the net's 4-D weights and the input batches in
            ``torch.channels_last`` memory format (for convolutional nets on GPUs).
    """

    #: the metric ModelCheckpoint and early stopping watch, and in which direction
    monitor = ("val/acc", "max")

    def __init__(
        self,
        net: nn.Module,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_fraction: float = 0.05,
        warmup_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        label_smoothing: float = 0.0,
        lr_scaling: str = "none",
        base_batch_size: int | None = None,
        compile: bool = False,
        compile_mode: str = "default",
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"lr={lr!r} must be positive")
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction={warmup_fraction!r} must be in [0, 1)")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing!r} must be in [0, 1)")
        check_lr_scaling(lr_scaling, base_batch_size)
        check_compile_mode(compile_mode)
        num_classes = getattr(net, "num_classes", None)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"net must have an integer num_classes >= 2, got {num_classes!r}")
        save_hparams_without_net(self, inspect.currentframe())
        self.net = net
        self.num_classes = num_classes
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # One metric object per stage, so states never mix across stages.
        self.train_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.num_params: int = count_parameters(net)
        self.flops_per_sample: int | None = None
        self.effective_lr: float | None = None  # set by configure_optimizers
        self.global_batch_size: int | None = None
        self._param_groups: list[dict] | None = None  # weight-decay groups, made before any wrapping
        if channels_last:
            # parameters keep their identity (optimiser, checkpoints); loading a state_dict
            # copies into these strides, so the layout survives checkpoint restores
            self.net.to(memory_format=torch.channels_last)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.hparams.get("channels_last") and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    # ---------------------------------------------------------------- setup
    def setup(self, stage: str) -> None:
        """Check the net against the data before any step runs, and count FLOPs once."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        data_classes = getattr(datamodule, "num_classes", None)
        if data_classes is not None and data_classes != self.num_classes:
            raise ValueError(
                f"the data has {data_classes} classes but the net was built with "
                f"num_classes={self.num_classes}; set --model.net.init_args.num_classes {data_classes}"
            )
        data_shape = getattr(datamodule, "input_shape", None)
        net_shape = getattr(self.net, "input_shape", None)
        if data_shape is not None and net_shape is not None and tuple(data_shape) != tuple(net_shape):
            raise ValueError(
                f"the data's images are {tuple(data_shape)} (C, H, W) but the net expects "
                f"{tuple(net_shape)}; set the net's in_chans/img_size (or the data's image_size) to agree"
            )
        shape = data_shape or net_shape
        if shape is not None:
            self.example_input_array = torch.zeros(2, *shape)  # shapes and FLOPs in the model summary
        if self.flops_per_sample is None and shape is not None:
            self.flops_per_sample = count_flops(self.net, torch.zeros(1, *shape))

    def configure_model(self) -> None:
        """Runs after ``setup`` (FLOPs are counted on the plain net) and before the strategy
        wraps the module (DDP, FSDP); called again by every later fit/validate/test, so
        idempotent."""
        if self._param_groups is None:
            # FSDP (use_orig_params) turns every parameter into a flat 1-D view of its shard:
            # made later, the groups would see no matrices and decay nothing
            self._param_groups = self._weight_decay_groups()
        if self.hparams.get("compile"):
            compile_in_place(self.net, self.hparams.get("compile_mode", "default"))

    def on_fit_start(self) -> None:
        stats = {"model/params": self.num_params}
        if self.flops_per_sample is not None:
            stats["model/flops_per_sample"] = self.flops_per_sample
        for logger in self.loggers:
            logger.log_hyperparams(stats)
        log_effective_lr(self)

    # ---------------------------------------------------------------- steps
    def _shared_step(self, batch, metric: MulticlassAccuracy) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = self.criterion(logits, labels)  # int labels, or (B, K) class probabilities (Mixup/CutMix)
        metric.update(logits.detach(), labels.argmax(dim=-1) if labels.is_floating_point() else labels)
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, self.train_acc)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        loss = self._shared_step(batch, self.val_acc)
        self.log("val/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("val/acc", self.val_acc, prog_bar=True, on_step=False, on_epoch=True)

    def test_step(self, batch, batch_idx: int) -> None:
        loss = self._shared_step(batch, self.test_acc)
        self.log("test/loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True)

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(images).softmax(dim=-1)

    # ---------------------------------------------------------------- optimiser
    def _weight_decay_groups(self) -> list[dict]:
        no_decay = set(self.net.no_weight_decay()) if hasattr(self.net, "no_weight_decay") else set()
        return param_groups_weight_decay(self.net, self.hparams.weight_decay, no_weight_decay_list=no_decay)

    def configure_optimizers(self):
        groups = self._param_groups
        if groups is None or {id(p) for g in groups for p in g["params"]} != {
            id(p) for p in self.net.parameters() if p.requires_grad
        }:  # not made yet, or the net's parameters were replaced since
            groups = self._param_groups = self._weight_decay_groups()
        groups = [dict(g) for g in groups]  # the optimiser adds its keys to the dicts it gets
        self.effective_lr, self.global_batch_size = resolve_lr(self)
        optimizer = torch.optim.AdamW(groups, lr=self.effective_lr, betas=tuple(self.hparams.betas))
        total = int(self.trainer.estimated_stepping_batches)
        warmup = self.hparams.warmup_steps
        if warmup is None:
            warmup = int(self.hparams.warmup_fraction * total)
        return scheduled(optimizer, warmup_steps=warmup, total_steps=total, min_lr_ratio=self.hparams.min_lr_ratio)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping, except norm clipping under FSDP, which Lightning refuses
        (``torch.nn.utils.clip_grad_norm_`` would see only this rank's shards): FSDP's own
        ``clip_grad_norm_`` on the root module computes the global norm over all shards."""
        if _uses_fsdp(self) and gradient_clip_algorithm in (None, "norm"):  # also GradClipAlgorithmType.NORM
            if gradient_clip_val:  # Lightning hands the hook the trainer's gradient_clip_val
                self.trainer.model.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


def _uses_fsdp(module: LightningModule) -> bool:
    trainer = module._trainer
    if trainer is None:
        return False
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(getattr(trainer, "strategy", None), FSDPStrategy)
