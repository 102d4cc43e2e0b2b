"""``python -m reproductions data prepare|info`` (``reproductions/data.py``) on tiny folders, offline."""

from __future__ import annotations

import json

from reproductions.__main__ import main
from tests.images_helpers import isolated  # noqa: F401
from tests.test_images_prepared import write_jpeg_folder


def test_prepare_then_info_show_where_the_data_is_and_its_splits(tmp_path, capsys):
    folder, cache = tmp_path / "imgs", tmp_path / "cache"
    write_jpeg_folder(folder, per_class=3)
    args = ["--source", "imagenet", "--data.data_dir", str(folder), "--data.cache_dir", str(cache)]
    assert main(["data", "info", *args]) == 0
    assert "not prepared" in capsys.readouterr().out
    assert main(["data", "prepare", *args, "--data.prepare_workers", "1", "--json"]) == 0
    assert "prepared 12 images" in capsys.readouterr().out
    assert main(["data", "prepare", *args, "--json"]) == 0  # prepared already: found by its fingerprint
    out = capsys.readouterr().out
    result = json.loads(out[out.index("{\n"):])
    assert result["splits"] == {"train": 6, "test": 6} and result["classes"] == 2 and result["kind"] == "folder"
    assert result["path"].startswith(str(cache)) and result["bytes"] > 0
    assert main(["data", "info", *args]) == 0
    out = capsys.readouterr().out
    assert f"prepared in {result['path']}" in out and "train 6, test 6, 2 classes" in out


def test_prepare_from_a_config_with_overrides_and_one_line_errors(tmp_path, capsys):
    folder, cache = tmp_path / "imgs", tmp_path / "cache"
    write_jpeg_folder(folder, splits=("train",), per_class=4)
    (folder / "train" / "n01" / "broken.jpg").write_bytes(b"GIF89a not really")
    config = tmp_path / "x.yaml"
    config.write_text("data:\n  class_path: datamodules.images.ImageDataModule\n  init_args:\n    source: folder\n"
                      "    image_size: 8\n")
    args = ["--config", str(config), "--data.data_dir", str(folder), "--data.cache_dir", str(cache)]
    assert main(["data", "prepare", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar: one line
    assert err.startswith("data prepare: BadImageError: ") and "broken.jpg: cannot be decoded" in err
    assert "skip_bad_images" in err
    assert main(["data", "prepare", *args, "--data.skip_bad_images", "true"]) == 0
    out = capsys.readouterr().out
    assert "skipped 1 of 9 files" in out and "1 undecodable files skipped" in out and "in memory" in out
