"""The ImageNet recipe's transforms (``datamodules/images/transforms.py``) and decoders (``decode.py``) on small
JPEG fixtures: RandomResizedCrop, timm's RandAugment, random erasing, Mixup/CutMix, the centre-crop evaluation,
and torchvision's decoding against Pillow's."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.images.decode import decode_bytes, decode_pil, verify_image
from datamodules.images.transforms import (
    BatchMix,
    EvalResize,
    PolicyOnTensor,
    RandomResizedCropFlip,
    random_erasing,
    timm_policy,
)
from datamodules.images.torch_datasets import seeded
from tests.images_helpers import cache, isolated, make  # noqa: F401


def photo(height: int = 60, width: int = 80, seed: int = 0) -> np.ndarray:
    """A smooth RGB image (gradients + a few blobs): JPEG-friendly, like a photograph."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = [128 + 100 * np.sin(x / (7 + 3 * c) + y / (11 + c) + rng.uniform(0, 6)) for c in range(3)]
    return np.clip(np.stack(channels, -1), 0, 255).astype(np.uint8)


def jpeg(array: np.ndarray, quality: int = 90, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    image = Image.fromarray(array)
    (image.convert(mode) if mode else image).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@pytest.fixture
def images() -> list[torch.Tensor]:
    return [decode_bytes(jpeg(photo(60 + 7 * k, 80 - 5 * k, seed=k)), "RGB") for k in range(6)]


# ------------------------------------------------------------------------------------------- decoders


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_torchvision_decodes_the_same_pixels_as_pillow_within_jpeg_tolerance(mode):
    for k in range(4):
        data = jpeg(photo(64 + 8 * k, 96, seed=k), quality=75 + 5 * k)
        fast, reference = decode_bytes(data, mode, "torchvision"), decode_bytes(data, mode, "pil")
        assert fast.shape == reference.shape == ((3 if mode == "RGB" else 1), 64 + 8 * k, 96)
        diff = (fast.int() - reference.int()).abs()
        assert diff.float().mean() < 1.0 and diff.max() <= 8  # IDCT / upsampling / luma rounding differ slightly


def test_lossless_and_other_formats_decode_exactly():
    array = np.random.default_rng(0).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    for fmt in ("PNG", "BMP", "TIFF"):
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format=fmt)
        out = decode_bytes(buffer.getvalue(), "RGB")
        assert torch.equal(out, torch.from_numpy(array).permute(2, 0, 1)), fmt
    cmyk = jpeg(photo(), mode="CMYK")  # torchvision refuses or converts: the result is Pillow's within tolerance
    assert (decode_bytes(cmyk, "RGB").int() - decode_pil(cmyk, "RGB").int()).abs().float().mean() < 2.0


