"""One walk of an image folder: its splits, classes and files, their fingerprint, and the stamp a warm open checks.

Layout: ``root/<class>/<image>`` (one split: the test set is held out), or ``root/train/<class>/<image>`` with
``root/test/`` (or ``val/``, ``validation/``) beside it, as ImageNet's ``train/<wnid>/*.JPEG`` and
``val/<wnid>/*.JPEG``. Images may sit in sub-folders of a class folder (the class is the top folder). Files
whose extension is not an image's (``IMAGE_EXTENSIONS``) and names starting with ``.`` are ignored.

``walk(root)`` lists the folder with ``os.scandir`` (one ``stat`` per file, for its size and mtime), once, when
the folder is prepared. Its ``key`` hashes every file's relative path, size and mtime: a prepared dataset is
named by it, so a changed folder is prepared again. Its ``stamp`` holds the mtime of every directory walked
(root, split and class folders, ~2,000 for ImageNet): adding, removing or renaming a file changes its
folder's mtime. A warm open compares the stamp (``stamp_matches``: one ``stat`` per directory, none per file)
instead of walking again, so it does not grow with the number of images. A file rewritten in place under the
same name changes no directory's mtime: ``repro data prepare`` always walks and notices it.

Symlinked split, class and image folders are followed (``train -> /mnt/disk/train``, as ImageFolder does): paths
are recorded as seen through the links, sizes, mtimes and the stamp are the targets'. A link to a folder that
holds it (a loop) stops the walk with one line naming the link.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm")
TEST_DIRS = ("test", "val", "validation")
"""Folders beside ``train/`` that hold the test split, in order of preference."""
LISTING_FORMAT = "attention-repro-listing-v1"


@dataclass
class FolderListing:
    """What one walk of an image folder found (see the module docstring)."""

    root: Path
    class_names: list[str]
    files: dict[str, list[tuple[str, int, int]]]  # split -> [(path relative to root, class index, bytes)], sorted
    key: str  # hash of every file's relative path, size and mtime
    stamp: dict[str, int]  # directory relative to root ("." for root) -> mtime_ns
    test_dir: str | None  # "test" / "val" / "validation", or None: the test set is held out of train
    ignored: int = 0  # files that are not images (by extension), hidden files
    dirs: dict[str, str] = field(default_factory=dict)  # split -> folder relative to root
    bad_names: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # split -> [(escaped path, why)]

    def count(self, split: str | None = None) -> int:
        return sum(len(v) for k, v in self.files.items() if split in (None, k))

    def size(self, split: str | None = None) -> int:
        return sum(f[2] for k, v in self.files.items() if split in (None, k) for f in v)


def split_dirs(root: Path) -> dict[str, str]:
    """``{"train": "train", "test": "val"}`` for a split layout, ``{"train": "."}`` for class folders at the root."""
    if (root / "train").is_dir():
        dirs = {"train": "train"}
        test = next((d for d in TEST_DIRS if (root / d).is_dir()), None)
        if test is not None:
            dirs["test"] = test
        return dirs
    return {"train": "."}


def is_image_name(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


class LinkLoop(ValueError):
    """A symlinked folder that points back to a folder above it (walking it would never end)."""


def walk_dirs(top: Path, rel: str = ".", outer: tuple[str, ...] = ()):
    """Yield ``(directory, relative path, sorted entries)`` for ``top`` and every folder below it, following
    symlinked folders as ImageFolder does (hidden folders skipped); a link to a folder that holds it (``top``,
    a folder walked on the way to it, or one of ``outer``: the data root and split folder) raises ``LinkLoop``
    naming the link."""
    _check_loop(str(top), os.path.realpath(top), outer)
    pending = [(Path(top), rel, (*outer, os.path.realpath(top)))]
    while pending:
        directory, drel, above = pending.pop()
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
        yield directory, drel, entries
        for entry in entries:  # pushed in name order, walked last first (the order the fingerprint hashes)
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            real = os.path.realpath(entry.path)
            _check_loop(entry.path, real, above)
            pending.append((Path(entry.path), f"{drel}/{entry.name}", (*above, real)))


def _check_loop(path: str, real: str, above: tuple[str, ...]) -> None:
    """Raise ``LinkLoop`` if the folder ``path`` (real path ``real``) holds one of the folders ``above`` it."""
    if any(_within(a, real) for a in above):
        raise LinkLoop(f"{path}: a symbolic link loop (it points to {real}, which holds the link itself); "
                       "remove the link or point it at a folder outside its own tree")


def _within(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies below it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def has_image(top: Path) -> bool:
    """Whether any image lies below ``top`` (symlinked folders followed); stops at the first folder holding one."""
    return any(any(not e.is_dir() and is_image_name(e.name) for e in entries) for _, _, entries in walk_dirs(top))


def escaped(name: str) -> str:
    """``name`` (a file name as ``os`` gives it) printable: bytes that are not UTF-8 as ``\\xff``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def valid_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _walk_class(folder: Path, rel: str, stamp: dict[str, int], out: list[tuple[str, int, int]], label: int,
                digest: "hashlib._Hash", outer: tuple[str, ...] = (),
                bad: list[tuple[str, str]] | None = None) -> int:  # fmt: skip
    """Every image below ``folder`` (relative path ``rel``) into ``out``, one whose path is not valid UTF-8 into
    ``bad`` (escaped; it cannot be stored or named as text); returns how many files were ignored."""
    ignored = 0
    for directory, drel, entries in walk_dirs(folder, rel, outer):
        stamp[drel] = directory.stat().st_mtime_ns
        for entry in entries:
            if entry.is_dir():
                continue
            if not is_image_name(entry.name):
                ignored += 1
                continue
            erel = f"{drel}/{entry.name}"
            st = entry.stat()
            if not valid_utf8(erel):
                if bad is not None:
                    bad.append((escaped(erel), "its name is not valid UTF-8"))
                digest.update(f"{escaped(erel)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                continue
            out.append((erel, label, st.st_size))
            digest.update(f"{erel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return ignored


def walk(root: str | os.PathLike) -> FolderListing:
    """List the folder ``root`` once (see the module docstring); raises if it holds no class folder or image."""
    root = Path(root).expanduser().resolve()
    dirs = split_dirs(root)
    digest = hashlib.sha256(LISTING_FORMAT.encode())
    stamp: dict[str, int] = {".": root.stat().st_mtime_ns}
    classes_by_split: dict[str, list[str]] = {}
    for split, rel in dirs.items():
        folder = root / rel
        stamp[rel] = folder.stat().st_mtime_ns
        classes_by_split[split] = sorted(
            e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith(".")
        )
    class_names = classes_by_split["train"]
    for split, names in classes_by_split.items():
        for name in names:
            if not valid_utf8(name):
                raise ValueError(f"{escaped(str(root / dirs[split] / name))}: a class folder whose name is not valid "
                                 "UTF-8 (shown escaped); rename it (class names are stored as text)")
    if not class_names:
        raise FileNotFoundError(
            f"{root / dirs['train']}: no class folders; an image folder needs one sub-folder of images per class, "
            "e.g. <data_dir>/cat/0001.jpg, or <data_dir>/train/<class>/... and <data_dir>/val/<class>/..."
        )
    index = {name: k for k, name in enumerate(class_names)}
    extra = sorted(set(classes_by_split.get("test", [])) - set(index))
    # classes only the test split has get indices after the train classes (the splits check then names them)
    for name in extra:
        index[name] = len(class_names)
        class_names = [*class_names, name]
    files: dict[str, list[tuple[str, int, int]]] = {}
    bad_names: dict[str, list[tuple[str, str]]] = {}
    ignored = 0
    for split, rel in dirs.items():
        outer = (str(root), os.path.realpath(root / rel))  # a class folder's link back to these is a loop too
        out: list[tuple[str, int, int]] = []
        bad: list[tuple[str, str]] = []
        for name in classes_by_split[split]:
            crel = name if rel == "." else f"{rel}/{name}"
            ignored += _walk_class(root / crel, crel, stamp, out, index[name], digest, outer, bad)
        out.sort()
        files[split] = out
        if bad:
            bad_names[split] = sorted(bad)
    if not any(files.values()) and not bad_names:
        raise FileNotFoundError(
            f"no images ({', '.join(IMAGE_EXTENSIONS)}) found under {root}: an image folder needs one sub-folder of "
            "images per class, e.g. <data_dir>/cat/0001.png"
        )
    digest.update(repr(sorted(dirs.items())).encode())
    stamp = {escaped(k) if not valid_utf8(k) else k: v for k, v in stamp.items()}  # stored as JSON text
    return FolderListing(root, class_names, files, digest.hexdigest()[:16], stamp,
                         dirs.get("test"), ignored, dirs, bad_names)  # fmt: skip


def stamp_matches(root: str | os.PathLike, stamp: dict[str, int]) -> bool:
    """Whether every directory of ``stamp`` still exists with the same mtime (one ``stat`` per directory)."""
    root = Path(root)
    for rel, mtime in stamp.items():
        try:
            if (root / rel).stat().st_mtime_ns != mtime:
                return False
        except OSError:
            return False
    return True
