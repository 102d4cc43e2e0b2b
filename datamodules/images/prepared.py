"""Prepared once, opened in seconds: image sources as memory-mapped Arrow files of ENCODED images.

A folder or hub dataset is prepared once into ``<cache root>/attention-repro/prepared/<name>-<key>/``:

    manifest.json            what is there: origin, key, class names, per split its files, rows and bytes,
                             the skipped (undecodable) files, the images' modes and sizes
    train/00000.arrow ...    folders: Arrow IPC files, columns ``image`` (``datasets.Image``: the file's bytes
    test/00000.arrow ...     and its path relative to the folder) and ``label`` (``ClassLabel``)
    decoded-RGB-32x32/       only for data that is held in memory: the uint8 pixels, decoded once

A hub dataset is not copied: its manifest lists the Arrow files ``datasets.load_dataset`` left in the hub cache
(a copy is written only for datasets that live in memory). Opening is ``datasets.Dataset.from_file`` on each
file (memory-mapped, no copy, no per-image work) and ``concatenate_datasets``; images are decoded per sample in
the loader workers. The index ``prepared/index/<hash of the folder path or hub name>.json`` maps a source to its
prepared directory and, for a folder, the ``stamp`` of its directories (``datamodules.images.listing``): a warm
open stats the folder's directories, reads two JSON files and maps the Arrow files, so it takes the same time
for 10,000 or 1.28 million images and needs neither the network nor a hub token. ``prepared=<directory>`` opens a
prepared directory directly (e.g. copied to a node's local disk), with no source at all.

Preparing walks the folder once (``listing.walk``), then a process pool (all cores, or ``workers``) reads,
verifies (``decode.verify_image``) and writes the files in shards (``shard_pool``), with a progress bar
(rate, ETA). A file that cannot be decoded fails the preparation with one line naming it, unless
``skip_bad_images``: then it is left out, counted and listed in the manifest. Everything is written into a
temporary sibling and renamed at the end (``workspace.owned_directory``): a failed or interrupted
preparation leaves no prepared dataset behind, and a killed one a temporary directory that records its owner, so
the next ``data prepare`` removes it once that process is gone (``workspace.remove_stale``).

Why Arrow files of encoded bytes, not ``litdata``: ``datasets`` is already the data layer (hub datasets arrive as
these very Arrow files, so a hub dataset is prepared without a copy), the files are memory-mapped and random
access costs ~60 us per image (Python included), opening is constant-time (measured: ``README.md``, "Your own
images"), and one local directory on a shared or node-local disk is what single-node and SLURM multi-node
training here read. ``litdata`` (Lightning's streaming format: chunked, optimised with ``litdata.optimize``,
streamed from object stores with per-rank shuffling and resumable iteration) pays off when the data lives in
S3/GCS and nodes have no shared filesystem; it would add a dependency and a second copy of every hub dataset.
The decoded pixels are never stored for large data (ImageNet's would be ~193 GB at 224 px), only the encoded
bytes (ImageNet ~145 GB, about the size of its JPEGs).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from datamodules.images.decode import BadImageError
from datamodules.images.listing import FolderListing, stamp_matches, walk
from datamodules.images.shard_pool import (
    SHARD_FILES,
    default_workers,
    folder_features,
    merge_stats,
    run_tasks,
    shard_files,
    verify_rows,
    write_folder_shard,
)
from datamodules.images.workspace import human_bytes, owned_directory
from utils.atomic import atomic_write_json

log = logging.getLogger(__name__)

PREPARED_FORMAT = "attention-repro-prepared-v1"
"""Bump when the layout changes: a manifest of another format is prepared again."""
PREPARED_SUBDIR = "prepared"
MANIFEST = "manifest.json"
BAD_HINT = "delete or replace it, or set skip_bad_images: true (--data.skip_bad_images true) to skip such files"


ARROW_STREAM_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""How a whole Arrow IPC stream (the files ``datasets`` writes) ends; it starts with the first four bytes."""


