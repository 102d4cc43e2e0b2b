"""``bench vit``: the ViT training step (forward, backward, AdamW step) against timm, and its cost against work.

1. **Position embeddings vs timm.** images/s of ``models.vit.ViT`` for every position-embedding
   kind and placement it accepts (``models.position.VALID_PLACEMENTS``: 12 pairs) and of timm's
   ``VisionTransformer`` of the same shape (image and patch size, width, depth, heads, MLP ratio,
   class token, learned 1-D position embedding, classes; the same parameter count as our default,
   tested); every kind's step time as a ratio to the default. Target: our default (learned_1d at
   the stem) >= 0.97x timm (PASS/FAIL), decided by a dedicated A/B of the two alone over
   ``--check-rounds`` rounds (a 3% target needs more rounds than the 13-model table gets), which
   also reports images per second of process CPU time (steadier on a shared CPU).
2. **Cost against work.** images/s and peak memory as the token count grows (patch 8 -> 4 -> 2
   at 32 px on a CPU; 32 -> 16 -> 8 at 224 px with ``--device cuda``) and as the batch grows; the
   measured time ratio beside the ratio predicted from FLOPs counted by
   ``lightning_modules.model_stats.count_flops``, and whether the growth matches (within 20%).
3. **Achieved GFLOP/s** of each step (3 x forward FLOPs per image x images/s) as a fraction of the
   fp32 matmul rate measured in the same process and rounds (``torch.matmul`` of 1024^2 on a CPU,
   8192^2 on a GPU): how close the step gets to the machine's limit.

All candidates of a table are measured in alternating rounds on the same random batches
(``reproductions.benchmarks.common``). CPU defaults: 32 px, patch 4 (64 tokens), width 64, depth
4, 4 heads, MLP ratio 2, batch 32; ``--device cuda``: ViT-B/16 at 224 px, batch 32 (fp32 unless
``--amp bf16``).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from timm.models.vision_transformer import VisionTransformer

from models.position import POS_EMBED_KINDS, VALID_PLACEMENTS
from models.vit import ViT
from reproductions.benchmarks.common import (
    BenchReport, Table, TrainStep, add_run_args, alternate, compare, cross_entropy, fmt_flops, fmt_fraction, fmt_gflops,
    fmt_mib, fmt_rate, fmt_ratio, forward_flops, growth_verdict, image_batches, int_list, measure_rates, median,
    memory_method, paired_ratios, pass_fail, run_settings, setup_run,
)

NAME = "vit"
HELP = "ViT training step: every position embedding vs timm, cost against tokens and batch, GFLOP/s"
TIMM_TARGET = 0.97  #: our default ViT's images/s must be at least this fraction of timm's
DEFAULT = ("learned_1d", "stem")
TIMM = "timm VisionTransformer"
SHAPE_KEYS = ("img_size", "in_chans", "num_classes", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")

PROFILES: dict[str, dict[str, Any]] = {
    "cpu": dict(img_size=32, in_chans=3, num_classes=10, patch_size=4, embed_dim=64, depth=4, num_heads=4,
                mlp_ratio=2.0, batch_size=32, steps=8, scale_patches=[8, 4, 2], batch_sizes=[8, 32, 128]),
    "cuda": dict(img_size=224, in_chans=3, num_classes=1000, patch_size=16, embed_dim=768, depth=12, num_heads=12,
                 mlp_ratio=4.0, batch_size=32, steps=20, scale_patches=[32, 16, 8], batch_sizes=[8, 32, 128]),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shape = parser.add_argument_group("model shape (default: the device's profile, see the description)")
    shape.add_argument("--img-size", dest="img_size", type=int)
    shape.add_argument("--in-chans", dest="in_chans", type=int)
    shape.add_argument("--num-classes", dest="num_classes", type=int)
    shape.add_argument("--patch-size", dest="patch_size", type=int)
    shape.add_argument("--embed-dim", dest="embed_dim", type=int)
    shape.add_argument("--depth", type=int)
    shape.add_argument("--num-heads", dest="num_heads", type=int)
    shape.add_argument("--mlp-ratio", dest="mlp_ratio", type=float)
    parser.add_argument("--scale-patches", dest="scale_patches", type=int_list,
                        help="patch sizes for the token-count table, e.g. 8,4,2")
    parser.add_argument("--batch-sizes", dest="batch_sizes", type=int_list,
                        help="batch sizes for the batch table, e.g. 8,32,128")
    parser.add_argument("--amp", choices=["none", "bf16"], default="none", help="autocast dtype (default fp32)")
    parser.add_argument("--check-rounds", dest="check_rounds", type=int, default=7,
                        help="rounds of the dedicated A/B of our default ViT against timm that decides PASS/FAIL "
                             "(default 7)")
    add_run_args(parser, rounds=3, steps=None, warmup=2, batch_size=None)


def fill_profile(args: argparse.Namespace, device: torch.device) -> None:
    """Options left unset take the device's profile."""
    for key, value in PROFILES["cuda" if device.type == "cuda" else "cpu"].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def shape_of(args: Any, **overrides: Any) -> dict[str, Any]:
    return {**{k: getattr(args, k) for k in SHAPE_KEYS}, **overrides}


