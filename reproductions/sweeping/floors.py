"""The pixel floors in the results registry: ``results/floors/<dataset>.json``, read and written.

A floor is the test accuracy of a multinomial logistic regression on the raw pixels of the very training subset
a run trains on, its regularisation chosen on the validation split (``datamodules.images.floor``); a deep model
below it is under-trained, whatever the claim. ``repro registry floors`` computes them for every image sweep
profile (``reproductions.sweeping.floor_targets``) and keeps them here, one file per data set:

    {"dataset": "fashion_mnist", "source": ..., "origin": ..., "test_split": ..., "input_shape": [1, 28, 28],
     "features": ..., "model": ..., "grid": [...], "max_iter": ..., "tol": ...,
     "by_train_samples": {"1000": {"C", "val_acc", "test_acc", "val_by_C", "n_train", "n_val", "n_test",
                                   "seconds", "split_seed", "val_fraction", "test_fraction", ...},
                          "all": {...}},         # "all": the whole training split (train_samples None)
     "hardware": {"cpu": ...}, "versions": {...}, "command": "repro registry floors"}

Readers: ``floor_for(dataset, train_samples)`` (accuracies as fractions), ``run_dataset(results)`` (a run's
data set and training-subset size from its ``results.json`` or record), ``run_floor(results)`` (both, checking
that the run used the floor's split), ``floor_of(variant results)`` and ``floor_label``. Data sets are named by
``dataset_name``: the source (``digits``, ``fashion_mnist``, ``cifar10``), or ``folder-<folder name>`` for an
image folder (``folder-cifar10``).
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reproductions.sweeping.records import FLOORS_DIR_NAME, REGISTRY_DIR, scrub_paths
from utils.atomic import atomic_write_json

FLOORS_DIR = REGISTRY_DIR / FLOORS_DIR_NAME
ALL = "all"
"""The ``by_train_samples`` key of the whole training split (``train_samples: null``)."""
MODEL_TEXT = ("multinomial logistic regression (scikit-learn LogisticRegression, lbfgs, L2 penalty), "
              "C chosen on the validation split, then one test evaluation")  # fmt: skip
#: the split settings a run must share with a floor for the floor to be its own
SPLIT_KEYS = ("split_seed", "val_fraction", "test_fraction")


def dataset_name(data: dict[str, Any]) -> str | None:
    """The floor's name of a run's data (results.json's ``data``): its source, or ``folder-<name>`` for an image
    folder; None for data that is not images (no ``input_shape``)."""
    source = data.get("source")
    if not source or data.get("input_shape") is None:
        return None
    if source == "folder":
        origin = str(data.get("origin") or "").rstrip("/")
        return f"folder-{os.path.basename(origin) or 'images'}"
    return str(source).replace("/", "--")


def size_key(train_samples: int | None) -> str:
    return ALL if train_samples is None else str(int(train_samples))


def floor_file(dataset: str, floors_dir: str | os.PathLike = FLOORS_DIR) -> Path:
    return Path(floors_dir) / f"{dataset}.json"


_READ: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}
"""``read_floors``'s files already read, by path: (inode, size, mtime) and the contents; a table or a claims
page asks for a floor per variant and column, so each file is parsed once until it changes."""


def read_floors(dataset: str, floors_dir: str | os.PathLike = FLOORS_DIR) -> dict[str, Any] | None:
    """The registry file of ``dataset``, or None when there is none; the contents are shared between calls
    (read them, do not change them)."""
    path = floor_file(dataset, floors_dir).resolve()
    try:
        st = path.stat()
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = _READ.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        data = json.loads(path.read_text())
    except FileNotFoundError:
        _READ.pop(path, None)
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a floors file ({e}); compute it again with `repro registry floors`") from e
    if not isinstance(data, dict) or not isinstance(data.get("by_train_samples"), dict):
        raise ValueError(f"{path}: no by_train_samples mapping; compute it again with `repro registry floors`")
    _READ[path] = (stamp, data)
    return data


def floor_for(dataset: str, train_samples: int | None, *, floors_dir: str | os.PathLike = FLOORS_DIR) -> dict | None:
    """The floor of ``dataset`` trained on ``train_samples`` images (None: the whole training split):
    ``test_acc``, ``val_acc`` (fractions of 1), ``C`` and the rest of the registry entry; None when none is
    recorded."""
    data = read_floors(dataset, floors_dir)
    if data is None:
        return None
    entry = data["by_train_samples"].get(size_key(train_samples))
    if entry is None and train_samples is not None:  # a subset as large as the whole split is the split
        whole = data["by_train_samples"].get(ALL)
        entry = whole if whole is not None and whole.get("n_train") == train_samples else None
    return None if entry is None else {"dataset": dataset, "train_samples": train_samples, **entry}


def run_dataset(results: dict[str, Any]) -> tuple[str, int | None] | None:
    """(data set, train_samples) of a run from its results.json or record (``data`` section); None when the
    run's data is not images."""
    data = results.get("data") or {}
    name = dataset_name(data)
    return None if name is None else (name, data.get("train_samples"))


def run_floor(results: dict[str, Any], *, floors_dir: str | os.PathLike = FLOORS_DIR) -> dict | None:
    """The floor of a run (``floor_for`` of ``run_dataset``), or None when there is none or the run split its
    data otherwise: its ``split_seed`` and ``val_fraction`` (both must be recorded), input shape and test-split
    size must be the floor's."""
    found = run_dataset(results)
    if found is None:
        return None
    floor = floor_for(*found, floors_dir=floors_dir)
    if floor is None:
        return None
    data = results.get("data") or {}
    same = all(data.get(k) is not None and data[k] == floor.get(k) for k in ("split_seed", "val_fraction"))
    same = same and list(data.get("input_shape") or []) == list(floor.get("input_shape") or [])
    if floor.get("test_size") is not None and data.get("test_size") is not None:
        same = same and data["test_size"] == floor["test_size"]
    return floor if same else None


def floor_of(results: list[dict[str, Any]], *, floors_dir: str | os.PathLike = FLOORS_DIR) -> dict | None:
    """The one floor shared by every run in ``results`` (a variant's seeds, or a profile's runs); None when
    there is none or the runs differ in data set or training size."""
    keys = {run_dataset(r) for r in results}
    if len(keys) != 1 or None in keys:
        return None
    return run_floor(results[0], floors_dir=floors_dir)


def floor_label(floor: dict[str, Any]) -> str:
    """``pixel logistic regression (C=0.1, chosen on validation)``, with the training size when it is a
    subset."""
    size = "" if floor.get("train_samples") is None else f", train_samples={floor['train_samples']}"
    return f"pixel logistic regression (C={floor['C']:g}, chosen on validation{size})"


def record_floor(dataset: str, train_samples: int | None, result: dict[str, Any], *, command: str,
                 floors_dir: str | os.PathLike = FLOORS_DIR) -> Path:  # fmt: skip
    """Add (or replace) the floor of ``train_samples`` in ``dataset``'s registry file, atomically.
    ``result`` is ``datamodules.images.floor.datamodule_floor``'s."""
    path = floor_file(dataset, floors_dir)
    current = read_floors(dataset, floors_dir) or {}
    ident = result.get("identity") or {}
    shape = ident.get("input_shape")
    features = int(math.prod(shape)) if shape else None
    entry_keys = ("C", "val_acc", "test_acc", "val_by_C", "iterations_by_C", "converged", "n_train", "n_val",
                  "n_test", "seconds")  # fmt: skip
    entry = {k: result[k] for k in entry_keys if k in result}
    entry.update({k: ident.get(k) for k in (*SPLIT_KEYS, "input_shape", "test_size")})
    entry.update(cpu=result.get("cpu"), computed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    by_size = dict(current.get("by_train_samples") or {})
    by_size[size_key(train_samples)] = entry
    order = sorted(by_size, key=lambda k: (k == ALL, int(k) if k != ALL else 0))
    data = {
        "dataset": dataset,
        "source": ident.get("source"),
        "origin": scrub_paths(ident.get("origin")),
        "test_split": ident.get("test_split"),
        "input_shape": shape,
        "features": f"raw pixels scaled to [0, 1], flattened ({features} values)" if features else "raw pixels",
        "model": MODEL_TEXT,
        "grid": result.get("grid"),
        "max_iter": result.get("max_iter"),
        "tol": result.get("tol"),
        "by_train_samples": {k: by_size[k] for k in order},
        "hardware": {"cpu": result.get("cpu")},
        "versions": result.get("versions"),
        "command": scrub_paths(command),
    }
    atomic_write_json(path, data)
    return path

