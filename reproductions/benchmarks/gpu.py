"""``bench gpu``: the GPU check, ViT-B/16 and BST training in bf16 on one GPU, with model FLOPs utilisation.

53 s on one H200 (measured: docs/benchmarks.md#on-one-h200-the-gpu-check):

1. **ViT-B/16 at 224 px** (``models.vit.ViT``: width 768, depth 12, 12 heads, MLP 4, 1000 classes,
   timm's shape) against timm's ``VisionTransformer`` of the same shape: images/s of the training
   step (forward and loss under ``torch.autocast(bfloat16)``, backward, AdamW), fused attention.
2. **BST** (``bench bst``'s grid: sequence length x blocks, against the ``nn.TransformerEncoder``
   reference) under the same bf16 autocast.

Model FLOPs utilisation (MFU) = achieved FLOP/s (3 x forward FLOPs per sample, counted by
``count_flops``, x samples/s) / the device's dense bf16 peak, taken from ``PEAK_BF16_TFLOPS`` by
device name (H100 SXM and H200 989 TFLOP/s, H100 PCIe 756, H100 NVL 835, A100 312); for any other
device the bf16 matmul rate measured in the same run (8192^2 ``torch.matmul``) stands in, and the
output says so. The measured matmul rate is reported in every case.

``--budget SECONDS`` (scripts/gpu_check.sh passes its stage limit less a margin) bounds the run: the BST
grid is measured one sequence length at a time, and the next one starts only while twice the previous
one's time is left; the lengths left out are named in the output and the JSON (``bst.skipped_seq_lens``).

Attention: on CUDA the steps run under ``sdpa_kernel`` restricted to the fused kernels (flash,
memory-efficient, cuDNN) when a trial step accepts that; otherwise PyTorch's default choice, and
the output says so. Without CUDA it exits with code 2 and a message; ``--device cpu --tiny`` runs
the same code path on a CPU with tiny models (what the tests do).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from typing import Any

import torch

from reproductions.benchmarks.bst import TARGET as BST_TARGET
from reproductions.benchmarks.bst import bst_kwargs, geometric_mean, training_grid, training_table
from reproductions.benchmarks.common import (
    BenchReport, Table, TrainStep, add_run_args, compare, cross_entropy, fmt_fraction, fmt_mib,
    fmt_rate, fmt_ratio, image_batches, int_list, memory_method, pass_fail, run_settings, setup_run,
)
from reproductions.benchmarks.vit import TIMM_TARGET, our_vit, timm_vit

NAME = "gpu"
HELP = "GPU check: ViT-B/16 and BST in bf16 with fused attention, images/s and MFU (exit 2 without CUDA)"

#: dense bf16 peak (no sparsity), TFLOP/s, by a substring of torch.cuda.get_device_name(); first match wins
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
]
VIT_B16 = dict(img_size=224, in_chans=3, num_classes=1000, patch_size=16, embed_dim=768, depth=12, num_heads=12,
               mlp_ratio=4.0)
VIT_TINY = dict(img_size=32, in_chans=3, num_classes=10, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                mlp_ratio=2.0)
PROFILES = {
    "full": dict(batch_size=128, bst_batch_size=1024, seq_lens=[20, 50, 100, 200], blocks=[1, 2, 3], steps=20,
                 warmup=5),
    "tiny": dict(batch_size=4, bst_batch_size=8, seq_lens=[8], blocks=[1], steps=1, warmup=1),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true",
                        help="tiny ViT and BST, one step (exercises the code path, e.g. --device cpu --tiny in tests)")
    parser.add_argument("--bst-batch-size", dest="bst_batch_size", type=int)
    parser.add_argument("--seq-lens", dest="seq_lens", type=int_list)
    parser.add_argument("--blocks", type=int_list)
    parser.add_argument("--no-timm", dest="no_timm", action="store_true", help="skip the timm ViT reference")
    add_run_args(parser, rounds=3, steps=None, warmup=None, batch_size=None, device=False)
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps before each measurement")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds the benchmark may take from its start: BST sequence lengths that would not "
                             "fit are left out (and named); default: no limit")


def table_peak(device_name: str) -> float | None:
    """Dense bf16 FLOP/s of a known device, else None."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops * 1e12
    return None


