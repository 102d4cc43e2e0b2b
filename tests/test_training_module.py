"""lightning_modules/base.py: the TrainingModule both modules share (groups, lr, schedule, hparams)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.base import TrainingModule, warmup_schedule
from lightning_modules.ctr import CTRModule
from lightning_modules.image_classifier import ImageClassifier
from models.ctr import BST
from models.vit import ViT
from tests.tiny_models import tiny_vit, tiny_bst




def stub_trainer(steps: int = 100, batch_size: int | None = None):
    """What configure_optimizers reads from a trainer."""
    datamodule = SimpleNamespace(batch_size=batch_size) if batch_size else None
    return SimpleNamespace(estimated_stepping_batches=steps, datamodule=datamodule, accumulate_grad_batches=1)


def multipliers(config, steps: int) -> list[float]:
    """The schedule's lr multiplier per optimiser step, read off the LambdaLR."""
    scheduler = config["lr_scheduler"]["scheduler"]
    return [scheduler.lr_lambdas[0](s) for s in range(steps)]


# --------------------------------------------------------------------------- weight-decay groups


@pytest.mark.parametrize("pos_embed, placement", [("learned_1d", "stem"), ("learned_2d", "every_layer"),
                                                  ("sincos_2d", "stem"), ("relative", "stem")])
def test_only_weight_matrices_are_decayed(pos_embed, placement):
    """Matrices (qkv, proj, MLP, head, patch projection) decayed; norms, biases, every position
    embedding (even the 2-D and 3-D ones) and the class token not."""
    net = tiny_vit(pos_embed=pos_embed, pos_placement=placement)
    module = TrainingModule(net, weight_decay=0.1)
    module.configure_model()
    names = {id(p): n for n, p in net.named_parameters()}
    groups = module.parameter_groups()
    decayed = {names[id(p)] for g in groups if g["weight_decay"] == 0.1 for p in g["params"]}
    plain = {names[id(p)] for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert not decayed & plain and decayed | plain == set(names.values())
    positions = {n for n in names.values() if n.startswith(("pos_embed", "pos_stem")) or ".pos." in n or "rel_pos" in n}
    assert positions or pos_embed == "sincos_2d"  # sin-cos has no parameters
    assert positions | {"cls_token"} <= plain
    assert all(n.endswith(".bias") or "norm" in n for n in plain - positions - {"cls_token"}), plain
    expected = {n for n, p in net.named_parameters() if p.ndim >= 2} - positions - {"cls_token"}
    assert decayed == expected and {"blocks.0.attn.qkv.weight", "head.weight", "patch_embed.proj.weight"} <= decayed


def test_groups_are_made_once_in_configure_model_and_used_by_the_optimiser():
    module = ImageClassifier(tiny_vit(), weight_decay=0.1)
    module.configure_model()
    made = module._param_groups
    module.configure_model()  # called again by every fit/validate/test
    assert module._param_groups is made
    module._trainer = stub_trainer()
    optimizer = module.configure_optimizers()["optimizer"]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert [[id(p) for p in g["params"]] for g in optimizer.param_groups] == [[id(p) for p in g["params"]] for g in made]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0, 0.1]  # timm's order: no decay first


def test_ctr_groups_spare_embeddings_and_choose_adam():
    module = CTRModule(tiny_bst(), weight_decay=0.1, optimizer="adam")
    module._trainer = stub_trainer()
    optimizer = module.configure_optimizers()
    assert type(optimizer) is torch.optim.Adam
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert not any(id(m.weight) in decayed for m in module.net.modules() if isinstance(m, nn.Embedding))


# --------------------------------------------------------------------------- lr and schedule


@pytest.mark.parametrize("rule, factor", [("none", 1.0), ("linear", 4.0), ("sqrt", 2.0)])
def test_the_optimiser_gets_the_scaled_lr_and_the_config_keeps_its_own(rule, factor):
    for module in (ImageClassifier(tiny_vit(), lr=1e-3, lr_scaling=rule, base_batch_size=64),
                   CTRModule(tiny_bst(), lr=1e-3, lr_scaling=rule, base_batch_size=64)):
        module._trainer = stub_trainer(batch_size=256)
        config = module.configure_optimizers()
        optimizer = config["optimizer"] if isinstance(config, dict) else config
        assert module.effective_lr == pytest.approx(1e-3 * factor) and module.global_batch_size == 256
        assert all(g.get("initial_lr", g["lr"]) == pytest.approx(1e-3 * factor) for g in optimizer.param_groups)
        assert module.hparams.lr == 1e-3


