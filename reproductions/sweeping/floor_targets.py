"""Which pixel floors the sweeps need, and computing them into the registry (``repro registry floors``).

``floor_targets(sweeps, profiles)`` resolves every variant of every image sweep profile (the config each run
would get, ``reuse.resolve_config``, without running anything) and keeps each distinct data setting (source,
folder, ``train_samples``, split settings, image size) once, with the profiles that use it. ``compute`` builds
that ``ImageDataModule`` (in memory, on the CPU), computes the floor of its training subset
(``datamodules.images.floor.datamodule_floor``: C chosen on validation, cached beside the prepared data) and
records it in ``results/floors/<dataset>.json`` (``reproductions.sweeping.floors``). A target whose floor the
registry holds already (same grid) is skipped unless ``recompute``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reproductions.sweeping.floors import FLOORS_DIR, dataset_name, read_floors, record_floor, size_key
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.records import is_smoke
from reproductions.sweeping.reuse import load_config, resolve_config
from reproductions.sweeping.spec import load_sweep, profiles_by_sweep

IMAGE_DATA = "datamodules.images.ImageDataModule"
#: the data settings that decide a floor (the rest, batch sizes, augmentation, loaders, do not)
FLOOR_KEYS = ("source", "data_dir", "prepared", "train_samples", "val_fraction", "test_fraction", "split_seed",
              "image_size", "image_mode", "image_column", "label_column", "cache_dir", "skip_bad_images")  # fmt: skip


@dataclass
class FloorTarget:
    """One data setting whose floor the sweeps need, and the profiles (``sweep:profile``) that use it."""

    settings: dict[str, Any]
    where: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        s = self.settings
        where = s.get("data_dir") or s.get("prepared")
        return (f"{s['source']}" + (f" ({where})" if where else "")
                + f", train_samples={s.get('train_samples')}")  # fmt: skip


def floor_targets(sweeps: Sequence[str] | None = None, profiles: Sequence[str] | None = None, *,
                  smoke: bool = False, extra: dict[str, Any] | None = None) -> list[FloorTarget]:  # fmt: skip
    """The distinct image data settings of the sweeps' profiles (every sweep of the repository when ``sweeps``
    is None; every profile but ``smoke`` when ``profiles`` is None), ``extra`` settings applied to each."""
    found: dict[tuple, FloorTarget] = {}
    for sweep_ref in sweeps or list(profiles_by_sweep()):
        sweep = load_sweep(sweep_ref)
        for name in profiles or list(sweep.profiles):
            if name not in sweep.profiles or (is_smoke(name) and not smoke and not profiles):
                continue
            plan = make_plan(sweep, name, seeds=None)
            for variant in plan.variants:
                run = next(r for r in plan.runs if r.variant.name == variant.name)
                data = (load_config(resolve_config(run.args)) or {}).get("data") or {}
                if data.get("class_path") != IMAGE_DATA:
                    break  # not image data: no floor for this profile
                settings = {k: v for k, v in (data.get("init_args") or {}).items() if k in FLOOR_KEYS}
                settings.update(extra or {})
                key = tuple(sorted((k, repr(v)) for k, v in settings.items()))
                target = found.setdefault(key, FloorTarget(settings))
                where = f"{sweep.id}:{name}"
                if where not in target.where:
                    target.where.append(where)
    return list(found.values())


def recorded(target: FloorTarget, dataset: str, grid: Sequence[float], floors_dir: os.PathLike) -> bool:
    """Whether the registry holds this target's floor, computed with ``grid``."""
    data = read_floors(dataset, floors_dir)
    if data is None or [float(c) for c in data.get("grid") or []] != [float(c) for c in grid]:
        return False
    entry = data["by_train_samples"].get(size_key(target.settings.get("train_samples")))
    if entry is None:
        return False
    return all(entry.get(k) == target.settings.get(k) for k in ("split_seed", "val_fraction", "test_fraction")
               if k in target.settings)  # fmt: skip


def guess_dataset(settings: dict[str, Any]) -> str | None:
    """The data set's floor name from the settings alone (no data read): None for a folder without a
    ``data_dir`` or a prepared directory."""
    source = settings.get("source")
    if source == "folder":
        where = settings.get("data_dir") or settings.get("prepared")
        return dataset_name({"source": "folder", "origin": str(where), "input_shape": []}) if where else None
    return dataset_name({"source": source, "input_shape": []})


def build_datamodule(settings: dict[str, Any]):
    """The target's ``ImageDataModule``, prepared and set up, in memory, on the CPU, without loader workers."""
    from datamodules.images import ImageDataModule

    dm = ImageDataModule(**{**settings, "in_memory": True, "on_device": False, "num_workers": 0})
    dm.prepare_data()
    dm.setup("fit")
    return dm


def compute(target: FloorTarget, dm: Any, *, grid: Sequence[float], recompute: bool = False, command: str,
            floors_dir: os.PathLike = FLOORS_DIR) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """Compute (or read from the cache) the floor of the target's data module ``dm`` (``build_datamodule``)
    and record it: (data set, result)."""
    from datamodules.images.floor import datamodule_floor

    dataset = dataset_name(dm.describe())
    result = datamodule_floor(dm, grid=grid, recompute=recompute)
    record_floor(dataset, target.settings.get("train_samples"), result, command=command, floors_dir=floors_dir)
    return dataset, result
