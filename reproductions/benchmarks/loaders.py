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
- **224 px JPEG decoding.** ImageNet-like JPEGs (``--jpeg-size``, default 375x500, the most common
  ImageNet size; quality 90; cut from scikit-learn's two sample photographs) decoded and given the
  DeiT training augmentation at 224 px (RandomResizedCrop + flip, RandAugment rand-m9-mstd0.5-inc1,
  normalisation, random erasing 0.25), one image at a time on one thread, as a loader worker does:
  Pillow + timm's own PIL pipeline (``timm.data.create_transform``) against the DataModule's
  per-sample path with each decoder (``torchvision.io.decode_jpeg``, libjpeg-turbo into a tensor;
  Pillow), and decoding alone. Images per second of CPU time = per worker core; from it the loader
  workers one GPU training ViT-B/16 at 224 in bf16 needs (``--gpu-images-per-sec``, see
  ``GPU_IMAGES_PER_SEC``), and the two decoders' pixel difference on these files.

- **Images held on the device.** CIFAR-shaped data (``--resident-images`` generated uint8 3x32x32 images,
  crop (4 px padding) + flip, batch ``--batch-size``, default 512): the ordinary training loader (the
  ``ResumableLoader`` over ``InMemoryImages``, ``--resident-workers`` workers, each batch then copied to
  ``--device``, pinned on a GPU) against the device-resident one (``ImageDataModule(on_device=True)``:
  ``ResumableDeviceLoader``, each batch indexed, augmented and normalised on ``--device``); images/s of a
  batch ready on the device (the device synchronised after the timed batches). ``--resident-only`` runs only
  this case: ``repro bench data --resident-only --device cuda --resident-workers 8`` on a GPU.

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
    BenchReport, Table, TrainStep, add_run_args, alternate, bce_with_logits, build, build_seeded, config_net,
    cross_entropy, fmt_rate, fmt_ratio, measure_rate, measure_rates, median, pass_fail, read_config, run_settings, setup_run,
)

