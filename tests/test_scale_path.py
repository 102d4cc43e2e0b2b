"""The GPU and multi-node path, checked on a CPU: torch.compile, channels_last, fused attention,
learning-rate scaling with the global batch, the FSDP overlay (its runs: test_fsdp.py), the global batch split over
devices x nodes, and the launchers' commands (torchrun, SLURM)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml

from lightning_modules.base import (
    LR_SCALINGS,
    global_batch_size,
    is_compiled,
    scaled_lr,
)
from lightning_modules.ctr import CTRModule
from lightning_modules.image_classifier import ImageClassifier
from models.ctr import BST
from models.vit import explicit_attention
from tests.cli_helpers import build_only
from tests.helpers import TinyData
from tests.helpers import quiet_trainer as trainer
from tests.tiny_models import tiny_resnet
from tests.tiny_models import tiny_vit as tiny_gray_vit

REPO = Path(__file__).resolve().parents[1]
CIFAR = "reproductions/vit/configs/cifar10.yaml"
DIGITS = "reproductions/vit/configs/digits.yaml"
FSDP = "reproductions/vit/configs/overlays/fsdp.yaml"
GPU_SWEEPS = ["vit/position", "vit/patch_size", "vit/pooling", "vit/attention", "bst/position", "bst/table"]
CL = torch.channels_last




#: the tiny ViT on RGB images, as this file's batches are
tiny_vit = functools.partial(tiny_gray_vit, in_chans=3)


# --------------------------------------------------------------------------- fused attention


def test_default_vit_training_forward_goes_through_scaled_dot_product_attention(monkeypatch):
    """The training forward of a default ViT calls F.scaled_dot_product_attention once per
    block (timm's fused path); the explicit path (analysis) and additive scoring never do."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    module = ImageClassifier(tiny_vit(depth=3)).train()
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,))
    loss = module._shared_step((x, y), module.train_acc)
    loss.backward()
    assert len(calls) == 3  # one fused call per block
    assert calls[0] == (4, 2, 16 + 1, 8)  # (B, heads, tokens incl. the class token, head dim)
    assert all(p.grad is not None for p in module.net.parameters() if p.requires_grad)

    calls.clear()
    with explicit_attention(module.net) as weights:
        module.net(x)
    assert calls == [] and len(weights) == 3  # the analysis path computes the softmax by hand
    module.net(x)
    assert len(calls) == 3  # and the fused path is back after the context
    calls.clear()
    ImageClassifier(tiny_vit(attention="additive")).net(x)
    assert calls == []


# --------------------------------------------------------------------------- torch.compile


def test_compile_is_in_place_and_checkpoints_keep_plain_keys():
    """compile=True compiles the net in configure_model (lazily: nothing is traced until the
    first call), in place: the state_dict keys carry no ``_orig_mod.`` prefix, so a compiled
    module's state loads strictly into an uncompiled one and vice versa."""
    torch.manual_seed(0)
    compiled = ImageClassifier(tiny_vit(), compile=True)
    plain = ImageClassifier(tiny_vit())
    assert not is_compiled(compiled.net)  # only the trainer's configure_model compiles
    compiled.configure_model()
    plain.configure_model()
    assert is_compiled(compiled.net) and not is_compiled(plain.net)
    impl = compiled.net._compiled_call_impl
    compiled.configure_model()  # called again by every fit/validate/test: compiles once
    assert compiled.net._compiled_call_impl is impl
    keys = list(compiled.state_dict())
    assert not [k for k in keys if "_orig_mod" in k]
    assert keys == list(plain.state_dict())
    assert compiled.net is compiled._modules["net"]  # the module itself, no OptimizedModule wrapper
    plain.load_state_dict(compiled.state_dict(), strict=True)
    compiled.load_state_dict(ImageClassifier(tiny_vit()).state_dict(), strict=True)
    assert torch.equal(compiled.net.head.weight, compiled.state_dict()["net.head.weight"])
    with pytest.raises(ValueError, match="compile_mode='fast' is not one of"):
        ImageClassifier(tiny_vit(), compile=True, compile_mode="fast")


