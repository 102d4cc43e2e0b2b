"""Sharded (FSDP2), multi-node and compiled training, run on the CPU with gloo.

The same code a GPU user runs: ``lightning_modules.sharding`` (``FSDP2Strategy`` on Lightning's
``ModelParallelStrategy``, ``shard_net``) through ``python -m reproductions fit --config ...
--config reproductions/vit/configs/overlays/fsdp.yaml``; DDP over two torchrun "nodes"; DDP with
``torch.compile``. The process-spawning tests are slow-marked; models are tiny (2 blocks of width
32 on 8x8 digits, patch 4) and runs a handful of steps.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_modules.sharding import FSDP2Strategy, ShardedPrecision, resolve_param_dtype, shard_units
from models.hybrid import ConvStemViT, HybridViT
from models.vit import ViT

REPO = Path(__file__).resolve().parents[1]
DIGITS = "reproductions/vit/configs/digits.yaml"
FSDP = "reproductions/vit/configs/overlays/fsdp.yaml"
#: a 2-block ViT of width 32 on 8x8 digits, patch 4 (4 tokens + class token), 6 steps an epoch of
#: the global batch 64: learns (val acc ~0.3 -> ~0.55 in 3 epochs) in seconds
TINY = [
    "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false", "--model.net.init_args.depth", "2",
    "--model.net.init_args.embed_dim", "32", "--model.net.init_args.num_heads", "2",
    "--model.net.init_args.patch_size", "4", "--trainer.limit_train_batches", "6",
    "--trainer.log_every_n_steps", "1", "--data.batch_size", "64", "--model.init_args.lr", "0.003",
    "--model.init_args.warmup_steps", "2",
]
EPOCHS = 3
STEPS_PER_EPOCH = 6


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def fit_command(root: Path, *extra: str, devices: int = 1, sharded: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "reproductions", "fit", "--config", DIGITS]
    if sharded:
        cmd += ["--config", FSDP]
    elif devices > 1:
        cmd += ["--trainer.strategy", "ddp"]
    return [*cmd, *TINY, "--trainer.max_epochs", str(EPOCHS), "--trainer.devices", str(devices),
            "--run.root", str(root), *extra]


def run(cmd: list[str], *, fail: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=900)
    if fail:
        assert proc.returncode != 0 and "injected failure" in proc.stderr, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_dir(root: Path) -> Path:
    return root / "vit" / "digits" / "default" / "seed0"


def results(root: Path) -> dict:
    return json.loads((run_dir(root) / "results.json").read_text())


def metric(root: Path, name: str) -> list[float]:
    with open(run_dir(root) / "metrics.csv") as f:
        return [float(r[name]) for r in csv.DictReader(f) if r.get(name)]


def records(folder: Path, stem: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"{stem}_rank*.json"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- in-process: units, options


def test_nets_name_their_shard_units():
    vit = ViT(img_size=8, in_chans=1, num_classes=4, patch_size=2, embed_dim=16, depth=3, num_heads=2)
    assert shard_units(vit) == list(vit.blocks) and len(shard_units(vit)) == 3
    hybrid = HybridViT(img_size=16, in_chans=1, num_classes=4, backbone_layers=(1, 1, 1),
                       backbone_channels=(16, 32, 48), stem_chs=8, embed_dim=16, depth=2, num_heads=2)
    assert shard_units(hybrid) == [*hybrid.backbone.stages, *hybrid.blocks] and len(shard_units(hybrid)) == 5
    conv = ConvStemViT(img_size=8, in_chans=1, num_classes=4, patch_size=2, stem_channels=(8,), embed_dim=16,
                       depth=2, num_heads=2)
    assert shard_units(conv) == list(conv.blocks)
    assert shard_units(torch.nn.Linear(2, 2)) == []  # no shard_units(): one root unit


def test_precision_under_fsdp2_is_the_policy_and_never_autocast_on_top():
    bf16, fp32 = torch.bfloat16, torch.float32
    assert resolve_param_dtype("auto", "32-true", "cuda") == bf16  # the GPU default
    assert resolve_param_dtype("auto", "32-true", "cpu") == fp32  # the CPU default
    assert resolve_param_dtype("auto", "bf16-mixed", "cpu") == bf16  # asked for (e.g. a gpu profile)
    assert resolve_param_dtype("fp32", "bf16-mixed", "cuda") == fp32
    assert resolve_param_dtype("bf16", "32-true", "cpu") == bf16
    for flag in ("bf16-true", "16-mixed", "16-true", "64-true"):
        with pytest.raises(ValueError, match=f"trainer.precision='{flag}' is not supported"):
            resolve_param_dtype("auto", flag, "cuda")
    with pytest.raises(ValueError, match="mixed_precision='fp16' is not one of"):
        FSDP2Strategy(mixed_precision="fp16")
    plugin = ShardedPrecision("bf16-mixed")  # what replaces Lightning's autocast plugin
    with plugin.forward_context():
        assert not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")


def test_fsdp_overlay_builds_the_fsdp2_strategy():
    from tests.cli_helpers import build_only

    cli = build_only(["fit", "--config", "reproductions/vit/configs/cifar10.yaml", "--config", FSDP,
                      "--trainer.strategy.init_args.activation_checkpointing", "true"])
    strategy = cli.trainer_config["strategy"]
    assert isinstance(strategy, FSDP2Strategy)
    assert (strategy.mixed_precision, strategy.activation_checkpointing, strategy.reshard_after_forward) == (
        "auto", True, True)
    assert strategy._save_distributed_checkpoint is False  # one ordinary checkpoint file
    assert strategy._tensor_parallel_size == 1
    # the experiment's flag, kept: under FSDP2Strategy bf16-mixed means FSDP2's bf16 policy, no autocast
    assert cli.trainer_config["precision"] == "bf16-mixed"
    assert cli.experiment == "vit/cifar10"  # an overlay does not rename the experiment


def test_optimizer_state_of_a_plain_checkpoint_is_rekeyed_by_group_position():
    """A DDP or single-device checkpoint keys the optimiser state by index in the order of the
    weight-decay groups, not of ``module.parameters()``: FSDP2Strategy maps the indices the way
    ``Optimizer.load_state_dict`` does, so every moment lands on its own parameter."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import FullyShardedDataParallel, OptimStateKeyType

    from lightning_modules.image_classifier import ImageClassifier
    from lightning_modules.sharding import optimizer_state_by_name

    torch.manual_seed(0)
    module = ImageClassifier(ViT(img_size=8, in_chans=1, num_classes=4, patch_size=4, embed_dim=16, depth=1,
                                 num_heads=2), weight_decay=0.1)
    module._trainer = SimpleNamespace(estimated_stepping_batches=10, datamodule=None, accumulate_grad_batches=1)
    optimizer = module.configure_optimizers()["optimizer"]
    assert len(optimizer.param_groups) == 2
    module(torch.randn(4, 1, 8, 8)).sum().backward()
    optimizer.step()
    saved = optimizer.state_dict()
    assert all(isinstance(k, int) for k in saved["state"])
    by_name = optimizer_state_by_name(saved, optimizer, module)
    params = dict(module.named_parameters())
    assert set(by_name["state"]) == set(params)
    for name, state in by_name["state"].items():
        assert torch.equal(state["exp_avg"], optimizer.state[params[name]]["exp_avg"]), name
    assert [g["weight_decay"] for g in by_name["param_groups"]] == [0.0, 0.1]
    assert "net.blocks.0.attn.qkv.weight" in by_name["param_groups"][1]["params"]
    assert optimizer_state_by_name(by_name, optimizer, module) is by_name  # already by name
    # the index = position in module.parameters() reading (Lightning's loader) gets it wrong
    wrong = FullyShardedDataParallel.rekey_optim_state_dict(saved, OptimStateKeyType.PARAM_NAME, module)
    assert any(state["exp_avg"].shape != params[name].shape for name, state in wrong["state"].items())
    optimizer.param_groups[1]["params"].pop()
    with pytest.raises(ValueError, match=r"parameter groups of sizes \[\d+, \d+\], this run's"):
        optimizer_state_by_name(saved, optimizer, module)


