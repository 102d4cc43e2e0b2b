"""Attention analyses of a trained checkpoint or a timm ViT (ViT paper Fig. 6, 7 and 11).

    repro analyze distance|rollout|posemb|filters
        (--ckpt PATH | --timm NAME [--weights FILE | --pretrained] [--img-size N])
        [--data-source digits|fashion_mnist|cifar10|cifar100|folder|owner/name] [--data-dir DIR]
        [--split val|test] [--num-images 128] [--out DIR] [--class-token drop|zero]
        [--head-fusion mean|max|min] [--num-maps 8] [--components 28] [--device cpu|cuda]

What each writes into ``--out`` (PNG figures and a JSON of the numbers, atomically):

- ``distance``: ``attention_distance.{png,json}``, mean attention distance per (layer, head)
  in pixels over ``--num-images`` images (Fig. 11). ``--ckpt`` / ``--timm`` may be repeated:
  the models are drawn side by side (e.g. ViT and hybrid); ``--label`` names them.
- ``rollout``: ``rollout.{png,json}``, attention-rollout maps over the first ``--num-maps``
  images (Fig. 6).
- ``posemb``: ``position_similarity[_<table>].png`` and ``position_similarity.json``, the
  cosine similarity of the patches' position embeddings (Fig. 7 centre).
- ``filters``: ``patch_filters_pca.{png,json}``, the first ``--components`` principal
  components of the patch-embedding filters (Fig. 7 left).

Models. ``--ckpt``: a checkpoint of this repository (``runs/<exp>/<variant>/seed<k>/
checkpoints/last.ckpt``), its net rebuilt from the checkpoint's hyper-parameters. ``--timm``:
any timm VisionTransformer by name, randomly initialised unless ``--weights FILE`` (a local
.safetensors/.pth/.npz, through timm's own loader and filters) or ``--pretrained`` (the hub's
weights: needs network or a filled cache; offline it fails in seconds and says so).

Data: any ImageDataModule source. Default for ``--ckpt``: the data the run trained on (the
checkpoint's data hyper-parameters, the same split). Default for ``--timm``: sklearn's digits
(offline, always there), resized to the model's input size. Images are converted to the
model's channels (grey replicated to RGB, RGB averaged to grey) and, for timm models,
normalised with the model's own mean/std (``pretrained_cfg``).

Default ``--out``: ``<run dir>/analysis/`` for a checkpoint, ``runs/analysis/<timm name>/``
for a timm model (the first model's, when several are given).

The shipped checkpoint. ``reproductions/vit/demo/fmnist_vit_p4.ckpt`` is a small ViT trained on
Fashion-MNIST (its config, command and accuracy: ``reproductions/vit/demo/README.md``); the
notebook analyses it when given no model (``load_target``). Given as ``--ckpt``, its analyses go
to ``runs/analysis/fmnist_vit_p4/`` (not into the repository) and, when the file records no
data, its images are Fashion-MNIST's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TextIO

import torch
from torch import nn

from analysis.attention import attention_weights, token_layout
from analysis.distance import (
    CLASS_TOKEN_MODES,
    DEFAULT_NUM_IMAGES,
    format_summary,
    mean_attention_distance,
    summarize,
    uniform_distance,
)
from analysis.figures import (
    attention_distance_figure,
    filters_figure,
    position_similarity_figure,
    rollout_figure,
    save_figure,
)
from analysis.filters import DEFAULT_NUM_COMPONENTS, filter_pca, patch_filters
from analysis.posemb import position_similarity, row_column_contrast
from analysis.rollout import HEAD_FUSIONS, attention_rollout, rollout_maps, upsample_maps
from utils.atomic import atomic_write_json

COMMANDS = ("distance", "rollout", "posemb", "filters")
DEFAULT_TIMM_SOURCE = "digits"
DEFAULT_OUT_ROOT = Path("runs") / "analysis"
DEFAULT_DPI = 120  # of the PNG figures (the notebook draws smaller ones)
#: the small trained ViT shipped with the repository, and the data it was trained on
DEMO_CKPT = Path(__file__).resolve().parent / "vit" / "demo" / "fmnist_vit_p4.ckpt"
DEMO_SOURCE = "fashion_mnist"


class AnalyzeError(Exception):
    """A bad request or a missing input, reported as one clear line."""


# ------------------------------------------------------------------------------------ models


@dataclass
class Target:
    """A model to analyse and where it came from.

    ``input_mean`` / ``input_std``: the normalisation the model expects (timm models); None
    for checkpoints, whose images are normalised as in training (the data module's stats).
    ``out_dir``: where its analyses go by default, when not the run's or the timm model's folder."""

    net: nn.Module
    label: str
    origin: str
    run_dir: Optional[Path] = None
    data_hparams: dict = field(default_factory=dict)
    input_mean: Optional[Sequence[float]] = None
    input_std: Optional[Sequence[float]] = None
    out_dir: Optional[Path] = None

    @property
    def in_chans(self) -> int:
        pe = self.net.patch_embed
        if getattr(pe, "in_chans", None):  # HybridEmbed
            return int(pe.in_chans)
        if isinstance(getattr(pe, "proj", None), nn.Conv2d):  # PatchEmbed
            return int(pe.proj.in_channels)
        return int(getattr(self.net, "in_chans", 3))

    @property
    def img_size(self) -> tuple[int, int]:
        size = self.net.patch_embed.img_size
        return (int(size[0]), int(size[1])) if isinstance(size, (tuple, list)) else (int(size), int(size))

    @property
    def default_out(self) -> Path:
        if self.out_dir is not None:
            return self.out_dir
        if self.run_dir is not None:
            return self.run_dir / "analysis"
        return DEFAULT_OUT_ROOT / self.origin.replace("/", "_")


def net_kind(net: nn.Module) -> str:
    """``hybrid`` when the patch embedding runs a CNN (timm ``HybridEmbed``), else ``ViT``."""
    return "hybrid" if getattr(getattr(net, "patch_embed", None), "backbone", None) is not None else "ViT"


def run_dir_of(ckpt: Path) -> Path:
    """``<run dir>/checkpoints/last.ckpt`` -> ``<run dir>``; else the checkpoint's folder."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


#: what each analysis needs of the net: a patch grid and attention blocks (ViT or hybrid)
NEEDS_VIT = ("distance", "rollout", "posemb")


def _net_class(checkpoint: dict) -> str:
    """The net's class path recorded in a checkpoint's hyper-parameters ('?' if none)."""
    hparams = checkpoint.get("hyper_parameters") or {}
    net = hparams.get("net") if isinstance(hparams, dict) else None
    if isinstance(net, dict):
        return str(net.get("class_path") or "?")
    return type(net).__name__ if net is not None else str(hparams.get("_class_path") or "?")


def load_checkpoint(path: str | os.PathLike, *, label: Optional[str] = None, device: str = "cpu",
                    analysis: Optional[str] = None) -> Target:
    """A checkpoint of this repository: its net (rebuilt from the hyper-parameters) in eval mode.

    Read with ``weights_only=True`` (lightning_modules.checkpoint_io): a file that asks to import
    anything beyond tensors and plain containers is refused and nothing in it runs. With
    ``analysis`` one of ``NEEDS_VIT``, a checkpoint whose net is not a ViT or hybrid (a ResNet, a
    CTR model) is refused before it is built, naming the net it holds.
    """
    from lightning_modules.checkpoint_io import CheckpointError, safe_globals
    from lightning_modules.checkpoint_io import load_checkpoint as load_safely
    from lightning_modules.image_classifier import ImageClassifier

    path = Path(path)
    try:
        raw = load_safely(path, what="--ckpt", mmap=True)
    except CheckpointError as e:
        raise AnalyzeError(str(e)) from e
    net_class = _net_class(raw)
    data = {k: v for k, v in (raw.get("datamodule_hyper_parameters") or {}).items() if not k.startswith("_")}
    del raw
    short = net_class.rpartition(".")[2]
    if analysis in NEEDS_VIT and short not in ("ViT", "HybridViT", "ConvStemViT") and "vit" not in short.lower():
        raise AnalyzeError(
            f"--ckpt {str(path)!r} holds a {short} ({net_class}); {analysis} needs a ViT or hybrid checkpoint "
            "(a net with patch embeddings and attention blocks), e.g. one of vit/digits"
        )
    with safe_globals():
        module = ImageClassifier.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    net = module.net.to(device).eval()
    if analysis in NEEDS_VIT and (not hasattr(net, "patch_embed") or not hasattr(net, "blocks")):
        raise AnalyzeError(f"--ckpt {str(path)!r} holds a {type(net).__name__}; {analysis} needs a ViT or hybrid "
                           "checkpoint (a net with patch embeddings and attention blocks)")
    if _is_demo(path):
        return Target(net=net, label=label or f"{net_kind(net)} {DEMO_CKPT.stem}", origin=_repo_relative(DEMO_CKPT),
                      data_hparams=data or {"source": DEMO_SOURCE}, out_dir=DEFAULT_OUT_ROOT / DEMO_CKPT.stem)
    run_dir = run_dir_of(path)
    if label is None:
        label = f"{net_kind(net)} {run_dir.parent.name}/{run_dir.name}" if run_dir.parent.name else net_kind(net)
    return Target(net=net, label=label, origin=str(path), run_dir=run_dir, data_hparams=data)


def _is_demo(path: Path) -> bool:
    try:
        return path.resolve() == DEMO_CKPT
    except OSError:
        return False


def _repo_relative(path: Path) -> str:
    """``path`` relative to the repository (the folder above ``reproductions/``) when inside it."""
    try:
        return str(path.relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        return str(path)


def load_target(
    ckpt: Optional[str | os.PathLike] = None,
    timm_name: Optional[str] = None,
    *,
    weights: Optional[str] = None,
    img_size: Optional[int] = None,
    device: str = "cpu",
) -> Target:
    """The notebook's model: ``ckpt`` if given, else the timm model ``timm_name`` (random init
    unless ``weights``), else the shipped checkpoint (``DEMO_CKPT``)."""
    if ckpt:
        return load_checkpoint(ckpt, device=device)
    if timm_name:
        return load_timm(timm_name, weights=weights, img_size=img_size, device=device)
    if not DEMO_CKPT.is_file():
        raise AnalyzeError(f"the shipped checkpoint {_repo_relative(DEMO_CKPT)} is missing; give a checkpoint or a "
                           "timm model name")
    return load_checkpoint(DEMO_CKPT, device=device)


def _hub_weights_offline() -> Optional[str]:
    """Why the hub cannot give weights now (None if it can): the offline switches, or a
    connection probe to the endpoint that fails within seconds."""
    import huggingface_hub.constants

    from datamodules.images.hub import TRUE_VALUES, endpoint_reachable

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(var)
        if value and value.strip().upper() in TRUE_VALUES:
            return f"{var}={value}"
    endpoint = huggingface_hub.constants.ENDPOINT
    if not endpoint_reachable(endpoint):
        return f"{endpoint} is unreachable"
    return None


def load_timm(
    name: str,
    *,
    weights: Optional[str] = None,
    pretrained: bool = False,
    img_size: Optional[int] = None,
    label: Optional[str] = None,
    device: str = "cpu",
) -> Target:
    """A timm ViT by name: random init, a local weights file, or the hub's pretrained weights."""
    import timm

    if weights and pretrained:
        raise AnalyzeError("give --weights FILE or --pretrained, not both")
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('_')[0]}*")[:8]
        raise AnalyzeError(f"--timm {name!r} is not a timm model name (e.g. {', '.join(close) or 'vit_base_patch16_224'})")
    kwargs: dict[str, Any] = {}
    if img_size is not None:
        kwargs["img_size"] = img_size
    if weights:
        file = Path(weights)
        if not file.is_file():
            raise AnalyzeError(f"--weights {weights!r}: no such file")
        # timm's loader: filters the state dict (e.g. original .npz, resized position tables)
        try:
            net = timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": str(file)}, **kwargs)
        except Exception as e:  # noqa: BLE001 - not a weights file, or another model's: any failure of the load
            text = " ".join(str(e).split())[:200] or type(e).__name__
            raise AnalyzeError(f"--weights {weights!r} could not be loaded as {name!r} weights ({type(e).__name__}: "
                               f"{text}); give a .safetensors, .pth or .npz file of this model") from e
    elif pretrained:
        from datamodules.images.hub import offline_mode

        why = _hub_weights_offline()
        try:
            with offline_mode(why is not None):
                net = timm.create_model(name, pretrained=True, **kwargs)
        except Exception as e:  # noqa: BLE001 - offline, any failure means: not in the cache
            if why is None:
                raise
            raise AnalyzeError(
                f"pretrained weights for {name!r} are not in the local cache and the hub cannot be used "
                f"({why}). Download them on a machine with network (they are cached under HF_HOME) or pass "
                f"a local file with --weights FILE. Underlying error: {type(e).__name__}: {e}"
            ) from e
    else:
        net = timm.create_model(name, pretrained=False, **kwargs)
    if not hasattr(net, "blocks") or not hasattr(net, "patch_embed"):
        raise AnalyzeError(f"--timm {name!r} is a {type(net).__name__}, not a VisionTransformer")
    cfg = getattr(net, "pretrained_cfg", {}) or {}
    return Target(
        net=net.to(device).eval(),
        label=label or name,
        origin=name,
        input_mean=list(cfg.get("mean", (0.5, 0.5, 0.5))),
        input_std=list(cfg.get("std", (0.5, 0.5, 0.5))),
    )


# ------------------------------------------------------------------------------------ images


@dataclass
class Images:
    """``inputs`` (N, C, H, W) normalised for the model; ``display`` (N, c, H, W) in [0, 1];
    ``labels`` (N,); ``description``: where they came from."""

    inputs: torch.Tensor
    display: torch.Tensor
    labels: torch.Tensor
    description: str
    class_names: Optional[list[str]] = None


def _adapt_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    if x.shape[1] == channels:
        return x
    if x.shape[1] == 1:
        return x.expand(-1, channels, -1, -1)
    if channels == 1:
        return x.mean(dim=1, keepdim=True)
    raise AnalyzeError(f"cannot feed {x.shape[1]}-channel images to a {channels}-channel model")


def load_images(
    target: Target,
    *,
    source: Optional[str] = None,
    data_dir: Optional[str] = None,
    split: str = "val",
    num_images: int = DEFAULT_NUM_IMAGES,
) -> Images:
    """The first ``num_images`` images of a split, prepared for ``target``'s model."""
    from datamodules.images import ImageDataModule

    if split not in ("val", "test"):
        raise AnalyzeError(f"--split {split!r} is not one of ['val', 'test']")
    hparams = dict(target.data_hparams)
    if source is not None or not hparams:
        source = source or DEFAULT_TIMM_SOURCE
        keep = {k: hparams[k] for k in ("split_seed", "val_fraction", "test_fraction", "cache_dir") if k in hparams}
        hparams = {"source": source, "data_dir": data_dir, **keep,
                   "image_mode": "L" if target.in_chans == 1 else "RGB"}
    elif data_dir is not None:
        hparams["data_dir"] = data_dir
    height, width = target.img_size
    if height != width:
        raise AnalyzeError(f"the model takes {height}x{width} images; only square inputs are supported")
    hparams.update(augment="none", train_samples=None, num_workers=0, image_size=height)
    if target.input_mean is not None:  # timm: the data's own normalisation is undone below
        hparams.update(mean=None, std=None)
    try:
        dm = ImageDataModule(**hparams)
        dm.setup("fit")
    except (ValueError, FileNotFoundError) as e:
        raise AnalyzeError(f"data source {hparams['source']!r}: {e}") from e
    dataset = dm.val_dataset if split == "val" else dm.test_dataset
    used = split
    if dataset is None or len(dataset) == 0:
        dataset, used = dm.test_dataset, "test"
    n = min(num_images, len(dataset))
    images, labels = zip(*(dataset[i] for i in range(n)))
    x, y = torch.stack(images), torch.stack([torch.as_tensor(t) for t in labels])
    mean = torch.tensor(dm.mean).view(1, -1, 1, 1)
    std = torch.tensor(dm.std).view(1, -1, 1, 1)
    display = (x * std + mean).clamp(0, 1)
    if target.input_mean is None:
        inputs = _adapt_channels(x, target.in_chans)
    else:
        m = torch.tensor(target.input_mean[: target.in_chans]).view(1, -1, 1, 1)
        s = torch.tensor(target.input_std[: target.in_chans]).view(1, -1, 1, 1)
        inputs = (_adapt_channels(display, target.in_chans) - m) / s
    description = f"{n} images of {hparams['source']} ({used} split), {height}x{width}"
    return Images(inputs.contiguous(), display, y, description, list(dm.class_names or []) or None)


# ------------------------------------------------------------------------------------ analyses


def _device(net: nn.Module) -> torch.device:
    return next(net.parameters()).device


def run_distance(
    models: Sequence[tuple[Target, Images]],
    out: Path,
    *,
    class_token: str = "drop",
    batch_size: int = 32,
    dpi: int = DEFAULT_DPI,
) -> dict:
    """Mean attention distance of each model; one figure with the models side by side."""
    results: dict[str, Any] = {"class_token": class_token, "models": {}}
    mads, references = {}, {}
    for target, images in models:
        mad = mean_attention_distance(
            target.net, images.inputs.to(_device(target.net)), num_images=len(images.inputs),
            class_token=class_token, batch_size=batch_size,
        )
        layout = token_layout(target.net, images.inputs.shape[-2:])
        label = target.label
        while label in mads:
            label += "'"
        mads[label] = mad
        references[label] = uniform_distance(layout)
        results["models"][label] = {
            "origin": target.origin,
            "kind": net_kind(target.net),
            "images": images.description,
            "num_images": len(images.inputs),
            "grid_size": list(layout.grid_size),
            "pixels_per_token": list(layout.pixels_per_token),
            "num_prefix_tokens": layout.num_prefix_tokens,
            "uniform_attention_distance": references[label],
            "layers": summarize(mad),
        }
    fig = attention_distance_figure(mads, references=references)
    results["figure"] = str(save_figure(fig, out / "attention_distance.png", dpi=dpi))
    atomic_write_json(out / "attention_distance.json", results)
    results["summary"] = "\n\n".join(
        f"{format_summary(mad, label)}\n(uniform attention over the patches: {references[label]:.2f})"
        for label, mad in mads.items()
    )
    return results


def run_rollout(
    target: Target, images: Images, out: Path, *, head_fusion: str = "mean", num_maps: int = 8,
    dpi: int = DEFAULT_DPI,
) -> dict:
    """Rollout maps of the first ``num_maps`` images, overlaid on them."""
    inputs = images.inputs[:num_maps].to(_device(target.net))
    weights = attention_weights(target.net, inputs)
    with torch.no_grad():
        predicted = target.net(inputs).argmax(dim=-1).cpu()
    layout = token_layout(target.net, inputs.shape[-2:])
    maps = rollout_maps(attention_rollout(weights, head_fusion=head_fusion), layout.grid_size,
                        layout.num_prefix_tokens)
    names = images.class_names
    titles = [
        f"{names[int(t)] if names else int(t)} / {int(p)}" for t, p in zip(images.labels[: len(inputs)], predicted)
    ]
    fig = rollout_figure(images.display[: len(inputs)], upsample_maps(maps, inputs.shape[-2:]), titles=titles)
    results = {
        "origin": target.origin,
        "head_fusion": head_fusion,
        "images": images.description,
        "grid_size": list(layout.grid_size),
        "maps": [
            {"index": i, "label": int(images.labels[i]), "predicted": int(predicted[i]),
             "map": [[round(float(v), 5) for v in row] for row in maps[i]]}
            for i in range(len(inputs))
        ],
        "figure": str(save_figure(fig, out / "rollout.png", dpi=dpi)),
    }
    atomic_write_json(out / "rollout.json", results)
    results["summary"] = f"rollout maps of {len(inputs)} images ({head_fusion} over heads): {results['figure']}"
    return results


def run_posemb(target: Target, out: Path, *, dpi: int = DEFAULT_DPI) -> dict:
    """Position-embedding similarity grids, one per table (stem, shared, or per layer)."""
    try:
        sims = position_similarity(target.net)
    except ValueError as e:
        raise AnalyzeError(str(e)) from e
    results: dict[str, Any] = {"origin": target.origin, "tables": {}}
    lines = []
    for name, sim in sims.items():
        stem = "position_similarity" if len(sims) == 1 else f"position_similarity_{name}"
        fig = position_similarity_figure(sim, title=f"{target.label}: position embedding similarity ({name})")
        contrast = row_column_contrast(sim)
        h, w = sim.shape[:2]
        results["tables"][name] = {
            "grid_size": [h, w],
            "row_column_contrast": contrast,
            "similarity": [[round(float(v), 4) for v in row] for row in sim.reshape(h * w, h * w)],
            "figure": str(save_figure(fig, out / f"{stem}.png", dpi=dpi)),
        }
        lines.append(
            f"{name}: mean cosine similarity, same row/column {contrast['same_row_or_column']:.3f}, "
            f"other {contrast['other']:.3f} ({results['tables'][name]['figure']})"
        )
    atomic_write_json(out / "position_similarity.json", results)
    results["summary"] = "\n".join(lines)
    return results


def run_filters(target: Target, out: Path, *, num_components: int = DEFAULT_NUM_COMPONENTS,
                dpi: int = DEFAULT_DPI) -> dict:
    """Principal components of the patch-embedding filters."""
    try:
        filters = patch_filters(target.net)
    except (ValueError, TypeError) as e:
        raise AnalyzeError(str(e)) from e
    pca = filter_pca(filters, num_components)
    fig = filters_figure(pca.components, explained=pca.explained_variance_ratio,
                         title=f"{target.label}: principal components of the patch filters")
    results = {
        "origin": target.origin,
        "filter_shape": list(filters.shape[1:]),
        "num_filters": int(filters.shape[0]),
        "explained_variance_ratio": [float(v) for v in pca.explained_variance_ratio],
        "figure": str(save_figure(fig, out / "patch_filters_pca.png", dpi=dpi)),
    }
    atomic_write_json(out / "patch_filters_pca.json", results)
    top = ", ".join(f"{100 * v:.1f}%" for v in results["explained_variance_ratio"][:5])
    results["summary"] = (f"{len(pca.components)} components of {filters.shape[0]} filters "
                          f"{tuple(filters.shape[1:])}; variance of the first: {top} ({results['figure']})")
    return results


# ------------------------------------------------------------------------------------ command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="repro analyze",
        description="Attention analyses of a checkpoint or a timm ViT: mean attention distance (Fig. 11), "
        "rollout (Fig. 6), position-embedding similarity and patch-filter PCA (Fig. 7).",
        allow_abbrev=False,
    )
    p.add_argument("analysis", choices=COMMANDS)
    p.add_argument("--ckpt", action="append", default=[], help="a checkpoint of ours (repeat for distance)")
    p.add_argument("--timm", action="append", default=[], help="a timm model name, e.g. vit_base_patch16_224")
    p.add_argument("--label", action="append", default=[], help="names of the models, in order (--ckpt first)")
    p.add_argument("--weights", default=None, help="local weights file for --timm (.safetensors, .pth, .npz)")
    p.add_argument("--pretrained", action="store_true", help="the hub's pretrained weights for --timm (network)")
    p.add_argument("--img-size", type=int, default=None, help="input size of the --timm model (default: its own)")
    p.add_argument("--data-source", default=None,
                   help=f"ImageDataModule source (default: the checkpoint's data; {DEFAULT_TIMM_SOURCE} for --timm)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--split", default="val", choices=("val", "test"))
    p.add_argument("--num-images", type=int, default=DEFAULT_NUM_IMAGES)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", default=None, help="output folder (default: <run dir>/analysis or runs/analysis/<timm name>)")
    p.add_argument("--class-token", default="drop", choices=CLASS_TOKEN_MODES)
    p.add_argument("--head-fusion", default="mean", choices=HEAD_FUSIONS)
    p.add_argument("--num-maps", type=int, default=8, help="rollout: how many images")
    p.add_argument("--components", type=int, default=DEFAULT_NUM_COMPONENTS, help="filters: how many components")
    p.add_argument("--device", default="cpu")
    return p


