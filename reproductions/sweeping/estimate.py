"""How long a sweep profile's runs take on one GPU, from their counted FLOPs and a measured reference.

The reference is the GPU check's measured training rate of ViT-B/16 at 224 px in bf16 on one H200 (2,535
images/s at 35.1 GFLOPs forward per image, counted by ``torch.utils.flop_counter``:
docs/benchmarks.md); a run's model trains at the same FLOPs per second, scaled by its own FLOPs per image,
except that no training step is assumed faster than ``STEP_FLOOR_S`` (kernel launches and Lightning's
per-step work bound small models at 32 px, not arithmetic; an assumption until a campaign measures it).
Each run adds ``RUN_OVERHEAD_S`` (process start, imports, CUDA context, the data opened and copied to the
GPU, checkpoints, test, attention analysis: the GPU check's short runs spent about 25 s so) and each
validation pass ``VAL_PASS_S`` besides its images.

A run's configuration is resolved as the runs resolve it, closely enough for the count: its base config,
the profile's overlay configs, then the sweep's, profile's and variant's overrides (dotted keys; ``model.net``
is ``model.init_args.net``). ``estimate_profile`` gives one ``RunEstimate`` per run; ``repro``'s runs then
record the measured ``samples_per_sec`` and ``fit_time_s`` in results.json to compare with.
"""

from __future__ import annotations

import copy
import importlib
import math
from dataclasses import dataclass
from typing import Any

import yaml

from reproductions.sweeping.plan import Plan, resolve_base, make_plan

#: the measured reference: ViT-B/16 at 224 px, bf16, one H200 (scripts/gpu_check.sh, 2026-12-04)
REFERENCE_IMAGES_PER_S = 2535.0
REFERENCE_FLOPS = 35.1e9
REFERENCE_TRAIN_FLOPS_PER_S = 3 * REFERENCE_FLOPS * REFERENCE_IMAGES_PER_S  # 267 TFLOP/s
STEP_FLOOR_S = 0.008
RUN_OVERHEAD_S = 25.0
VAL_PASS_S = 1.0
#: images in the data set before the splits, by the profile's scale.data
DATA_IMAGES = {"cifar10": 50_000}


@dataclass(frozen=True)
class RunEstimate:
    label: str
    flops: int  # forward FLOPs per image
    steps: int
    batch_size: int
    images_per_s: float  # training
    train_s: float
    eval_s: float
    total_s: float  # with RUN_OVERHEAD_S
    flops_only_train_s: float  # the training at the reference's FLOPs per second, no step floor


def _merge(into: dict, other: dict) -> dict:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def _set(config: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if parts[0] in ("model", "data") and len(parts) > 1 and parts[1] not in ("init_args", "class_path"):
        parts.insert(1, "init_args")
    node = config
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def resolved_config(plan: Plan, run) -> dict:
    """The run's config: base, overlays, then the overrides (the extra command-line words are not read)."""
    base = resolve_base(plan.sweep, run.variant.base) if run.variant.base else plan.base
    config: dict = yaml.safe_load(base.read_text()) or {}
    for overlay in plan.profile.configs:
        _merge(config, yaml.safe_load(resolve_base(plan.sweep, overlay).read_text()) or {})
    for key, value in {**plan.sweep.overrides, **plan.profile.overrides, **run.variant.overrides}.items():
        _set(config, key, value)
    return config


def net_flops(config: dict) -> int:
    """Forward FLOPs per image of the config's net (built on the CPU, counted on one zero image)."""
    import torch

    from lightning_modules.model_stats import count_flops

    spec = config["model"]["init_args"]["net"]
    module, _, name = spec["class_path"].rpartition(".")
    args = dict(spec.get("init_args") or {})
    net = getattr(importlib.import_module(module), name)(**args).eval()
    size = int(args.get("img_size", 32))
    return int(count_flops(net, torch.zeros(1, int(args.get("in_chans", 3)), size, size)))


def estimate_run(label: str, config: dict, flops: int, data_images: int) -> RunEstimate:
    data = config["data"]["init_args"]
    trainer = config.get("trainer") or {}
    test = round(data.get("test_fraction", 0.2) * data_images)
    val = round(data.get("val_fraction", 0.1) * (data_images - test))
    train = int(data.get("train_samples") or data_images - test - val)
    batch = int(data.get("batch_size", 128))
    per_epoch = train // batch if train >= 2 * batch else math.ceil(train / batch)
    max_steps = int(trainer.get("max_steps") or -1)
    if max_steps > 0:
        steps = max_steps
        interval = trainer.get("val_check_interval")
        passes = steps // int(interval) if isinstance(interval, int) and interval > 0 else math.ceil(steps / per_epoch)
    else:
        epochs = int(trainer.get("max_epochs") or 1)
        steps = epochs * per_epoch
        every = trainer.get("check_val_every_n_epoch", 1)
        passes = epochs // int(every) if every else 0
    step_s = max(STEP_FLOOR_S, 3 * flops * batch / REFERENCE_TRAIN_FLOPS_PER_S)
    train_s = steps * step_s
    eval_s = passes * (VAL_PASS_S + val * flops / (REFERENCE_TRAIN_FLOPS_PER_S / 3)) + test * flops / (
        REFERENCE_TRAIN_FLOPS_PER_S / 3)
    return RunEstimate(label, flops, steps, batch, batch / step_s, train_s, eval_s, train_s + eval_s + RUN_OVERHEAD_S,
                       steps * 3 * flops * batch / REFERENCE_TRAIN_FLOPS_PER_S)


def estimate_profile(sweep: str, profile: str, data_images: int | None = None) -> list[RunEstimate]:
    """One estimate per run of ``sweep`` at ``profile`` (its default seeds)."""
    plan = make_plan(sweep, profile)
    if data_images is None:
        data = plan.profile.scale.data if plan.profile.scale else None
        if data not in DATA_IMAGES:
            raise ValueError(f"{plan.sweep.id} --profile {profile}: no image count known for data {data!r}; "
                             f"give data_images (known: {sorted(DATA_IMAGES)})")
        data_images = DATA_IMAGES[data]
    flops: dict[str, int] = {}
    out = []
    for run in plan.runs:
        config = resolved_config(plan, run)
        if run.variant.name not in flops:
            flops[run.variant.name] = net_flops(config)
        out.append(estimate_run(run.label, config, flops[run.variant.name], data_images))
    return out