def prepared_root(cache_root: Path) -> Path:
    """Where prepared datasets live: ``<cache root>/attention-repro/prepared``."""
    return Path(cache_root) / "attention-repro" / PREPARED_SUBDIR


# ------------------------------------------------------------------------------------------------ opening


@dataclass
class Prepared:
    """A prepared dataset: its directory and manifest; ``split(name)`` opens one split memory-mapped."""

    path: Path
    manifest: dict[str, Any]

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    @property
    def skipped(self) -> list[list[str]]:
        return [bad for s in self.manifest["splits"].values() for bad in s.get("skipped", [])]

    def file_path(self, name: str) -> Path:
        p = Path(name)
        return p if p.is_absolute() else self.path / p

    def split(self, name: str) -> datasets.Dataset:
        """The split ``name`` as one ``datasets.Dataset`` over its memory-mapped Arrow files.

        The tables are mapped and concatenated with ``datasets.table`` and the dataset is given its fingerprint
        (the prepared key): ``Dataset.from_file`` per file would hash each file's state (~5-15 ms a shard).
        """
        from datasets.table import MemoryMappedTable, concat_tables

        info = self.manifest["splits"][name]
        features = datasets.Features.from_dict(self.manifest["features"])
        if not info["files"]:
            return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
        tables = [MemoryMappedTable.from_file(str(self.file_path(f))) for f in info["files"]]
        table = tables[0] if len(tables) == 1 else concat_tables(tables)
        fingerprint = hashlib.sha256(f"{self.manifest['key']}\0{name}\0{self.path}".encode()).hexdigest()[:16]
        ds = datasets.Dataset(table, info=datasets.DatasetInfo(features=features), fingerprint=fingerprint)
        if info.get("keep") is not None:  # rows left after skipping undecodable images of a hub file
            ds = ds.select(np.load(self.path / info["keep"]))
        return ds

    def damaged_files(self) -> list[tuple[Path, str]]:
        """Referenced Arrow files that are gone (a cleared hub cache, a deleted shard) or cut short (no Arrow
        stream start or end marker), with why: the dataset must be prepared again. Reads 12 bytes a file."""
        damaged = []
        for f in (f for s in self.manifest["splits"].values() for f in s["files"]):
            path = self.file_path(f)
            try:
                with open(path, "rb") as fh:
                    head = fh.read(4)
                    size = fh.seek(0, os.SEEK_END)
                    fh.seek(max(size - len(ARROW_STREAM_END), 0))
                    tail = fh.read()
            except FileNotFoundError:
                damaged.append((path, "missing"))
                continue
            except OSError as e:
                damaged.append((path, f"unreadable: {e.strerror or e}"))
                continue
            if head != ARROW_STREAM_END[:4] or tail != ARROW_STREAM_END:
                damaged.append((path, f"damaged: {size:,} bytes, not a whole Arrow stream"))
        return damaged

    def missing_files(self) -> list[Path]:
        """Referenced Arrow files that are missing or damaged (``damaged_files``)."""
        return [p for p, _ in self.damaged_files()]

    def check(self) -> None:
        """Raise ``DamagedPreparedError`` naming the first missing or damaged Arrow file, if any."""
        damaged = self.damaged_files()
        if damaged:
            path, why = damaged[0]
            more = f" ({len(damaged)} of its files are)" if len(damaged) > 1 else ""
            raise DamagedPreparedError(
                f"{path}: {why}, a file of the prepared dataset {self.path}{more}; prepare it again (`repro data "
                f"prepare` with the settings that made it, or train with its source, which prepares it again), "
                f"or delete {self.path}"
            )


class DamagedPreparedError(ValueError):
    """A prepared dataset whose Arrow files are missing or cut short."""


