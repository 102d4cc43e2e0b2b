"""The worker side of preparing image data: a process pool that runs one task per shard, in parallel.

``datamodules.images.prepared`` cuts a folder's files into shards (``shard_files``: about ``SHARD_BYTES`` each)
or a hub dataset's Arrow files into row ranges, and ``run_tasks`` runs a task on each, on all cores (or
``workers``) with a progress bar: ``write_folder_shard`` reads, verifies and writes one shard of a folder as an
Arrow file; ``verify_rows`` verifies the images of rows of a hub Arrow file. Each returns its rows, the files
that do not decode (with why) and the statistics of its images (modes, sizes), which ``merge_stats`` adds up for
the manifest. ``datamodules.images.pools`` decodes data into memory on the same pool.
"""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import get_context
from typing import Any

import datasets
import pyarrow as pa

from datamodules.images.decode import image_bytes, verify_image
from utils.stop import deferred

SHARD_BYTES = 512 * 2**20
"""Target size of one folder shard (and of one verification task of a hub file)."""
SHARD_FILES = 4096
"""At most this many images per shard, so that small images still give every worker tasks."""
WRITE_BATCH = 512
"""Rows per Arrow record batch written by a shard writer (bounds its memory)."""


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover (macOS)
        return os.cpu_count() or 1


# ------------------------------------------------------------------------------------------------ process pool


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and terminates the pool


def run_tasks(fn: Callable[[Any], dict], tasks: Sequence[Any], weights: Sequence[int], desc: str, unit: str,
              workers: int) -> list[dict]:  # fmt: skip
    """``fn(task)`` for every task, on ``workers`` processes, with a progress bar advanced by each task's weight
    (rate and ETA); the results in task order. An exception (or Ctrl-C) terminates the pool and propagates."""
    from tqdm import tqdm

    results: list[dict | None] = [None] * len(tasks)
    with tqdm(total=int(sum(weights)), desc=desc, unit=unit, unit_scale=True, mininterval=0.5, smoothing=0.1) as bar:
        if workers <= 1 or len(tasks) <= 1:
            for i, task in enumerate(tasks):
                results[i] = fn(task)
                bar.update(weights[i])
            return results  # type: ignore[return-value]
        pool, finished = None, False
        try:
            with deferred():  # a Ctrl-C while the workers start stops the pool once they have started
                pool = _pool_context().Pool(min(workers, len(tasks)), initializer=_ignore_sigint)
            for i, result in pool.imap_unordered(_indexed, [(fn, i, t) for i, t in enumerate(tasks)]):
                results[i] = result
                bar.update(weights[i])
            pool.close()
            finished = True
        finally:
            if pool is not None:
                if not finished:
                    pool.terminate()
                pool.join()
    return results  # type: ignore[return-value]


def _pool_context():
    """A ``forkserver`` context where there is one (Linux, macOS), else the platform default.

    Not ``fork``: the process that prepares is usually threaded (Lightning, W&B, tqdm's monitor,
    pytest-xdist), and a child forked from a threaded process can inherit a lock held by another
    thread and hang at its exit, which hangs the pool's join. The fork server is a clean process
    that imports this module once (preload), so each worker starts in milliseconds.
    """
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return get_context()
    ctx = get_context("forkserver")
    # first a module that ignores Ctrl-C in the fork server and its workers, from their start (the
    # pool's initializer runs only once a worker has started): the parent handles it
    ctx.set_forkserver_preload(["utils.quiet_workers", __name__])
    return ctx


def _indexed(item: tuple[Callable[[Any], dict], int, Any]) -> tuple[int, dict]:
    fn, i, task = item
    return i, fn(task)


# ------------------------------------------------------------------------------------------------ image stats


def _image_stats() -> dict[str, Any]:
    return {"modes": Counter(), "height": [None, None], "width": [None, None], "pixels": 0, "count": 0}


def _add_image(stats: dict[str, Any], mode: str, height: int, width: int) -> None:
    stats["modes"][mode] += 1
    for key, value in (("height", height), ("width", width)):
        lo, hi = stats[key]
        stats[key] = [value if lo is None else min(lo, value), value if hi is None else max(hi, value)]
    stats["pixels"] += height * width
    stats["count"] += 1


