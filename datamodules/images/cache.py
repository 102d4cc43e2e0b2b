"""Convert once, then read: raw files as a ``datasets.DatasetDict`` saved in the datasets cache.

A conversion lands in ``<cache root>/attention-repro/<name>-<key>``, where the key hashes ``CACHE_FORMAT`` and
the source files' names, sizes and mtimes: a changed file is converted again, an unchanged one never. The
save goes through ``utils.atomic.atomic_directory`` (a temporary sibling renamed into place), so an
interrupted run never leaves a half-written cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import datasets

from datamodules.images.workspace import owned_directory

log = logging.getLogger(__name__)

CACHE_FORMAT = "attention-repro-images-v1"
"""Bump when the layout of what we save changes, so stale caches are not read."""
CACHE_SUBDIR = "attention-repro"


def cache_root(cache_dir: str | None) -> Path:
    """The datasets cache root: ``cache_dir``, else ``$HF_DATASETS_CACHE``, else the ``datasets`` default."""
    root = cache_dir or os.environ.get("HF_DATASETS_CACHE") or datasets.config.HF_DATASETS_CACHE
    return Path(os.path.expanduser(str(root)))


def files_key(paths: Sequence[Path]) -> str:
    """A short hash of ``CACHE_FORMAT`` and each file's name, size and mtime."""
    digest = hashlib.sha256(CACHE_FORMAT.encode())
    for path in paths:
        st = path.stat()
        digest.update(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def cached_arrays(
    root: Path, name: str, key_files: Sequence[Path], build: Callable[[], datasets.DatasetDict]
) -> datasets.DatasetDict:
    """Load ``<root>/attention-repro/<name>-<key>`` or build it (once) with ``build`` and save it atomically."""
    final = root / CACHE_SUBDIR / f"{name}-{files_key(key_files)}"
    if not final.is_dir():
        log.info("converting %s into the datasets cache %s", name, final)
        with owned_directory(final) as tmp:
            build().save_to_disk(str(tmp))
    return datasets.load_from_disk(str(final))
