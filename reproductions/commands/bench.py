"""Benchmarks that print ratios against a reference measured in the same process.

    repro bench trainer   # Lightning fit vs a plain PyTorch loop, same model and batches
    repro bench vit       # ViT step per position embedding vs timm; cost vs tokens and batch; GFLOP/s
    repro bench hybrid    # HybridViT and ResNet (config shapes): channels_last vs contiguous, GFLOP/s
    repro bench precision # fp32 vs bf16 autocast (and channels_last) at the image configs; per-op profile
    repro bench data      # image and behaviour DataModules: batches/s vs the model's steps/s (>= 2x)
    repro bench bst       # BST vs an nn.TransformerEncoder BST (>= 1.0x) and FuxiCTR's BST (>= 1.2x; its
                          # environment: scripts/bench_env.sh) by length and blocks; AUC/GAUC
    repro bench gpu       # ViT-B/16 and BST in bf16 on one GPU: images/s and MFU (exit 2 without CUDA)

Every comparison runs in one process on the same inputs, alternating the candidates over
``--rounds`` so that machine noise hits all of them; results are ratios of medians. Each prints
its tables (Markdown) and PASS/FAIL lines, and writes JSON (``--out``, default
``bench_results/<name>.json``). ``--steps``, ``--batch-size`` and ``--rounds`` have small CPU
defaults (about 1-2 minutes each on 2 cores); ``--threads 1`` is steadier on a shared CPU.
``repro bench <name> --help`` describes each. The code lives in
``reproductions/benchmarks/`` (``common.py``: timing, alternation, memory, FLOPs, tables).
"""

from __future__ import annotations

import argparse
import sys

import torch

from reproductions.benchmarks import NAMES, load


def build_parser() -> argparse.ArgumentParser:
    from reproductions.benchmarks.common import add_out_arg

    parser = argparse.ArgumentParser(prog="repro bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="which", required=True, metavar="{" + ",".join(NAMES) + "}")
    for name in NAMES:
        module = load(name)
        p = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        add_out_arg(p, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from reproductions.benchmarks.common import BenchmarkUnavailable, emit

    module = load(args.which)
    threads = torch.get_num_threads()
    try:
        report = module.run(args)
    except BenchmarkUnavailable as err:
        print(f"bench {args.which}: {err}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)  # --threads applies to this run only (main() may be called in-process)
    emit(report, args.out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
