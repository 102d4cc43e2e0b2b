"""analysis/few_shot.py: the closed-form ridge probe, k-shot draws, features and the callback."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from analysis.few_shot import (
    BIAS_CONSTANT,
    FewShotCallback,
    draw_kshot,
    fewshot_evaluate,
    fewshot_from_datasets,
    fit_linear_fewshot,
    linear_fewshot_accuracy,
    pre_logits,
    ridge_regression,
)


def random_problem(n: int, d: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, k, generator=g, dtype=torch.float64)


# ------------------------------------------------------------------------------ solver


@pytest.mark.parametrize("n,d", [(40, 7), (6, 30)], ids=["primal N>=D", "dual N<D"])
@pytest.mark.parametrize("l2", [1e-3, 1.0, 2.0**10])
def test_ridge_matches_lstsq_on_the_regularised_system(n, d, l2):
    """min ||XW - Y||^2 + l2 ||W||^2 is the plain least squares of [X; sqrt(l2) I] W = [Y; 0]."""
    x, y = random_problem(n, d, 4)
    stacked_x = np.vstack([x.numpy(), np.sqrt(l2) * np.eye(d)])
    stacked_y = np.vstack([y.numpy(), np.zeros((d, 4))])
    reference = np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0]
    np.testing.assert_allclose(ridge_regression(x, y, l2).numpy(), reference, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("n,d", [(40, 7), (6, 30)])
def test_ridge_matches_sklearn_ridge(n, d):
    from sklearn.linear_model import Ridge

    x, y = random_problem(n, d, 3, seed=1)
    sk = Ridge(alpha=5.0, fit_intercept=False, solver="cholesky").fit(x.numpy(), y.numpy())
    np.testing.assert_allclose(ridge_regression(x, y, 5.0).numpy(), sk.coef_.T, rtol=1e-7, atol=1e-10)


def test_probe_standardises_appends_the_bias_feature_and_regresses_plus_minus_one_targets():
    """The fitted weights are the ridge solution on the standardised design with a bias column of 100."""
    x, _ = random_problem(30, 5, 1, seed=2)
    labels = torch.arange(30) % 3
    probe = fit_linear_fewshot(x, labels, 3, l2=7.0)
    z = (x - x.mean(0)) / (x.std(0, unbiased=False) + 1e-5)
    design = torch.cat([z, torch.full((30, 1), BIAS_CONSTANT, dtype=torch.float64)], 1)
    targets = 2 * torch.nn.functional.one_hot(labels, 3).double() - 1
    torch.testing.assert_close(probe.weights, ridge_regression(design, targets, 7.0))
    torch.testing.assert_close(probe.design(x), design)


def test_probe_is_perfect_on_linearly_separable_features():
    g = torch.Generator().manual_seed(3)
    num_classes, dim = 10, 32
    centres = 6.0 * torch.randn(num_classes, dim, generator=g)

    def sample(per_class):
        labels = torch.arange(num_classes).repeat_interleave(per_class)
        return centres[labels] + 0.3 * torch.randn(len(labels), dim, generator=g), labels

    for k in (1, 5, 25):
        train_x, train_y = sample(k)
        test_x, test_y = sample(50)
        assert linear_fewshot_accuracy(train_x, train_y, test_x, test_y, num_classes) == 1.0


def test_ridge_rejects_bad_input():
    x, y = random_problem(5, 3, 2)
    with pytest.raises(ValueError, match="l2=0"):
        ridge_regression(x, y, 0)
    with pytest.raises(ValueError, match="same N"):
        ridge_regression(x, y[:4], 1.0)


# ------------------------------------------------------------------------------ draws


def test_kshot_draws_are_balanced_nested_seeded_and_skip_unfillable_shots():
    labels = np.repeat(np.arange(4), [30, 30, 30, 8])
    sets = draw_kshot(labels, (1, 5, 10), 4, seed=0)
    assert set(sets) == {1, 5}  # class 3 has only 8 images
    for k, idx in sets.items():
        assert np.bincount(labels[idx], minlength=4).tolist() == [k] * 4
    assert set(sets[1]) <= set(sets[5])
    again = draw_kshot(labels, (1, 5, 10), 4, seed=0)
    other = draw_kshot(labels, (1, 5, 10), 4, seed=1)
    assert all((sets[k] == again[k]).all() for k in sets)
    assert not (sets[5] == other[5]).all()


def test_fewshot_evaluate_averages_the_draws():
    g = torch.Generator().manual_seed(4)
    labels = torch.arange(5).repeat(20)
    feats = torch.randn(100, 8, generator=g) + labels[:, None] * 0.5  # weakly separable: draws differ
    test_y = torch.arange(5).repeat(10)
    test_x = torch.randn(50, 8, generator=g) + test_y[:, None] * 0.5
    res = fewshot_evaluate(feats, labels, test_x, test_y, 5, shots=(1, 5, 30), draws=4, seed=7)
    assert res.skipped == [30] and set(res.accuracy) == {1, 5}
    for k in (1, 5):
        assert len(res.per_draw[k]) == 4 and res.accuracy[k] == pytest.approx(np.mean(res.per_draw[k]))
        sets = draw_kshot(labels.numpy(), (k,), 5, seed=7 + 2)[k]
        assert res.per_draw[k][2] == linear_fewshot_accuracy(feats[sets], labels[sets], test_x, test_y, 5)
    assert res.accuracy == fewshot_evaluate(feats, labels, test_x, test_y, 5, shots=(1, 5, 30), draws=4, seed=7).accuracy


# ------------------------------------------------------------------------------ features


def test_pre_logits_are_what_the_classifier_reads():
    from models.hybrid import HybridViT
    from models.resnet import ResNet
    from models.vit import ViT

    torch.manual_seed(0)
    x = torch.randn(3, 1, 8, 8)
    for net in (
        ViT(img_size=8, in_chans=1, num_classes=4, patch_size=2, embed_dim=16, depth=1, num_heads=2),
        ViT(img_size=8, in_chans=1, num_classes=4, patch_size=2, embed_dim=16, depth=1, num_heads=2, pool="gap"),
        HybridViT(img_size=8, in_chans=1, num_classes=4, backbone_layers=(1, 1), backbone_channels=(16, 32),
                  stem_chs=8, embed_dim=16, depth=1, num_heads=2),
    ):
        net.eval()
        f = pre_logits(net, x)
        assert f.shape == (3, 16)
        torch.testing.assert_close(net.head(f), net(x))
    resnet = ResNet(img_size=8, in_chans=1, num_classes=4, layers=(1, 1), channels=(16, 32), stem_chs=8).eval()
    f = pre_logits(resnet, x)
    torch.testing.assert_close(f, resnet.forward_features(x).mean(dim=(2, 3)))
    with pytest.raises(TypeError, match="forward_features"):
        pre_logits(torch.nn.Linear(3, 3), x)


class _Items(torch.utils.data.Dataset):
    """(image, label) items; ``transform`` would be applied per item (must be off for the shots)."""

    def __init__(self, images, labels, transform=None):
        self.images, self.targets, self.transform = images, labels, transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        x = self.images[i]
        return (self.transform(x) if self.transform else x), self.targets[i]


def test_fewshot_from_datasets_reads_the_shots_without_augmentation_and_restores_train_mode():
    from models.resnet import ResNet

    torch.manual_seed(0)
    net = ResNet(img_size=8, in_chans=1, num_classes=3, layers=(1,), channels=(16,), stem_chs=8, dropout=0.5)
    labels = torch.arange(3).repeat(10)
    images = torch.randn(30, 1, 8, 8) + labels[:, None, None, None]

    def poison(x):
        raise AssertionError("augmentation used for few-shot features")

    shots = _Items(images, labels, transform=poison)
    evals = _Items(images, labels)
    net.train()
    res = fewshot_from_datasets(net, shots, evals, 3, shots=(1, 5), draws=2, batch_size=7)
    assert net.training and shots.transform is poison
    assert set(res.accuracy) == {1, 5} and all(0 <= a <= 1 for a in res.accuracy.values())
    # the same numbers as the probe on features computed by hand
    feats = pre_logits(net.eval(), images).detach()
    expected = fewshot_evaluate(feats, labels, feats, labels, 3, shots=(1, 5), draws=2)
    assert set(res.per_draw) == set(expected.per_draw)
    for k in res.per_draw:
        assert res.per_draw[k] == pytest.approx(expected.per_draw[k])


# ------------------------------------------------------------------------------ callback


def test_callback_validates_its_arguments():
    with pytest.raises(ValueError, match="shots"):
        FewShotCallback(shots=(0, 5))
    with pytest.raises(ValueError, match="every_n_epochs"):
        FewShotCallback(every_n_epochs=0)
    with pytest.raises(ValueError, match="draws"):
        FewShotCallback(draws=0)


def test_callback_logs_fewshot_keys_in_a_tiny_fit_without_changing_training(tmp_path):
    """Through the CLI on digits: val/fewshot_<k> in the run's metrics every epoch it is due;
    the training losses are those of the same run without the callback (no RNG is consumed)."""
    from reproductions.run.cli import main as cli_main

    small = ["--config", "reproductions/vit/configs/digits.yaml", "--trainer.max_epochs", "2",
             "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
             "--model.net.init_args.depth", "1", "--model.net.init_args.embed_dim", "16",
             "--model.net.init_args.num_heads", "2", "--trainer.limit_train_batches", "3",
             "--trainer.limit_val_batches", "2", "--run.test_after_fit", "false"]  # fmt: skip
    cli_main(["fit", *small, "--run.root", str(tmp_path / "with"), "--trainer.callbacks+=analysis.few_shot.FewShotCallback",
              "--trainer.callbacks.shots=[1, 5, 10]", "--trainer.callbacks.draws=2",
              "--trainer.callbacks.max_eval_samples=64"])
    cli_main(["fit", *small, "--run.root", str(tmp_path / "without")])

    def rows(root):
        with open(root / "vit/digits/default/seed0/metrics.csv") as f:
            return list(csv.DictReader(f))

    with_cb, without = rows(tmp_path / "with"), rows(tmp_path / "without")
    logged = [r for r in with_cb if r.get("val/fewshot_5")]
    assert len(logged) == 2  # both epochs
    for r in logged:
        for k in (1, 5, 10):
            assert 0.0 <= float(r[f"val/fewshot_{k}"]) <= 1.0
        assert r["val/acc"]  # the same row as the validation metrics
    def curve(rs):
        return [(r["epoch"], key, r[key]) for r in rs for key in ("train/loss_epoch", "val/loss") if r.get(key)]

    assert curve(with_cb) == curve(without) and len(curve(without)) == 4


def test_callback_at_test_only_puts_test_fewshot_in_results(tmp_path):
    """every_n_epochs=None: nothing during fit; the test after fit (best checkpoint) logs
    test/fewshot_<k> on the test split, and results.json holds it beside test/acc."""
    from reproductions.run.cli import main as cli_main
    from reproductions.run.results import read_results

    cli_main(["fit", "--config", "reproductions/vit/configs/digits.yaml", "--trainer.max_epochs", "1",
              "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
              "--model.net.init_args.depth", "1", "--model.net.init_args.embed_dim", "16",
              "--model.net.init_args.num_heads", "2", "--trainer.limit_train_batches", "3",
              "--trainer.limit_val_batches", "2", "--run.test_ckpt", "best", "--run.root", str(tmp_path),
              "--trainer.callbacks+=analysis.few_shot.FewShotCallback", "--trainer.callbacks.shots=[1, 5]",
              "--trainer.callbacks.every_n_epochs=null", "--trainer.callbacks.draws=2"])  # fmt: skip
    run_dir = tmp_path / "vit/digits/default/seed0"
    with open(run_dir / "metrics.csv") as f:
        assert not any(k.startswith("val/fewshot") for k in csv.DictReader(f).fieldnames)
    test = read_results(run_dir)["test"]
    assert set(test) >= {"test/acc", "test/fewshot_1", "test/fewshot_5"}
    assert 0.1 < test["test/fewshot_5"] <= 1.0