def fused_attention(device: torch.device, steps: dict[str, TrainStep]) -> tuple[Any, str]:
    """A context that keeps attention on the fused kernels, if one trial step of each model accepts it."""
    if device.type != "cuda":
        return contextlib.nullcontext(), "scaled_dot_product_attention, PyTorch's CPU choice"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    try:
        with sdpa_kernel(backends):
            for step in steps.values():
                step()
    except RuntimeError as err:
        return contextlib.nullcontext(), f"PyTorch's default SDPA choice (fused-only refused: {str(err)[:120]})"
    return sdpa_kernel(backends), "fused SDPA kernels only (flash / memory-efficient / cuDNN)"


def run(args: argparse.Namespace) -> BenchReport:
    start = time.perf_counter()
    device = setup_run(args, cpu_hint="--device cpu --tiny")
    for key, value in PROFILES["tiny" if args.tiny else "full"].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    shape = VIT_TINY if args.tiny else VIT_B16
    if device.type == "cpu" and not args.tiny:
        print("[gpu] warning: ViT-B/16 and the full BST grid in bf16 on a CPU take very long; add --tiny", flush=True)
    amp = torch.bfloat16
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    timing = dict(rounds=args.rounds, steps_per_measure=args.steps, warmup=args.warmup, device=device,
                  matmul_dtype=torch.bfloat16)

    # ViT
    vit_name = "ViT-B/16 (models.vit)" if not args.tiny else "tiny ViT (models.vit)"
    batches = image_batches(2, args.batch_size, (shape["in_chans"], shape["img_size"], shape["img_size"]),
                            shape["num_classes"])
    steps = {vit_name: TrainStep(our_vit(shape), batches, cross_entropy, device=device, amp_dtype=amp)}
    if not args.no_timm:
        steps["timm VisionTransformer"] = TrainStep(timm_vit(shape), batches, cross_entropy, device=device,
                                                    amp_dtype=amp)
    print(f"[gpu] {device_name}: {vit_name}, batch {args.batch_size}, bf16 autocast", flush=True)
    context, attention = fused_attention(device, steps)
    with context:
        vit = compare(steps, **timing)
    measured_peak = vit.matmul
    peak = table_peak(device_name)
    peak_source = "table" if peak else "measured bf16 matmul (device not in the table)"
    peak = peak or measured_peak

    vit_table = Table(f"{vit_name} training step, bf16 autocast, batch {args.batch_size} ({device_name})",
                      ["model", "params", "GFLOPs/img", "images/s", "x timm", "TFLOP/s", "MFU", "of bf16 matmul",
                       "peak MiB"])
    ours = vit[vit_name]
    timm = vit.items.get("timm VisionTransformer")
    for name, m in vit.items.items():
        vit_table.add(name, f"{m.params:,}", f"{m.forward_flops / 1e9:.4g}", fmt_rate(m.median),
                      fmt_ratio(m.median / timm.median) if timm else "-", f"{m.flops_per_sec / 1e12:.4g}",
                      fmt_fraction(m.flops_per_sec / peak), fmt_fraction(m.fraction_of_matmul), fmt_mib(m.peak_bytes))
    notes = [
        f"MFU: 3 x forward FLOPs x images/s over the bf16 dense peak {peak / 1e12:,.1f} TFLOP/s ({peak_source}); "
        f"measured bf16 matmul in the same rounds: {measured_peak / 1e12:,.1f} TFLOP/s.",
        f"attention: {attention}; peak MiB: {memory_method(device)}.",
        f"median of {args.rounds} alternating rounds x {args.steps} steps (after {args.warmup} warm-up steps).",
    ]
    vit_table.notes += notes

    # BST, one sequence length at a time (a budget may cut the grid short)
    print(f"[gpu] BST: seq_len {args.seq_lens} x blocks {args.blocks}, batch {args.bst_batch_size}, bf16", flush=True)
    kwargs = bst_kwargs()
    fused = device.type == "cuda" and attention.startswith("fused")
    bst_attention = attention
    rows: list[dict] = []
    skipped: list[int] = []
    last = 0.0
    for seq_len in args.seq_lens:
        left = math.inf if args.budget is None else args.budget - (time.perf_counter() - start)
        if left <= 0 or (rows and left < 2 * last):
            skipped.append(seq_len)
            continue
        began = time.perf_counter()
        grid = dict(seq_lens=[seq_len], blocks=args.blocks, batch_size=args.bst_batch_size, device=device,
                    amp_dtype=amp, rounds=args.rounds, steps=args.steps, warmup=args.warmup, matmul_dtype=None)
        if fused:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            try:
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                  SDPBackend.CUDNN_ATTENTION]):
                    rows += training_grid(kwargs, **grid)[1]
                last = time.perf_counter() - began
                continue
            except RuntimeError as err:  # a masked shape the fused kernels refuse: PyTorch's default choice
                print(f"[gpu] BST: fused-only attention refused ({str(err)[:120]}); PyTorch's default choice",
                      flush=True)
                fused, bst_attention = False, "PyTorch's default SDPA choice"
        rows += training_grid(kwargs, **grid)[1]
        last = time.perf_counter() - began
    if skipped:
        print(f"[gpu] BST: sequence lengths {skipped} left out: --budget {args.budget:g} s", flush=True)
    bst_overall = geometric_mean([r["ratio"] for r in rows]) if rows else None
    for r in rows:
        for side in ("ours", "reference"):
            r[side]["mfu"] = r[side]["flops_per_sec"] / peak
    tables = [vit_table]
    if rows:  # none when the budget was spent on the ViT: its measurement is still written
        tables.append(training_table(
            rows, f"BST vs nn.TransformerEncoder BST, bf16 autocast, batch {args.bst_batch_size} ({device_name})",
            [f"MFU over {peak / 1e12:,.1f} TFLOP/s ({peak_source}); attention: {bst_attention}.",
             f"peak MiB: {memory_method(device)}; median of {args.rounds} alternating rounds x {args.steps} steps; "
             f"geometric mean of BST x reference: {bst_overall:.3f}x."],
            peak_flops=peak,
        ))

    elapsed = time.perf_counter() - start
    verdicts = [
        f"{vit_name}: {ours.median:,.1f} images/s, {ours.flops_per_sec / 1e12:,.1f} TFLOP/s, MFU "
        f"{fmt_fraction(ours.flops_per_sec / peak)} (peak {peak / 1e12:,.1f} TFLOP/s, {peak_source})",
    ]
    if timm:
        verdicts.append(f"{pass_fail(ours.median / timm.median, TIMM_TARGET)}: {vit_name} vs timm: "
                        f"{ours.median / timm.median:.3f}x (target >= {TIMM_TARGET})")
    if rows:
        verdicts.append(f"{pass_fail(bst_overall, BST_TARGET)}: BST vs nn.TransformerEncoder BST: {bst_overall:.3f}x "
                        f"(geometric mean; target >= {BST_TARGET:g}x)")
    if skipped:
        verdicts.append(f"BST sequence lengths {skipped} not measured: the --budget of {args.budget:g} s was spent")
    verdicts.append(f"total time {elapsed:.0f} s (budget: {'none' if args.budget is None else f'{args.budget:g} s'})")
    if args.tiny:
        verdicts.append("--tiny: a smoke run of the code path (tiny models, few steps); its numbers are not a measurement")
    result = {
        "settings": run_settings(args, device, amp="bf16", device_name=device_name),
        "device_name": device_name,
        "peak_flops": peak,
        "peak_source": peak_source,
        "measured_bf16_matmul_flops_per_sec": measured_peak,
        "attention": {"vit": attention, "bst": bst_attention},
        "vit": {"shape": shape, "batch_size": args.batch_size, "comparison": vit.to_json(),
                "mfu": ours.flops_per_sec / peak, "ratio_to_timm": ours.median / timm.median if timm else None},
        "bst": {"net": kwargs, "batch_size": args.bst_batch_size, "training": rows, "geomean_ratio": bst_overall,
                "skipped_seq_lens": skipped},
        "elapsed_seconds": elapsed,
    }
    return BenchReport(NAME, result, tables, verdicts)