NAME = "data"
HELP = "image and behaviour DataModules: loader batches/s vs the model's training steps/s (target >= 2x)"
TARGET = 2.0
IMAGE_CONFIGS = {
    "fashion_mnist": "reproductions/vit/configs/fashion_mnist.yaml",
    "digits": "reproductions/vit/configs/digits.yaml",
}
BEHAVIOR_CONFIG = "reproductions/bst/configs/bst.yaml"
GPU_IMAGES_PER_SEC = {
    "RTX 3090": (391.0, "published: timm results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv, "
                 "vit_base_patch16_224 AMP training, 390.9 images/s"),
    "A100 (assumed)": (1200.0, "assumed: ~40% MFU of 312 TFLOP/s bf16 at 3 x 35.2 GFLOPs per image"),
    "H100 (assumed)": (3000.0, "assumed: ~30% MFU of 989 TFLOP/s bf16 at 3 x 35.2 GFLOPs per image; "
                       "measure yours with `bench gpu`"),
}
"""ViT-B/16 training images/s at 224 px on one GPU that the worker counts are computed for."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=["auto", *IMAGE_CONFIGS], default="auto",
                        help="image source (auto: fashion_mnist if /usr/share/datasets/fashion-mnist exists, else digits)")
    parser.add_argument("--augment", default="crop_flip", help="image augmentation (default crop_flip)")
    parser.add_argument("--data-steps", dest="data_steps", type=int, default=20,
                        help="loader batches per measurement (default 20)")
    parser.add_argument("--behavior-samples", dest="behavior_samples", type=int, default=100_000,
                        help="synthetic behaviour samples to generate (the loader's speed does not depend on it)")
    parser.add_argument("--jpeg-size", dest="jpeg_size", default="375x500",
                        help="HxW of the generated JPEGs of the 224 px decoding case (default 375x500)")
    parser.add_argument("--jpeg-images", dest="jpeg_images", type=int, default=24,
                        help="distinct JPEGs decoded per measurement (default 24)")
    parser.add_argument("--gpu-images-per-sec", dest="gpu_images_per_sec", type=float, default=None,
                        help="also compute the workers for this ViT-B/16 training rate (images/s on your GPU)")
    parser.add_argument("--resident-images", dest="resident_images", type=int, default=45_000,
                        help="generated CIFAR-shaped images of the device-resident case (default 45,000)")
    parser.add_argument("--resident-workers", dest="resident_workers", type=int, default=0,
                        help="loader workers of the ordinary loader in that case (default 0: in this process)")
    parser.add_argument("--resident-only", dest="resident_only", action="store_true",
                        help="run only the device-resident case (the ordinary loader against on_device=True)")
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


def run(args: argparse.Namespace) -> BenchReport:
    device = setup_run(args)
    if args.data_steps < 1:
        raise ValueError(f"--data-steps {args.data_steps} must be >= 1")
    if args.resident_images < 2 * (args.batch_size or RESIDENT_BATCH) or args.resident_workers < 0:
        raise ValueError(f"--resident-images {args.resident_images} must hold at least two batches and "
                         f"--resident-workers {args.resident_workers} must be >= 0")
    if args.resident_only:
        table, row = resident_table(args, device)
        return BenchReport(NAME, {"settings": run_settings(args, device), "resident": row}, [table], [row["verdict"]])
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
    jpeg_tables, jpeg_row = jpeg_case(args)
    verdicts.append(jpeg_row["verdict"])
    resident, resident_row = resident_table(args, device)
    verdicts.append(resident_row["verdict"])
    result = {"settings": run_settings(args, device), **rows, "augmentation": aug_row, "jpeg224": jpeg_row,
              "resident": resident_row}
    return BenchReport(NAME, result, [table, aug_table, *jpeg_tables, resident], verdicts)


RESIDENT_BATCH = 512


def resident_table(args: argparse.Namespace, device: torch.device) -> tuple[Table, dict]:
    """Images/s of a training batch ready on ``device``: the ordinary loader (+ the copy) against the
    device-resident one, on generated CIFAR-shaped data with crop (padding 4) + flip."""
    from datamodules.images.augment import build_augment
    from datamodules.images.device_loader import ResumableDeviceLoader
    from datamodules.images.torch_datasets import InMemoryImages
    from datamodules.sampler import ResumableLoader, ResumableSampler

    n, batch = args.resident_images, args.batch_size or RESIDENT_BATCH
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    mean, std = [0.49, 0.48, 0.45], [0.25, 0.24, 0.26]
    data = InMemoryImages(images, labels, torch.arange(n), mean, std, build_augment("crop_flip", 32, 32))
    workers, pin = args.resident_workers, device.type == "cuda"
    ordinary = LoaderStep(ResumableLoader(data, batch_size=batch, sampler=ResumableSampler(data), drop_last=True,
                                          num_workers=workers, pin_memory=pin, persistent_workers=workers > 0))
    resident = LoaderStep(ResumableDeviceLoader(data.to(device), batch_size=batch, sampler=ResumableSampler(data),
                                                drop_last=True, num_workers=0))

    def ordinary_on_device():
        x, y = ordinary()
        return x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)

    steps = max(5, args.data_steps)
    names = {"ordinary": f"ordinary loader ({workers} workers) + copy to {device.type}",
             "resident": f"on_device=True ({device.type})"}
    rates = alternate({
        names["ordinary"]: lambda: measure_rate(ordinary_on_device, steps=steps, warmup=2, items_per_step=batch,
                                                device=device),
        names["resident"]: lambda: measure_rate(resident, steps=steps, warmup=2, items_per_step=batch, device=device),
    }, args.rounds, unit="images/s")  # fmt: skip
    before, after = median(rates[names["ordinary"]]), median(rates[names["resident"]])
    table = Table(f"Images held on the device: training batches of {batch} CIFAR-shaped 3x32x32 images "
                  f"(crop 4 px + flip), {n:,} images", ["loader", "images/s", "x ordinary"])
    table.add(names["ordinary"], fmt_rate(before), fmt_ratio(1.0))
    table.add(names["resident"], fmt_rate(after), fmt_ratio(after / before))
    table.notes.append(f"median of {args.rounds} alternating rounds x {steps} batches, each ready on {device} "
                       f"(synchronised); {torch.get_num_threads()} thread(s)")
    verdict = (f"images on the device: {after:,.0f} images/s against the ordinary loader's {before:,.0f} "
               f"({after / before:.2f}x, {device.type}, batch {batch})")
    return table, {"ordinary_images_per_sec": rates[names["ordinary"]],
                   "resident_images_per_sec": rates[names["resident"]], "ratio": after / before, "batch_size": batch,
                   "images": n, "workers": workers, "device": str(device), "verdict": verdict}


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


# ------------------------------------------------------------------------------------------------ 224 px JPEG


def imagenet_like_jpegs(n: int, height: int, width: int, quality: int = 90) -> list[bytes]:
    """``n`` JPEGs of ``height`` x ``width`` cut (and scaled) from scikit-learn's two sample photographs."""
    import io

    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images  # two 427 x 640 RGB photographs, shipped with scikit-learn
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        photo = Image.fromarray(photos[k % len(photos)])
        scale = max(height / photo.height, width / photo.width) * rng.uniform(1.0, 1.3)
        photo = photo.resize((max(width, round(photo.width * scale)), max(height, round(photo.height * scale))),
                             Image.BICUBIC)  # fmt: skip
        top, left = rng.integers(0, photo.height - height + 1), rng.integers(0, photo.width - width + 1)
        buffer = io.BytesIO()
        photo.crop((left, top, left + width, top + height)).save(buffer, format="JPEG", quality=quality)
        out.append(buffer.getvalue())
    return out