# --------------------------------------------------------------------------- shard_net on 2 processes


def _shard_net_worker(rank: int, world: int, init_file: str, out: str) -> None:
    """Each net, sharded over 2 ranks with half of a batch each, against the unsharded net on the
    whole batch: the same gradients, the same global gradient norm and clipping; half of each
    parameter per rank; bf16 compute with fp32 master weights; activation checkpointing."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from lightning_modules.sharding import shard_net

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    nets = {
        "vit": lambda: ViT(img_size=8, in_chans=1, num_classes=4, patch_size=2, embed_dim=32, depth=2, num_heads=2),
        "vit_shared_pos": lambda: ViT(img_size=8, in_chans=1, num_classes=4, patch_size=2, embed_dim=32, depth=2,
                                      num_heads=2, pos_embed="learned_2d", pos_placement="every_layer_shared"),
        "hybrid": lambda: HybridViT(img_size=16, in_chans=1, num_classes=4, backbone_layers=(1, 1),
                                    backbone_channels=(16, 32), stem_chs=8, gn_groups=4, embed_dim=32, depth=2,
                                    num_heads=2),
    }
    report: dict = {}
    for name, make in nets.items():
        for variant, options in (("fp32", {}), ("checkpointed", {"activation_checkpointing": True}),
                                 ("bf16", {"param_dtype": torch.bfloat16})):
            if name != "vit" and variant != "fp32":
                continue
            torch.manual_seed(0)
            ref = make()
            sharded = copy.deepcopy(ref)
            shard_net(sharded, mesh, **options)
            size = ref.input_shape[-1]
            x = torch.randn(8, 1, size, size, generator=torch.Generator().manual_seed(1))
            y = torch.arange(8) % 4
            seen = {}
            sharded.blocks[0].attn.qkv.register_forward_pre_hook(lambda m, a: seen.update(dtype=str(a[0].dtype)))
            logits = sharded(x[rank::world])
            loss = torch.nn.functional.cross_entropy(logits, y[rank::world])
            loss.backward()
            ref_loss = torch.nn.functional.cross_entropy(ref(x), y)
            ref_loss.backward()
            grads = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}
            ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}  # clipping below is in place
            tol = dict(rtol=5e-2, atol=5e-3) if variant == "bf16" else dict(rtol=1e-4, atol=1e-6)
            norm = torch.nn.utils.clip_grad_norm_(list(sharded.parameters()), 0.5)
            ref_norm = torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 0.5)
            clipped = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}
            report[f"{name}/{variant}"] = {
                "grads_match": all(torch.allclose(grads[n], ref_grads[n], **tol) for n in ref_grads),
                "worst": max(((grads[n] - ref_grads[n]).abs().max().item(), n) for n in ref_grads),
                "names_match": list(grads) == list(ref_grads),
                "norm": float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm),
                "ref_norm": float(ref_norm),
                "clipped_match": all(torch.allclose(clipped[n], ref.get_parameter(n).grad, **tol) for n in ref_grads),
                "local_sizes": {n: [p.to_local().numel(), p.numel(), p.shape[0]] for n, p in sharded.named_parameters()},
                "param_dtypes": sorted({str(p.dtype) for p in sharded.parameters()}),
                "grad_dtypes": sorted({str(p.grad.dtype) for p in sharded.parameters()}),
                "logits_dtype": str(logits.dtype),
                "compute_dtype": seen["dtype"],
                "all_dtensor": all(hasattr(p, "to_local") for p in sharded.parameters()),
            }
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
def test_shard_net_on_two_processes_matches_the_unsharded_net(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_shard_net_worker, args=(2, str(tmp_path / "pg"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert set(ranks[0]) == {"vit/fp32", "vit/checkpointed", "vit/bf16", "vit_shared_pos/fp32", "hybrid/fp32"}
    for key, r0 in ranks[0].items():
        r1 = ranks[1][key]
        for r in (r0, r1):
            assert r["grads_match"], (key, r["worst"])
            assert r["grads_match"] and r["clipped_match"] and r["names_match"] and r["all_dtensor"], key
            # the global norm over both ranks' shards is the unsharded net's
            assert r["norm"] == pytest.approx(r["ref_norm"], rel=5e-2 if key.endswith("bf16") else 1e-5), key
            assert r["param_dtypes"] == ["torch.float32"] and r["grad_dtypes"] == ["torch.float32"], key
            assert r["logits_dtype"] == "torch.float32", key  # the loss sees fp32 logits in every variant
        assert r0["compute_dtype"] == ("torch.bfloat16" if key.endswith("bf16") else "torch.float32"), key
        for name, (local0, total, dim0) in r0["local_sizes"].items():
            local1 = r1["local_sizes"][name][0]
            assert local0 + local1 == total, (key, name)  # each rank one slice of dim 0, together the whole
            if dim0 >= 2:
                assert max(local0, local1) == -(-dim0 // 2) * (total // dim0), (key, name)  # about half each
    sizes = ranks[0]["vit/fp32"]["local_sizes"]
    assert sizes["blocks.0.attn.qkv.weight"] == [48 * 32, 96 * 32, 96]


# --------------------------------------------------------------------------- FSDP2 through the CLI


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    """The same recipe (global batch 64) uninterrupted: FSDP2 on 2 processes and plain on 1."""
    root = tmp_path_factory.mktemp("fsdp_reference")
    sharded, plain = root / "fsdp2", root / "plain"
    for path, devices, is_sharded in ((sharded, 2, True), (plain, 1, False)):
        run(fit_command(path, "--trainer.callbacks+=tests.helpers.RecordSharding",
                        f"--trainer.callbacks.out_dir={path}/record", devices=devices, sharded=is_sharded))
    return sharded, plain


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.xdist_group("fsdp-reference")  # shares a module fixture: one test process
@pytest.mark.slow
def test_fsdp2_on_two_processes_trains_like_one_process(reference_runs):
    sharded, plain = reference_runs
    two, one = results(sharded), results(plain)
    assert two["training"]["devices"] == 2 and two["training"]["steps"] == one["training"]["steps"] == 18
    assert two["training"]["precision"] == "32-true"  # fp32 on the CPU (mixed_precision auto)
    assert one["final"]["val/acc"] > 0.4  # it learned, so the comparison means something
    # every step's loss (the mean over both ranks' halves of the global batch) is the one-process loss
    assert metric(sharded, "train/loss_step") == pytest.approx(metric(plain, "train/loss_step"), rel=1e-4)
    assert len(metric(plain, "train/loss_step")) == 18
    assert metric(sharded, "val/acc") == metric(plain, "val/acc")  # same validation accuracy every epoch
    rec = records(sharded / "record", "sharding")
    ref = records(plain / "record", "sharding")[0]
    assert len(rec) == 2 and [r["rank"] for r in rec] == [0, 1]
    for r in rec:
        assert r["precision_plugin"] == "ShardedPrecision" and r["precision"] == "32-true"
        # the global gradient norm (what gradient_clip_val clips) over both ranks' shards
        assert r["grad_norms"] == pytest.approx(ref["grad_norms"], rel=1e-5)
        assert len(r["grad_norms"]) == 4
        # weight decay reaches the matrices and not the norms, biases, class token, position table,
        # exactly as in the unsharded run (groups made from the DTensor parameters after sharding)
        assert r["groups"] == ref["groups"]
    decayed = {n for g in rec[0]["groups"] if g["weight_decay"] > 0 for n in g["params"]}
    params = rec[0]["params"]
    assert decayed == {n for n in params if n.endswith(".weight") and "norm" not in n}
    assert "net.blocks.0.attn.qkv.weight" in decayed and "net.pos_embed" not in decayed
    assert all(p["dtensor"] and p["placements"] == ["S(0)"] and p["dtype"] == "torch.float32" for p in params.values())
    # each rank holds about half of every sharded parameter and of the optimiser state
    for name, p in params.items():
        assert p["local"] + rec[1]["params"][name]["local"] == p["global"]
    qkv = params["net.blocks.0.attn.qkv.weight"]
    assert qkv["local"] * 2 == qkv["global"] == 96 * 32
    for r in rec:
        state = r["optimizer_state"]
        assert state["global"] == ref["optimizer_state"]["local"]
        assert 0.45 < state["local"] / state["global"] < 0.55


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.xdist_group("fsdp-reference")  # shares a module fixture: one test process
@pytest.mark.slow
def test_sharded_checkpoint_resumes_on_one_process_then_on_two(reference_runs, tmp_path):
    """A 2-process FSDP2 run stops in epoch 2; it resumes on 1 process from its last.ckpt (2 -> 1)
    and stops in epoch 3; that 1-process checkpoint resumes on 2 processes (1 -> 2) and finishes.
    Every epoch's metrics are the uninterrupted runs'. What can differ: the last bits of the
    gradient reduction order on a different world size (the losses agree to 1e-4 relative)."""
    sharded, plain = reference_runs
    root = tmp_path / "chain"
    last = run_dir(root) / "checkpoints" / "last.ckpt"
    fail = ["--trainer.callbacks+=tests.helpers.FailAtStep", "--trainer.callbacks.step"]
    run(fit_command(root, *fail, str(STEPS_PER_EPOCH), devices=2, sharded=True), fail=True)
    state = torch.load(last, map_location="cpu", weights_only=False)
    assert last.is_file() and state["global_step"] == STEPS_PER_EPOCH  # one ordinary file, plain keys
    assert list(state["state_dict"]) == list(torch.load(run_dir(plain) / "checkpoints" / "last.ckpt",
                                                        map_location="cpu", weights_only=False)["state_dict"])
    run(fit_command(root, *fail, str(2 * STEPS_PER_EPOCH), "--ckpt_path", str(last), devices=1, sharded=True),
        fail=True)
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2 * STEPS_PER_EPOCH
    run(fit_command(root, "--ckpt_path", str(last), devices=2, sharded=True))
    resumed = results(root)
    assert resumed["training"]["steps"] == 18 and resumed["training"]["devices"] == 2
    # metrics.csv was rewritten by each resume: the last leg's epoch; the earlier epochs' values
    # are compared through results.json (final) and the per-step losses of the last leg
    for reference in (sharded, plain):
        want = results(reference)
        assert resumed["final"]["val/acc"] == want["final"]["val/acc"]
        assert resumed["final"]["val/loss"] == pytest.approx(want["final"]["val/loss"], rel=1e-4)
        assert resumed["final"]["train/loss_epoch"] == pytest.approx(want["final"]["train/loss_epoch"], rel=1e-4)
        assert metric(root, "train/loss_step")[-STEPS_PER_EPOCH:] == pytest.approx(
            metric(reference, "train/loss_step")[-STEPS_PER_EPOCH:], rel=1e-4)
    assert resumed["test"]["test/acc"] == results(sharded)["test"]["test/acc"]  # both tested on 2 processes


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.xdist_group("fsdp-reference")  # shares a module fixture: one test process
@pytest.mark.slow
def test_sharded_checkpoint_loads_into_the_plain_model_for_test_and_analysis(reference_runs, tmp_path):
    """The FSDP2 run's checkpoint is an ordinary Lightning checkpoint: load_from_checkpoint, the
    ``test`` subcommand without the overlay (1 process) and ``analyze distance`` read it."""
    from lightning_modules.image_classifier import ImageClassifier
    from reproductions.__main__ import main as repro_main

    sharded, plain = reference_runs
    ckpt = run_dir(sharded) / "checkpoints" / "last.ckpt"
    module = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu")
    assert not any(hasattr(p, "to_local") for p in module.parameters())
    reference = ImageClassifier.load_from_checkpoint(run_dir(plain) / "checkpoints" / "last.ckpt", map_location="cpu")
    assert list(module.state_dict()) == list(reference.state_dict())
    # the same weights up to rounding; the worst is the qkv bias, whose key part gets no gradient
    # in exact arithmetic (softmax ignores it), so Adam turns rounding noise into +-lr steps there
    for (name, p), q in zip(module.state_dict().items(), reference.state_dict().values()):
        assert (p - q).norm() <= 5e-3 * q.norm(), name
    images = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(module.eval()(images), reference.eval()(images), atol=1e-4)
    repro_main(["test", "--config", DIGITS, *TINY, "--trainer.devices", "1", "--run.root", str(sharded),
                "--ckpt_path", str(ckpt)])
    with open(run_dir(sharded) / "test" / "metrics.csv") as f:
        tested = [float(r["test/acc"]) for r in csv.DictReader(f) if r.get("test/acc")]
    # the plain one-process run tested its own (equal up to float rounding) weights on the same split
    assert tested == [pytest.approx(results(plain)["test"]["test/acc"], abs=1e-6)]  # same predictions
    out = tmp_path / "analysis"
    assert repro_main(["analyze", "distance", "--ckpt", str(ckpt), "--num-images", "8", "--out", str(out)]) == 0
    result = json.loads((out / "attention_distance.json").read_text())
    (model,) = result["models"].values()
    assert model["kind"] == "ViT" and len(model["layers"]) == 2


# --------------------------------------------------------------------------- multi-node, simulated

#: 2 training steps, one validation batch, no test: the DDP runs below
SHORT = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
         "--run.test_after_fit", "false"]


def record_args(root: Path) -> list[str]:
    return ["--trainer.callbacks+=tests.helpers.RecordShards", f"--trainer.callbacks.out_dir={root}/rec",
            "--trainer.callbacks+=tests.helpers.RecordCompile", f"--trainer.callbacks.out_dir={root}/rec"]


@pytest.fixture(scope="module")
def ddp_two_devices(tmp_path_factory):
    """DDP on 2 devices of one node, uncompiled: the reference of the two-node and compiled runs."""
    root = tmp_path_factory.mktemp("ddp") / "two_devices"
    run([sys.executable, "-m", "reproductions", "fit", "--config", DIGITS, *TINY, *SHORT, "--trainer.devices", "2",
         "--trainer.strategy", "ddp", "--run.root", str(root), *record_args(root)])
    return root


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.xdist_group("fsdp-ddp")  # shares a module fixture: one test process
@pytest.mark.slow
def test_two_torchrun_nodes_split_the_data_like_two_devices(ddp_two_devices, tmp_path):
    """docs/scaling.md's multi-node command as two "nodes" of one process each on this machine
    (torchrun, c10d rendezvous on localhost): each rank reads a different shard, each gets half
    of the global batch, and the shards are the ones 2 devices on one node get."""
    nodes = tmp_path / "nodes"
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
               "--rdzv-id", "fsdp-test", "-m", "reproductions", "fit", "--config", DIGITS, *TINY, *SHORT,
               "--trainer.num_nodes", "2", "--trainer.devices", "1", "--trainer.strategy", "ddp",
               "--run.root", str(nodes), *record_args(nodes)]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    shards, reference = records(nodes / "rec", "shard"), records(ddp_two_devices / "rec", "shard")
    assert [(s["rank"], s["world_size"], s["batch_size"]) for s in shards] == [(0, 2, 32), (1, 2, 32)]
    assert not set(shards[0]["indices"]) & set(shards[1]["indices"])  # a different shard on each node
    assert [s["indices"] for s in shards] == [s["indices"] for s in reference]  # as on 2 devices of one node
    res = results(nodes)
    assert res["training"]["devices"] == 2 and res["training"]["num_nodes"] == 2
    assert res["training"]["global_batch_size"] == 64 and res["training"]["steps"] == 2
    assert metric(nodes, "train/loss_step") == pytest.approx(metric(ddp_two_devices, "train/loss_step"), rel=1e-5)


# --------------------------------------------------------------------------- torch.compile under DDP


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.xdist_group("fsdp-ddp")  # shares a module fixture: one test process
@pytest.mark.slow
def test_compiled_ddp_matches_uncompiled_ddp(ddp_two_devices, tmp_path):
    """2-process DDP with ``--model.init_args.compile true`` (inductor on the CPU; about a minute of
    compile) takes the uncompiled run's steps, and its checkpoint keys stay plain."""
    from lightning_modules.image_classifier import ImageClassifier

    root = tmp_path / "compiled"
    run([sys.executable, "-m", "reproductions", "fit", "--config", DIGITS, *TINY, *SHORT, "--trainer.devices", "2",
         "--trainer.strategy", "ddp", "--model.init_args.compile", "true", "--run.root", str(root), *record_args(root)])
    eager, compiled = records(ddp_two_devices / "rec", "compile"), records(root / "rec", "compile")
    assert [r["compiled"] for r in eager] == [False, False] and [r["compiled"] for r in compiled] == [True, True]
    assert all(r["graphs"] >= 1 for r in compiled) and all(r["graphs"] == 0 for r in eager)
    losses = metric(root, "train/loss_step")
    assert len(losses) == 2 and losses == pytest.approx(metric(ddp_two_devices, "train/loss_step"), rel=1e-4)
    ckpt = run_dir(root) / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    assert not [k for k in state if "_orig_mod" in k or k.startswith("module.")]
    plain = ImageClassifier.load_from_checkpoint(ckpt, map_location="cpu", compile=False, strict=True)
    assert list(plain.state_dict()) == list(state)