def open_prepared(path: str | os.PathLike, *, check: bool = True) -> Prepared:
    """The prepared dataset in ``path`` (a directory holding ``manifest.json``); with ``check``, its Arrow files are
    checked to be there and whole (``Prepared.check``)."""
    path = Path(path).expanduser()
    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        raise FileNotFoundError(
            f"{path} is not a prepared dataset (no {MANIFEST}); prepare one with `repro data "
            "prepare ...` and pass the directory it prints"
        )
    manifest = json.loads(manifest_file.read_text())
    if manifest.get("format") != PREPARED_FORMAT:
        raise ValueError(f"{path}: prepared in format {manifest.get('format')!r}, this code reads {PREPARED_FORMAT!r}; "
                         "prepare it again")  # fmt: skip
    prepared = Prepared(path, manifest)
    if check:
        prepared.check()
    return prepared


def list_prepared(cache_root: Path) -> list[Prepared]:
    """Every prepared dataset under ``cache_root`` (for ``data info``)."""
    root = prepared_root(cache_root)
    if not root.is_dir():
        return []
    found = []
    for d in sorted(root.iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file():
            try:
                found.append(open_prepared(d, check=False))
            except ValueError:
                continue
    return found


# ------------------------------------------------------------------------------------------------ index


def _index_file(cache_root: Path, identity: str) -> Path:
    return prepared_root(cache_root) / "index" / f"{hashlib.sha256(identity.encode()).hexdigest()[:20]}.json"


def read_index(cache_root: Path, identity: str) -> dict | None:
    path = _index_file(cache_root, identity)
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return entry if entry.get("identity") == identity else None


def write_index(cache_root: Path, identity: str, prepared: Prepared, **extra: Any) -> None:
    atomic_write_json(_index_file(cache_root, identity), {"identity": identity, "prepared": prepared.path.name, **extra})


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60] or "data"


# ------------------------------------------------------------------------------------------------ folders


def _bad_error(bad: list[tuple[str, str]], root: Path | str, total: int) -> BadImageError:
    where, reason = bad[0]
    path = where if os.path.isabs(str(where)) or str(where).startswith(("row ", "hub ")) else os.path.join(root, where)
    more = f" ({len(bad)} of {total:,} files cannot be decoded; the others are listed above)" if len(bad) > 1 else ""
    return BadImageError(f"{path}: cannot be decoded as an image ({reason}){more}; {BAD_HINT}")


def _finish_bad(bad: list[tuple[str, str]], root: Path | str, total: int, skip: bool, what: str) -> None:
    """Report undecodable files: skipped and counted, or the one-line error."""
    if not bad:
        return
    if skip:
        print(f"[data] skip_bad_images: skipped {len(bad):,} of {total:,} {what} that cannot be decoded "
              f"(first: {bad[0][0]}; all listed in the manifest)", flush=True)  # fmt: skip
        return
    for where, reason in bad[1:]:
        log.error("%s: cannot be decoded as an image (%s)", where, reason)
    raise _bad_error(bad, root, total) from None