def test_ctr_module_compiles_in_place_too():
    net = BST(n_items=10, n_categories=4, item_dim=4, category_dim=4, position_dim=4, num_heads=2, mlp_dims=(8,))
    module = CTRModule(net, compile=True)
    keys = list(module.state_dict())
    module.configure_model()
    assert is_compiled(module.net) and list(module.state_dict()) == keys
    assert not is_compiled(CTRModule(BST(n_items=10, n_categories=4, item_dim=4, category_dim=4, position_dim=4,
                                         num_heads=2, mlp_dims=(8,))).net)


@pytest.mark.slow
def test_compiled_vit_trains_on_cpu_and_its_checkpoint_loads_uncompiled(tmp_path):
    """One real training step through torch.compile (inductor on the CPU; about a minute), then
    the checkpoint loads strictly into an uncompiled module that computes the same logits."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    module = ImageClassifier(tiny_vit(), compile=True, lr=1e-2, warmup_steps=0)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    t = trainer(max_steps=1, limit_val_batches=0)
    t.fit(module, datamodule=TinyData(shape=(3, 8, 8)))
    assert t.global_step == 1 and is_compiled(module.net)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the step really ran compiled
    assert not torch.equal(before["net.head.weight"], module.state_dict()["net.head.weight"])
    ckpt = tmp_path / "compiled.ckpt"
    t.save_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=False)["state_dict"]
    assert not [k for k in state if "_orig_mod" in k]
    plain = ImageClassifier.load_from_checkpoint(ckpt, net=tiny_vit(), compile=False, strict=True)
    assert not is_compiled(plain.net)
    x = torch.randn(4, 3, 8, 8)
    module.eval()
    plain.eval()
    with torch.no_grad():
        assert torch.allclose(module(x), plain(x), atol=1e-5)


# --------------------------------------------------------------------------- channels_last


def test_channels_last_converts_conv_weights_and_the_input_and_keeps_vit_results():
    torch.manual_seed(0)
    plain = ImageClassifier(tiny_vit())
    cl = ImageClassifier(tiny_vit(), channels_last=True)
    cl.load_state_dict(plain.state_dict())  # same weights; the copy keeps the channels_last strides
    weight = cl.net.patch_embed.proj.weight  # (D, C, p, p): the ViT's one convolution
    assert weight.is_contiguous(memory_format=CL) and not weight.is_contiguous()
    assert plain.net.patch_embed.proj.weight.is_contiguous()
    seen = {}
    cl.net.patch_embed.proj.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    x = torch.randn(4, 3, 8, 8)
    assert x.is_contiguous() and not x.is_contiguous(memory_format=CL)
    with torch.no_grad():
        out_cl, out_plain = cl.eval()(x), plain.eval()(x)
    assert seen["x"].is_contiguous(memory_format=CL) and not seen["x"].is_contiguous()
    assert torch.allclose(out_cl, out_plain, atol=1e-5)  # a layout, not a different model


def test_channels_last_trains_a_cnn_and_keeps_the_layout():
    torch.manual_seed(0)
    module = ImageClassifier(tiny_resnet(), channels_last=True, warmup_steps=0)
    convs = [m.weight for m in module.net.modules() if isinstance(m, torch.nn.Conv2d) and m.weight.shape[1] > 1
             and m.weight.shape[-1] > 1]
    assert convs and all(w.is_contiguous(memory_format=CL) and not w.is_contiguous() for w in convs)
    before = [w.detach().clone() for w in convs]
    t = trainer(max_steps=2, limit_val_batches=0)
    t.fit(module, datamodule=TinyData(shape=(3, 16, 16)))
    assert t.global_step == 2
    assert all(not torch.equal(a, w) for a, w in zip(before, convs))  # trained ...
    assert all(w.is_contiguous(memory_format=CL) for w in convs)  # ... in place, still channels_last


# --------------------------------------------------------------------------- learning-rate scaling


def test_lr_scaling_arithmetic():
    assert LR_SCALINGS == ("none", "linear", "sqrt")
    assert scaled_lr(1e-3, lr_scaling="none", global_batch=4096, base_batch_size=None) == 1e-3
    assert scaled_lr(1e-3, lr_scaling="none", global_batch=None, base_batch_size=256) == 1e-3
    assert scaled_lr(1e-3, lr_scaling="linear", global_batch=1024, base_batch_size=256) == pytest.approx(4e-3)
    assert scaled_lr(1e-3, lr_scaling="linear", global_batch=128, base_batch_size=256) == pytest.approx(5e-4)
    assert scaled_lr(1e-3, lr_scaling="sqrt", global_batch=1024, base_batch_size=256) == pytest.approx(2e-3)
    assert scaled_lr(3e-4, lr_scaling="sqrt", global_batch=512, base_batch_size=256) == pytest.approx(3e-4 * math.sqrt(2))
    with pytest.raises(ValueError, match="needs base_batch_size"):
        scaled_lr(1e-3, lr_scaling="linear", global_batch=1024, base_batch_size=None)
    with pytest.raises(ValueError, match="needs the global batch size"):
        scaled_lr(1e-3, lr_scaling="sqrt", global_batch=None, base_batch_size=256)
    with pytest.raises(ValueError, match=r"lr_scaling='cubic' is not one of \['none', 'linear', 'sqrt'\]"):
        scaled_lr(1e-3, lr_scaling="cubic", global_batch=1, base_batch_size=1)
    # up front, at construction
    with pytest.raises(ValueError, match="needs base_batch_size"):
        ImageClassifier(tiny_vit(), lr_scaling="linear")
    with pytest.raises(ValueError, match="base_batch_size=0"):
        CTRModule(BST(n_items=10, n_categories=4, mlp_dims=(8,)), lr_scaling="sqrt", base_batch_size=0)
    # the global batch: the DataModule's batch_size (already global) x gradient accumulation
    assert global_batch_size(SimpleNamespace(datamodule=SimpleNamespace(batch_size=64), accumulate_grad_batches=4)) == 256
    assert global_batch_size(SimpleNamespace(datamodule=None, accumulate_grad_batches=1)) is None


@pytest.mark.parametrize(
    "rule, accumulate, factor",
    [("none", 1, 1.0), ("linear", 1, 2.0), ("sqrt", 1, math.sqrt(2.0)), ("linear", 2, 4.0)],
)
def test_image_classifier_optimiser_gets_the_scaled_lr(rule, accumulate, factor):
    """Global batch 16 (x accumulation), tuned for 8: the optimiser's peak lr is lr x factor."""
    module = ImageClassifier(tiny_vit(), lr=1e-3, warmup_steps=0, lr_scaling=rule,
                             base_batch_size=None if rule == "none" else 8)
    t = trainer(max_steps=1, limit_val_batches=0, accumulate_grad_batches=accumulate)
    t.fit(module, datamodule=TinyData(batch_size=16, shape=(3, 8, 8)))
    assert module.global_batch_size == 16 * accumulate
    assert module.effective_lr == pytest.approx(1e-3 * factor)
    assert t.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(1e-3 * factor)
    assert module.hparams.lr == 1e-3  # the configured value stays what the config says


