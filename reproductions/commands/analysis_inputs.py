"""What ``repro analyze`` and the attention notebook analyse: the model (``Target``: a
checkpoint of this repository, a timm ViT, or the shipped demo checkpoint; ``load_target``,
``load_checkpoint_net``, ``load_timm``) and its images (``Images``, ``load_images``), with
``AnalyzeError`` for every way an input can be wrong. The analyses themselves and the command
are ``reproductions.commands.analyze``.
"""


from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from analysis.distance import DEFAULT_NUM_IMAGES

COMMANDS = ("distance", "rollout", "posemb", "filters")
DEFAULT_TIMM_SOURCE = "digits"
DEFAULT_OUT_ROOT = Path("runs") / "analysis"
DEFAULT_DPI = 120  # of the PNG figures (the notebook draws smaller ones)
#: the small trained ViT shipped with the repository, and the data it was trained on
DEMO_CKPT = Path(__file__).resolve().parents[1] / "vit" / "demo" / "fmnist_vit_p4.ckpt"
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


def load_checkpoint_net(path: str | os.PathLike, *, label: Optional[str] = None, device: str = "cpu",
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
        return str(path.relative_to(Path(__file__).resolve().parents[2]))
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
        return load_checkpoint_net(ckpt, device=device)
    if timm_name:
        return load_timm(timm_name, weights=weights, img_size=img_size, device=device)
    if not DEMO_CKPT.is_file():
        raise AnalyzeError(f"the shipped checkpoint {_repo_relative(DEMO_CKPT)} is missing; give a checkpoint or a "
                           "timm model name")
    return load_checkpoint_net(DEMO_CKPT, device=device)


def _hub_weights_offline() -> Optional[str]:
    """Why the hub cannot give weights now (None if it can): the offline switches, or a
    connection probe to the endpoint that fails within seconds."""
    import huggingface_hub.constants

    from datamodules.images.hub import HUB_PROBE_TIMEOUT_S, TRUE_VALUES
    from utils.net import connection_problem

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(var)
        if value and value.strip().upper() in TRUE_VALUES:
            return f"{var}={value}"
    endpoint = huggingface_hub.constants.ENDPOINT
    problem = connection_problem(endpoint, HUB_PROBE_TIMEOUT_S)
    if problem is not None:
        return f"{endpoint} is unreachable ({problem})"
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
