"""``bench hybrid``: training-step throughput of the hybrid, the conv-stem ViT and the ResNet at
their config shapes.

The models are built from the configs' ``model.init_args.net`` (class path and keywords, read with
YAML, so the benchmark follows the configs): ``reproductions/vit/configs/fashion_mnist.yaml``
(the ViT, the reference), ``hybrid_fashion_mnist.yaml`` (``models.hybrid.HybridViT``) and
``convstem_fashion_mnist.yaml`` (``models.hybrid.ConvStemViT``, the time-to-accuracy recipe) and
``resnet_fashion_mnist.yaml`` (``models.resnet.ResNet``), at the ViT config's batch size.

The CNN parts (the hybrid's and the conv-stem ViT's ``patch_embed``: the convolutions and the 1x1
projection; the whole ResNet) run contiguous (NCHW) and channels-last (NHWC, parameters and inputs), and the table gives
channels_last / contiguous images/s (on CPUs channels_last can be slower: it is reported, not
judged). Every model's images/s is also given against the ViT's, with achieved GFLOP/s (3 x
forward FLOPs x images/s) and its fraction of the fp32 matmul rate measured in the same rounds.
All seven steps alternate over the rounds on the same random batches.
"""

from __future__ import annotations

import argparse

import torch

from reproductions.benchmarks.common import (
    BenchReport, Table, TrainStep, add_run_args, build_seeded, compare, config_net, cross_entropy, fmt_flops,
    fmt_fraction, fmt_gflops, fmt_mib, fmt_rate, fmt_ratio, image_batches, memory_method, read_config, run_settings,
    setup_run,
)

NAME = "hybrid"
HELP = "HybridViT, ConvStemViT and ResNet at the Fashion-MNIST config shapes: channels_last vs contiguous, GFLOP/s"
CONFIGS = {
    "vit": "reproductions/vit/configs/fashion_mnist.yaml",
    "hybrid": "reproductions/vit/configs/hybrid_fashion_mnist.yaml",
    "convstem": "reproductions/vit/configs/convstem_fashion_mnist.yaml",
    "resnet": "reproductions/vit/configs/resnet_fashion_mnist.yaml",
}
CNN_MODELS = ("hybrid", "convstem", "resnet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vit-config", dest="vit_config", default=CONFIGS["vit"])
    parser.add_argument("--hybrid-config", dest="hybrid_config", default=CONFIGS["hybrid"])
    parser.add_argument("--convstem-config", dest="convstem_config", default=CONFIGS["convstem"])
    parser.add_argument("--resnet-config", dest="resnet_config", default=CONFIGS["resnet"])
    add_run_args(parser, rounds=3, steps=4, warmup=1, batch_size=None)


def load_net(path: str) -> tuple[str, dict, int]:
    """(class path, keywords, batch size) of a config's net and data."""
    config = read_config(path)
    class_path, kwargs = config_net(config)
    batch_size = int(config["data"]["init_args"].get("batch_size", 128))
    return class_path, kwargs, batch_size


def cnn_part(name: str, model: torch.nn.Module) -> torch.nn.Module:
    """The convolutional part that channels_last applies to: the hybrids' patch_embed, the whole ResNet."""
    return model if name == "resnet" else model.patch_embed


def run(args: argparse.Namespace) -> BenchReport:
    device = setup_run(args)
    nets = {name: load_net(getattr(args, f"{name}_config")) for name in CONFIGS}
    batch_size = args.batch_size or nets["vit"][2]
    shapes = {name: (kw["in_chans"], kw["img_size"], kw["img_size"]) for name, (_, kw, _) in nets.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"the configs' input shapes differ: {shapes}; the comparison needs one input shape")
    shape = shapes["vit"]
    num_classes = nets["vit"][1]["num_classes"]
    batches = image_batches(2, batch_size, shape, num_classes)

    steps = {"vit": TrainStep(build_seeded(nets["vit"][0], **nets["vit"][1]), batches, cross_entropy, device=device)}
    for name in CNN_MODELS:
        class_path, kwargs, _ = nets[name]
        steps[f"{name} contiguous"] = TrainStep(build_seeded(class_path, **kwargs), batches, cross_entropy,
                                                device=device)
        model = build_seeded(class_path, **kwargs)
        steps[f"{name} channels_last"] = TrainStep(model, batches, cross_entropy, device=device,
                                                   memory_format=torch.channels_last, cnn=cnn_part(name, model))
    print(f"[hybrid] {len(steps)} steps at batch {batch_size}, input {shape}", flush=True)
    cmp = compare(steps, rounds=args.rounds, steps_per_measure=args.steps, warmup=args.warmup, device=device)

    vit = cmp["vit"]
    table = Table(
        f"Hybrid and ResNet training step at the Fashion-MNIST configs' shapes (batch {batch_size}, {device.type})",
        ["model", "layout", "params", "MFLOPs/img", "images/s", "x ViT", "channels_last x contiguous", "GFLOP/s",
         "of matmul", "peak MiB"],
    )
    rows = []
    for name, m in cmp.items.items():
        model, _, layout = name.partition(" ")
        cl_ratio = None
        if layout == "channels_last":
            cl_ratio = m.median / cmp[f"{model} contiguous"].median
        table.add(model, layout or "-", f"{m.params:,}", fmt_flops(m.forward_flops), fmt_rate(m.median),
                  fmt_ratio(m.median / vit.median), fmt_ratio(cl_ratio), fmt_gflops(m.flops_per_sec),
                  fmt_fraction(m.fraction_of_matmul), fmt_mib(m.peak_bytes))
        rows.append({**m.to_json(), "model": model, "layout": layout or None, "config": getattr(args, f"{model}_config"),
                     "ratio_to_vit": m.median / vit.median, "channels_last_over_contiguous": cl_ratio})
    table.notes += [
        "channels_last applies to the CNN parts (hybrid: patch_embed = ResNet backbone + 1x1 projection; convstem: "
        "patch_embed = 3x3 conv stem + 1x1 projection; ResNet: all) "
        "and the input; x ViT: images/s over fashion_mnist.yaml's ViT.",
        f"GFLOP/s: 3 x forward FLOPs x images/s; of matmul: over a fp32 torch.matmul measured in the same rounds "
        f"({fmt_gflops(cmp.matmul)} GFLOP/s).",
        f"peak MiB: {memory_method(device)}.",
        f"median of {args.rounds} alternating rounds x {args.steps} steps; {torch.get_num_threads()} thread(s).",
    ]
    cl = {m: cmp[f"{m} channels_last"].median / cmp[f"{m} contiguous"].median for m in CNN_MODELS}
    verdicts = [
        "channels_last / contiguous: " + ", ".join(f"{m} {r:.3f}x" for m, r in cl.items()) + " (reported, no target)",
        f"conv-stem ViT / BiT hybrid (contiguous): {cmp['convstem contiguous'].median / cmp['hybrid contiguous'].median:.3f}x "
        f"images/s at {cmp['convstem contiguous'].forward_flops / cmp['hybrid contiguous'].forward_flops:.2f}x the FLOPs "
        "(reported, no target)",
    ]
    result = {
        "settings": run_settings(args, device, batch_size_used=batch_size),
        "configs": {name: {"class_path": cp, "init_args": kw, "batch_size": bs} for name, (cp, kw, bs) in nets.items()},
        "memory_method": memory_method(device),
        "models": rows,
        "channels_last_over_contiguous": cl,
        "matmul_flops_per_sec": cmp.matmul,
        "comparison": cmp.to_json(),
    }
    return BenchReport(NAME, result, [table], verdicts)