def test_ctr_module_optimiser_gets_the_scaled_lr():
    net = BST(n_items=10, n_categories=4, item_dim=4, category_dim=4, position_dim=4, num_heads=2, mlp_dims=(8,))
    module = CTRModule(net, lr=1e-3, lr_scaling="linear", base_batch_size=256)
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(batch_size=1024), accumulate_grad_batches=1)
    optimizer = module.configure_optimizers()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(4e-3) and module.effective_lr == pytest.approx(4e-3)
    module = CTRModule(net, lr=1e-3)  # default: no scaling, whatever the batch
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(batch_size=1024), accumulate_grad_batches=1)
    assert module.configure_optimizers().param_groups[0]["lr"] == 1e-3


def test_a_run_records_its_effective_lr_in_hparams_and_results(tmp_path):
    from reproductions.run.cli import main as cli_main

    root = tmp_path / "runs"
    with contextlib.redirect_stdout(io.StringIO()):
        cli_main(["fit", "--config", DIGITS, "--run.root", str(root), "--trainer.max_epochs", "1",
                  "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
                  "--trainer.limit_test_batches", "1", "--trainer.enable_progress_bar", "false",
                  "--trainer.enable_model_summary", "false", "--model.net.init_args.depth", "1",
                  "--model.net.init_args.embed_dim", "16", "--model.net.init_args.num_heads", "2",
                  "--data.batch_size", "64", "--model.init_args.lr", "0.001",
                  "--model.init_args.lr_scaling", "linear", "--model.init_args.base_batch_size", "16"])
    run = root / "vit" / "digits" / "default" / "seed0"
    results = json.loads((run / "results.json").read_text())
    assert results["training"]["lr_scaling"] == "linear"
    assert results["training"]["effective_lr"] == pytest.approx(0.004)  # 1e-3 x 64 / 16
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    assert hparams["optim/effective_lr"] == pytest.approx(0.004)
    assert hparams["optim/global_batch_size"] == 64 and hparams["lr"] == 0.001


