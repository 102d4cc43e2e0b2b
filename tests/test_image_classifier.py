"""ImageClassifier: schedule, weight-decay groups, FLOP counting, data/net consistency checks."""

import math

import lightning as L
import pytest
import torch

from lightning_modules.base import warmup_schedule
from lightning_modules.image_classifier import ImageClassifier
from lightning_modules.model_stats import count_flops, count_parameters
from models.vit import ViT
from tests.helpers import TinyData
from tests.helpers import quiet_trainer as trainer
from tests.tiny_models import tiny_vit



def test_warmup_cosine_shape():
    lrs = [warmup_schedule(s, warmup_steps=10, total_steps=100, min_lr_ratio=0.1) for s in range(120)]
    assert lrs[0] == pytest.approx(0.1)  # 1/warmup
    assert lrs[9] == pytest.approx(1.0)  # end of warm-up: peak
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))  # rising during warm-up
    assert all(a >= b for a, b in zip(lrs[10:100], lrs[11:101]))  # cosine decay is monotone
    assert lrs[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lrs[100] == pytest.approx(0.1) and lrs[119] == pytest.approx(0.1)
    assert warmup_schedule(0, warmup_steps=0, total_steps=10, min_lr_ratio=0.0) == pytest.approx(1.0)


def test_no_weight_decay_on_norms_biases_and_embeddings():
    module = ImageClassifier(tiny_vit(), lr=1e-3, weight_decay=0.1, warmup_steps=2)
    t = trainer(max_steps=4)
    t.fit(module, datamodule=TinyData())
    groups = t.optimizers[0].param_groups
    names = {id(p): n for n, p in module.net.named_parameters()}
    decayed = {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    plain = {names[id(p)] for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    assert "pos_embed" in plain and "cls_token" in plain
    assert all(n.endswith(".bias") or ".norm" in n or n.startswith("norm") or n in ("pos_embed", "cls_token")
               for n in plain), plain
    assert "blocks.0.attn.qkv.weight" in decayed and "head.weight" in decayed
    assert decayed | plain == set(names.values())  # every parameter is optimised exactly once
    assert not decayed & plain


def test_schedule_follows_warmup_cosine_per_step():
    module = ImageClassifier(tiny_vit(), lr=1e-2, warmup_steps=2, min_lr_ratio=0.0)
    lrs = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    t = trainer(max_epochs=2, callbacks=[Record()])
    t.fit(module, datamodule=TinyData(n=64, batch_size=16))  # 4 steps per epoch, 8 in all
    expected = [1e-2 * warmup_schedule(s, warmup_steps=2, total_steps=8, min_lr_ratio=0.0) for s in range(8)]
    assert lrs == pytest.approx(expected)


def test_flops_match_the_analytic_count():
    """Known answer: every matmul of a ViT forward, a multiply-add counted as 2 FLOPs."""
    C, S, P, D, depth, M, K = 1, 8, 2, 16, 2, 2.0, 4
    net = tiny_vit(embed_dim=D, depth=depth, mlp_ratio=M, num_classes=K)
    N = (S // P) ** 2
    T = N + 1  # class token
    hidden = int(D * M)
    patch = 2 * N * (C * P * P) * D
    per_block = 2 * T * D * 3 * D + 2 * 2 * T * T * D + 2 * T * D * D + 2 * 2 * T * D * hidden
    head = 2 * D * K
    assert count_flops(net, torch.zeros(1, C, S, S)) == patch + depth * per_block + head


def test_flops_count_leaves_module_state_alone():
    net = tiny_vit()
    net.train()
    count_flops(net, torch.zeros(1, 1, 8, 8))
    assert net.training
    assert all(p.grad is None for p in net.parameters())


def test_module_records_params_and_flops():
    net = tiny_vit()
    module = ImageClassifier(net)
    module.trainer = trainer(max_steps=1)
    assert module.num_params == count_parameters(net) == sum(p.numel() for p in net.parameters())


def test_class_count_mismatch_fails_before_training():
    module = ImageClassifier(tiny_vit(num_classes=4))
    with pytest.raises(ValueError, match=r"7 classes.*num_classes=4"):
        trainer(max_steps=1).fit(module, datamodule=TinyData(num_classes=7))
    assert module.global_step == 0


def test_image_shape_mismatch_fails_before_training():
    module = ImageClassifier(tiny_vit())
    with pytest.raises(ValueError, match=r"\(3, 8, 8\).*\(1, 8, 8\)"):
        trainer(max_steps=1).fit(module, datamodule=TinyData(shape=(3, 8, 8)))


@pytest.mark.parametrize("kwargs, bad", [({"lr": 0.0}, "lr=0.0"), ({"label_smoothing": 1.0}, "label_smoothing=1.0"),
                                         ({"warmup_fraction": 1.5}, "warmup_fraction=1.5")])
def test_bad_recipe_values_raise(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        ImageClassifier(tiny_vit(), **kwargs)


def test_training_fits_a_small_batch():
    """The whole loop learns: a few dozen steps drive the loss on a fixed batch far down."""
    torch.manual_seed(0)
    data = TinyData(n=16, batch_size=16)
    module = ImageClassifier(tiny_vit(embed_dim=32), lr=1e-2, warmup_steps=0, weight_decay=0.0)
    x, y = data.x, data.y
    before = torch.nn.functional.cross_entropy(module(x), y).item()
    trainer(max_epochs=150).fit(module, datamodule=data)
    module.eval()
    after = torch.nn.functional.cross_entropy(module(x), y).item()
    assert after < 0.2 * before
    assert (module(x).argmax(-1) == y).float().mean() > 0.9


def test_eval_flip_averages_the_mirror_image_in_evaluation_only():
    torch.manual_seed(0)
    module = ImageClassifier(tiny_vit(), lr=1e-3, eval_flip=True).eval()
    images = torch.randn(3, 1, 8, 8)
    mirrored = (module(images) + module(images.flip(-1))) / 2
    assert not torch.allclose(module(images), mirrored)  # the mirror changes a ViT's logits
    assert torch.allclose(module.evaluate(images), mirrored)
    assert torch.allclose(module.predict_step((images,), 0), mirrored.softmax(-1))
    plain = ImageClassifier(tiny_vit(), lr=1e-3).eval()
    plain.load_state_dict(module.state_dict())
    assert torch.allclose(plain.evaluate(images), module(images))
    # the loss and accuracy of validation see the averaged logits; training does not
    labels = torch.tensor([0, 1, 2])
    loss = module._shared_step((images, labels), module.val_acc)
    assert torch.allclose(loss, module.criterion(mirrored, labels))
    module.train()
    loss = module._shared_step((images, labels), module.train_acc)
    assert torch.allclose(loss, module.criterion(module(images), labels))



def test_eval_translate_adds_two_shifted_views_at_a_quarter_weight_each():
    torch.manual_seed(0)
    module = ImageClassifier(tiny_vit(), lr=1e-3, eval_flip=True, eval_translate=1).eval()
    images = torch.randn(3, 1, 8, 8)

    def mirrored(x):
        return (module(x) + module(x.flip(-1))) / 2

    # shifted by one pixel with reflection at the border, written out by index
    rows = torch.tensor([1, 0, 1, 2, 3, 4, 5, 6])  # reflect-pad by 1, crop the first 8 rows
    up_left = images[..., rows, :][..., :, rows]
    rows = torch.tensor([1, 2, 3, 4, 5, 6, 7, 6])  # reflect-pad by 1, crop the last 8 rows
    down_right = images[..., rows, :][..., :, rows]
    expected = mirrored(images) / 2 + (mirrored(up_left) + mirrored(down_right)) / 4
    assert not torch.allclose(expected, mirrored(images))
    assert torch.allclose(module.evaluate(images), expected, atol=1e-6)
    labels = torch.tensor([0, 1, 2])
    assert torch.allclose(module._shared_step((images, labels), module.val_acc), module.criterion(expected, labels))
    module.train()  # training sees the plain forward
    loss = module._shared_step((images, labels), module.train_acc)
    assert torch.allclose(loss, module.criterion(module(images), labels))
    with pytest.raises(ValueError, match="eval_translate=-1"):
        ImageClassifier(tiny_vit(), lr=1e-3, eval_translate=-1)


# ------------------------------------------------------------------------------ the stem by SGD, whitening from data

from lightning_modules.optim import SGDAdamW  # noqa: E402
from models.hybrid import ConvStemViT, PatchWhitening  # noqa: E402


class TinyImages(TinyData):
    """TinyData with ``train_images``, as ImageDataModule has."""

    def __init__(self, seed: int = 0, **kw):
        super().__init__(**kw)
        self.x = torch.randn(self.x.shape, generator=torch.Generator().manual_seed(seed))

    def train_images(self, n):
        return self.x[:n]


def whitened_net(**kw):
    torch.manual_seed(0)
    args = dict(img_size=8, in_chans=3, num_classes=4, patch_size=4, stem_channels=(8, 16), stem_block="group",
                whiten=True, downsample="maxpool", embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0)
    args.update(kw)
    return ConvStemViT(**args)


@pytest.mark.parametrize("lr_scaling,factor", [("none", 1.0), ("linear", 2.0)])
def test_sgd_stem_trains_the_stem_by_sgd_and_the_rest_by_adamw(lr_scaling, factor):
    """Stem weights in one SGD group at ``sgd_lr``, its biases in another at 64x with the decay
    divided by 64, everything else in AdamW's groups, each trainable parameter exactly once, the
    frozen whitening and BatchNorm scales in none; ``lr_scaling`` scales the SGD rates as ``lr``.
    The whitening is fitted to the datamodule's training images before the first step."""
    module = ImageClassifier(whitened_net(), lr=1e-3, weight_decay=0.05, warmup_steps=0, stem_optimizer="sgd",
                             sgd_lr=0.2, sgd_momentum=0.8, sgd_weight_decay=1e-3, lr_scaling=lr_scaling,
                             base_batch_size=8)  # fmt: skip
    data = TinyImages(n=32, batch_size=16, shape=(3, 8, 8))
    reference = PatchWhitening(3)
    reference.fit(data.x[:5000])
    t = trainer(max_steps=2)
    t.fit(module, datamodule=data)
    optimizer = t.optimizers[0]
    assert isinstance(optimizer, SGDAdamW)
    assert torch.equal(module.net.whitening.weight, reference.weight) and module.net.needs_images() == 0
    names = {id(p): n for n, p in module.net.named_parameters()}
    by_rule = {"sgd": set(), "adamw": set()}
    for g in optimizer.param_groups:
        by_rule[g["rule"]] |= {names[id(p)] for p in g["params"]}
    stem = {"patch_embed.backbone." + n for n, p in module.net.stem.named_parameters() if p.requires_grad}
    assert by_rule["sgd"] == stem and not by_rule["sgd"] & by_rule["adamw"]
    assert by_rule["sgd"] | by_rule["adamw"] == {n for n, p in module.net.named_parameters() if p.requires_grad}
    assert "patch_embed.backbone.0.weight" not in stem and "patch_embed.backbone.0.bias" in stem  # whitening
    assert "patch_embed.proj.weight" in by_rule["adamw"]
    sgd = [g for g in optimizer.param_groups if g["rule"] == "sgd"]
    weights = next(g for g in sgd if g["params"][0].ndim > 1)
    biases = next(g for g in sgd if g["params"][0].ndim == 1)
    assert weights["initial_lr"] == pytest.approx(0.2 * factor) and weights["weight_decay"] == pytest.approx(1e-3)
    assert biases["initial_lr"] == pytest.approx(0.2 * 64 * factor)
    assert biases["weight_decay"] == pytest.approx(1e-3 / 64)
    assert weights["momentum"] == biases["momentum"] == 0.8 and weights["nesterov"]
    adamw = [g for g in optimizer.param_groups if g["rule"] == "adamw"]
    assert all(g["initial_lr"] == pytest.approx(1e-3 * factor) for g in adamw)


def test_a_resumed_run_keeps_the_checkpoint_s_whitening(tmp_path):
    """Resuming on other images fits the whitening to them at setup, then the checkpoint's
    (trained-with) whitening replaces it: the model continues, it is not re-whitened."""
    module = ImageClassifier(whitened_net(), lr=1e-3, warmup_steps=0, stem_optimizer="sgd")
    t = trainer(max_steps=2)
    t.fit(module, datamodule=TinyImages(seed=0, shape=(3, 8, 8)))
    path = tmp_path / "last.ckpt"
    t.save_checkpoint(path)
    resumed = ImageClassifier(whitened_net(), lr=1e-3, warmup_steps=0, stem_optimizer="sgd")
    trainer(max_steps=3).fit(resumed, datamodule=TinyImages(seed=1, shape=(3, 8, 8)), ckpt_path=path)
    assert torch.equal(resumed.net.whitening.weight, module.net.whitening.weight)


def test_whitening_and_sgd_stem_fail_clearly_without_what_they_need():
    with pytest.raises(ValueError, match=r"needs a datamodule with train_images\(n\) .* got TinyData; or set whiten: false"):
        trainer(max_steps=1).fit(ImageClassifier(whitened_net()), datamodule=TinyData(shape=(3, 8, 8)))
    with pytest.raises(ValueError, match=r"stem_optimizer='sgd' trains the net's convolutional stem .* ViT has none"):
        ImageClassifier(tiny_vit(), stem_optimizer="sgd")
    with pytest.raises(ValueError, match=r"stem_optimizer='lamb' is not one of \['adamw', 'sgd'\]"):
        ImageClassifier(tiny_vit(), stem_optimizer="lamb")
    for bad, match in (({"sgd_lr": 0.0}, "sgd_lr=0.0 must be positive"), ({"sgd_momentum": 1.0}, r"sgd_momentum=1.0 must be in \(0, 1\)"),
                       ({"sgd_weight_decay": -1.0}, "sgd_weight_decay=-1.0 must be >= 0")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            ImageClassifier(whitened_net(), stem_optimizer="sgd", **bad)
