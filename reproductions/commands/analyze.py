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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

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

from reproductions.commands.analysis_inputs import (  # noqa: F401 - load_target: the notebook imports it from here
    COMMANDS, DEFAULT_DPI, DEFAULT_TIMM_SOURCE, AnalyzeError, Images, Target, load_checkpoint_net, load_images,
    load_target, load_timm, net_kind,
)


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
    targets = [load_checkpoint_net(c, label=labels[i], device=args.device, analysis=args.analysis)
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
