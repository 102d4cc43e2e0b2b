"""The new recipes through the CLI (``python -m reproductions fit``), each on a tiny generated folder in its layout:
the ImageNet configs (ViT-S/16, ViT-B/16, R50+ViT-B/16 with the DeiT recipe) on train/<wnid>/ + val/<wnid>/ JPEGs,
the CPU-sized 32 px recipe on a 32 px folder; and the sweeps' imagenet profiles build."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from reproductions.run.cli import main as cli_main
from reproductions.run.results import RESULTS_FILE
from tests.cli_helpers import QUIET, build_only
from tests.images_helpers import isolated  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
IMAGENET_CONFIGS = ["imagenet_vit_s16.yaml", "imagenet_vit_b16.yaml", "imagenet_hybrid_r50_b16.yaml"]


def tiny_folder(root: Path, splits: tuple[str, str], size: tuple[int, int], per_class: int = 3) -> Path:
    """2 classes of small JPEGs (sizes vary a little, as ImageNet's do when ``size`` differs per image)."""
    rng = np.random.default_rng(0)
    for split in splits:
        for k in range(2):
            d = root / split / f"n0{k}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                h, w = size[0] + (i % 2) * 3, size[1] - (i % 3)
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(d / f"{i}.JPEG", quality=85)
    return root


@pytest.mark.parametrize("config", IMAGENET_CONFIGS)
def test_imagenet_configs_fast_dev_run_on_a_tiny_imagenet_folder(config, tmp_path):
    folder = tiny_folder(tmp_path / "imagenet", ("train", "val"), (20, 26))
    path = f"reproductions/vit/configs/{config}"
    cfg = yaml.safe_load((REPO / path).read_text())
    assert cfg["data"]["init_args"]["source"] == "imagenet"
    assert cfg["model"]["init_args"]["net"]["init_args"]["img_size"] == 224
    header = (REPO / path).read_text().split("seed_everything")[0]
    assert "Measured: not yet run" in header and ("79.8" in header or "81.8" in header)
    # the recipe and data path as configured; the net made small (1 block, 1-block CNN stages) and float32, so
    # that a CPU runs a 224 px step in seconds (bf16 convolutions are slow on CPUs)
    small = ["--model.net.init_args.depth", "1", "--trainer.precision", "32-true"]
    if "hybrid" in config:
        small += ["--model.net.init_args.backbone_layers", "[1, 1, 1, 1]"]
    cli_main(["fit", "--config", path, "--run.root", str(tmp_path / "runs"), "--trainer.fast_dev_run", "true", *QUIET,
              "--data.data_dir", str(folder), "--data.cache_dir", str(tmp_path / "cache"), "--data.batch_size", "4",
              "--data.eval_batch_size", "4", "--data.num_workers", "0", "--model.net.init_args.num_classes", "2",
              *small])  # fmt: skip
    assert not list((tmp_path / "runs").rglob(RESULTS_FILE))  # a smoke run is not a result


def test_the_cpu_32px_recipe_fast_dev_runs_on_a_tiny_32px_folder(tmp_path):
    folder = tiny_folder(tmp_path / "cifar", ("train", "test"), (32, 32))
    for k in range(2):  # one size for all: held in memory, as CIFAR-10 is
        for p in (folder / "train" / f"n0{k}").iterdir():
            Image.open(p).convert("RGB").resize((32, 32)).save(p)
        for p in (folder / "test" / f"n0{k}").iterdir():
            Image.open(p).convert("RGB").resize((32, 32)).save(p)
    path = "reproductions/vit/configs/convstem_cifar10_cpu.yaml"
    header = (REPO / path).read_text().split("seed_everything")[0]
    assert "Not yet measured on CIFAR-10" in header and "convstem_fashion_mnist.yaml" in header
    assert yaml.safe_load((REPO / path).read_text())["trainer"]["max_epochs"] == 35
    cli_main(["fit", "--config", path, "--run.root", str(tmp_path / "runs"), "--trainer.fast_dev_run", "true", *QUIET,
              "--data.source", "folder", "--data.data_dir", str(folder), "--data.cache_dir", str(tmp_path / "cache"),
              "--data.batch_size", "4", "--model.net.init_args.num_classes", "2"])  # fmt: skip


@pytest.mark.parametrize("sweep", ["vit/position", "vit/patch_size", "vit/pooling"])
def test_the_imagenet_profiles_build_through_the_cli(sweep, tmp_path):
    """The first run of each sweep's imagenet profile parses and instantiates (no training, no data read)."""
    from reproductions.sweeping.plan import make_plan

    folder = tiny_folder(tmp_path / "imagenet", ("train", "val"), (20, 26), per_class=1)
    plan = make_plan(sweep, "imagenet", root=tmp_path / "runs", seeds=1)
    assert plan.runs and all("imagenet" in Path(r.args[2]).name for r in plan.runs)
    run = plan.runs[-1]
    cli = build_only([*run.args, "--data.data_dir", str(folder), "--data.cache_dir", str(tmp_path / "cache")], trainer=True)
    cfg = cli.config["fit"].as_dict()
    assert cfg["trainer"]["precision"] == "bf16-mixed" and cfg["model"]["init_args"]["compile"] is True
    assert cli.model.net.num_classes == 1000 and cli.datamodule.augment == "random_resized_crop"
