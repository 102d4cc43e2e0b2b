"""Prepared image data (``datamodules/images/listing.py``, ``prepared.py``): round trip, re-preparation of a
changed folder, nothing left by a failed or interrupted preparation, a warm open that touches no file of the
folder, undecodable files, gated hub datasets."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import datamodules.images.prepared as prepared_mod
import datamodules.images.shard_pool as shard_pool
import datamodules.images.sources as sources
from datamodules.images import BadImageError, GatedDatasetError, ImageDataModule, open_prepared
from datamodules.images.cache import cache_root
from datamodules.images.decode import decode_pil
from datamodules.images.listing import walk
from datamodules.images.prepared import open_folder, prepared_root
from tests.images_helpers import cache, hub_like, isolated, jpeg_bytes, make, write_jpeg_folder  # noqa: F401


def prepared_dirs(cache: str) -> list[Path]:
    root = prepared_root(cache_root(cache))
    return sorted(p for p in root.iterdir() if p.name != "index") if root.is_dir() else []


# ------------------------------------------------------------------------------------------- round trip


def test_a_prepared_folder_holds_the_files_bytes_and_labels(cache, tmp_path):
    written = write_jpeg_folder(tmp_path / "imgs")
    prepared = open_folder(tmp_path / "imgs", cache_root(cache), workers=2)
    assert prepared.manifest["class_names"] == ["n01", "n02"] and prepared.manifest["test_origin"] == "official val"
    seen = {}
    for split in ("train", "test"):
        ds = prepared.split(split).cast_column("image", datasets.Image(decode=False))
        for row in ds:
            rel = row["image"]["path"]
            assert row["image"]["bytes"] == (tmp_path / "imgs" / rel).read_bytes()  # the encoded file, unchanged
            seen[rel] = row["label"]
    assert seen == written
    assert prepared.manifest["images"]["height"] == [12, 12] and prepared.manifest["images"]["modes"] == {"RGB": 20}


def test_the_datamodule_serves_the_decoded_source_pixels(cache, tmp_path):
    """Lazy (decoded per sample) and in memory: the pixels are the JPEG files decoded, within JPEG tolerance of
    Pillow's decoding, and the labels are the class folders."""
    written = write_jpeg_folder(tmp_path / "imgs", per_class=4)
    kwargs = {"source": "folder", "data_dir": str(tmp_path / "imgs"), "batch_size": 4, "mean": [0.0] * 3,
              "std": [1.0] * 3, "val_fraction": 0.0}  # fmt: skip
    for in_memory in (True, False):
        dm = make(cache, in_memory=in_memory, **kwargs)
        assert dm.in_memory is in_memory and dm.describe()["test_split"] == "official val"
        by_label = {}
        for rel, k in written.items():
            if rel.startswith("val/"):
                by_label.setdefault(k, []).append(decode_pil((tmp_path / "imgs" / rel).read_bytes(), "RGB"))
        for x, y in dm.test_dataloader():
            for image, label in zip(x, y, strict=True):
                pixels = image * 255
                diffs = [(pixels - ref.float()).abs().mean().item() for ref in by_label[int(label)]]
                assert min(diffs) < 1.0  # one of its class's files, decoded


# ------------------------------------------------------------------------------------------- changes


def test_a_changed_folder_is_prepared_again(cache, tmp_path):
    write_jpeg_folder(tmp_path / "imgs")
    first = open_folder(tmp_path / "imgs", cache_root(cache), workers=1)
    assert open_folder(tmp_path / "imgs", cache_root(cache), workers=1).path == first.path  # warm: the same
    new = tmp_path / "imgs" / "train" / "n01" / "extra.JPEG"
    new.write_bytes(jpeg_bytes(np.random.default_rng(5)))  # a new file changes its folder's mtime
    added = open_folder(tmp_path / "imgs", cache_root(cache), workers=1)
    assert added.path != first.path and added.manifest["splits"]["train"]["rows"] == 11
    new.unlink()  # back to the first listing: the first prepared dataset again, not prepared anew
    assert open_folder(tmp_path / "imgs", cache_root(cache), workers=1).path == first.path
    # a file rewritten in place under its name changes no directory: noticed by a refresh (`data prepare`)
    target = tmp_path / "imgs" / "val" / "n02" / "0.JPEG"
    target.write_bytes(jpeg_bytes(np.random.default_rng(6)))
    os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert open_folder(tmp_path / "imgs", cache_root(cache), workers=1).path == first.path
    refreshed = open_folder(tmp_path / "imgs", cache_root(cache), workers=1, refresh=True)
    assert refreshed.path != first.path
    assert len(prepared_dirs(cache)) == 3


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_or_interrupted_preparation_leaves_no_prepared_dataset(cache, tmp_path, monkeypatch, workers):
    write_jpeg_folder(tmp_path / "imgs", per_class=30)
    real = prepared_mod.write_folder_shard
    monkeypatch.setattr(prepared_mod, "write_folder_shard", _interrupted if workers == 1 else _failing)
    monkeypatch.setattr(shard_pool, "SHARD_FILES", 10)
    with pytest.raises(KeyboardInterrupt if workers == 1 else RuntimeError):
        ImageDataModule(cache_dir=cache, source="folder", data_dir=str(tmp_path / "imgs"),
                        prepare_workers=workers).prepare_data()  # fmt: skip
    root = prepared_root(cache_root(cache))
    assert not [p for p in root.iterdir() if p.name != "index"] and not (root / "index").exists()
    monkeypatch.setattr(prepared_mod, "write_folder_shard", real)  # the next run prepares it whole
    dm = make(cache, source="folder", data_dir=str(tmp_path / "imgs"), prepare_workers=workers)
    assert len(dm.train_dataset) + len(dm.val_dataset) == 60 and len(dm.test_dataset) == 60