def test_verify_finds_undecodable_data():
    good = jpeg(photo())
    assert verify_image(good) == ("RGB", 60, 80)
    for bad in (good[: len(good) // 2], b"not an image", b""):
        with pytest.raises(Exception):  # noqa: B017 - Pillow raises OSError / UnidentifiedImageError / ...
            verify_image(bad)


# ------------------------------------------------------------------------------------------- training


def test_random_resized_crop_gives_the_size_and_value_range_and_varies(images):
    crop = RandomResizedCropFlip(24, interpolation="bicubic")
    outs = []
    for k, image in enumerate(images):
        with seeded(k):
            out = crop(image)
        assert out.shape == (3, 24, 24) and out.dtype == torch.uint8
        outs.append(out)
    assert len({o.float().sum().item() for o in outs}) == len(outs)
    with seeded(3):
        again = crop(images[3])
    assert torch.equal(again, outs[3])  # a function of the seed
    # the whole image (scale 1, aspect kept) is the image resized
    whole = RandomResizedCropFlip(30, scale=(1.0, 1.0), ratio=(80 / 60, 80 / 60))
    with seeded(0):
        out = whole(images[0])
    resized = torch.nn.functional.interpolate(images[0][None].float(), size=(30, 30), mode="bilinear", antialias=True)[0]
    assert (out.float() - resized).abs().mean() < 12 or (out.flip(-1).float() - resized).abs().mean() < 12


def test_timm_randaugment_runs_at_every_magnitude_on_tensors(images):
    policy = PolicyOnTensor(timm_policy("rand-m10-mstd0.5-inc1", 24))  # magnitude 10: posterize to 0 bits
    crop = RandomResizedCropFlip(24, policy=policy)
    for k in range(120):
        with seeded(k):
            out = crop(images[k % len(images)])
        assert out.shape == (3, 24, 24) and out.dtype == torch.uint8
    # one channel (Fashion-MNIST): the geometric ops fill with the RGB mean, which a mode-L image
    # refuses; every op of the policy must run on grey images too
    gray_policy = PolicyOnTensor(timm_policy("rand-m9-mstd0.5-inc1", 24))
    grey = images[0][:1, :24, :24]
    for k in range(60):
        with seeded(k):
            out = gray_policy(grey)
        assert out.shape == (1, 24, 24) and out.dtype == torch.uint8
    full = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16)
    assert torch.equal(PolicyOnTensor(lambda im: im)(full), full)  # grey -> RGB -> grey loses nothing


def test_random_erasing_replaces_one_box_with_noise():
    erase = random_erasing(1.0)
    x = torch.zeros(3, 32, 32)
    with seeded(0):
        out = erase(x.clone())
    changed = (out != 0).any(0)
    rows, cols = changed.nonzero().T
    assert 0.02 * 32 * 32 <= changed.sum() <= (32 * 32) / 3 + 32  # area 2% - 1/3
    assert changed[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()  # one rectangle
    assert random_erasing(0.0) is None


@pytest.mark.parametrize(("mixup_alpha", "cutmix_alpha"), [(0.8, 0.0), (0.0, 1.0), (0.8, 1.0)])
def test_mixup_and_cutmix_mix_images_and_labels_summing_to_one(mixup_alpha, cutmix_alpha):
    mix = BatchMix(5, mixup_alpha, cutmix_alpha)
    for seed in range(5):
        x = torch.stack([torch.full((3, 8, 8), float(i)) for i in range(7)])  # odd: the last stays unmixed
        labels = torch.tensor([0, 1, 2, 3, 4, 0, 1])
        with seeded(seed):
            mixed, targets = mix(x.clone(), labels)
        assert targets.shape == (7, 5) and targets.dtype == torch.float32
        assert torch.allclose(targets.sum(1), torch.ones(7)) and (targets >= 0).all()
        assert ((targets > 0).sum(1) <= 2).all()
        assert torch.equal(targets[6], torch.nn.functional.one_hot(labels[6], 5).float()) and torch.equal(mixed[6], x[6])
        for i in range(6):  # each image is made of itself and its partner (the batch reversed), in the label's ratio
            j, lam = 5 - i, targets[i, labels[i]].item() if labels[i] != labels[5 - i] else None
            values = set(mixed[i].unique().tolist())
            if lam is not None and cutmix_alpha > 0 and mixup_alpha == 0:
                assert values <= {float(i), float(j)}
                assert (mixed[i] == float(i)).float().mean().item() == pytest.approx(lam, abs=1e-6)
            elif lam is not None and mixup_alpha > 0 and cutmix_alpha == 0:
                assert mixed[i].mean().item() == pytest.approx(lam * i + (1 - lam) * j, abs=1e-4)


# ------------------------------------------------------------------------------------------- evaluation


def test_centre_crop_evaluation_is_timms_and_deterministic(images):
    from timm.data import create_transform

    evaluate = EvalResize(32, 0.875, "bicubic")
    reference = create_transform(32, is_training=False, crop_pct=0.875, interpolation="bicubic", use_prefetcher=True)
    for image in images:
        out = evaluate(image)
        assert out.shape == (3, 32, 32) and out.dtype == torch.uint8
        assert torch.equal(evaluate(image), out)  # no randomness
        pil = reference(Image.fromarray(image.permute(1, 2, 0).numpy()))
        expected = pil if isinstance(pil, torch.Tensor) else torch.from_numpy(np.asarray(pil)).permute(2, 0, 1)
        assert (out.float() - expected.float()).abs().mean() < 3.0  # Pillow's and torch's bicubic differ slightly
    assert EvalResize(None)(images[0]) is images[0]
    assert EvalResize(16)(images[0]).shape == (3, 16, 16)  # no fraction: resized to size x size


# ------------------------------------------------------------------------------------------- the DataModule


def write_photo_folder(root: Path, per_class: int = 6) -> Path:
    for split in ("train", "val"):
        for k, name in enumerate(("n01", "n02")):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                h, w = 40 + 3 * i, 52 - 2 * i + k
                (root / split / name / f"{i}.JPEG").write_bytes(jpeg(photo(h, w, seed=10 * k + i)))
    return root


def test_the_imagenet_recipe_through_the_datamodule(cache, tmp_path, monkeypatch):
    folder = write_photo_folder(tmp_path / "imgs")
    kwargs = dict(source="imagenet", data_dir=str(folder), image_size=24, augment="random_resized_crop",
                  auto_augment="rand-m9-mstd0.5-inc1", random_erasing=0.25, mixup_alpha=0.8, cutmix_alpha=1.0,
                  eval_crop_fraction=0.875, interpolation="bicubic", batch_size=4, val_fraction=0.0,
                  mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])  # fmt: skip
    dm = make(cache, **kwargs)
    assert dm.in_memory is False and dm.input_shape == (3, 24, 24)  # sizes differ: crops from the native images
    x, targets = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 24, 24) and targets.shape == (4, 2) and torch.allclose(targets.sum(1), torch.ones(4))
    batch = [0, 3, 5, 7]
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    first, second = dm.train_dataset.__getitems__(batch), dm.train_dataset.__getitems__(batch)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, second, strict=True))
    # evaluation: centre crops, int labels, the same on every pass
    a, b = list(dm.test_dataloader()), list(dm.test_dataloader())
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True))
    assert a[0][1].dtype == torch.int64 and sum(len(p[1]) for p in a) == 12
    # in memory is refused when the images differ in size and the recipe needs them at their native size
    with pytest.raises(ValueError, match="in_memory=true.*native size"):
        make(cache, in_memory=True, **kwargs)


