"""The pixel floor: a multinomial logistic regression on raw pixels, the least a deep model must beat.

``fit_floor(train, val, test)`` fits scikit-learn's ``LogisticRegression`` (lbfgs, multinomial) on the
training pixels scaled to [0, 1] and flattened, once per regularisation strength ``C`` of the grid (smallest
first, each fit starting from the previous one's weights), chooses the ``C`` with the best VALIDATION accuracy
(ties: the smaller ``C``, the stronger regularisation), and only then asks for the test split (``test`` is a
function, called once, after ``C`` is fixed) and measures that one model's test accuracy. The test split never
takes part in the choice.

``datamodule_floor(dm)`` does it for an ``ImageDataModule`` after ``setup``: the arrays are the module's own
splits (its nested class-balanced ``train_samples`` subset, its validation and test rows: ``splits``), the
pixels as the module holds them in memory (at its input size), never normalised. The result is cached once under
``<cache root>/attention-repro/floors/`` (beside ``prepared/``), keyed by the data's identity (source, origin,
split settings, a hash of the training and validation pixels and labels), the grid and the solver settings:
a second call reads it back.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from datamodules.images.cache import CACHE_SUBDIR, cache_root
from utils.atomic import atomic_write_json

FLOOR_FORMAT = "pixel-floor-v1"
"""Bump when the method changes: cached floors of another format are computed again."""
DEFAULT_GRID = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
"""The regularisation strengths tried (scikit-learn's ``C``, the inverse of the L2 penalty), log-spaced."""
MAX_ITER = 300
"""lbfgs iterations per ``C`` at most (a fit that stops there is recorded as not converged)."""
TOL = 1e-4
FLOORS_SUBDIR = "floors"

Arrays = tuple[np.ndarray, np.ndarray]


def pixels(images: np.ndarray) -> np.ndarray:
    """uint8 images (N, ...) as float32 rows (N, features) in [0, 1]."""
    images = np.asarray(images)
    return images.reshape(len(images), -1).astype(np.float32) / np.float32(255.0)


def fit_floor(train: Arrays, val: Arrays, test: Callable[[], Arrays], *, grid: Sequence[float] = DEFAULT_GRID,
              max_iter: int = MAX_ITER, tol: float = TOL) -> dict[str, Any]:  # fmt: skip
    """The floor of one training set: ``C`` chosen on ``val``, then the test accuracy of that model alone.

    ``train`` and ``val`` are (features (N, F) float, labels (N,) int); ``test()`` gives the test pair and is
    called once, after the choice. Returns ``C``, ``val_acc``, ``test_acc`` (fractions), ``val_by_C``,
    ``iterations_by_C``, ``converged`` (every fit stopped before ``max_iter``), the split sizes and ``seconds``.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    if not grid:
        raise ValueError("the grid of C values is empty; give at least one positive C, e.g. 0.1")
    if any(not (c > 0) for c in grid):
        raise ValueError(f"grid={list(grid)}: every C must be positive")
    start = time.perf_counter()
    x_train, y_train = train
    x_val, y_val = val
    model = LogisticRegression(C=float(min(grid)), max_iter=max_iter, tol=tol, warm_start=True)
    val_by_c: dict[str, float] = {}
    iterations: dict[str, int] = {}
    best: tuple[float, float, np.ndarray, np.ndarray] | None = None  # (val acc, C, coef, intercept)
    for c in sorted(float(c) for c in grid):
        model.set_params(C=c)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # recorded: iterations_by_C and converged
            model.fit(x_train, y_train)
        acc = float(np.mean(model.predict(x_val) == y_val))
        val_by_c[f"{c:g}"] = acc
        iterations[f"{c:g}"] = int(np.max(model.n_iter_))
        if best is None or acc > best[0]:  # ties keep the smaller C (fitted first)
            best = (acc, c, model.coef_.copy(), model.intercept_.copy())
    assert best is not None
    val_acc, chosen, coef, intercept = best
    model.coef_, model.intercept_ = coef, intercept
    x_test, y_test = test()  # only now: C is fixed
    test_acc = float(np.mean(model.predict(x_test) == y_test))
    return {
        "C": chosen,
        "val_acc": val_acc,
        "test_acc": test_acc,
        "val_by_C": val_by_c,
        "iterations_by_C": iterations,
        "converged": all(n < max_iter for n in iterations.values()),
        "n_train": int(len(y_train)),
        "n_val": int(len(y_val)),
        "n_test": int(len(y_test)),
        "seconds": round(time.perf_counter() - start, 2),
    }


def split_arrays(dm: Any) -> tuple[Arrays, Arrays, Callable[[], Arrays]]:
    """(train, val, test function) of a set-up ``ImageDataModule``: its training subset, validation and test
    rows, as [0, 1] pixel rows and labels. Needs the images held in memory at the input size."""
    from datamodules.images.torch_datasets import InMemoryImages

    def arrays(dataset: Any, name: str) -> Arrays:
        if not isinstance(dataset, InMemoryImages):
            raise ValueError(f"the pixel floor needs the {name} images held in memory; set in_memory true "
                             f"(--data.in_memory true) for source {dm.source!r}")  # fmt: skip
        if tuple(dataset.images.shape[1:]) != tuple(dm.input_shape):
            raise ValueError(f"the pixel floor needs the images stored at the input size {tuple(dm.input_shape)}, "
                             f"but they are held at {tuple(dataset.images.shape[1:])} (a native-size recipe)")  # fmt: skip
        rows = dataset.indices.cpu()
        return pixels(dataset.images[rows].cpu().numpy()), dataset.labels[rows].cpu().numpy()

    if dm.train_dataset is None:
        raise RuntimeError("call prepare_data() and setup() before computing the floor")
    return arrays(dm.train_dataset, "training"), arrays(dm.val_dataset, "validation"), \
        lambda: arrays(dm.test_dataset, "test")  # fmt: skip


def identity(dm: Any, train: Arrays, val: Arrays) -> dict[str, Any]:
    """What a floor depends on: the data's description (no test pixels are read) and the training and
    validation pixels and labels themselves (a hash)."""
    described = dm.describe()
    digest = hashlib.sha256()
    for x, y in (train, val):
        digest.update(np.ascontiguousarray(x).tobytes())
        digest.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    keys = ("source", "origin", "test_split", "test_size", "input_shape", "val_fraction", "split_seed",
            "num_classes")  # fmt: skip  (not train_samples: the hash says which images; a subset of all is all)
    return {**{k: described.get(k) for k in keys}, "test_fraction": dm.test_fraction,
            "train_val_sha256": digest.hexdigest()[:24]}  # fmt: skip


def floors_dir(cache_dir: str | None) -> Path:
    """``<cache root>/attention-repro/floors``: beside the prepared data (``prepared/``)."""
    return cache_root(cache_dir) / CACHE_SUBDIR / FLOORS_SUBDIR


def datamodule_floor(dm: Any, *, grid: Sequence[float] = DEFAULT_GRID, max_iter: int = MAX_ITER, tol: float = TOL,
                     recompute: bool = False) -> dict[str, Any]:  # fmt: skip
    """The floor of a set-up ``ImageDataModule``'s training subset (cached; see the module docstring). The
    result is ``fit_floor``'s plus ``grid``, ``max_iter``, ``tol``, ``identity``, ``versions``, ``cpu`` and
    ``cached`` (whether it was read back)."""
    train, val, test = split_arrays(dm)
    ident = identity(dm, train, val)
    settings = {"format": FLOOR_FORMAT, "grid": [float(c) for c in grid], "max_iter": max_iter, "tol": tol}
    key = hashlib.sha256(json.dumps({**settings, **ident}, sort_keys=True).encode()).hexdigest()[:20]
    path = floors_dir(dm.cache_dir) / f"{dm.source.replace('/', '--')}-{len(train[1])}-{key}.json"
    if not recompute and path.is_file():
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = None
        if isinstance(cached, dict) and cached.get("key") == key:
            return {**cached, "cached": True}
    result = fit_floor(train, val, test, grid=grid, max_iter=max_iter, tol=tol)
    result.update(settings, key=key, identity=ident, versions=versions(), cpu=cpu_name())
    atomic_write_json(path, result)
    return {**result, "cached": False}


def versions() -> dict[str, str]:
    import sklearn

    return {"scikit-learn": sklearn.__version__, "numpy": np.__version__, "python": platform.python_version()}


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
