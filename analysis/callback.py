"""A Lightning callback: attention analysis of the trained model at the end of ``fit``.

``AttentionDistanceCallback(num_images=128)`` takes a fixed batch, the first ``num_images``
images of the validation set (the same images every run with the same split), and computes

- the mean attention distance per (layer, head) (``analysis/distance.py``), logged to every
  logger as ``analysis/mad_layer{l}`` (l = 1..L, the mean over heads) at the final step;
- the position-embedding similarity grids (``analysis/posemb.py``), when the model has an
  absolute position embedding.

Under ``trainer.log_dir`` (the run directory with this repository's CLI, where metrics.csv
is) it writes ``analysis/attention_distance.json`` (per-layer mean/min/max and per-head
values) and PNG figures (``analysis/attention_distance.png``,
``analysis/position_similarity[_<table>].png``); a ``WandbLogger`` also gets the figures as
images (``WandbLogger.log_image``). Runs on global rank 0 only, in eval mode, under no_grad;
the net is put back into its previous mode.

The ViT experiment configs list it under ``trainer.callbacks`` (``reproductions/vit/configs/``), so
every fit from them ends with the analysis; a config of one's own adds it the same way, or on the
command line: ``--trainer.callbacks+=analysis.callback.AttentionDistanceCallback``. It analyses a net
with a patch embedding and attention blocks (``ViT``, the hybrids) and does nothing for any other (a
ResNet variant of a ViT sweep) or when the net is sharded over processes (FSDP2, DeepSpeed: the analysis
runs on rank 0 alone, which a sharded forward cannot); ``--trainer.callbacks=[]`` (or a config without
it) leaves it out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from lightning import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from analysis.attention import token_layout
from analysis.distance import (
    CLASS_TOKEN_MODES,
    DEFAULT_NUM_IMAGES,
    locality,
    mean_attention_distance,
    summarize,
    uniform_distance,
)
from analysis.figures import attention_distance_figure, position_similarity_figure, save_figure, save_json
from analysis.posemb import position_similarity, row_column_contrast


def _images_of(batch) -> torch.Tensor:
    while isinstance(batch, (tuple, list)):
        batch = batch[0]
    if isinstance(batch, dict):
        batch = next(v for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() == 4)
    return batch


def fixed_images(trainer: Trainer, num_images: int) -> Optional[torch.Tensor]:
    """The first ``num_images`` images of the validation set, in order (None if there is none)."""
    datamodule = getattr(trainer, "datamodule", None)
    dataset = getattr(datamodule, "val_dataset", None)
    if dataset is None or len(dataset) == 0:
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
        dataset = getattr(loader, "dataset", None)
    if dataset is None or len(dataset) == 0:
        return None
    loader = DataLoader(dataset, batch_size=min(num_images, len(dataset)), shuffle=False)
    return _images_of(next(iter(loader)))


class AttentionDistanceCallback(Callback):
    """Mean attention distance (and position-embedding similarity) at the end of fit.

    Args:
        num_images: how many validation images (the paper: 128).
        class_token: ``drop`` (rows and columns removed, rows renormalised) or ``zero``
            (see ``analysis/distance.py``).
        position_similarity: also draw the position-embedding similarity.
        batch_size: images per forward pass during the analysis.
    """

    def __init__(
        self,
        num_images: int = DEFAULT_NUM_IMAGES,
        class_token: str = "drop",
        position_similarity: bool = True,
        batch_size: int = 32,
    ) -> None:
        if num_images < 1:
            raise ValueError(f"num_images={num_images} must be positive")
        if class_token not in CLASS_TOKEN_MODES:
            raise ValueError(f"class_token={class_token!r} is not one of {list(CLASS_TOKEN_MODES)}")
        self.num_images = num_images
        self.class_token = class_token
        self.position_similarity = position_similarity
        self.batch_size = batch_size
        self.results: Optional[dict] = None
        self.figures: dict[str, Path] = {}

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not analysable(trainer, pl_module):  # the same answer on every rank
            return
        log_dir = trainer.log_dir  # every rank: under DDP it is a broadcast that all processes must join
        if not trainer.is_global_zero:
            return
        net = getattr(pl_module, "net", pl_module)
        images = fixed_images(trainer, self.num_images)
        if images is None:
            rank_zero_warn("AttentionDistanceCallback: no validation images, so no attention analysis")
            return
        mad = mean_attention_distance(
            net, images.to(pl_module.device), num_images=self.num_images,
            class_token=self.class_token, batch_size=self.batch_size,
        )
        layers = summarize(mad)
        layout = token_layout(net, images.shape[-2:])
        uniform = uniform_distance(layout)
        self.results = {
            "num_images": int(min(self.num_images, len(images))),
            "class_token": self.class_token,
            "grid_size": list(layout.grid_size),
            "pixels_per_token": list(layout.pixels_per_token),
            "uniform_attention_distance": uniform,
            "step": int(trainer.global_step),
            "attention_distance": layers,
            "locality": locality(layers, uniform),
        }
        metrics = {f"analysis/mad_layer{row['layer']}": row["mean"] for row in layers}
        label = type(net).__name__
        figures = {"attention_distance": attention_distance_figure({label: mad}, references={label: uniform})}
        if self.position_similarity:
            try:
                sims = position_similarity(net)
            except ValueError:  # no absolute table (none, relative kinds)
                sims = {}
            for name, sim in sims.items():
                key = "position_similarity" if len(sims) == 1 else f"position_similarity_{name}"
                figures[key] = position_similarity_figure(sim, title=f"position embedding similarity ({name})")
                self.results.setdefault("position_similarity", {})[name] = row_column_contrast(sim)

        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
            logger.save()

        if log_dir is None:
            return
        out = Path(log_dir) / "analysis"
        self.figures = {key: save_figure(fig, out / f"{key}.png") for key, fig in figures.items()}
        self.results["figures"] = {key: str(path) for key, path in self.figures.items()}
        save_json(out / "attention_distance.json", self.results)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                for key, path in self.figures.items():
                    logger.log_image(key=f"analysis/{key}", images=[str(path)], step=trainer.global_step)


def analysable(trainer: Trainer, module: LightningModule) -> bool:
    """Whether ``module``'s net is a ViT (patch embedding and attention blocks) that is not sharded over
    processes (the analysis runs on rank 0 alone, which a sharded forward cannot)."""
    net = getattr(module, "net", module)
    if not (hasattr(net, "patch_embed") and hasattr(net, "blocks")):
        return False
    strategy = type(trainer.strategy).__name__
    return not ("FSDP" in strategy or "ModelParallel" in strategy or "DeepSpeed" in strategy)