def prepare_folder(listing: FolderListing, cache_root: Path, *, workers: int | None = None,
                   skip_bad_images: bool = False, source: str = "folder") -> Prepared:  # fmt: skip
    """The prepared dataset of ``listing``'s folder: found by its key, else written now (see the module docstring)."""
    root = prepared_root(cache_root)
    final = root / f"{source}-{_slug(listing.root.name)}-{listing.key}"
    if (final / MANIFEST).is_file():
        prepared = open_prepared(final, check=False)
        damaged = prepared.damaged_files()
        if not damaged:
            _check_skipped(prepared, skip_bad_images)
            return prepared
        print(f"[data] {damaged[0][0]}: {damaged[0][1]}; preparing {listing.root} again into {final}", flush=True)
        shutil.rmtree(final)
    workers = workers or default_workers()
    start = time.perf_counter()
    named_bad = [b for split in listing.files for b in listing.bad_names.get(split, [])]
    total = listing.count() + len(named_bad)
    if named_bad and not skip_bad_images:  # before any work: the name alone says it cannot be prepared
        more = f" ({len(named_bad)} of {total:,} files have such names)" if len(named_bad) > 1 else ""
        raise BadImageError(f"{os.path.join(listing.root, named_bad[0][0])}: its name is not valid UTF-8 (shown "
                            f"escaped){more}; rename, {BAD_HINT}")
    with owned_directory(final, complete=lambda p: (p / MANIFEST).is_file()) as tmp:
        tasks, owners = [], []
        for split, files in listing.files.items():
            (tmp / split).mkdir()
            for i, shard in enumerate(shard_files(files, workers)):
                tasks.append({"root": str(listing.root), "out": str(tmp / split / f"{i:05d}.arrow"), "files": shard,
                              "class_names": listing.class_names})  # fmt: skip
                owners.append((split, f"{split}/{i:05d}.arrow"))
        results = run_tasks(write_folder_shard, tasks, [len(t["files"]) for t in tasks],
                            f"Preparing {listing.root.name} ({total:,} images, {workers} processes)", "img",
                            workers)  # fmt: skip
        bad = named_bad + [tuple(b) for r in results for b in r["bad"]]
        _finish_bad(bad, listing.root, total, skip_bad_images, "files")
        splits: dict[str, dict[str, Any]] = {
            s: {"files": [], "rows": 0, "bytes": 0, "skipped": [list(b) for b in listing.bad_names.get(s, [])]}
            for s in listing.files
        }
        for (split, name), r in zip(owners, results, strict=True):
            info = splits[split]
            info["skipped"] += r["bad"]
            if r["rows"]:
                info["files"].append(name)
                info["rows"] += r["rows"]
                info["bytes"] += r["bytes"]
            else:
                (tmp / name).unlink()
        manifest = {
            "format": PREPARED_FORMAT, "kind": "folder", "source": source, "origin": str(listing.root),
            "key": listing.key, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "prepare_seconds": round(time.perf_counter() - start, 1), "workers": workers,
            "class_names": listing.class_names, "image_column": "image", "label_column": "label",
            "features": folder_features(listing.class_names).to_dict(),
            "test_origin": f"official {listing.test_dir}" if listing.test_dir else "held out",
            "splits": splits, "images": merge_stats(r["stats"] for r in results), "ignored_files": listing.ignored,
        }  # fmt: skip
        atomic_write_json(tmp / MANIFEST, manifest)
    print(f"[data] prepared {total - len(bad):,} images of {listing.root} in {time.perf_counter() - start:.1f} s "
          f"into {final} ({human_bytes(sum(s['bytes'] for s in splits.values()))})", flush=True)  # fmt: skip
    return open_prepared(final)


def _check_skipped(prepared: Prepared, skip_bad_images: bool) -> None:
    """A dataset prepared with ``skip_bad_images`` left files out: without the setting that is the error again."""
    skipped = prepared.skipped
    if skipped and not skip_bad_images:
        raise _bad_error([tuple(s) for s in skipped], prepared.manifest["origin"], len(skipped))
    if skipped:
        print(f"[data] skip_bad_images: {len(skipped):,} images that cannot be decoded were left out when "
              f"{prepared.path.name} was prepared", flush=True)  # fmt: skip


