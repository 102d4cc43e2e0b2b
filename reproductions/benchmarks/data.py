"""``bench data``: can the DataModules feed the models? Loader batches/s against training steps/s.

- **Images.** ``datamodules.images.ImageDataModule`` with ``crop_flip`` augmentation (random crop
  with padding + horizontal flip, per sample), on Fashion-MNIST when its idx files are installed
  (``/usr/share/datasets/fashion-mnist``), else on scikit-learn's digits; the data and net keywords
  come from the matching config (``reproductions/vit/configs/fashion_mnist.yaml`` or
  ``digits.yaml``). Its training loader's batches/s against the config's ViT training steps/s on
  batches from the same loader and of the same size.
- **Behaviour.** ``datamodules.behavior.BehaviorDataModule`` on its synthetic source with
  ``reproductions/bst/configs/bst.yaml``'s data keywords (``--behavior-samples`` samples,
  generated in memory) against that config's BST training steps/s (loss as
  ``lightning_modules.ctr.CTRModule``'s: BCE on the logits).

- **Augmentation.** The batched random crop + flip (``datamodules.images.CropFlip``, one gather per
  batch) against the per-image torchvision loop it replaced (``v2.RandomCrop(padding)`` +
  ``v2.RandomHorizontalFlip`` on each uint8 image, then ``torch.stack``), on the same batches:
  the before/after ratio of that optimisation.

Target: loader batches/s >= 2x the model's steps/s (the loader, running in the training
process with ``num_workers`` from the config, then takes at most a third of the step time).
Loader and model alternate over the rounds (``reproductions.benchmarks.common``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from reproductions.benchmarks.common import (
    Report, Table, TrainStep, add_run_args, alternate, bce_with_logits, build, build_seeded, config_net,
    cross_entropy, fmt_rate, fmt_ratio, measure_rate, median, pass_fail, read_config, run_settings, setup_run,
)

NAME = "data"
HELP = "image and behaviour DataModules: loader batches/s vs the model's training steps/s (target >= 2x)"
TARGET = 2.0
IMAGE_CONFIGS = {
    "fashion_mnist": "reproductions/vit/configs/fashion_mnist.yaml",
    "digits": "reproductions/vit/configs/digits.yaml",
}
BEHAVIOR_CONFIG = "reproductions/bst/configs/bst.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=["auto", *IMAGE_CONFIGS], default="auto",
                        help="image source (auto: fashion_mnist if /usr/share/datasets/fashion-mnist exists, else digits)")
    parser.add_argument("--augment", default="crop_flip", help="image augmentation (default crop_flip)")
    parser.add_argument("--data-steps", dest="data_steps", type=int, default=20,
                        help="loader batches per measurement (default 20)")
    parser.add_argument("--behavior-samples", dest="behavior_samples", type=int, default=100_000,
                        help="synthetic behaviour samples to generate (the loader's speed does not depend on it)")
    add_run_args(parser, rounds=3, steps=5, warmup=1, batch_size=None)


class LoaderStep:
    """One call = the next training batch of a DataLoader (a new epoch's iterator when one ends)."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self._it = iter(loader)

    def __call__(self):
        try:
            return next(self._it)
        except StopIteration:
            self._it = iter(self.loader)
            return next(self._it)


def image_source(choice: str) -> str:
    from datamodules.images import FASHION_MNIST_DEBIAN_DIR

    if choice != "auto":
        return choice
    return "fashion_mnist" if Path(FASHION_MNIST_DEBIAN_DIR).is_dir() else "digits"


def image_side(args, device):
    """(DataModule, its loader step, the config's ViT training step on the loader's batches, describe)."""
    source = image_source(args.source)
    config = read_config(IMAGE_CONFIGS[source])
    data_args = dict(config["data"]["init_args"], source=source, augment=args.augment)
    if args.batch_size:
        data_args["batch_size"] = args.batch_size
    start = time.perf_counter()
    dm = build(config["data"]["class_path"], **data_args)
    dm.prepare_data()
    dm.setup("fit")
    setup_s = time.perf_counter() - start
    loader = LoaderStep(dm.train_dataloader())
    batches = [loader(), loader()]
    class_path, net_args = config_net(config)
    model_step = TrainStep(build_seeded(class_path, **net_args), batches, cross_entropy, device=device)
    info = {"config": IMAGE_CONFIGS[source], "source": source, "augment": args.augment,
            "batch_size": dm.per_device_batch_size, "num_workers": dm.num_workers, "setup_seconds": setup_s,
            "train_size": len(dm.train_dataset), "net": class_path, "net_args": net_args}
    return loader, model_step, info


def behavior_side(args, device):
    config = read_config(BEHAVIOR_CONFIG)
    data_args = dict(config["data"]["init_args"], use_cache=False, synthetic_samples=args.behavior_samples)
    if args.batch_size:
        data_args["batch_size"] = args.batch_size
    start = time.perf_counter()
    dm = build(config["data"]["class_path"], **data_args)
    dm.setup("fit")
    setup_s = time.perf_counter() - start
    loader = LoaderStep(dm.train_dataloader())
    batches = [(b, b["label"]) for b in (loader(), loader())]
    class_path, net_args = config_net(config)
    model_step = TrainStep(build_seeded(class_path, **net_args), batches, bce_with_logits, device=device)
    info = {"config": BEHAVIOR_CONFIG, "source": data_args["source"], "samples": args.behavior_samples,
            "batch_size": dm.per_device_batch_size, "num_workers": dm.hparams.num_workers,
            "setup_seconds": setup_s, "net": class_path, "net_args": net_args}
    return loader, model_step, info


def run(args: argparse.Namespace) -> Report:
    device = setup_run(args)
    if args.data_steps < 1:
        raise ValueError(f"--data-steps {args.data_steps} must be >= 1")
    print("[data] setting up the image and behaviour DataModules", flush=True)
    sides = {"images": image_side(args, device), "behaviour": behavior_side(args, device)}
    candidates = {}
    for side, (loader, model_step, _) in sides.items():
        candidates[f"{side} loader"] = (lambda s=loader: measure_rate(s, steps=args.data_steps, warmup=args.warmup,
                                                                       items_per_step=1, device=device))
        candidates[f"{side} model"] = (lambda s=model_step: measure_rate(s, steps=args.steps, warmup=args.warmup,
                                                                          items_per_step=1, device=device))
    rates = alternate(candidates, args.rounds, unit="batches/s")

    table = Table(f"DataModule batches/s against the model's training steps/s ({device.type})",
                  ["data", "model", "batch", "loader batches/s", "samples/s", "model steps/s", "loader x model",
                   f"target >= {TARGET:g}x"])
    verdicts, rows = [], {}
    for side, (_, model_step, info) in sides.items():
        loader_rate, model_rate = median(rates[f"{side} loader"]), median(rates[f"{side} model"])
        r = loader_rate / model_rate
        data_name = (f"ImageDataModule {info['source']} +{info['augment']}" if side == "images"
                     else f"BehaviorDataModule {info['source']}")
        model_name = f"{info['net'].rpartition('.')[2]} ({Path(info['config']).name})"
        table.add(data_name, model_name, info["batch_size"], fmt_rate(loader_rate),
                  fmt_rate(loader_rate * info["batch_size"]), fmt_rate(model_rate), fmt_ratio(r), pass_fail(r, TARGET))
        verdicts.append(f"{pass_fail(r, TARGET)}: {side}: loader {loader_rate:,.1f} batches/s vs {model_name} "
                        f"{model_rate:,.1f} steps/s: {r:.2f}x (target >= {TARGET:g}x)")
        rows[side] = {**info, "loader_batches_per_sec": rates[f"{side} loader"],
                      "model_steps_per_sec": rates[f"{side} model"], "median_loader": loader_rate,
                      "median_model": model_rate, "ratio": r, "target": TARGET, "pass": r >= TARGET}
    table.notes += [
        "loader: next(iter(train_dataloader())) in this process (num_workers from the config: "
        f"images {sides['images'][2]['num_workers']}, behaviour {sides['behaviour'][2]['num_workers']}), "
        "including augmentation and collation; model: forward, loss, backward, AdamW step on the loader's batches.",
        f"median of {args.rounds} alternating rounds ({args.data_steps} loader batches, {args.steps} model steps); "
        f"{torch.get_num_threads()} thread(s). DataModule setup: images "
        f"{sides['images'][2]['setup_seconds']:.1f} s, behaviour {sides['behaviour'][2]['setup_seconds']:.1f} s "
        "(not timed above).",
    ]
    aug_table, aug_row = augmentation_table(sides["images"][2], args)
    verdicts.append(f"augmentation: batched CropFlip {aug_row['ratio']:.1f}x the per-image torchvision loop it replaced")
    result = {"settings": run_settings(args, device), **rows, "augmentation": aug_row}
    return Report(NAME, result, [table, aug_table], verdicts)


def augmentation_table(info: dict, args: argparse.Namespace) -> tuple[Table, dict]:
    """Images/s of the batched CropFlip against the per-image torchvision crop + flip (before)."""
    from torchvision.transforms import v2

    from datamodules.images import CropFlip

    torch.manual_seed(0)
    shape = (info["batch_size"], 1, 28, 28) if info["source"] == "fashion_mnist" else (info["batch_size"], 1, 8, 8)
    images = torch.randint(0, 256, shape, dtype=torch.uint8)
    h, w = shape[-2:]
    pad_h, pad_w = max(1, h // 8), max(1, w // 8)
    batched = CropFlip(h, w, pad_h=pad_h, pad_w=pad_w)
    per_image = v2.Compose([v2.RandomCrop((h, w), padding=[pad_w, pad_h]), v2.RandomHorizontalFlip()])
    n = shape[0]
    steps = max(5, args.data_steps)
    rates = alternate({
        "per-image torchvision (before)": lambda: measure_rate(lambda: torch.stack([per_image(x) for x in images]),
                                                               steps=steps, warmup=1, items_per_step=n, device=torch.device("cpu")),
        "batched CropFlip (after)": lambda: measure_rate(lambda: batched(images), steps=steps, warmup=1,
                                                         items_per_step=n, device=torch.device("cpu")),
    }, args.rounds, unit="images/s")  # fmt: skip
    before, after = median(rates["per-image torchvision (before)"]), median(rates["batched CropFlip (after)"])
    table = Table(f"Augmentation: random crop (padding {pad_h}) + flip of uint8 {h}x{w} batches of {n}",
                  ["implementation", "images/s", "x before"])
    table.add("per-image torchvision loop (before)", fmt_rate(before), fmt_ratio(1.0))
    table.add("batched CropFlip (after)", fmt_rate(after), fmt_ratio(after / before))
    table.notes.append(f"median of {args.rounds} alternating rounds x {steps} batches; {torch.get_num_threads()} thread(s)")
    return table, {"before_images_per_sec": rates["per-image torchvision (before)"],
                   "after_images_per_sec": rates["batched CropFlip (after)"], "ratio": after / before}
