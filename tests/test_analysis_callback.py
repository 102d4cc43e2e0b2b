"""analysis/callback.py and analysis/figures.py: the end-of-fit analysis in a tiny Lightning fit."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from analysis.callback import AttentionDistanceCallback, fixed_images
from analysis.distance import mean_attention_distance
from analysis.figures import (
    attention_distance_figure,
    filters_figure,
    position_similarity_figure,
    rollout_figure,
    save_figure,
    save_json,
)
from datamodules.images import ImageDataModule
from lightning_modules.image_classifier import ImageClassifier
from models.vit import ViT

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path) -> bool:
    return Path(path).read_bytes()[:8] == PNG


def test_callback_logs_numbers_and_figures_to_csv_and_wandb(tmp_path):
    torch.manual_seed(0)
    net = ViT(img_size=8, in_chans=1, num_classes=10, patch_size=2, embed_dim=32, depth=2, num_heads=2)
    module = ImageClassifier(net)
    data = ImageDataModule(source="digits", batch_size=32)
    callback = AttentionDistanceCallback(num_images=24, batch_size=10)
    run = tmp_path / "run"
    csv_logger = CSVLogger(run, name="", version="")
    wandb_logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="test-analysis")
    trainer = L.Trainer(
        accelerator="cpu", max_steps=3, limit_val_batches=1, logger=[csv_logger, wandb_logger],
        callbacks=[callback], enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    trainer.fit(module, datamodule=data)
    wandb_logger.experiment.finish()  # Lightning leaves the run open; close it as the CLI does

    # numbers: the same as computing the distance on the first 24 validation images by hand
    images = torch.stack([data.val_dataset[i][0] for i in range(24)])
    expected = mean_attention_distance(net, images, num_images=24)
    result = json.loads((run / "analysis" / "attention_distance.json").read_text())
    assert result["num_images"] == 24 and result["class_token"] == "drop"
    got = torch.tensor([row["heads"] for row in result["attention_distance"]], dtype=torch.float64)
    torch.testing.assert_close(got, expected)
    assert module.net.training  # the analysis put the net back into training mode

    # metrics: analysis/mad_layer{l} (mean over heads) in metrics.csv
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    logged = [r for r in rows if r.get("analysis/mad_layer1")]
    assert len(logged) == 1
    for layer in (1, 2):
        assert float(logged[0][f"analysis/mad_layer{layer}"]) == pytest.approx(float(expected[layer - 1].mean()))

    # figures: next to the metrics, and in the W&B run
    for name in ("attention_distance.png", "position_similarity.png"):
        assert is_png(run / "analysis" / name)
    assert set(result["figures"]) == {"attention_distance", "position_similarity"}
    assert result["position_similarity"]["stem"].keys() == {"same_row_or_column", "other"}
    media = sorted(p.name for p in tmp_path.glob("wandb/*run-*/files/media/images/analysis/*.png"))
    assert any(n.startswith("attention_distance") for n in media)
    assert any(n.startswith("position_similarity") for n in media)


def test_fixed_images_are_the_first_validation_images():
    data = ImageDataModule(source="digits", batch_size=32)
    data.setup("fit")

    class FakeTrainer:
        datamodule = data
        val_dataloaders = None

    images = fixed_images(FakeTrainer(), 5)
    torch.testing.assert_close(images, torch.stack([data.val_dataset[i][0] for i in range(5)]))


def test_callback_validates_its_arguments():
    with pytest.raises(ValueError, match="num_images=0"):
        AttentionDistanceCallback(num_images=0)
    with pytest.raises(ValueError, match="class_token='cls'"):
        AttentionDistanceCallback(class_token="cls")


def test_figures_write_png_files_atomically(tmp_path):
    mads = {"ViT": torch.rand(4, 3) * 10, "hybrid": torch.rand(4, 3) * 10}
    figures = {
        "distance": attention_distance_figure(mads),
        "rollout": rollout_figure(torch.rand(3, 1, 8, 8), torch.rand(3, 8, 8), titles=["a", "b", "c"]),
        "posemb": position_similarity_figure(torch.rand(3, 4, 3, 4) * 2 - 1),
        "filters": filters_figure(torch.randn(5, 3, 4, 4), explained=torch.full((5,), 0.2)),
    }
    for name, fig in figures.items():
        assert is_png(save_figure(fig, tmp_path / f"{name}.png"))
    assert len(figures["distance"].axes) == 2  # side by side
    save_json(tmp_path / "n.json", {"a": 1})
    assert json.loads((tmp_path / "n.json").read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"{n}.png" for n in figures] + ["n.json"])


def test_it_analyses_a_vit_and_leaves_other_nets_and_sharded_ones_alone():
    """A ResNet variant of a ViT sweep keeps the ViT config's callback: it does nothing there, nor for a net
    sharded over processes; for a ViT in a plain trainer it analyses."""
    import inspect
    from types import SimpleNamespace

    from analysis.callback import analysable
    from models.resnet import ResNet

    vit = ImageClassifier(ViT(img_size=8, in_chans=1, num_classes=10, patch_size=2, embed_dim=16, depth=1,
                              num_heads=2))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert analysable(trainer, vit)
    for sharded in ("FSDPStrategy", "ModelParallelStrategy", "DeepSpeedStrategy"):
        assert not analysable(SimpleNamespace(strategy=type(sharded, (), {})()), vit)
    kwargs = {k: v for k, v in {"in_chans": 1, "num_classes": 10}.items() if k in inspect.signature(ResNet).parameters}
    resnet = ImageClassifier(ResNet(**kwargs))
    assert not analysable(trainer, resnet)
    callback = AttentionDistanceCallback()
    callback.on_fit_end(SimpleNamespace(strategy=trainer.strategy), resnet)  # touches nothing of the trainer's
    assert callback.results is None and callback.figures == {}


def _net_and_callbacks(config: dict) -> tuple[str, list[str]]:
    net = config["model"]["init_args"]["net"]["class_path"]
    return net, [c["class_path"] for c in (config.get("trainer") or {}).get("callbacks") or []]


def test_every_vit_config_and_every_sweep_list_of_callbacks_keeps_the_analysis():
    """The analysis is wired from the experiment's configs: every config whose net is a ViT (plain, hybrid,
    conv stem) lists the callback and the ResNet configs do not; a sweep that sets ``trainer.callbacks``
    (which replaces the config's list) keeps it."""
    import yaml

    repo = Path(__file__).resolve().parents[1]
    name = "analysis.callback.AttentionDistanceCallback"
    seen = {}
    for path in sorted((repo / "reproductions/vit/configs").glob("*.yaml")):
        net, callbacks = _net_and_callbacks(yaml.safe_load(path.read_text()))
        seen[path.name] = net
        assert (name in callbacks) is net.rsplit(".", 1)[-1].endswith("ViT"), (path.name, net, callbacks)
    assert sum(n.endswith("ViT") for n in seen.values()) >= 10 and any(n.endswith("ResNet") for n in seen.values())
    lists = 0
    for path in sorted((repo / "reproductions").glob("*/sweeps/*.yaml")):
        sweep = yaml.safe_load(path.read_text())
        places = [sweep.get("overrides") or {}] + [p.get("overrides") or {} for p in (sweep.get("profiles") or {}).values()]
        for overrides in places:
            if overrides.get("run.test_after_fit") is False:
                continue  # a validation-only search (vit/tune): never tested, nothing to analyse
            if "trainer.callbacks" in overrides and path.parent.parent.name == "vit":
                lists += 1
                assert name in [c["class_path"] for c in overrides["trainer.callbacks"]], path.name
    assert lists >= 4  # hybrid and data_size, each at its base and smoke


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("switch, expected", [([], True), (["--trainer.callbacks=[]"], False)])
def test_a_vit_config_fit_ends_with_the_analysis_unless_its_callbacks_are_emptied(switch, expected, tmp_path):
    from tests.cli_helpers import TINY, repro

    result = repro("fit", "--config", "reproductions/vit/configs/digits.yaml", "--run.root", str(tmp_path), *TINY,
                   "--trainer.max_epochs", "1", *switch, case="attention analysis at the end of a ViT fit")
    assert result.returncode == 0, result.output[-3000:]
    run = tmp_path / "vit" / "digits" / "default" / "seed0"
    assert (run / "analysis" / "attention_distance.png").exists() is expected
    with open(run / "metrics.csv", newline="") as f:
        assert ("analysis/mad_layer1" in next(csv.reader(f))) is expected