def open_folder(data_dir: str | os.PathLike, cache_root: Path, *, workers: int | None = None,
                skip_bad_images: bool = False, refresh: bool = False, source: str = "folder") -> Prepared:  # fmt: skip
    """The prepared dataset of the folder ``data_dir``, preparing it if needed.

    Warm (the index names a prepared dataset and the folder's directory stamp is unchanged): no walk, no file
    listed or opened under ``data_dir``. Otherwise, or with ``refresh``, the folder is walked and fingerprinted,
    and prepared unless a prepared dataset with that fingerprint exists.
    """
    root = Path(data_dir).expanduser().resolve()
    identity = f"folder:{root}"
    if not refresh:
        entry = read_index(cache_root, identity)
        if entry is not None and stamp_matches(root, entry.get("stamp", {})):
            path = prepared_root(cache_root) / entry["prepared"]
            if (path / MANIFEST).is_file() and not open_prepared(path, check=False).damaged_files():
                prepared = open_prepared(path, check=False)
                _check_skipped(prepared, skip_bad_images)
                return prepared  # else: walked and prepared again (prepare_folder replaces a damaged one)
    listing = walk(root)
    prepared = prepare_folder(listing, cache_root, workers=workers, skip_bad_images=skip_bad_images, source=source)
    write_index(cache_root, identity, prepared, stamp=listing.stamp)
    return prepared


# ------------------------------------------------------------------------------------------------ hub datasets


def _arrow_files(ds: datasets.Dataset) -> list[str] | None:
    """The Arrow files ``ds`` reads, if opening them again gives exactly ``ds`` (no view, no in-memory table)."""
    files = [f["filename"] for f in ds.cache_files]
    if not files:
        return None
    try:
        parts = [datasets.Dataset.from_file(f) for f in files]
    except Exception:  # noqa: BLE001
        return None
    same = all(p.column_names == ds.column_names for p in parts)
    return files if same and sum(p.num_rows for p in parts) == ds.num_rows else None


