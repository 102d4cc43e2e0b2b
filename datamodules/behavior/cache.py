"""The on-disk cache of preprocessed splits (HF ``datasets``), keyed by what produced them.

An entry is a folder ``<cache root>/<source>-<key>`` holding ``splits/`` (a ``DatasetDict``
saved with ``save_to_disk``: one ``Dataset`` per split, fixed-length list columns for the
sequences) and ``meta.json`` (feature sizes, split counts, the synthetic ceiling, ...).

- The root is ``cache_dir``, else ``$BEHAVIOR_CACHE_DIR``, else ``~/.cache/bst_behavior``
  (:func:`behavior_cache_root`).
- The key (:func:`entry_key`) hashes ``CACHE_VERSION``, every preprocessing parameter and the
  source files' names, sizes and modification times: another parameter or a changed file is
  another entry; batch sizes, workers and paths are not part of it.
- An entry is written whole to a temporary sibling and renamed into place
  (``utils.atomic.atomic_directory``), so a reader never sees half an entry, and a second run
  (or another process) loads it instead of preprocessing; ``meta.json`` is written last and
  marks an entry complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from datamodules.behavior.splits import SPLITS
from utils.atomic import atomic_directory, atomic_write_json

#: bump when the stored layout or the meaning of a column changes (old entries are then ignored)
CACHE_VERSION = 1

#: columns stored as int32 (ids and buckets); ``label``/``click_prob`` are float32, the rest int64
INT32_COLUMNS = ("user", "user_features", "target_item", "target_category", "hist_items", "hist_categories",
                 "hist_positions")
FLOAT32_COLUMNS = ("label", "click_prob")


def behavior_cache_root(cache_dir: str | os.PathLike | None) -> Path:
    """``cache_dir``, else ``$BEHAVIOR_CACHE_DIR``, else ``~/.cache/bst_behavior``."""
    root = cache_dir or os.environ.get("BEHAVIOR_CACHE_DIR") or "~/.cache/bst_behavior"
    return Path(root).expanduser()


def file_stats(folder: Path, names: Iterable[str]) -> list:
    """``[name, size, mtime_ns]`` of each raw file: what the key tracks of the data."""
    return [(name, (folder / name).stat().st_size, (folder / name).stat().st_mtime_ns) for name in names]


def entry_key(params: dict, files: list) -> str:
    """16 hex digits of the SHA-256 of the cache version, the preprocessing parameters and the file stats."""
    blob = json.dumps({"version": CACHE_VERSION, "params": params, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def is_complete(path: Path) -> bool:
    """An entry is complete once its ``meta.json`` is there (written last)."""
    return (path / "meta.json").is_file()


def to_hf_splits(columns: dict[str, np.ndarray], split: np.ndarray):
    """Numpy columns and split codes -> a DatasetDict with one Dataset per split (fixed-length list columns)."""
    import pyarrow as pa
    from datasets import Dataset, DatasetDict

    out = {}
    for code, name in enumerate(SPLITS):
        m = split == code
        arrays = {}
        for key, values in columns.items():
            v = values[m]
            if key in INT32_COLUMNS:
                v = v.astype(np.int32)
            elif key in FLOAT32_COLUMNS:
                v = v.astype(np.float32)
            else:
                v = v.astype(np.int64)
            if v.ndim == 2:
                if v.shape[1] == 0:
                    continue
                arrays[key] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
            else:
                arrays[key] = pa.array(v)
        out[name] = Dataset(pa.table(arrays))
    return DatasetDict(out)


def split_columns(dataset, names: Iterable[str], n_profile: int) -> dict[str, np.ndarray]:
    """Columns of an HF dataset as writable in-memory numpy arrays (2-D for fixed-length lists).

    A source without a profile stores no ``user_features``: asked for, it comes back (N, n_profile) zeros.
    """
    import pyarrow as pa

    table = dataset.data
    n = dataset.num_rows
    out = {}
    for name in names:
        if name not in table.column_names:
            if name == "user_features":
                out[name] = np.zeros((n, n_profile), dtype=np.int32)
                continue
            raise KeyError(f"column {name!r} missing from the cached data")
        column = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            width = column.type.list_size
            values = column.flatten().to_numpy(zero_copy_only=False).reshape(n, width)
        else:
            values = column.to_numpy(zero_copy_only=False)
        out[name] = np.array(values)  # a writable in-memory copy (the cache is memory-mapped)
    return out


def save_entry(path: Path, splits, meta: dict) -> None:
    """Write the splits and ``meta.json`` (strict JSON: NaN becomes null) as the entry ``path``,
    atomically; a complete entry written meanwhile by another process wins."""
    with atomic_directory(path, complete=is_complete) as tmp:
        with _datasets_progress_bars_off():
            splits.save_to_disk(str(tmp / "splits"), **_shards_for_empty_splits(splits))
        atomic_write_json(tmp / "meta.json", meta, indent=1)


def _shards_for_empty_splits(splits) -> dict:
    """``save_to_disk`` options that give an empty split (a tiny file, a strict history rule) one
    empty shard: by default datasets writes none for it, and then cannot load the entry back."""
    from datasets import DatasetDict

    if not isinstance(splits, DatasetDict):
        return {}
    empty = {name: 1 for name, dataset in splits.items() if dataset.num_rows == 0}
    return {"num_shards": empty} if empty else {}


def load_entry(path: Path):
    """(the DatasetDict of splits, memory-mapped; the meta dict) of a complete entry."""
    from datasets import load_from_disk

    meta = json.loads((path / "meta.json").read_text())
    splits = load_from_disk(str(path / "splits"))
    return splits, meta


@contextlib.contextmanager
def _datasets_progress_bars_off() -> Iterator[None]:
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()