_WRITE_SHARD = prepared_mod.write_folder_shard


def _interrupted(task):
    if "00001" in task["out"]:  # the second shard of a split: Ctrl-C
        raise KeyboardInterrupt
    return _WRITE_SHARD(task)


def _failing(task):  # module level: the pool's workers get it by name
    if "00001" in task["out"]:
        raise RuntimeError("disk full")
    return _WRITE_SHARD(task)


# ------------------------------------------------------------------------------------------- warm open


class FileSystemCalls:
    """Counts listing, stat and open calls on paths under ``root`` while active."""

    def __init__(self, monkeypatch, root: Path) -> None:
        self.root, self.calls = str(root), {"list": [], "stat": [], "open": []}
        for module, name, kind in [(os, "scandir", "list"), (os, "listdir", "list"), (os, "stat", "stat"),
                                   (os, "lstat", "stat"), (os, "open", "open")]:  # fmt: skip
            monkeypatch.setattr(module, name, self._wrap(getattr(module, name), kind))
        import builtins

        monkeypatch.setattr(builtins, "open", self._wrap(builtins.open, "open"))

    def _wrap(self, fn, kind):
        def wrapped(path=".", *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(self.root):
                self.calls[kind].append(os.fspath(path))
            return fn(path, *args, **kwargs)

        return wrapped


def test_a_warm_open_of_10000_files_makes_no_per_file_call(cache, tmp_path, monkeypatch):
    root = tmp_path / "big"
    payloads = [jpeg_bytes(np.random.default_rng(k), size=(8, 8)) for k in range(10)]
    for k in range(10):  # 10 classes x 1,000 files (the same 10 encoded images, written as bytes: fast)
        (root / f"c{k}").mkdir(parents=True)
        for i in range(1000):
            (root / f"c{k}" / f"{i:04d}.jpg").write_bytes(payloads[(k + i) % 10])
    kwargs = {"cache_dir": cache, "source": "folder", "data_dir": str(root), "prepare_workers": 2}
    cold = ImageDataModule(**kwargs)
    cold.prepare_data()
    cold.setup("fit")
    assert len(cold.train_dataset) + len(cold.val_dataset) + len(cold.test_dataset) == 10_000

    counter = FileSystemCalls(monkeypatch, root)
    start = time.perf_counter()
    warm = ImageDataModule(**kwargs)
    warm.prepare_data()
    warm.setup("fit")
    seconds = time.perf_counter() - start
    monkeypatch.undo()
    assert warm.prepared_path == cold.prepared_path
    assert counter.calls["list"] == [] and counter.calls["open"] == []  # nothing listed, no file opened
    directories = {str(root)} | {str(root / f"c{k}") for k in range(10)}
    assert set(counter.calls["stat"]) <= directories and len(counter.calls["stat"]) <= 4 * len(directories)
    assert seconds < 5.0
    warm_test, cold_test = warm.test_dataset, cold.test_dataset
    assert torch.equal(warm_test.images[warm_test.indices], cold_test.images[cold_test.indices])


def test_an_explicit_prepared_directory_needs_no_source(cache, tmp_path):
    write_jpeg_folder(tmp_path / "imgs")
    path = open_folder(tmp_path / "imgs", cache_root(cache), workers=1).path
    moved = tmp_path / "copied"
    os.rename(path, moved)  # e.g. copied to a node's local disk; the source folder is not needed
    dm = make(cache, source="folder", prepared=str(moved), batch_size=4)
    assert dm.class_names == ["n01", "n02"] and len(dm.test_dataset) == 10 and dm.prepared_path == str(moved)
    with pytest.raises(FileNotFoundError, match="not a prepared dataset"):
        ImageDataModule(cache_dir=cache, prepared=str(tmp_path))


# ------------------------------------------------------------------------------------------- bad images


def test_an_undecodable_file_is_named_in_one_line_and_can_be_skipped(cache, tmp_path, capsys):
    write_jpeg_folder(tmp_path / "imgs", per_class=6)
    text = tmp_path / "imgs" / "train" / "n01" / "notes.jpg"
    text.write_text("this is not an image\n")
    good = (tmp_path / "imgs" / "train" / "n02" / "0.JPEG").read_bytes()
    (tmp_path / "imgs" / "train" / "n02" / "cut.JPEG").write_bytes(good[: len(good) // 2])  # truncated
    kwargs = {"source": "folder", "data_dir": str(tmp_path / "imgs"), "prepare_workers": 2}
    with pytest.raises(BadImageError) as error:
        ImageDataModule(cache_dir=cache, **kwargs).prepare_data()
    message = str(error.value)
    assert "\n" not in message and str(text) in message and "cannot be decoded" in message
    assert "2 of 26 files" in message and "skip_bad_images" in message
    assert error.value.__cause__ is None and error.value.__suppress_context__  # no Pillow traceback chained
    assert prepared_dirs(cache) == []

    dm = make(cache, skip_bad_images=True, val_fraction=0.0, **kwargs)
    assert len(dm.train_dataset) == 12 and "skipped 2 of 26 files that cannot be decoded" in capsys.readouterr().out
    manifest = open_prepared(dm.prepared_path).manifest
    assert sorted(s[0] for s in manifest["splits"]["train"]["skipped"]) == ["train/n01/notes.jpg", "train/n02/cut.JPEG"]
    with pytest.raises(BadImageError, match="notes.jpg|cut.JPEG"):  # without the setting: the error again
        make(cache, **kwargs)


# ------------------------------------------------------------------------------------------- hub


def test_a_prepared_hub_dataset_opens_without_loading_it_again(cache, monkeypatch):
    loads = []

    def fake_load(name, cache_dir):
        loads.append(name)
        return hub_like({"train": 30, "test": 10}, label=["a", "b", "c"])

    monkeypatch.setattr(sources, "load_hub_dataset", fake_load)
    first = make(cache, source="owner/pictures")
    second = make(cache, source="owner/pictures")
    assert loads == ["owner/pictures"] and first.prepared_path == second.prepared_path
    assert len(second.test_dataset) == 10 and second.class_names == ["a", "b", "c"]


def test_imagenet_from_the_hub_needs_a_token_and_uses_the_validation_split(cache, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(GatedDatasetError) as error:
        ImageDataModule(cache_dir=cache, source="imagenet")
    message = str(error.value)
    assert "\n" not in message and "ILSVRC/imagenet-1k" in message
    assert "hf auth login" in message and "huggingface-cli login" in message and "HF_TOKEN" in message

    def fake_load(name, cache_dir):
        assert name == "ILSVRC/imagenet-1k"
        dd = hub_like({"train": 20, "validation": 6, "test": 4}, image_column="image", label=["n01", "n02"])
        return datasets.DatasetDict({**dd, "test": dd["test"].map(lambda r: {"label": -1})})  # unlabelled

    monkeypatch.setattr(sources, "load_hub_dataset", fake_load)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_token")
    dm = make(cache, source="imagenet", batch_size=4)
    assert dm.describe()["test_split"] == "official validation" and len(dm.test_dataset) == 6
    # prepared: a node without a token opens it
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert len(make(cache, source="imagenet", batch_size=4).test_dataset) == 6


def test_a_listing_is_sorted_and_ignores_what_is_not_an_image(tmp_path):
    write_jpeg_folder(tmp_path / "imgs", splits=("train",), per_class=2)
    (tmp_path / "imgs" / "train" / "n01" / "README.txt").write_text("x")
    (tmp_path / "imgs" / "train" / "n01" / ".hidden.jpg").write_bytes(b"x")
    listing = walk(tmp_path / "imgs")
    assert listing.ignored == 2 and listing.test_dir is None
    assert [f[0] for f in listing.files["train"]] == sorted(f[0] for f in listing.files["train"])
    assert json.loads(json.dumps(listing.stamp)) == listing.stamp


# ------------------------------------------------------------------------------------------- symlinked folders


def test_symlinked_split_and_class_folders_are_followed_and_their_changes_noticed(cache, tmp_path):
    """``train -> /disk/train`` (a repository pointed at a shared data disk) lists, checks and prepares as the
    real folder does, and a file added on the disk is noticed by the warm open's stamp through the link."""
    disk = tmp_path / "disk"
    write_jpeg_folder(disk / "real")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "train").symlink_to(disk / "real" / "train", target_is_directory=True)
    (linked / "val").mkdir()
    for name in ("n01", "n02"):  # a class folder that is a link, inside a real split folder
        (linked / "val" / name).symlink_to(disk / "real" / "val" / name, target_is_directory=True)
    real_listing, listing = walk(disk / "real"), walk(linked)
    assert listing.files == real_listing.files and listing.test_dir == "val" and listing.count() == 20
    sources.check_image_folder(sources.ReadOptions(str(linked), cache_root(cache)))  # raised "no images" before
    first = open_folder(linked, cache_root(cache), workers=1)
    assert first.manifest["splits"]["train"]["rows"] == 10
    assert open_folder(linked, cache_root(cache), workers=1).path == first.path  # warm
    extra = disk / "real" / "train" / "n02" / "extra.JPEG"
    extra.write_bytes(jpeg_bytes(np.random.default_rng(7)))  # behind the link: its target folder's mtime
    added = open_folder(linked, cache_root(cache), workers=1)
    assert added.path != first.path and added.manifest["splits"]["train"]["rows"] == 11
    assert len(make(cache, source="folder", data_dir=str(linked), batch_size=4).train_dataset) > 0


@pytest.mark.parametrize("where", ["class", "nested"])
def test_a_symlink_loop_is_named_in_one_line(cache, tmp_path, where):
    write_jpeg_folder(tmp_path / "imgs", splits=("train",), per_class=2)
    if where == "class":  # a class folder that is the data folder itself
        link = tmp_path / "imgs" / "train" / "n03"
        link.symlink_to(tmp_path / "imgs", target_is_directory=True)
    else:  # a folder inside a class folder that points back up to the class folder
        link = tmp_path / "imgs" / "train" / "n01" / "again"
        link.symlink_to(tmp_path / "imgs" / "train" / "n01", target_is_directory=True)
    with pytest.raises(ValueError, match="symbolic link loop") as info:
        walk(tmp_path / "imgs")
    assert str(info.value).startswith(f"{link}: ") and "\n" not in str(info.value)


def test_a_file_name_that_is_not_utf8_is_named_escaped_and_can_be_skipped(cache, tmp_path):
    write_jpeg_folder(tmp_path / "imgs", per_class=2)
    bad = os.fsdecode(bytes(tmp_path / "imgs" / "train" / "n01") + b"/caf\xe9.JPEG")  # Latin-1, not UTF-8
    Path(bad).write_bytes(jpeg_bytes(np.random.default_rng(3)))
    with pytest.raises(BadImageError) as info:
        open_folder(tmp_path / "imgs", cache_root(cache), workers=1)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'imgs'}/train/n01/caf\\xe9.JPEG: its name is not valid UTF-8"), message
    assert "--data.skip_bad_images true" in message and "\n" not in message
    assert prepared_dirs(cache) == []  # refused before any work
    skipped = open_folder(tmp_path / "imgs", cache_root(cache), workers=1, skip_bad_images=True)
    assert skipped.manifest["splits"]["train"]["rows"] == 4
    assert skipped.skipped == [["train/n01/caf\\xe9.JPEG", "its name is not valid UTF-8"]]
    json.dumps(skipped.manifest, ensure_ascii=False).encode()  # the manifest is plain text


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_damaged_prepared_shard_is_prepared_again_or_named(cache, tmp_path, damage):
    """A shard of a prepared folder deleted or cut short: with the source there it is prepared again (and says so);
    a prepared directory given alone is refused at open, naming the file (not a FileNotFoundError at training)."""
    write_jpeg_folder(tmp_path / "imgs")
    first = open_folder(tmp_path / "imgs", cache_root(cache), workers=1)
    shard = first.file_path(first.manifest["splits"]["train"]["files"][0])
    copy = tmp_path / "copy"
    import shutil as _shutil

    _shutil.copytree(first.path, copy)
    for path in (shard, copy / shard.relative_to(first.path)):
        if damage == "deleted":
            path.unlink()
        else:
            path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(prepared_mod.DamagedPreparedError) as info:
        open_prepared(copy)
    message = str(info.value)
    assert message.startswith(f"{copy / shard.relative_to(first.path)}: {'missing' if damage == 'deleted' else 'damaged'}")
    assert "prepare it again" in message and "\n" not in message
    again = open_folder(tmp_path / "imgs", cache_root(cache), workers=1)  # warm open: the stamp is unchanged
    assert again.path == first.path and not again.damaged_files()
    assert again.split("train").num_rows == 10