def prepare_hub(name: str, dd: datasets.DatasetDict, splits: dict[str, str], image_column: str, cache_root: Path,
                *, workers: int | None = None, skip_bad_images: bool = False, test_origin: str = "held out",
                source: str | None = None) -> Prepared:  # fmt: skip
    """The prepared dataset of the hub dataset ``name`` (loaded as ``dd``): the splits ``{ours: theirs}``.

    The manifest references the Arrow files of the hub cache; datasets held in memory are copied. Every image
    of ``image_column`` is verified once.
    """
    files = {ours: _arrow_files(dd[theirs]) for ours, theirs in splits.items()}
    digest = hashlib.sha256(f"{PREPARED_FORMAT}\0{name}\0{image_column}\0{sorted(splits.items())}".encode())
    for ours, theirs in splits.items():
        if files[ours] is None:
            digest.update(dd[theirs]._fingerprint.encode())  # an in-memory dataset: its content fingerprint
        for f in files[ours] or []:
            st = os.stat(f)
            digest.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    key = digest.hexdigest()[:16]
    final = prepared_root(cache_root) / f"hub-{_slug(name.replace('/', '--'))}-{key}"
    if (final / MANIFEST).is_file() and not open_prepared(final, check=False).missing_files():
        prepared = open_prepared(final, check=False)
        _check_skipped(prepared, skip_bad_images)
        return prepared
    workers = workers or default_workers()
    start = time.perf_counter()
    with owned_directory(final, complete=lambda p: (p / MANIFEST).is_file()) as tmp:
        for ours, theirs in splits.items():
            if files[ours] is None:  # in memory: copy it into the prepared directory
                dd[theirs].save_to_disk(str(tmp / ours))
                files[ours] = sorted(str(p) for p in (tmp / ours).glob("*.arrow"))
        tasks, owners = [], []
        for ours in splits:
            offset = 0
            for f in files[ours]:
                rows = datasets.Dataset.from_file(f).num_rows
                step = max(1, min(SHARD_FILES, -(-rows // max(1, 4 * workers))))
                for lo in range(0, rows, step):
                    tasks.append({"file": f, "column": image_column, "start": lo, "stop": min(rows, lo + step),
                                  "offset": offset})  # fmt: skip
                    owners.append(ours)
                offset += rows
        total = sum(t["stop"] - t["start"] for t in tasks)
        results = run_tasks(verify_rows, tasks, [t["stop"] - t["start"] for t in tasks],
                            f"Verifying {name} ({total:,} images, {workers} processes)", "img", workers)  # fmt: skip
        bad = [(f"hub {name} split {ours} row {b[0]}", b[1]) for ours, r in zip(owners, results, strict=True)
               for b in r["bad"]]  # fmt: skip
        _finish_bad(bad, name, total, skip_bad_images, "images")
        info: dict[str, dict[str, Any]] = {}
        for ours in splits:
            rows = sum(datasets.Dataset.from_file(f).num_rows for f in files[ours])
            skipped = [b for o, r in zip(owners, results, strict=True) if o == ours for b in r["bad"]]
            entry = {"files": [_relative(f, tmp, final) for f in files[ours]], "rows": rows - len(skipped),
                     "bytes": sum(os.path.getsize(f) for f in files[ours]),
                     "skipped": [[f"row {b[0]}", b[1]] for b in skipped], "keep": None}  # fmt: skip
            if skipped:
                keep = np.setdiff1d(np.arange(rows), np.array([b[0] for b in skipped]))
                np.save(tmp / f"{ours}-keep.npy", keep)
                entry["keep"] = f"{ours}-keep.npy"
            info[ours] = entry
        train_files = files["train"]
        features = datasets.Dataset.from_file(train_files[0]).features if train_files else dd[splits["train"]].features
        manifest = {
            "format": PREPARED_FORMAT, "kind": "hub", "source": source or name, "origin": name, "key": key,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "prepare_seconds": round(time.perf_counter() - start, 1), "workers": workers,
            "hub_splits": splits, "image_column": image_column, "features": features.to_dict(),
            "test_origin": test_origin, "splits": info, "images": merge_stats(r["stats"] for r in results),
        }  # fmt: skip
        atomic_write_json(tmp / MANIFEST, manifest)
    print(f"[data] prepared {name} ({total - len(bad):,} images verified) in {time.perf_counter() - start:.1f} s: "
          f"{final}", flush=True)  # fmt: skip
    return open_prepared(final)


def _relative(f: str, tmp: Path, final: Path) -> str:
    """A file copied into the temporary directory is named relative to the prepared directory."""
    p = Path(f)
    try:
        return str(p.relative_to(tmp))
    except ValueError:
        return str(p)


def open_hub(name: str, load: Callable[[], datasets.DatasetDict], choose: Callable[[datasets.DatasetDict],
             tuple[dict[str, str], str, str]], cache_root: Path, *, workers: int | None = None,
             skip_bad_images: bool = False, refresh: bool = False, identity_extra: str = "") -> Prepared:  # fmt: skip
    """The prepared dataset of a hub dataset; ``load()`` (network or hub cache) only when it is not prepared.

    ``choose(dd)`` gives ({our split: its split}, image column, test origin).
    """
    identity = f"hub:{name}:{identity_extra}"
    if not refresh:
        entry = read_index(cache_root, identity)
        if entry is not None:
            path = prepared_root(cache_root) / entry["prepared"]
            if (path / MANIFEST).is_file():
                prepared = open_prepared(path, check=False)
                if not prepared.missing_files():
                    _check_skipped(prepared, skip_bad_images)
                    return prepared
    dd = load()
    splits, image_column, test_origin = choose(dd)
    prepared = prepare_hub(name, dd, splits, image_column, cache_root, workers=workers,
                           skip_bad_images=skip_bad_images, test_origin=test_origin)  # fmt: skip
    write_index(cache_root, identity, prepared)
    return prepared


def is_prepared_hub(name: str, cache_root: Path, identity_extra: str = "") -> bool:
    """Whether the hub dataset ``name`` is prepared locally (then neither the network nor a token is needed)."""
    entry = read_index(cache_root, f"hub:{name}:{identity_extra}")
    if entry is None:
        return False
    path = prepared_root(cache_root) / entry["prepared"]
    return (path / MANIFEST).is_file() and not open_prepared(path, check=False).missing_files()