def merge_stats(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total = _image_stats()
    for part in parts:
        total["modes"].update(part["modes"])
        for key in ("height", "width"):
            for i, pick in ((0, min), (1, max)):
                values = [v for v in (total[key][i], part[key][i]) if v is not None]
                total[key][i] = pick(values) if values else None
        total["pixels"] += part["pixels"]
        total["count"] += part["count"]
    return {"modes": dict(total["modes"]), "height": total["height"], "width": total["width"],
            "mean_pixels": total["pixels"] / total["count"] if total["count"] else 0}  # fmt: skip


# ------------------------------------------------------------------------------------------------ folders


def folder_features(class_names: Sequence[str]) -> datasets.Features:
    """The columns of a prepared folder: ``image`` (encoded bytes + relative path) and ``label``."""
    return datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(class_names))})


def _reason(error: BaseException) -> str:
    """One line saying why a file did not decode (Pillow's message without its in-memory buffer's repr)."""
    text = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", f"{type(error).__name__}: {error}")
    return text.replace("\n", " ")[:300]


def write_folder_shard(task: dict[str, Any]) -> dict[str, Any]:
    """Read, verify and write one shard of a folder (runs in a pool worker)."""
    root, out, files = task["root"], task["out"], task["files"]
    schema = folder_features(task["class_names"]).arrow_schema
    stats, bad, rows = _image_stats(), [], 0
    buffer: dict[str, list] = {"bytes": [], "path": [], "label": []}

    def flush(writer: pa.ipc.RecordBatchStreamWriter) -> None:
        image = pa.StructArray.from_arrays(
            [pa.array(buffer["bytes"], pa.binary()), pa.array(buffer["path"], pa.string())], names=["bytes", "path"]
        )
        writer.write_table(pa.table([image, pa.array(buffer["label"], pa.int64())], schema=schema))
        for v in buffer.values():
            v.clear()

    with pa.OSFile(out, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for rel, label, _ in files:
            try:
                with open(os.path.join(root, rel), "rb") as f:
                    data = f.read()
                mode, height, width = verify_image(data)
            except Exception as e:  # noqa: BLE001 - any failure to read or decode makes the file bad
                bad.append([rel, _reason(e)])
                continue
            _add_image(stats, mode, height, width)
            buffer["bytes"].append(data)
            buffer["path"].append(rel)
            buffer["label"].append(label)
            rows += 1
            if len(buffer["label"]) >= WRITE_BATCH:
                flush(writer)
        if buffer["label"] or rows == 0:
            flush(writer)
    return {"rows": rows, "bad": bad, "stats": stats, "bytes": os.path.getsize(out)}


def shard_files(files: list[tuple[str, int, int]], workers: int) -> list[list[tuple[str, int, int]]]:
    """Consecutive runs of ``files`` of about ``SHARD_BYTES`` (at most ``SHARD_FILES``; at least 4 per worker)."""
    if not files:
        return []
    per_worker = -(-len(files) // max(1, 4 * workers))
    cap = max(1, min(SHARD_FILES, per_worker))
    shards, current, size = [], [], 0
    for f in files:
        if current and (size + f[2] > SHARD_BYTES or len(current) >= cap):
            shards.append(current)
            current, size = [], 0
        current.append(f)
        size += f[2]
    shards.append(current)
    return shards


# ------------------------------------------------------------------------------------------------ hub datasets


def verify_rows(task: dict[str, Any]) -> dict[str, Any]:
    """Verify the images of rows [start, stop) of one Arrow file (runs in a pool worker)."""
    with pa.memory_map(task["file"]) as source:
        table = pa.ipc.open_stream(source).read_all()
    column = table.column(task["column"]).slice(task["start"], task["stop"] - task["start"])
    stats, bad = _image_stats(), []
    for k, value in enumerate(column.to_pylist()):
        row = task["offset"] + task["start"] + k
        try:
            mode, height, width = verify_image(image_bytes(value))
        except Exception as e:  # noqa: BLE001
            bad.append([row, _reason(e)])
            continue
        _add_image(stats, mode, height, width)
    return {"bad": bad, "stats": stats}