def our_vit(shape: dict[str, Any], pos_embed: str = "learned_1d", pos_placement: str = "stem", seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    return ViT(**shape, pool="cls", pos_embed=pos_embed, pos_placement=pos_placement)


def timm_vit(shape: dict[str, Any], seed: int = 0) -> VisionTransformer:
    """timm's ViT of the same shape as ``our_vit(shape)``: class token, learned 1-D position embedding."""
    torch.manual_seed(seed)
    return VisionTransformer(**shape, class_token=True, global_pool="token", pos_embed="learn")


def position_variants() -> list[tuple[str, str]]:
    """Every (pos_embed, pos_placement) pair ``models.vit.ViT`` accepts, the default first."""
    pairs = [(k, p) for k in POS_EMBED_KINDS for p in VALID_PLACEMENTS[k]]
    return [DEFAULT] + [pair for pair in pairs if pair != DEFAULT]


def label(kind: str, placement: str) -> str:
    return f"{kind}/{placement}"


def predicted_time_ratio(flops: list[float]) -> list[float]:
    """Time ratios FLOPs predict: each FLOP count against the first."""
    return [f / flops[0] for f in flops]


def flops_per_image(shape: dict[str, Any]) -> int:
    """Forward FLOPs per image of ``our_vit(shape)`` (``count_flops``)."""
    return forward_flops(our_vit(shape), torch.zeros(1, shape["in_chans"], shape["img_size"], shape["img_size"]))


def run(args: argparse.Namespace) -> BenchReport:
    device = setup_run(args)
    if args.check_rounds < 1:
        raise ValueError(f"--check-rounds {args.check_rounds} must be >= 1")
    fill_profile(args, device)
    amp = torch.bfloat16 if args.amp == "bf16" else None
    timing = dict(rounds=args.rounds, steps_per_measure=args.steps, warmup=args.warmup, device=device)
    shape = shape_of(args)
    image_shape = (args.in_chans, args.img_size, args.img_size)
    batches = image_batches(2, args.batch_size, image_shape, args.num_classes)
    mem_note = f"peak MiB: {memory_method(device)}."

    # 1. every position embedding against timm
    print(f"[vit] position embeddings vs timm: {len(position_variants()) + 1} models, batch {args.batch_size}",
          flush=True)
    steps = {TIMM: TrainStep(timm_vit(shape), batches, cross_entropy, device=device, amp_dtype=amp)}
    for kind, placement in position_variants():
        steps[label(kind, placement)] = TrainStep(our_vit(shape, kind, placement), batches, cross_entropy,
                                                  device=device, amp_dtype=amp)
    pos = compare(steps, **timing)
    timm, default = pos[TIMM], pos[label(*DEFAULT)]
    check = timm_check(steps[label(*DEFAULT)], steps[TIMM], rounds=args.check_rounds, steps=args.steps,
                       warmup=args.warmup, device=device)
    ours_over_timm = check["ratio"]
    del steps  # free the 13 models (and their optimiser states) before the next tables
    _release(device)
    table1 = Table(
        f"ViT training step by position embedding vs timm ({args.img_size} px, patch {args.patch_size}, width "
        f"{args.embed_dim}, depth {args.depth}, batch {args.batch_size}, {device.type})",
        ["model / pos_embed", "placement", "params", "MFLOPs/img", "images/s", "x timm", "time x 1-D",
         "GFLOP/s", "of matmul", "peak MiB"],
    )
    position_rows = []
    for name, m in pos.items.items():
        kind, placement = ("timm", "stem") if name == TIMM else name.split("/")
        time_vs_default = default.median / m.median
        table1.add(TIMM if name == TIMM else kind, placement, f"{m.params:,}", fmt_flops(m.forward_flops),
                   fmt_rate(m.median), fmt_ratio(m.median / timm.median), fmt_ratio(time_vs_default),
                   fmt_gflops(m.flops_per_sec), fmt_fraction(m.fraction_of_matmul), fmt_mib(m.peak_bytes))
        position_rows.append({**m.to_json(), "pos_embed": kind, "pos_placement": placement,
                              "ratio_to_timm": m.median / timm.median, "time_vs_default": time_vs_default})
    table1.notes += [
        f"x timm: images/s over timm's (target for learned_1d/stem: >= {TIMM_TARGET}, decided by the A/B below); "
        "time x 1-D: step time over the learned_1d/stem default (> 1: costlier).",
        f"GFLOP/s: 3 x forward FLOPs x images/s; of matmul: that over a fp32 {'8192' if device.type == 'cuda' else '1024'}"
        f"^2 torch.matmul measured in the same rounds ({fmt_gflops(pos.matmul)} GFLOP/s).",
        mem_note,
        f"median of {args.rounds} alternating rounds x {args.steps} steps; {torch.get_num_threads()} thread(s).",
    ]

    # 2a. tokens
    print(f"[vit] token count: patch sizes {args.scale_patches}", flush=True)
    token_steps = {}
    for p in args.scale_patches:
        token_steps[f"patch {p}"] = TrainStep(our_vit(shape_of(args, patch_size=p)), batches, cross_entropy,
                                              device=device, amp_dtype=amp)
    tokens = compare(token_steps, **timing)
    del token_steps
    _release(device)
    table2, token_rows = _scaling_table(
        f"Cost against tokens ({args.img_size} px, batch {args.batch_size})", "patch",
        [(p, (args.img_size // p) ** 2 + 1, tokens[f"patch {p}"]) for p in args.scale_patches],
        per_step=False, matmul=tokens.matmul, batch_sizes=[args.batch_size] * len(args.scale_patches),
    )
    table2.notes.insert(0, "tokens include the class token; time x: time per image over the first row's; FLOPs x: "
                           "forward FLOPs per image over the first row's (count_flops). Match: within 20%.")
    table2.notes.append(mem_note)

    # 2b. batch
    print(f"[vit] batch size: {args.batch_sizes}", flush=True)
    batch_steps = {}
    for b in args.batch_sizes:
        batch_steps[f"batch {b}"] = TrainStep(our_vit(shape), image_batches(2, b, image_shape, args.num_classes),
                                              cross_entropy, device=device, amp_dtype=amp)
    batch = compare(batch_steps, **timing)
    table3, batch_rows = _scaling_table(
        f"Cost against batch size ({args.img_size} px, patch {args.patch_size})", "batch",
        [(b, b, batch[f"batch {b}"]) for b in args.batch_sizes],
        per_step=True, matmul=batch.matmul, batch_sizes=args.batch_sizes,
    )
    table3.notes.insert(0, "time x: step time over the first row's; FLOPs x: forward FLOPs per step (per image x "
                           "batch) over the first row's; below FLOPs means larger batches use the machine better.")
    table3.notes.append(mem_note)

    table0 = Table(f"Our default ViT (learned_1d/stem) against timm: dedicated A/B, {args.check_rounds} rounds",
                   ["model", "images/s (wall clock)", "images/s (process CPU time)"])
    table0.add(TIMM, fmt_rate(check["timm"]), fmt_rate(check["timm_cpu"]))
    table0.add("ViT learned_1d/stem", fmt_rate(check["ours"]), fmt_rate(check["ours_cpu"]))
    table0.add("ours x timm", fmt_ratio(check["ratio"]), fmt_ratio(check["cpu_ratio"]))
    table0.notes += [
        f"median of {args.check_rounds} alternating rounds x {args.steps} steps; median of per-round wall-clock ratios "
        f"{check['median_paired_ratio']:.3f}. PASS/FAIL: wall-clock ratio of medians >= {TIMM_TARGET}.",
        "CPU time: items per second of this process's CPU time, which ignores time spent waiting for other "
        "processes (the steadier number on a shared CPU with --threads 1; with more threads it counts spinning).",
    ]
    passed = ours_over_timm >= TIMM_TARGET
    verdicts = [
        f"{pass_fail(ours_over_timm, TIMM_TARGET)}: ViT learned_1d/stem {check['ours']:,.1f} images/s vs timm "
        f"{check['timm']:,.1f} images/s: {ours_over_timm:.3f}x (target >= {TIMM_TARGET}; {args.check_rounds}-round "
        f"A/B; median of per-round ratios {check['median_paired_ratio']:.3f}; process-CPU-time ratio "
        f"{check['cpu_ratio']:.3f})",
        f"achieved: {fmt_gflops(default.flops_per_sec)} GFLOP/s = {fmt_fraction(default.fraction_of_matmul)} of the "
        f"measured fp32 matmul rate ({fmt_gflops(pos.matmul)} GFLOP/s)",
    ]
    result = {
        "settings": run_settings(args, device, amp=args.amp),
        "shape": shape,
        "memory_method": memory_method(device),
        "position": position_rows,
        "timm_target": {**check, "target": TIMM_TARGET, "pass": passed, "params_ours": default.params,
                        "params_timm": timm.params, "all_kinds_ratio": default.median / timm.median},
        "token_scaling": token_rows,
        "batch_scaling": batch_rows,
        "achieved": {"flops_per_sec": default.flops_per_sec, "fraction_of_matmul": default.fraction_of_matmul},
        "matmul_flops_per_sec": {"position": pos.matmul, "tokens": tokens.matmul, "batch": batch.matmul},
        "comparisons": {"position": pos.to_json(), "tokens": tokens.to_json(), "batch": batch.to_json()},
    }
    return BenchReport(NAME, result, [table0, table1, table2, table3], verdicts)


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timm_check(ours: TrainStep, timm: TrainStep, *, rounds: int, steps: int, warmup: int,
               device: torch.device) -> dict:
    """A/B of two training steps over ``rounds``: wall-clock and process-CPU-time images/s, ratios of medians."""
    cpu: dict[str, list[float]] = {"ours": [], "timm": []}

    def measure(name: str, step: TrainStep) -> float:
        wall, cpu_rate = measure_rates(step, steps=steps, warmup=warmup, items_per_step=step.batch_size, device=device)
        cpu[name].append(cpu_rate)
        return wall

    print(f"[vit] dedicated A/B against timm: {rounds} rounds", flush=True)
    rates = alternate({"timm": lambda: measure("timm", timm), "ours": lambda: measure("ours", ours)}, rounds,
                      unit="images/s")
    paired = paired_ratios(rates["ours"], rates["timm"])
    out = {"ours": median(rates["ours"]), "timm": median(rates["timm"]), "ours_rates": rates["ours"],
           "timm_rates": rates["timm"], "paired_ratios": paired, "median_paired_ratio": median(paired),
           "ours_cpu": median(cpu["ours"]), "timm_cpu": median(cpu["timm"]), "ours_cpu_rates": cpu["ours"],
           "timm_cpu_rates": cpu["timm"]}
    out["ratio"] = out["ours"] / out["timm"]
    out["cpu_ratio"] = out["ours_cpu"] / out["timm_cpu"]
    return out


def _scaling_table(title: str, axis: str, rows: list[tuple[int, int, Any]], *, per_step: bool,
                   matmul: float | None, batch_sizes: list[int]) -> tuple[Table, list[dict]]:
    """Rows (axis value, tokens or batch, Measurement): measured vs FLOPs-predicted time ratios."""
    work = [m.forward_flops * (b if per_step else 1) for (_, _, m), b in zip(rows, batch_sizes)]
    predicted = predicted_time_ratio(work)
    first = rows[0][2]
    first_time = (batch_sizes[0] if per_step else 1) / first.median
    table = Table(title, [axis, "tokens" if not per_step else "images/step", "MFLOPs/img", "images/s", "time x",
                          "FLOPs x", "growth", "GFLOP/s", "of matmul", "peak MiB"])
    out = []
    for (value, count, m), b, pred in zip(rows, batch_sizes, predicted):
        measured = ((b if per_step else 1) / m.median) / first_time
        verdict = growth_verdict(measured, pred)
        table.add(value, count, fmt_flops(m.forward_flops), fmt_rate(m.median), fmt_ratio(measured), fmt_ratio(pred),
                  verdict, fmt_gflops(m.flops_per_sec), fmt_fraction(m.fraction_of_matmul), fmt_mib(m.peak_bytes))
        out.append({**m.to_json(), axis: value, "tokens" if not per_step else "batch_size": count,
                    "measured_time_ratio": measured, "predicted_time_ratio": pred, "growth": verdict})
    table.notes.append(f"matmul rate in these rounds: {fmt_gflops(matmul)} GFLOP/s.")
    return table, out
