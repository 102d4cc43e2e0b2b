"""The device-resident image loader (``ImageDataModule(on_device=True)``, ``datamodules/images/device_loader.py``)
against the ordinary loader: the same batches (samples, order, crops and flips, normalisation) every epoch,
the same position saved and resumed mid-epoch, through the command line too; and its refusals.

On the CPU here (the same code as on a GPU); with a CUDA device present the comparisons run there too.
"""

from __future__ import annotations

import pytest
import torch

from tests.images_helpers import cache, isolated, make, write_folder  # noqa: F401

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def epochs(loader, n: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every batch of ``n`` epochs of a training loader, on the CPU."""
    out = []
    for epoch in range(n):
        loader.sampler.set_epoch(epoch)
        out.append([(x.cpu(), y.cpu()) for x, y in loader])
    return out


def pair(cache, monkeypatch, device: str, **data):
    """(ordinary DataModule, device-resident DataModule) on the same data and settings."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")
    ordinary = make(cache, **data)
    resident = make(cache, on_device=True, **data)
    if device != "cpu":  # no trainer: move to the device as setup would under one
        resident.train_dataset = resident.train_dataset.to(device)
        resident.val_dataset = resident.val_dataset.to(device)
    return ordinary, resident


def assert_same_batches(a, b) -> None:
    assert len(a) == len(b)
    for epoch_a, epoch_b in zip(a, b, strict=True):
        assert len(epoch_a) == len(epoch_b)
        for (xa, ya), (xb, yb) in zip(epoch_a, epoch_b, strict=True):
            assert xa.dtype == xb.dtype == torch.float32 and xa.shape == xb.shape
            torch.testing.assert_close(xb, xa, rtol=0, atol=1e-6)
            assert torch.equal(ya, yb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("augment", ["crop_flip", "flip", "none"])
def test_digits_batches_equal_the_ordinary_loaders_every_epoch(cache, monkeypatch, device, augment):
    ordinary, resident = pair(cache, monkeypatch, device, source="digits", augment=augment, batch_size=64)
    a, b = epochs(ordinary.train_dataloader(), 2), epochs(resident.train_dataloader(), 2)
    assert_same_batches(a, b)
    # another order each epoch, full batches only (drop_last, as the ordinary loader), and (with an
    # augmentation) not the raw images
    labels = [torch.cat([y for _, y in e]) for e in b]
    assert not torch.equal(labels[0], labels[1])
    assert len(labels[0]) == len(resident.train_dataset) // 64 * 64
    raw = epochs(make(cache, source="digits", augment="none", batch_size=64, on_device=True).train_dataloader(), 1)
    changed = not torch.equal(raw[0][0][0], b[0][0][0])
    assert changed == (augment != "none")
    # the labels the analyses read (few-shot), on the CPU wherever the images are
    targets = resident.train_dataset.targets
    assert targets.device.type == "cpu" and torch.equal(targets, ordinary.train_dataset.targets)
    # evaluation batches: in order, no augmentation, the same values
    val_a = [(x, y) for x, y in ordinary.val_dataloader()]
    val_b = [(x.cpu(), y.cpu()) for x, y in resident.val_dataloader()]
    assert_same_batches([val_a], [val_b])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mix", [{"cutmix_alpha": 1.0}, {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}])
def test_mixed_batches_equal_the_ordinary_loaders(cache, monkeypatch, device, mix):
    # CutMix (and Mixup) on the device: the same boxes, mixing weights and soft targets as on the CPU
    ordinary, resident = pair(cache, monkeypatch, device, source="digits", augment="crop_flip", batch_size=64, **mix)
    a, b = epochs(ordinary.train_dataloader(), 2), epochs(resident.train_dataloader(), 2)
    assert len(a[0]) == len(b[0]) > 0
    for epoch_a, epoch_b in zip(a, b, strict=True):
        for (xa, ta), (xb, tb) in zip(epoch_a, epoch_b, strict=True):
            torch.testing.assert_close(xb, xa, rtol=0, atol=1e-6)
            torch.testing.assert_close(tb, ta, rtol=0, atol=1e-6)
    targets = torch.cat([t for e in b for _, t in e])
    assert targets.shape[1] == 10 and torch.allclose(targets.sum(1), torch.ones(len(targets)))
    assert (targets.max(1).values < 1).float().mean() > 0.5  # most targets are mixtures, not one-hot


def test_augmentation_statistics_match_on_an_rgb_folder(cache, monkeypatch, tmp_path):
    """An RGB image folder (prepared, decoded once): the crop offsets and flips drawn are the same, so are
    the per-channel statistics of the augmented epoch."""
    write_folder(tmp_path / "imgs", per_class=40, size=(16, 16))
    ordinary, resident = pair(cache, monkeypatch, "cpu", source="folder", data_dir=str(tmp_path / "imgs"),
                              augment="crop_flip", batch_size=16, test_fraction=0.1)  # fmt: skip
    a, b = epochs(ordinary.train_dataloader(), 3), epochs(resident.train_dataloader(), 3)
    assert_same_batches(a, b)
    xa, xb = torch.cat([x for e in a for x, _ in e]), torch.cat([x for e in b for x, _ in e])
    assert xb.shape[1] == 3
    torch.testing.assert_close(xb.mean((0, 2, 3)), xa.mean((0, 2, 3)))
    torch.testing.assert_close(xb.std((0, 2, 3)), xa.std((0, 2, 3)))
    # zero padding shows up in the augmented images: a share of exact -mean/std pixels
    zero = torch.tensor([-m / s for m, s in zip(resident.mean, resident.std)]).view(1, 3, 1, 1)
    assert ((xb - zero).abs() < 1e-5).float().mean() > 0.01


@pytest.mark.parametrize("device", DEVICES)
def test_resume_mid_epoch_serves_the_remaining_batches(cache, monkeypatch, device):
    _, resident = pair(cache, monkeypatch, device, source="digits", augment="crop_flip", batch_size=64)
    loader = resident.train_dataloader()
    loader.sampler.set_epoch(1)
    it = iter(loader)
    served = [next(it) for _ in range(5)]
    state = loader.state_dict()
    assert state == {"epoch": 1, "samples": 5 * 64}
    rest = [(x.cpu(), y.cpu()) for x, y in it]

    fresh = resident.train_dataloader()
    fresh.load_state_dict(state)
    fresh.sampler.set_epoch(1)
    resumed = [(x.cpu(), y.cpu()) for x, y in fresh]
    assert len(served) + len(rest) == len(loader) and len(resumed) == len(rest)
    assert_same_batches([rest], [resumed])


def test_refusals_name_the_setting(cache, tmp_path):
    from datamodules.images import ImageDataModule

    cases = [({"augment": "randaugment"}, "on_device=true does augment='randaugment' only on the CPU"),
             ({"augment": "crop_flip", "random_erasing": 0.25}, "random_erasing=0.25"),
             ({"augment": "crop_flip", "in_memory": False}, "in_memory=false"),
             ({"augment": "crop_flip", "auto_augment": "rand-m9-mstd0.5-inc1"}, "auto_augment='rand-m9-mstd0.5-inc1'")]
    for kwargs, text in cases:
        with pytest.raises(ValueError, match="on_device") as info:
            ImageDataModule(source="digits", cache_dir=cache, on_device=True, **kwargs)
        assert text in str(info.value)
    write_folder(tmp_path / "imgs", per_class=4, size=(8, 8))
    with pytest.raises(ValueError, match=r"^on_device=true needs the images held in memory, but folder is decoded "
                                         r"per sample in the loader workers: .*; set in_memory true"):
        make(cache, source="folder", data_dir=str(tmp_path / "imgs"), max_in_memory_bytes=10, on_device=True)


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_mid_epoch_with_the_device_loader_resumes_exactly(tmp_path):
    """Through the command line: stopped by SIGTERM mid-epoch and resumed equals the uninterrupted run."""
    from tests.cli_helpers import DIGITS
    from tests.resume_helpers import VIT, stop_and_resume

    stop_and_resume(tmp_path, DIGITS, [*VIT, "--data.on_device", "true"], step=8, signame="SIGTERM",
                    steps_per_epoch=6, total_steps=18)  # fmt: skip