def analyze(args: argparse.Namespace, out: TextIO) -> dict:
    if not args.ckpt and not args.timm:
        raise AnalyzeError("give a model: --ckpt PATH (ours) or --timm NAME")
    if (args.weights or args.pretrained or args.img_size) and not args.timm:
        raise AnalyzeError("--weights, --pretrained and --img-size apply to --timm models")
    if len(args.timm) > 1 and (args.weights or args.pretrained):
        raise AnalyzeError("--weights/--pretrained apply to one --timm model; give one")
    if args.num_images < 1 or args.num_maps < 1 or args.components < 1:
        raise AnalyzeError("--num-images, --num-maps and --components must be positive")
    count = len(args.ckpt) + len(args.timm)
    if count > 1 and args.analysis != "distance":
        raise AnalyzeError(f"{args.analysis} takes one model (only distance compares several); got {count}")
    if args.label and len(args.label) != count:
        raise AnalyzeError(f"{len(args.label)} --label for {count} models")
    labels = list(args.label) or [None] * count
    targets = [load_checkpoint(c, label=labels[i], device=args.device, analysis=args.analysis)
               for i, c in enumerate(args.ckpt)]
    targets += [
        load_timm(name, weights=args.weights, pretrained=args.pretrained, img_size=args.img_size,
                  label=labels[len(args.ckpt) + i], device=args.device)
        for i, name in enumerate(args.timm)
    ]
    out_dir = Path(args.out) if args.out else targets[0].default_out
    target = targets[0]
    if args.analysis in ("distance", "rollout") and args.data_source is None and any(not t.data_hparams for t in targets):
        print(f"no --data-source: using {DEFAULT_TIMM_SOURCE} (offline), resized to the model's input size",
              file=out)

    def images_for(t: Target, n: int) -> Images:
        return load_images(t, source=args.data_source, data_dir=args.data_dir, split=args.split, num_images=n)

    if args.analysis == "distance":
        results = run_distance([(t, images_for(t, args.num_images)) for t in targets], out_dir,
                               class_token=args.class_token, batch_size=args.batch_size)
    elif args.analysis == "rollout":
        results = run_rollout(target, images_for(target, args.num_maps), out_dir,
                              head_fusion=args.head_fusion, num_maps=args.num_maps)
    elif args.analysis == "posemb":
        results = run_posemb(target, out_dir)
    else:
        results = run_filters(target, out_dir, num_components=args.components)
    print(results["summary"], file=out)
    print(f"written to {out_dir}", file=out)
    return results


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        analyze(args, out)
    except AnalyzeError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
