"""Decoding hub and folder images into uint8 (C, H, W) tensors, one mode and one size for all.

Prepared datasets hold the ENCODED bytes (JPEG, PNG, ...); ``decode_bytes`` decodes one image in a loader worker:
``torchvision`` (the default) decodes JPEG with ``torchvision.io.decode_jpeg`` and PNG with ``decode_png``
(libjpeg-turbo / libpng straight into a tensor), anything else, and any file those refuse, with Pillow; ``pil``
decodes everything with Pillow. Both give the same pixels within JPEG tolerance (``tests/test_images_decode.py``);
``repro bench data`` measures their images/s per core (``docs/benchmarks.md``). On a GPU,
``torchvision.io.decode_jpeg(device="cuda")`` decodes whole batches (nvJPEG): an option when the CPU cores
cannot keep up, not used here (the augmentation would then have to run on the GPU too).

``verify_image`` is the check a preparation runs on every file: Pillow reads the header and decodes the image
(JPEG at 1/8 scale: the same entropy decoding, an eighth of the work), so a file that cannot be decoded is
found when the data is prepared, never mid-epoch.
"""

from __future__ import annotations

import io
import os
import warnings
from typing import Literal, get_args

import torch
from PIL import Image
from torchvision.transforms.v2 import functional as TF


ImageMode = Literal["L", "RGB"]
"""What decoded images are converted to: ``L`` (1 channel) or ``RGB`` (3 channels)."""
IMAGE_MODES: tuple[str, ...] = get_args(ImageMode)
GRAYSCALE_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
"""PIL modes of one-channel images: a dataset whose images are all in these is decoded as ``L``."""


Decoder = Literal["torchvision", "pil"]
"""How encoded images are decoded: ``torchvision`` (libjpeg-turbo/libpng into a tensor; Pillow for other formats)
or ``pil`` (Pillow for everything)."""
DECODERS: tuple[str, ...] = get_args(Decoder)
JPEG_MAGIC = b"\xff\xd8\xff"
# torchvision 0.29 deprecates its image codecs in favour of TorchCodec (not a dependency here); they stay the
# fastest decoder in the pinned requirements, so their deprecation notice (one per process) is not shown.
warnings.filterwarnings("ignore", message=".*image decoding and encoding capabilities of TorchVision",
                        category=DeprecationWarning)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def channels(mode: str) -> int:
    """The channel count of decoded images in ``mode`` (``L``: 1, ``RGB``: 3)."""
    if mode not in IMAGE_MODES:
        raise ValueError(f"unknown image_mode {mode!r}: use one of {', '.join(IMAGE_MODES)}, or None")
    return 1 if mode == "L" else 3


# ------------------------------------------------------------------------------------------------ encoded


class BadImageError(ValueError):
    """Files that cannot be decoded; the message names the first in one line and says what to do."""


def image_bytes(value: dict, root: str | None = None) -> bytes:
    """The encoded bytes of an ``Image(decode=False)`` value ``{"bytes", "path"}`` (read from ``path`` if needed)."""
    data = value.get("bytes")
    if data is not None:
        return data
    path = value.get("path")
    if path is None:
        raise ValueError("an image value holds neither bytes nor a path")
    with open(os.path.join(root, path) if root and not os.path.isabs(path) else path, "rb") as f:
        return f.read()


def _tensor_mode(mode: str):
    from torchvision.io import ImageReadMode

    return ImageReadMode.GRAY if mode == "L" else ImageReadMode.RGB


def decode_pil(data: bytes, mode: str) -> torch.Tensor:
    """``data`` decoded by Pillow into uint8 (C, H, W) in ``mode``."""
    with Image.open(io.BytesIO(data)) as image:
        if image.mode != mode:
            image = image.convert(mode)
        return TF.pil_to_tensor(image)


def decode_bytes(data: bytes, mode: str, decoder: str = "torchvision") -> torch.Tensor:
    """An encoded image as uint8 (C, H, W) in ``mode`` (``L`` or ``RGB``), decoded by ``decoder``."""
    if decoder == "torchvision":
        from torchvision.io import decode_jpeg, decode_png

        head = data[:8]
        fn = decode_jpeg if head.startswith(JPEG_MAGIC) else decode_png if head == PNG_MAGIC else None
        if fn is not None:
            try:
                return fn(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=_tensor_mode(mode))
            except RuntimeError:
                pass  # a format variant torchvision refuses (e.g. some CMYK JPEGs, 16-bit PNGs): Pillow below
    elif decoder != "pil":
        raise ValueError(f"unknown decoder {decoder!r}: use one of {', '.join(DECODERS)}")
    return decode_pil(data, mode)


def verify_image(data: bytes) -> tuple[str, int, int]:
    """(PIL mode, height, width) of an encoded image after decoding it (JPEG at 1/8 scale); raises if it cannot."""
    with Image.open(io.BytesIO(data)) as image:
        mode, (width, height) = image.mode, image.size
        if image.format == "JPEG":
            image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
        image.load()
    return mode, height, width
