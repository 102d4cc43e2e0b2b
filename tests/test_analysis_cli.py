"""``python -m reproductions analyze``: on a checkpoint trained through the CLI and on timm models."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
import torch

from reproductions.__main__ import main as repro_main
from reproductions.commands.analyze import main as analyze_main
from reproductions.run.cli import main as cli_main

pytestmark = pytest.mark.xdist_group("analysis-cli")  # the tests share one trained run (module fixture)

PNG = b"\x89PNG\r\n\x1a\n"
DIGITS = "reproductions/vit/configs/digits.yaml"
TIMM = ["--timm", "vit_tiny_patch16_224", "--img-size", "32"]  # a 2x2 grid of 16-pixel patches


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny ViT fit through the CLI, with the end-of-fit analysis callback: its run directory."""
    root = tmp_path_factory.mktemp("runs")
    cli_main([
        "fit", "--config", DIGITS, "--run.root", str(root), "--run.test_after_fit", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--model.net.init_args.depth", "2", "--model.net.init_args.embed_dim", "32",
        "--model.net.init_args.num_heads", "2", "--trainer.max_epochs", "1",
        "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2",
        "--trainer.callbacks+=analysis.callback.AttentionDistanceCallback",
        "--trainer.callbacks.num_images", "32",
    ])
    return root / "vit" / "digits" / "default" / "seed0"