# --------------------------------------------------------------------------- global batch over devices x nodes


def test_global_batch_is_split_over_devices_times_nodes():
    """ImageDataModule divides data.batch_size by trainer.world_size = devices x num_nodes."""
    from datamodules.images import ImageDataModule

    t = L.Trainer(accelerator="cpu", devices=2, num_nodes=3, strategy="ddp", logger=False)  # not launched
    assert t.world_size == 6
    dm = ImageDataModule(source="digits", batch_size=48, eval_batch_size=96)
    dm.trainer = t
    dm._set_batch_sizes()
    assert (dm.per_device_batch_size, dm.per_device_eval_batch_size) == (8, 16)
    dm = ImageDataModule(source="digits", batch_size=64)
    dm.trainer = t
    with pytest.raises(ValueError, match=r"batch_size=64 is not divisible by the world size 6 \(devices x nodes\)"):
        dm._set_batch_sizes()


# --------------------------------------------------------------------------- FSDP


@pytest.mark.subprocess
def test_fsdp_overlay_prints_a_complete_config():
    proc = subprocess.run([sys.executable, "-m", "reproductions", "fit", "--config", CIFAR, "--config", FSDP,
                           "--print_config"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load(proc.stdout)
    strategy = cfg["trainer"]["strategy"]
    assert strategy["class_path"] == "lightning_modules.sharding.FSDP2Strategy"
    assert strategy["init_args"]["mixed_precision"] == "auto"
    assert strategy["init_args"]["activation_checkpointing"] is False
    assert strategy["init_args"]["save_distributed_checkpoint"] is False
    assert cfg["model"]["init_args"]["net"]["class_path"] == "models.vit.ViT"  # the experiment is intact
    # the strategy itself, sharding and its checkpoints: tests/test_fsdp.py


def test_overlays_do_not_name_the_experiment():
    from reproductions.run.cli import experiment_name

    assert experiment_name([REPO / CIFAR, REPO / FSDP]) == "vit/cifar10"
    assert experiment_name([REPO / FSDP, REPO / CIFAR]) == "vit/cifar10"
    assert experiment_name([REPO / DIGITS]) == "vit/digits"


def test_weight_decay_groups_survive_fsdp_flattening():
    """Lightning's FSDP1 strategy (by hand; the overlay is FSDP2) with use_orig_params replaces every parameter's data by a flat 1-D view of its shard
    after configure_model; groups made then would decay nothing. The module makes them in
    configure_model, before the wrapping, and keeps them by parameter identity."""

    def flatten(module):  # what FSDP does to each original parameter
        for p in module.net.parameters():
            p.data = p.data.reshape(-1)

    def decayed(module, groups):
        names = {id(p): n for n, p in module.net.named_parameters()}
        return {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}

    stub = SimpleNamespace(estimated_stepping_batches=10, datamodule=None, accumulate_grad_batches=1)
    module = ImageClassifier(tiny_vit(), weight_decay=0.1)
    module.configure_model()
    flatten(module)
    module._trainer = stub
    groups = module.configure_optimizers()["optimizer"].param_groups
    reference = ImageClassifier(tiny_vit(), weight_decay=0.1)
    reference._trainer = stub
    expected = decayed(reference, reference.configure_optimizers()["optimizer"].param_groups)
    assert "blocks.0.attn.qkv.weight" in expected and "pos_embed" not in expected
    assert decayed(module, groups) == expected
    late = ImageClassifier(tiny_vit(), weight_decay=0.1)  # groups made after flattening: the bug
    flatten(late)
    late._trainer = stub
    assert decayed(late, late.configure_optimizers()["optimizer"].param_groups) == set()


def test_norm_clipping_goes_through_fsdp_clip_grad_norm():
    """Lightning refuses norm clipping under FSDP1; the module calls the root FSDP module's
    clip_grad_norm_ (global norm over all shards) instead, and leaves other strategies alone."""
    from lightning.pytorch.strategies import FSDPStrategy, SingleDeviceStrategy
    from lightning.pytorch.utilities import GradClipAlgorithmType

    clipped = []
    module = ImageClassifier(tiny_vit())
    module._trainer = SimpleNamespace(strategy=FSDPStrategy(), model=SimpleNamespace(clip_grad_norm_=clipped.append))
    module.configure_gradient_clipping(None, 1.0, GradClipAlgorithmType.NORM)  # what the trainer passes
    assert clipped == [1.0]
    module.configure_gradient_clipping(None, 0.5, None)
    assert clipped == [1.0, 0.5]
    module.configure_gradient_clipping(None, None, None)
    assert clipped == [1.0, 0.5]  # nothing to clip
    default = []
    module.clip_gradients = lambda opt, gradient_clip_val=None, gradient_clip_algorithm=None: default.append(
        (gradient_clip_val, gradient_clip_algorithm))
    module._trainer = SimpleNamespace(strategy=SingleDeviceStrategy(torch.device("cpu")))
    module.configure_gradient_clipping(None, 1.0, "norm")
    assert clipped == [1.0, 0.5] and default == [(1.0, "norm")]


# --------------------------------------------------------------------------- gpu profiles and launchers


@pytest.mark.parametrize("sweep", GPU_SWEEPS)
def test_gpu_profiles_use_bf16_and_compile(sweep):
    from reproductions.sweeping.spec import load_sweep

    s = load_sweep(sweep)
    gpu_profiles = [p for name, p in s.profiles.items() if name.startswith("gpu")]
    assert gpu_profiles
    for p in gpu_profiles:
        assert p.overrides["trainer.precision"] == "bf16-mixed", (sweep, p.name)
        assert p.overrides["model.init_args.compile"] is True, (sweep, p.name)
    for name in ("smoke", "cpu"):
        assert "model.init_args.compile" not in s.profile(name).overrides  # CPU runs stay uncompiled


def test_gpu_profile_builds_with_compile_through_the_cli(tmp_path):
    from reproductions.sweeping.plan import make_plan

    run = make_plan("vit/position", "gpu", root=tmp_path, seeds=1).runs[0]
    cli = build_only(run.args)
    assert cli.model.hparams.compile is True and cli.trainer_config["precision"] == "bf16-mixed"


def test_slurm_dry_run_writes_srun_and_torchrun_writes_the_distributed_launcher(tmp_path):
    from reproductions.commands.sweep import main as sweep_main

    out = io.StringIO()
    assert sweep_main(["vit/position", "--profile", "gpu", "--launcher", "slurm", "--devices", "4", "--dry-run",
                       "--root", str(tmp_path), "--sbatch=--partition=gpu"], out=out) == 0
    script = out.getvalue()
    for line in ("#!/bin/bash", "#SBATCH --array=0-", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=gpu", 'srun bash -c "$CMD"', 'CMD="${COMMANDS[$SLURM_ARRAY_TASK_ID]}"'):
        assert line in script, line
    assert "--trainer.devices 4 --trainer.strategy ddp" in script
    assert "--model.init_args.compile true" in script and "--trainer.precision bf16-mixed" in script
    assert not list(tmp_path.iterdir())  # a dry run writes nothing

    out = io.StringIO()
    assert sweep_main(["vit/position", "--profile", "gpu", "--launcher", "torchrun", "--devices", "2", "--dry-run",
                       "--root", str(tmp_path)], out=out) == 0
    assert "-m torch.distributed.run --standalone --nproc-per-node 2 -m reproductions fit" in out.getvalue()