def test_image_schedule_warms_up_over_a_fraction_or_given_steps_then_cosine():
    module = ImageClassifier(tiny_vit(), warmup_fraction=0.1, min_lr_ratio=0.2)
    module._trainer = stub_trainer(steps=50)
    assert module.lr_schedule() == dict(warmup_steps=5, total_steps=50, schedule="cosine", min_lr_ratio=0.2)
    expected = [warmup_schedule(s, warmup_steps=5, total_steps=50, min_lr_ratio=0.2) for s in range(60)]
    assert multipliers(module.configure_optimizers(), 60) == pytest.approx(expected)
    module = ImageClassifier(tiny_vit(), warmup_fraction=0.1, warmup_steps=3)  # steps win over the fraction
    module._trainer = stub_trainer(steps=50)
    assert module.lr_schedule()["warmup_steps"] == 3


def test_ctr_schedule_is_constant_without_a_scheduler_unless_asked():
    module = CTRModule(tiny_bst())
    module._trainer = stub_trainer(steps=40)
    assert module.lr_schedule() is None
    assert isinstance(module.configure_optimizers(), torch.optim.Optimizer)  # no scheduler at all
    module = CTRModule(tiny_bst(), warmup_steps=4)
    module._trainer = stub_trainer(steps=40)
    assert multipliers(module.configure_optimizers(), 8) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0])
    module = CTRModule(tiny_bst(), warmup_steps=4, schedule="cosine", min_lr_ratio=0.1)
    module._trainer = stub_trainer(steps=40)
    got = multipliers(module.configure_optimizers(), 41)
    assert got[3] == pytest.approx(1.0) and got[40] == pytest.approx(0.1)
    assert got[22] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 18 / 36)))


# --------------------------------------------------------------------------- arguments and hparams


def test_hparams_hold_every_argument_but_the_net():
    """Saved from the base's __init__: the base's arguments and the subclass's, with defaults."""
    module = ImageClassifier(tiny_vit(), lr=2e-3, label_smoothing=0.1)
    assert dict(module.hparams) == dict(
        lr=2e-3, weight_decay=0.05, betas=(0.9, 0.999), warmup_steps=None, min_lr_ratio=0.0, lr_scaling="none",
        base_batch_size=None, compile=False, compile_mode="default", warmup_fraction=0.05, label_smoothing=0.1,
        channels_last=False, eval_flip=False, eval_translate=0, stem_optimizer="adamw", sgd_lr=0.2, sgd_momentum=0.85,
        sgd_weight_decay=1.3e-3, sgd_bias_lr_scale=64.0,
    )
    module = CTRModule(tiny_bst(), schedule="cosine")
    assert dict(module.hparams) == dict(
        lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999), warmup_steps=0, min_lr_ratio=0.0, lr_scaling="none",
        base_batch_size=None, compile=False, compile_mode="default", optimizer="adamw", schedule="cosine",
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(lr=0.0), "lr=0.0 must be positive"), (dict(weight_decay=-0.1), "weight_decay=-0.1"),
     (dict(warmup_steps=-1), "warmup_steps=-1"), (dict(min_lr_ratio=1.5), "min_lr_ratio=1.5"),
     (dict(lr_scaling="cubic"), r"lr_scaling='cubic' is not one of \['none', 'linear', 'sqrt'\]"),
     (dict(compile_mode="fast"), "compile_mode='fast' is not one of"),
     (dict(lr_scaling="sqrt"), "needs base_batch_size"), (dict(nonsense=1), "nonsense")],
)
def test_shared_arguments_are_checked_for_both_modules(kwargs, message):
    for build in (lambda: ImageClassifier(tiny_vit(), **kwargs), lambda: CTRModule(tiny_bst(), **kwargs)):
        with pytest.raises((ValueError, TypeError), match=message):
            build()


class Regressor(TrainingModule):
    """A module made only of the base and a loss: what a new task needs to write."""

    monitor = ("val/loss", "min")

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log_lr()
        return loss

    def inspect_data(self, datamodule):
        return torch.zeros(1, 3)


def test_a_new_module_gets_optimiser_schedule_and_statistics_from_the_base():
    torch.manual_seed(0)
    x = torch.randn(32, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    module = Regressor(nn.Linear(3, 1), lr=1e-2, warmup_steps=2, weight_decay=0.01)
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)
    assert module.num_params == 4 and module.flops_per_sample == 6  # 3 multiply-adds
    assert module.effective_lr == 1e-2 and module.global_batch_size is None  # bare loaders: no DataModule batch
    groups = trainer.optimizers[0].param_groups
    assert [(len(g["params"]), g["weight_decay"]) for g in groups] == [(1, 0.0), (1, 0.01)]  # bias, weight
    assert trainer.lr_scheduler_configs[0].interval == "step"
    assert groups[0]["lr"] == pytest.approx(1e-2 * warmup_schedule(8, warmup_steps=2, total_steps=8))
