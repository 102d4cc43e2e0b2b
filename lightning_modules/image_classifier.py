"""Image classification training logic: cross-entropy loss, accuracy per stage.

The network is injected (``ImageClassifier(net=ViT(...))``); this module knows nothing about
architectures or data files. The optimiser, schedule, lr scaling, compile and model statistics
are ``lightning_modules.base.TrainingModule``'s; this module adds the loss (cross-entropy with
label smoothing), accuracy per stage, the warm-up as a fraction of the run, ``channels_last``,
the test-time augmentation of evaluation (``eval_flip``, ``eval_translate``), and the checks of the
net against the data (classes, image shape). Recipe knobs are the ones the ViT paper and the strong
small-data recipes vary: AdamW, linear warm-up then cosine decay, label smoothing, no weight decay
on norms, biases, position embeddings and the class token.

Scale path (all opt-in, defaults leave a run as it was):
- ``compile``: ``torch.compile`` the net in place in ``configure_model`` (state_dict keys stay
  plain, so checkpoints move between compiled and uncompiled modules);
- ``channels_last``: the net's 4-D weights and every input batch in ``torch.channels_last``
  memory format (faster convolutions on GPUs for the CNN parts: ResNets, hybrid stems; a ViT only
  has its patch-embedding convolution and computes the same);
- ``lr_scaling`` with ``base_batch_size``: the learning rate follows the global batch
  (``lightning_modules.base.scaled_lr``); the effective rate is logged to the hparams and
  ``results.json``.
Under FSDP2 (``reproductions/vit/configs/overlays/fsdp.yaml``) ``TrainingModule.configure_model``
shards the net (``lightning_modules.sharding``) and makes the weight-decay groups from the sharded
parameters; norm clipping computes the global norm over the shards.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_modules.base import TrainingModule
from lightning_modules.optim import SGDAdamW
from utils.choices import check_choice, choices

StemOptimizer = Literal["adamw", "sgd"]
STEM_OPTIMIZERS = choices(StemOptimizer)


class ImageClassifier(TrainingModule):
    """Train and evaluate any ``nn.Module`` that maps images (B, C, H, W) to logits (B, K).

    Args:
        net: the network; must have ``num_classes`` (timm models do).
        weight_decay: AdamW decoupled weight decay; not applied to parameters with fewer than
            two dimensions (norms, biases) nor to those named in ``net.no_weight_decay()``
            (position embeddings, class token).
        warmup_fraction: fraction of all optimiser steps spent in linear warm-up, unless
            ``warmup_steps`` (a ``TrainingModule`` argument) gives the length in steps.
        label_smoothing: cross-entropy label smoothing.
        channels_last: keep the net's 4-D weights and the input batches in
            ``torch.channels_last`` memory format (for convolutional nets on GPUs).
        eval_flip: in validation, test and predict, average the logits of each image and of
            its horizontal mirror (test-time augmentation with one extra forward pass; for data
            whose classes are mirror-symmetric, as the flip augmentation assumes). Training is
            unchanged.
        eval_translate: with ``eval_flip``-style averaging, also evaluate each image shifted by
            this many pixels up-left and down-right (reflection padding, then a crop back to the
            size) and average: half the weight on the unshifted logits, a quarter on each shift
            (K. Jordan's airbench test-time augmentation; with ``eval_flip`` each of the three is
            mirror-averaged, six forward passes in all). 0 (default): no shift.
        stem_optimizer: how the net's convolutional stem (``net.stem``: ``ConvStemViT``) learns:
            ``adamw`` (as the rest of the net) or ``sgd``: SGD with Nesterov momentum, the fast
            CIFAR-10 CNNs' rule (K. Jordan's airbench), while the rest stays on AdamW
            (``lightning_modules.optim.SGDAdamW``). Then:
        sgd_lr: the stem weights' peak rate (for the configured global batch, on the mean loss;
            it follows the same warm-up and cosine as ``lr``, and ``lr_scaling`` scales it alike).
        sgd_momentum: the Nesterov momentum.
        sgd_weight_decay: PyTorch SGD's weight decay (added to the gradient) of the stem weights.
        sgd_bias_lr_scale: the stem's BatchNorm and conv biases learn at ``sgd_lr`` times this,
            with the decay divided by it (the same shrinkage per step); airbench's 64.
        **kwargs: ``TrainingModule``'s ``lr``, ``betas``, ``warmup_steps``, ``min_lr_ratio``,
            ``lr_scaling``, ``base_batch_size``, ``compile``, ``compile_mode``.

    The schedule is always warm-up then cosine decay to ``lr * min_lr_ratio``.
    """

    monitor = ("val/acc", "max")

    def __init__(
        self,
        net: nn.Module,
        *,
        weight_decay: float = 0.05,
        warmup_fraction: float = 0.05,
        label_smoothing: float = 0.0,
        channels_last: bool = False,
        eval_flip: bool = False,
        eval_translate: int = 0,
        stem_optimizer: StemOptimizer = "adamw",
        sgd_lr: float = 0.2,
        sgd_momentum: float = 0.85,
        sgd_weight_decay: float = 1.3e-3,
        sgd_bias_lr_scale: float = 64.0,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction={warmup_fraction!r} must be in [0, 1)")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing!r} must be in [0, 1)")
        if not isinstance(eval_translate, int) or eval_translate < 0:
            raise ValueError(f"eval_translate={eval_translate!r} must be a whole number of pixels >= 0")
        check_choice("stem_optimizer", stem_optimizer, StemOptimizer)
        if stem_optimizer == "sgd":
            if not isinstance(getattr(net, "stem", None), nn.Module):
                raise ValueError(
                    f"stem_optimizer='sgd' trains the net's convolutional stem (net.stem) by SGD, but "
                    f"{type(net).__name__} has none: use models.hybrid.ConvStemViT, or stem_optimizer='adamw'"
                )
            for name, value in (("sgd_lr", sgd_lr), ("sgd_bias_lr_scale", sgd_bias_lr_scale)):
                if not value > 0:
                    raise ValueError(f"{name}={value!r} must be positive")
            if not 0.0 < sgd_momentum < 1.0:
                raise ValueError(f"sgd_momentum={sgd_momentum!r} must be in (0, 1)")
            if sgd_weight_decay < 0:
                raise ValueError(f"sgd_weight_decay={sgd_weight_decay!r} must be >= 0")
        num_classes = getattr(net, "num_classes", None)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"net must have an integer num_classes >= 2, got {num_classes!r}")
        super().__init__(net, weight_decay=weight_decay, **kwargs)
        self.num_classes = num_classes
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # One metric object per stage, so states never mix across stages.
        self.train_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        if channels_last:
            # parameters keep their identity (optimiser, checkpoints); loading a state_dict
            # copies into these strides, so the layout survives checkpoint restores
            self.net.to(memory_format=torch.channels_last)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.hparams.get("channels_last") and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def evaluate(self, images: torch.Tensor) -> torch.Tensor:
        """The logits evaluation uses: ``forward``; with ``eval_flip`` the mean of the image's
        and its mirror image's; with ``eval_translate`` (pixels) half of that plus a quarter of
        the same for the image shifted up-left and for it shifted down-right."""
        logits = self._mirrored(images)
        shift = self.hparams.get("eval_translate") or 0
        if shift and images.dim() == 4:
            height, width = images.shape[-2:]
            padded = nn.functional.pad(images, (shift,) * 4, mode="reflect")
            up_left = padded[..., :height, :width]
            down_right = padded[..., 2 * shift:2 * shift + height, 2 * shift:2 * shift + width]
            logits = logits / 2 + (self._mirrored(up_left) + self._mirrored(down_right)) / 4
        return logits

    def _mirrored(self, images: torch.Tensor) -> torch.Tensor:
        logits = self(images)
        if self.hparams.get("eval_flip"):
            logits = (logits + self(images.flip(-1))) / 2
        return logits

    # ---------------------------------------------------------------- setup
    def inspect_data(self, datamodule) -> torch.Tensor | None:
        """The data's classes and image shape must be the net's; one zero image for the FLOPs."""
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
        if shape is None:
            return None
        self.example_input_array = torch.zeros(2, *shape)  # shapes and FLOPs in the model summary
        return torch.zeros(1, *shape)

    def setup(self, stage: str) -> None:
        """The base's checks and FLOP count; when fitting, then the net's data-dependent layers
        (``ConvStemViT(whiten=True)``'s patch whitening) from the training images, before any
        step and before the strategy wraps the net (DDP then broadcasts rank 0's to every rank).
        A run resumed from a checkpoint fits them here too, then loads the checkpoint's."""
        super().setup(stage)
        wanted = self.net.needs_images() if hasattr(self.net, "needs_images") else 0
        if stage != "fit" or not wanted:
            return
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        if not hasattr(datamodule, "train_images"):
            raise ValueError(
                f"{type(self.net).__name__} fits layers to the training images (whiten=True) and needs a "
                f"datamodule with train_images(n) (datamodules.images.ImageDataModule), got "
                f"{type(datamodule).__name__}; or set whiten: false"
            )
        self.net.fit_to_images(datamodule.train_images(wanted))

    # ---------------------------------------------------------------- steps
    def _shared_step(self, batch, metric: MulticlassAccuracy) -> torch.Tensor:
        images, labels = batch
        logits = self(images) if self.training else self.evaluate(images)
        loss = self.criterion(logits, labels)  # int labels, or (B, K) class probabilities (Mixup/CutMix)
        metric.update(logits.detach(), labels.argmax(dim=-1) if labels.is_floating_point() else labels)
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, self.train_acc)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, sync_dist=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        self.log_lr()
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
        return self.evaluate(images).softmax(dim=-1)

    # ---------------------------------------------------------------- optimiser
    def parameter_groups(self) -> list[dict]:
        """``TrainingModule``'s AdamW groups; with ``stem_optimizer='sgd'`` the stem's parameters
        leave them for two SGD groups (weights; biases at ``sgd_bias_lr_scale`` times the rate)."""
        groups = super().parameter_groups()
        h = self.hparams
        if h.get("stem_optimizer", "adamw") != "sgd":
            return groups
        stem = {id(p) for p in self.net.stem.parameters() if p.requires_grad}
        for group in groups:
            group["params"] = [p for p in group["params"] if id(p) not in stem]
        weights = [p for p in self.net.stem.parameters() if p.requires_grad and p.ndim > 1]
        biases = [p for p in self.net.stem.parameters() if p.requires_grad and p.ndim <= 1]
        scale = h.sgd_bias_lr_scale
        sgd = dict(rule="sgd", momentum=h.sgd_momentum, nesterov=True)
        return [
            *groups,
            dict(params=weights, lr=h.sgd_lr, weight_decay=h.sgd_weight_decay, **sgd),
            dict(params=biases, lr=h.sgd_lr * scale, weight_decay=h.sgd_weight_decay / scale, **sgd),
        ]

    def optimizer_class(self) -> type[torch.optim.Optimizer]:
        """AdamW, or ``SGDAdamW`` when the stem learns by SGD."""
        return SGDAdamW if self.hparams.get("stem_optimizer", "adamw") == "sgd" else super().optimizer_class()

    def lr_schedule(self) -> dict[str, Any]:
        """Warm-up then cosine; without ``warmup_steps`` the warm-up is ``warmup_fraction`` of
        all optimiser steps."""
        schedule = super().lr_schedule()
        if self.hparams.warmup_steps is None:
            schedule["warmup_steps"] = int(self.hparams.warmup_fraction * schedule["total_steps"])
        return schedule
