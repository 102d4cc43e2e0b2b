"""``bench precision``: fp32 against bf16 autocast (and channels_last) for the training step of
the image configs, and where the time goes in each.

Per config (``--config``, repeatable; default: the small ViT of ``fashion_mnist.yaml``, the
conv-stem ViT of the 10-minute Fashion-MNIST recipe and the CIFAR-10 recipe's wider one): the
net of ``model.init_args.net`` at the config's input shape, one training step (forward under
autocast, loss, backward, AdamW) in fp32 and under ``torch.autocast(bfloat16)``, each contiguous
and, for nets with convolutions, channels_last too. The candidates alternate over ``--rounds``
on the same batches; the table gives images/s and each one's ratio to fp32 contiguous. With
``--compile`` the same two precisions in the last layout run ``torch.compile``-d as well
(``nn.Module.compile``, compiled before the timed rounds), beside the eager ones.

Then the answer to "why": ``torch.profiler`` over ``--profile-steps`` steps of fp32 and of bf16
(same layout, the faster one) of each config, self CPU time per step grouped into what the
autocast adds (``aten::to``/``copy_``: the casts of weights and activations to bf16 and back),
matrix products (``addmm``, ``mm``, ``bmm``, ``linear``...), convolutions, attention (SDPA),
normalisation, elementwise and the rest, with the bf16/fp32 ratio of each group. Matmul rates of
one large fp32 and bf16 product are measured alongside: the headroom bf16 would give a step made
only of large products. The CPU's flags (``avx512_bf16``, ``amx_bf16``) are in the JSON: without
them the CPU has no bf16 instructions and bf16 is typically many times slower than fp32.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from reproductions.benchmarks.common import (
    BenchReport, Table, TrainStep, add_run_args, build_seeded, compare, config_net, cross_entropy, fmt_rate, fmt_ratio,
    image_batches, matmul_rate, median, read_config, run_settings, setup_run,
)
from reproductions.run.results import cpu_flags

NAME = "precision"
#: the instruction-set flags that decide whether bf16 has native instructions on a CPU
BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
HELP = "fp32 vs bf16 autocast (and channels_last) for the image configs' training steps, with a per-op profile"
CONFIGS = (
    "reproductions/vit/configs/fashion_mnist.yaml",
    "reproductions/vit/configs/convstem_fashion_mnist_fast.yaml",
    "reproductions/vit/configs/convstem_cifar10_fast.yaml",
)
#: op-name patterns -> group, first match wins (aten op names as the profiler reports them)
GROUPS = (
    ("casts (autocast)", r"^aten::(to|_to_copy|copy_)$"),
    ("matrix products", r"^aten::(addmm|mm|bmm|matmul|linear|baddbmm|_addmm_activation)$"),
    ("convolutions", r"^aten::(.*convolution.*|mkldnn_convolution|_slow_conv2d.*)$"),
    ("attention (SDPA)", r"^aten::(_scaled_dot_product.*|scaled_dot_product_attention|_flash_attention.*)$"),
    ("normalisation", r"^aten::(.*layer_norm.*|.*batch_norm.*)$"),
    ("optimiser", r"^(Optimizer\.step.*|aten::_fused_adamw.*|aten::_foreach_.*)$"),
    ("elementwise", r"^aten::(add|add_|mul|mul_|div|gelu|gelu_backward|relu|threshold_backward|sub|clamp.*|"
                    r"fill_|zero_|where|sum|mean|softmax|_softmax|_softmax_backward_data|_log_softmax.*|"
                    r"nll_loss.*|neg|exp|rsub)$"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", action="append", default=None,
                        help="an image config whose net is measured (repeatable; default: " + ", ".join(CONFIGS) + ")")
    parser.add_argument("--profile-steps", dest="profile_steps", type=int, default=5,
                        help="steps profiled per precision for the per-op breakdown (0: no profile; default 5)")
    parser.add_argument("--compile", action="store_true",
                        help="also time the steps compiled with torch.compile (fp32 and bf16 autocast, channels_last for "
                             "nets with convolutions); compiling takes tens of seconds per step on a CPU, untimed")
    add_run_args(parser, rounds=3, steps=4, warmup=1, batch_size=64)


def has_convolutions(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def group_of(op: str) -> str:
    for group, pattern in GROUPS:
        if re.match(pattern, op):
            return group
    return "other"


def profile_step(step: TrainStep, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Self CPU seconds and op calls per step, per op group, over ``steps`` steps of ``step``
    (after one untimed)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        seconds[group_of(event.key)] += event.self_cpu_time_total / 1e6 / steps
        calls[group_of(event.key)] += event.count / steps
    return dict(seconds), dict(calls)


def run(args: argparse.Namespace) -> BenchReport:
    device = setup_run(args)
    if args.profile_steps < 0:
        raise ValueError(f"--profile-steps {args.profile_steps} must be >= 0")
    configs = args.config or list(CONFIGS)
    tables, rows, profiles, verdicts = [], [], {}, []
    matmul = {dtype: median([matmul_rate(device, dtype) for _ in range(args.rounds)])
              for dtype in (torch.float32, torch.bfloat16)}
    for path in configs:
        class_path, kwargs = config_net(read_config(path))
        shape = (kwargs["in_chans"], kwargs["img_size"], kwargs["img_size"])
        batches = image_batches(2, args.batch_size, shape, kwargs["num_classes"])
        probe = build_seeded(class_path, **kwargs)
        layouts = ("contiguous", "channels_last") if has_convolutions(probe) else ("contiguous",)
        def train_step(amp: torch.dtype | None, layout: str) -> TrainStep:
            return TrainStep(build_seeded(class_path, **kwargs), batches, cross_entropy, device=device, amp_dtype=amp,
                             memory_format=torch.channels_last if layout == "channels_last" else None)

        steps = {}
        for layout in layouts:
            for amp in (None, torch.bfloat16):
                steps[f"{'bf16 autocast' if amp else 'fp32'} {layout}"] = train_step(amp, layout)
        if args.compile:
            for amp in (None, torch.bfloat16):
                step = train_step(amp, layouts[-1])
                step.model.compile()
                step()  # the compile, outside the timed rounds
                steps[f"{'bf16 autocast' if amp else 'fp32'} {layouts[-1]} compiled"] = step
        print(f"[precision] {path}: {len(steps)} steps at batch {args.batch_size}, input {shape}", flush=True)
        cmp = compare(steps, rounds=args.rounds, steps_per_measure=args.steps, warmup=args.warmup, device=device,
                      matmul_dtype=None, memory=False,
                      count=not args.compile)  # no FLOP count through a compiled graph
        reference = cmp["fp32 contiguous"].median
        table = Table(f"{Path(path).name}: {class_path.rsplit('.', 1)[1]} training step (batch {args.batch_size}, "
                      f"{device.type})", ["precision and layout", "images/s", "x fp32 contiguous"])
        for name, m in cmp.items.items():
            table.add(name, fmt_rate(m.median), fmt_ratio(m.median / reference))
            rows.append({**m.to_json(), "config": path, "ratio_to_fp32": m.median / reference})
        best = max(layouts, key=lambda lay: cmp[f"fp32 {lay}"].median)
        bf16 = cmp[f"bf16 autocast {best}"].median / cmp[f"fp32 {best}"].median
        verdicts.append(f"{Path(path).name}: bf16 autocast / fp32 ({best}) {bf16:.3f}x (reported, no target)")
        if args.compile:
            for prec in ("fp32", "bf16 autocast"):
                ratio = cmp[f"{prec} {layouts[-1]} compiled"].median / cmp[f"{prec} {layouts[-1]}"].median
                verdicts.append(f"{Path(path).name}: compiled / eager ({prec}, {layouts[-1]}) {ratio:.3f}x")
        if args.profile_steps:
            measured = {prec: profile_step(steps[f"{prec} {best}"], args.profile_steps) for prec in ("fp32", "bf16 autocast")}
            per = {prec: seconds for prec, (seconds, _) in measured.items()}
            profiles[path] = {"layout": best, "seconds_per_step": per,
                              "calls_per_step": {prec: calls for prec, (_, calls) in measured.items()}}
            names = [g for g, _ in GROUPS] + ["other"]
            ptable = Table(f"{Path(path).name}: self CPU ms per step by op group ({best}, {args.profile_steps} steps)",
                           ["op group", "fp32 ms", "bf16 autocast ms", "bf16 / fp32"])
            for g in names + ["total"]:
                a = sum(per["fp32"].values()) if g == "total" else per["fp32"].get(g, 0.0)
                b = sum(per["bf16 autocast"].values()) if g == "total" else per["bf16 autocast"].get(g, 0.0)
                if a or b:
                    ptable.add(g, f"{1e3 * a:.2f}", f"{1e3 * b:.2f}", fmt_ratio(b / a if a else None))
            ptable.notes.append("self CPU time of the aten ops (profiler overhead included, so the totals exceed the "
                                "timed steps); casts: the copies autocast makes of weights and activations")
            tables += [table, ptable]
        else:
            tables.append(table)
    tables[0].notes.append(f"median of {args.rounds} alternating rounds x {args.steps} steps; {torch.get_num_threads()} "
                           f"thread(s); one large matmul: fp32 {matmul[torch.float32] / 1e9:,.1f} GFLOP/s, bf16 "
                           f"{matmul[torch.bfloat16] / 1e9:,.1f} GFLOP/s "
                           f"({matmul[torch.bfloat16] / matmul[torch.float32]:.2f}x)")
    verdicts.append(f"one large matmul: bf16 / fp32 {matmul[torch.bfloat16] / matmul[torch.float32]:.2f}x "
                    "(the ceiling for a step made only of large products)")
    result = {
        "settings": run_settings(args, device, configs=configs),
        "cpu_flags": cpu_flags(BF16_FLAGS),  # the CPU and PyTorch's cpu_capability: the JSON's "hardware"
        "matmul_flops_per_sec": {str(k).removeprefix("torch."): v for k, v in matmul.items()},
        "steps": rows,
        "profiles": profiles,
    }
    return BenchReport(NAME, result, tables, verdicts)
