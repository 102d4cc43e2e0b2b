"""The benchmarks behind ``repro bench <name>`` (CLI: ``reproductions/commands/bench.py``).

Each module has ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> common.BenchReport``;
``common`` holds the shared timing, alternation, training step, memory, FLOPs, table and JSON code.

- ``trainer``: Lightning ``fit`` vs a plain PyTorch loop (``trainer.py``)
- ``vit``: ViT step per position embedding vs timm; cost against tokens and batch; GFLOP/s (``vit.py``)
- ``hybrid``: HybridViT and ResNet at their Fashion-MNIST config shapes, channels_last vs contiguous (``hybrid.py``)
- ``precision``: fp32 vs bf16 autocast (and channels_last) at the image configs, with a per-op profile (``precision.py``)
- ``data``: DataModule batches/s against the model's training steps/s, images and behaviour data (``loaders.py``)
- ``bst``: BST vs an ``nn.TransformerEncoder`` BST and FuxiCTR's BST (``fuxictr_peer.py``, where fuxictr is
  installed) over sequence length and blocks; AUC/GAUC evaluation (``bst.py``)
- ``gpu``: ViT-B/16 and BST in bf16 with fused attention: throughput and model FLOPs utilisation (``gpu.py``)
"""

from __future__ import annotations

from importlib import import_module

NAMES = ("trainer", "vit", "hybrid", "precision", "data", "bst", "gpu")
#: a benchmark whose module has another name than the benchmark
MODULES = {"data": "loaders"}


def load(name: str):
    """The benchmark module ``name`` (imported on demand, so ``--help`` stays quick)."""
    if name not in NAMES:
        raise ValueError(f"unknown benchmark {name!r}: use one of {list(NAMES)}")
    return import_module(f"reproductions.benchmarks.{MODULES.get(name, name)}")