def jpeg_pipelines(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> dict:
    """name -> (one image's bytes -> the training tensor), all at 224 px with DeiT's augmentation."""
    import io

    from PIL import Image
    from timm.data import create_transform

    from datamodules.images.decode import decode_bytes
    from datamodules.images.transforms import PolicyOnTensor, RandomResizedCropFlip, random_erasing, timm_policy

    timm_train = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
                                  interpolation="bicubic", re_prob=0.25, re_mode="pixel", mean=mean, std=std)  # fmt: skip
    fixed = timm_policy("rand-m9-mstd0.5-inc1", 224, mean)  # Pillow 13 refuses timm's 0-bit posterize:
    for t in timm_train.transforms:  # the DataModule's fix, in timm's pipeline too
        if type(t).__name__ == "RandAugment":
            t.ops = fixed.ops
    crop = RandomResizedCropFlip(224, interpolation="bicubic",
                                 policy=PolicyOnTensor(timm_policy("rand-m9-mstd0.5-inc1", 224, mean)))  # fmt: skip
    erase = random_erasing(0.25)
    m = torch.tensor(mean).view(3, 1, 1)
    s = torch.tensor(std).view(3, 1, 1)
    scale, shift = 1.0 / (255.0 * s), m / s

    def ours(decoder):
        def run(data: bytes) -> torch.Tensor:
            x = crop(decode_bytes(data, "RGB", decoder)).to(torch.float32).mul_(scale).sub_(shift)
            return erase(x)

        return run

    def timm_pil(data: bytes) -> torch.Tensor:
        with Image.open(io.BytesIO(data)) as image:
            return timm_train(image.convert("RGB"))

    return {
        "torchvision decode_jpeg + DataModule augmentation (default)": ours("torchvision"),
        "Pillow + DataModule augmentation": ours("pil"),
        "Pillow + timm create_transform (PIL pipeline)": timm_pil,
        "decode only: torchvision decode_jpeg": lambda data: decode_bytes(data, "RGB", "torchvision"),
        "decode only: Pillow": lambda data: decode_bytes(data, "RGB", "pil"),
    }