# --------------------------------------------------------------------------- scripts/gpu_check.sh


@pytest.mark.subprocess
def test_gpu_check_without_a_gpu_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path / "out")], cwd=REPO,
                          env={**env(), "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False): nothing run"]
    assert not (tmp_path / "out").exists()


@pytest.mark.subprocess
@pytest.mark.slow
def test_gpu_check_smoke_on_the_cpu_writes_its_json(tmp_path):
    """GPU_CHECK_SMOKE=1 runs the script's stages on the CPU with tiny shapes (here the FSDP2 one):
    the plumbing from the runs to the one JSON."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", str(out)], cwd=REPO, capture_output=True, text=True,
                          env={**env(), "PYTHON": sys.executable, "GPU_CHECK_SMOKE": "1", "GPU_CHECK_STAGES": "fsdp"},
                          timeout=600)
    logs = "".join(p.read_text()[-3000:] for p in sorted(out.glob("*.log")))
    assert proc.returncode == 0, proc.stderr[-3000:] + logs
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["smoke"] is True and report["device"] == "cpu" and report["ok"] is True
    assert set(report["versions"]) >= {"torch", "lightning", "cuda", "timm", "jsonargparse", "datasets"}
    assert list(report["stages"]) == ["preflight", "fsdp"]  # no GPU_CHECK_WHEELS: nothing to install
    assert all(s["status"] == "ok" and 0 < s["limit"] <= report["budget_s"] for s in report["stages"].values())
    assert report["preflight"]["ok"] and report["elapsed_s"] <= report["budget_s"]
    assert report["checkpoints"] and all(mib > 0 for mib in report["checkpoints"].values())
    assert not list(out.rglob("*.ckpt"))  # measured, then removed
    fsdp = report["fsdp"]  # the smoke run takes the GPU's bf16 policy (fp32 master weights) on tiny shapes
    assert fsdp["steps"] == 4 and fsdp["precision"] == "bf16-mixed" and fsdp["images_per_sec"] > 0
    assert "test/acc" in fsdp["test"] and fsdp["mfu"] is None  # no bench stage, no peak to divide by