def analyze(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return analyze_main(list(args), out=out), out.getvalue()


def is_png(path) -> bool:
    return Path(path).read_bytes()[:8] == PNG


def test_distance_on_a_checkpoint_matches_the_end_of_fit_callback(run):
    callback = json.loads((run / "analysis" / "attention_distance.json").read_text())
    code, printed = analyze("distance", "--ckpt", str(run / "checkpoints" / "last.ckpt"), "--num-images", "32")
    assert code == 0
    result = json.loads((run / "analysis" / "attention_distance.json").read_text())  # default --out
    (model,) = result["models"].values()
    assert model["kind"] == "ViT" and model["num_images"] == 32 and model["grid_size"] == [4, 4]
    assert model["pixels_per_token"] == [2.0, 2.0] and model["num_prefix_tokens"] == 1
    # same checkpoint, same validation images, same normalisation: the same numbers
    for got, want in zip(model["layers"], callback["attention_distance"]):
        assert got["heads"] == pytest.approx(want["heads"], rel=1e-6)
    assert is_png(result["figure"]) and "layer    mean     min     max" in printed


def test_rollout_posemb_filters_on_a_checkpoint(run, tmp_path):
    ckpt = str(run / "checkpoints" / "last.ckpt")
    for command in ("rollout", "posemb", "filters"):
        code, printed = analyze(command, "--ckpt", ckpt, "--out", str(tmp_path), "--num-maps", "3")
        assert code == 0, command
        assert f"written to {tmp_path}" in printed
    rollout = json.loads((tmp_path / "rollout.json").read_text())
    assert len(rollout["maps"]) == 3 and rollout["head_fusion"] == "mean"
    assert torch.tensor(rollout["maps"][0]["map"]).shape == (4, 4) and max(max(r) for r in rollout["maps"][0]["map"]) == 1
    posemb = json.loads((tmp_path / "position_similarity.json").read_text())
    sim = torch.tensor(posemb["tables"]["stem"]["similarity"])
    assert sim.shape == (16, 16)
    torch.testing.assert_close(sim.diagonal(), torch.ones(16), atol=1e-4, rtol=0)
    filters = json.loads((tmp_path / "patch_filters_pca.json").read_text())
    assert filters["filter_shape"] == [1, 2, 2] and len(filters["explained_variance_ratio"]) == 4
    for name in ("rollout.png", "position_similarity.png", "patch_filters_pca.png"):
        assert is_png(tmp_path / name)
    assert not list(tmp_path.glob("*.tmp"))


def test_timm_model_from_a_local_weights_file(tmp_path):
    """--weights: the file's position table is the one analysed; grey digits feed an RGB model."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32)
    save_file(model.state_dict(), str(tmp_path / "w.safetensors"))
    code, printed = analyze("posemb", *TIMM, "--weights", str(tmp_path / "w.safetensors"), "--out", str(tmp_path))
    assert code == 0
    table = torch.nn.functional.normalize(model.pos_embed[0, 1:].detach(), dim=-1)
    sim = torch.tensor(json.loads((tmp_path / "position_similarity.json").read_text())["tables"]["stem"]["similarity"])
    torch.testing.assert_close(sim, table @ table.T, atol=1e-4, rtol=0)
    code, printed = analyze("rollout", *TIMM, "--weights", str(tmp_path / "w.safetensors"), "--out", str(tmp_path),
                            "--num-maps", "2")
    assert code == 0 and "no --data-source: using digits" in printed


def test_distance_side_by_side_with_the_default_timm_output(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the timm default output is runs/analysis/<name>/ under the working directory
    code = repro_main([
        "analyze", "distance", *TIMM, "--ckpt", str(run / "checkpoints" / "last.ckpt"),
        "--num-images", "4", "--label", "ours", "--label", "timm tiny",
    ])
    assert code == 0
    result = json.loads((run / "analysis" / "attention_distance.json").read_text())  # the first model's default
    assert list(result["models"]) == ["ours", "timm tiny"]
    assert result["models"]["timm tiny"]["pixels_per_token"] == [16.0, 16.0]
    assert len(result["models"]["timm tiny"]["layers"]) == 12
    code = repro_main(["analyze", "filters", *TIMM])
    assert code == 0 and is_png(tmp_path / "runs" / "analysis" / "vit_tiny_patch16_224" / "patch_filters_pca.png")


def test_the_notebooks_model_a_checkpoint_else_timm_else_the_shipped_one(run):
    """load_target (the notebook's ANALYSIS_CKPT / ANALYSIS_TIMM, neither: the shipped checkpoint)."""
    from reproductions.commands.analysis_inputs import DEMO_CKPT, load_target

    ckpt = run / "checkpoints" / "last.ckpt"
    target = load_target(str(ckpt), "vit_tiny_patch16_224")  # a checkpoint wins over a timm name
    assert target.run_dir == run and target.default_out == run / "analysis" and target.data_hparams["source"] == "digits"
    target = load_target(None, "vit_tiny_patch16_224", img_size=32)
    assert target.label == "vit_tiny_patch16_224" and target.img_size == (32, 32)
    # neither: the shipped Fashion-MNIST ViT; its analyses go under runs/, not into the repository
    for target in (load_target(), load_target(str(DEMO_CKPT))):
        assert target.label == "ViT fmnist_vit_p4" and target.origin == "reproductions/vit/demo/fmnist_vit_p4.ckpt"
        assert target.default_out == Path("runs/analysis/fmnist_vit_p4") and target.data_hparams["source"] == "fashion_mnist"
        assert target.img_size == (28, 28) and tuple(target.net.patch_embed.grid_size) == (7, 7)
        assert target.in_chans == 1 and len(target.net.blocks) == 4


def test_a_shipped_checkpoint_without_data_records_reads_fashion_mnist(run, tmp_path, monkeypatch):
    """A slim copy (weights and hyper-parameters only) still finds its images; a missing one is named."""
    from reproductions.commands import analysis_inputs as module

    raw = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    slim = tmp_path / "demo.ckpt"
    torch.save({k: raw[k] for k in ("state_dict", "hyper_parameters", "pytorch-lightning_version")}, slim)
    monkeypatch.setattr(module, "DEMO_CKPT", slim)
    target = module.load_target()
    assert target.data_hparams == {"source": "fashion_mnist"} and target.default_out == Path("runs/analysis/demo")
    monkeypatch.setattr(module, "DEMO_CKPT", tmp_path / "missing.ckpt")
    with pytest.raises(module.AnalyzeError, match="missing.ckpt is missing"):
        module.load_target()


def test_vit_and_hybrid_side_by_side(tmp_path):
    """A hybrid (timm HybridEmbed over a CNN of stride 4, our blocks): distances in CNN-stride pixels."""
    from reproductions.commands.analyze import Images, Target, run_distance
    from tests.tiny_models import attention_vit, timm_hybrid

    def images(size):
        x = torch.rand(4, 3, size, size)
        return Images(x, x, torch.zeros(4, dtype=torch.long), f"4 random {size}x{size} images")

    result = run_distance(
        [(Target(attention_vit(), "ViT", "test"), images(8)), (Target(timm_hybrid(), "hybrid", "test"), images(16))], tmp_path
    )
    assert [m["kind"] for m in result["models"].values()] == ["ViT", "hybrid"]
    assert result["models"]["hybrid"]["pixels_per_token"] == [4.0, 4.0]
    assert result["models"]["ViT"]["pixels_per_token"] == [2.0, 2.0]
    assert is_png(result["figure"]) and "mean attention distance (pixels) - hybrid" in result["summary"]


def test_pretrained_weights_offline_fail_fast_with_a_clear_message(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    code, _ = analyze("filters", *TIMM, "--pretrained")
    assert code == 2 and time.monotonic() - start < 20
    err = capsys.readouterr().err
    assert "not in the local cache and the hub cannot be used (HF_HUB_OFFLINE=1)" in err and "--weights FILE" in err


@pytest.mark.parametrize(
    "args,message",
    [
        (["distance"], "give a model"),
        (["filters", "--timm", "not_a_model_xyz"], "is not a timm model name"),
        (["filters", "--ckpt", "missing.ckpt"], "no such file"),
        (["rollout", "--timm", "vit_tiny_patch16_224", "--timm", "vit_small_patch16_224"], "rollout takes one model"),
        (["posemb", "--ckpt", "x.ckpt", "--weights", "w.pth"], "apply to --timm models"),
        (["distance", "--timm", "vit_tiny_patch16_224", "--label", "a", "--label", "b"], "2 --label for 1 models"),
    ],
)
def test_bad_requests_fail_with_a_clear_message(args, message, capsys):
    code, _ = analyze(*args)
    assert code == 2 and message in capsys.readouterr().err