def jpeg_case(args: argparse.Namespace) -> tuple[list[Table], dict]:
    """Decode + DeiT train augmentation of 224 px crops from ImageNet-like JPEGs, per core; workers per GPU."""
    import math

    from datamodules.images.decode import decode_bytes

    height, width = (int(v) for v in args.jpeg_size.lower().split("x"))
    blobs = imagenet_like_jpegs(max(2, args.jpeg_images), height, width)
    pipelines = jpeg_pipelines()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a loader worker runs one thread
    cpu_rates: dict[str, list[float]] = {name: [] for name in pipelines}
    steps = max(1, args.data_steps // 4)

    def candidate(name):
        fn = pipelines[name]

        def measure() -> float:
            def step():
                for data in blobs:
                    fn(data)

            wall, cpu = measure_rates(step, steps=steps, warmup=1, items_per_step=len(blobs), device=torch.device("cpu"))
            cpu_rates[name].append(cpu)
            return wall

        return measure

    try:
        torch.manual_seed(0)
        wall_rates = alternate({name: candidate(name) for name in pipelines}, args.rounds, unit="images/s")
    finally:
        torch.set_num_threads(threads)
    diffs = [(decode_bytes(b, "RGB", "torchvision").int() - decode_bytes(b, "RGB", "pil").int()).abs() for b in blobs]
    mean_diff = sum(d.float().mean().item() for d in diffs) / len(diffs)
    max_diff = max(int(d.max()) for d in diffs)

    kb = sum(len(b) for b in blobs) / len(blobs) / 1000
    table = Table(f"224 px training images from {height}x{width} JPEGs (mean {kb:.0f} kB, quality 90): "
                  "decode + DeiT augmentation, one thread", ["pipeline", "images/s (wall)",
                  "images/s per core (CPU time)", "x Pillow + timm"])  # fmt: skip
    ref = "Pillow + timm create_transform (PIL pipeline)"
    per_core = {name: median(cpu_rates[name]) for name in pipelines}
    for name in pipelines:
        table.add(name, fmt_rate(median(wall_rates[name])), fmt_rate(per_core[name]),
                  fmt_ratio(per_core[name] / per_core[ref]) if "decode only" not in name else "-")  # fmt: skip
    table.notes += [
        f"median of {args.rounds} alternating rounds x {steps} passes over {len(blobs)} JPEGs; per core = images per "
        "second of this process's CPU time (steady on a shared machine). DeiT augmentation: RandomResizedCrop "
        "(bicubic) + flip, RandAugment rand-m9-mstd0.5-inc1, normalisation, random erasing 0.25.",
        f"pixels, torchvision against Pillow on these files: mean |diff| {mean_diff:.3f}, max {max_diff} "
        "(both decode with libjpeg-turbo; other builds or settings of the IDCT and chroma upsampling differ by a "
        "few levels: tests/test_images_transforms.py allows a mean of 1).",
        "Batched GPU decoding (torchvision.io.decode_jpeg(list, device='cuda'), nvJPEG) is the option when the "
        "cores cannot keep up; the augmentation would then run on the GPU too.",
    ]
    default = "torchvision decode_jpeg + DataModule augmentation (default)"
    gpus = dict(GPU_IMAGES_PER_SEC)
    if args.gpu_images_per_sec:
        gpus["yours (--gpu-images-per-sec)"] = (float(args.gpu_images_per_sec), "given")
    workers = Table("Loader worker cores one GPU training ViT-B/16 at 224 in bf16 needs",
                    ["GPU", "images/s", "source", "workers (default pipeline)", "workers (Pillow + timm)"])
    need = {}
    for gpu, (rate, source) in gpus.items():
        need[gpu] = {"images_per_sec": rate, "source": source, "workers_default": math.ceil(rate / per_core[default]),
                     "workers_timm_pil": math.ceil(rate / per_core[ref])}  # fmt: skip
        workers.add(gpu, fmt_rate(rate), source, need[gpu]["workers_default"], need[gpu]["workers_timm_pil"])
    workers.notes.append("workers = ceil(GPU images/s / images/s per core); per-core rates measured here, so a "
                         "faster or less loaded CPU needs fewer. Mixup/CutMix (per batch) cost ~1% of this.")
    h100 = need["H100 (assumed)"]
    verdict = (f"jpeg 224: {per_core[default]:,.0f} images/s per core with torchvision decode_jpeg + DeiT augmentation "
               f"({per_core[default] / per_core[ref]:.2f}x Pillow + timm's PIL pipeline, {per_core[ref]:,.0f}); an H100 "
               f"at {h100['images_per_sec']:,.0f} images/s needs {h100['workers_default']} worker cores")  # fmt: skip
    row = {"jpeg_size": [height, width], "mean_kb": kb, "images": len(blobs), "wall_images_per_sec": wall_rates,
           "cpu_images_per_sec": cpu_rates, "per_core_median": per_core, "pixel_mean_abs_diff": mean_diff,
           "pixel_max_abs_diff": max_diff, "workers": need, "default": default, "verdict": verdict}  # fmt: skip
    return [table, workers], row