def test_in_memory_auto_follows_the_size_and_can_be_overridden(cache, tmp_path, caplog):
    folder = tmp_path / "same"
    for k, name in enumerate(("a", "b")):
        (folder / name).mkdir(parents=True)
        for i in range(5):
            (folder / name / f"{i}.jpg").write_bytes(jpeg(photo(16, 16, seed=10 * k + i)))
    kwargs = dict(source="folder", data_dir=str(folder), batch_size=2)
    with caplog.at_level("INFO"):
        held = make(cache, **kwargs)
    assert held.in_memory is True and "in memory: 10 images x (3, 16, 16) uint8" in caplog.text
    assert "(in_memory=auto)" in caplog.text
    assert make(cache, max_in_memory_bytes=100, **kwargs).in_memory is False
    assert make(cache, in_memory=False, **kwargs).in_memory is False
    assert make(cache, in_memory=True, max_in_memory_bytes=100, **kwargs).in_memory is True
    # RandomResizedCrop from the in-memory native images (all 16 x 16), to another size
    rrc = make(cache, augment="random_resized_crop", image_size=12, **kwargs)
    assert rrc.in_memory is True and next(iter(rrc.train_dataloader()))[0].shape == (2, 3, 12, 12)
    assert next(iter(rrc.test_dataloader()))[0].shape[1:] == (3, 12, 12)
