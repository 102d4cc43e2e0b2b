"""Benchmarks (reproductions/commands/bench.py, reproductions/benchmarks/): each subcommand runs at tiny settings,
reports ratios and writes its JSON; the references are what they claim to be. No timing assertions."""

import json
import math
import statistics

import pytest
import torch
import yaml

from lightning_modules.model_stats import count_flops, count_parameters
from reproductions.commands.bench import main
from reproductions.benchmarks import common
from reproductions.benchmarks import bst as bst_bench
from reproductions.benchmarks import fuxictr_peer
from reproductions.benchmarks.bst import (
    PEER_TARGET, Peer, TorchEncoderBST, bst_kwargs, copy_block_weights, eval_data, our_bst, ours_auc, ours_gauc,
    ours_gauc_exact, paired_result, peer_list, random_batch, reference_auc, reference_gauc,
)
from reproductions.benchmarks.gpu import table_peak
from reproductions.benchmarks.vit import (
    PROFILES, SHAPE_KEYS, flops_per_image, our_vit, position_variants, predicted_time_ratio, timm_vit,
)
from reproductions.run.results import REPO_ROOT

TINY_RUN = ["--steps", "1", "--warmup", "1", "--rounds", "1", "--threads", "1"]  # one thread: steadier when shared


def _run(tmp_path, *argv) -> dict:
    out = tmp_path / f"{argv[0]}.json"
    threads = torch.get_num_threads()
    assert main([*argv, "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads  # --threads does not leak out of the run
    result = json.loads(out.read_text())
    assert result["benchmark"] == argv[0]
    assert result["tables"] and all(t["rows"] for t in result["tables"])
    assert result["versions"]["torch"] and "git" in result
    return result


def test_trainer_benchmark_writes_paired_ratios(tmp_path, capsys):
    out = tmp_path / "trainer.json"
    main(["trainer", "--img-size", "8", "--patch-size", "2", "--embed-dim", "16", "--depth", "1",
          "--num-heads", "2", "--batch-size", "8", "--steps", "4", "--rounds", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["lightning_images_per_sec"]) == len(result["plain_images_per_sec"]) == 2
    assert all(r > 0 for r in result["lightning_images_per_sec"] + result["plain_images_per_sec"])
    assert len(result["paired_ratios"]) == 2 and result["median_paired_ratio"] > 0
    assert result["ratio_lightning_over_plain"] == result["median_lightning"] / result["median_plain"]
    assert "ratio of medians" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- shared code
def test_alternate_rotates_the_order_every_round():
    calls = []
    rates = common.alternate({n: (lambda n=n: calls.append(n) or 1.0) for n in "abc"}, 3, log=None)
    assert "".join(calls) == "abc" + "bca" + "cab"
    assert rates == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}


def test_growth_verdict_compares_with_the_flops_prediction():
    assert common.growth_verdict(3.9, 4.0) == "matches FLOPs"
    assert common.growth_verdict(2.0, 4.0).startswith("below")
    assert common.growth_verdict(8.0, 4.0).startswith("above")


def test_step_peak_memory_sees_a_large_temporary():
    def step():
        x = torch.ones(16 * 2**20 // 4)  # 16 MiB, written so its pages are resident
        return float(x.sum())

    peak = common.step_peak_memory(step, torch.device("cpu"))
    if common.memory_method(torch.device("cpu")) == common.CPU_MEMORY_METHOD:
        assert peak >= 15 * 2**20
    else:  # the getrusage fallback is a lower bound
        assert peak >= 0


# ------------------------------------------------------------------------------------------- vit
def test_vit_benchmark_covers_every_position_embedding_and_timm(tmp_path, capsys):
    result = _run(tmp_path, "vit", "--img-size", "8", "--patch-size", "2", "--embed-dim", "16", "--depth", "1",
                  "--num-heads", "2", "--batch-size", "2", "--scale-patches", "4,2", "--batch-sizes", "1,2",
                  "--check-rounds", "2", *TINY_RUN)
    pairs = [(r["pos_embed"], r["pos_placement"]) for r in result["position"]]
    assert sorted(pairs) == sorted([("timm", "stem"), *position_variants()])
    assert len(pairs) == 13  # 12 valid (kind, placement) pairs of models/position.py + timm
    target = result["timm_target"]
    assert target["params_ours"] == target["params_timm"]
    assert target["ratio"] == target["ours"] / target["timm"] and target["target"] == 0.97
    assert target["pass"] == (target["ratio"] >= 0.97)
    assert len(target["ours_rates"]) == len(target["timm_rates"]) == len(target["paired_ratios"]) == 2
    assert target["cpu_ratio"] == target["ours_cpu"] / target["timm_cpu"] > 0
    for row in result["position"]:
        assert row["median"] > 0 and row["forward_flops"] > 0 and row["flops_per_sec"] > 0
        assert 0 < row["fraction_of_matmul"] and row["peak_bytes"] is not None
    tokens, batch = result["token_scaling"], result["batch_scaling"]
    assert [r["patch"] for r in tokens] == [4, 2] and [r["tokens"] for r in tokens] == [5, 17]
    assert tokens[1]["predicted_time_ratio"] == tokens[1]["forward_flops"] / tokens[0]["forward_flops"] > 3
    assert batch[1]["predicted_time_ratio"] == pytest.approx(2.0)  # same FLOPs per image, twice the images
    assert all(r["growth"] and r["measured_time_ratio"] > 0 for r in tokens + batch)
    assert all(v > 0 for v in result["matmul_flops_per_sec"].values())
    assert result["memory_method"]
    out = capsys.readouterr().out
    assert ("PASS: ViT learned_1d/stem" in out) or ("FAIL: ViT learned_1d/stem" in out)
    assert "of the measured fp32 matmul rate" in out


@pytest.mark.parametrize("profile", ["cpu", "cuda"])
def test_timm_reference_has_the_parameters_of_our_default_vit(profile):
    shape = {k: PROFILES[profile][k] for k in SHAPE_KEYS}
    ours, timm = our_vit(shape), timm_vit(shape)
    assert count_parameters(ours) == count_parameters(timm)
    assert [(n, p.shape) for n, p in ours.named_parameters()] == [(n, p.shape) for n, p in timm.named_parameters()]


def test_flops_prediction_comes_from_count_flops():
    shape = {k: PROFILES["cpu"][k] for k in SHAPE_KEYS}  # 32 px
    f8, f4 = flops_per_image({**shape, "patch_size": 8}), flops_per_image({**shape, "patch_size": 4})
    assert f4 == count_flops(our_vit({**shape, "patch_size": 4}), torch.zeros(1, 3, 32, 32))
    assert predicted_time_ratio([f8, f4]) == [1.0, f4 / f8]
    assert f4 / f8 > 3  # 4x the tokens: linear layers 4x, attention 16x


# ------------------------------------------------------------------------------------------- hybrid
def test_hybrid_benchmark_reads_the_configs_and_compares_layouts(tmp_path):
    result = _run(tmp_path, "hybrid", "--batch-size", "2", *TINY_RUN)
    for name, path in (("hybrid", "hybrid_fashion_mnist.yaml"), ("convstem", "convstem_fashion_mnist.yaml"),
                       ("resnet", "resnet_fashion_mnist.yaml")):
        config = yaml.safe_load((REPO_ROOT / "reproductions/vit/configs" / path).read_text())
        assert result["configs"][name]["init_args"] == config["model"]["init_args"]["net"]["init_args"]
    rows = {(r["model"], r["layout"]): r for r in result["models"]}
    assert set(rows) == {("vit", None), ("hybrid", "contiguous"), ("hybrid", "channels_last"),
                         ("convstem", "contiguous"), ("convstem", "channels_last"),
                         ("resnet", "contiguous"), ("resnet", "channels_last")}
    assert result["configs"]["convstem"]["class_path"] == "models.hybrid.ConvStemViT"
    for model in ("hybrid", "convstem", "resnet"):
        cl, contiguous = rows[(model, "channels_last")], rows[(model, "contiguous")]
        assert cl["channels_last_over_contiguous"] == cl["median"] / contiguous["median"]
        assert cl["params"] == contiguous["params"] and cl["forward_flops"] == contiguous["forward_flops"]
    assert all(r["flops_per_sec"] > 0 and r["fraction_of_matmul"] > 0 for r in rows.values())


# ------------------------------------------------------------------------------------------- precision
def test_precision_benchmark_compares_fp32_and_bf16_per_config_and_profiles_the_ops(tmp_path):
    from reproductions.benchmarks.precision import CONFIGS, group_of

    result = _run(tmp_path, "precision", "--batch-size", "2", "--profile-steps", "1", *TINY_RUN)
    rows = {(r["config"], r["name"]): r for r in result["steps"]}
    vit, *convstems = CONFIGS
    for config in CONFIGS:  # every net has convolutions (the ViT's patch projection): channels_last too
        assert {name for c, name in rows if c == config} == {
            "fp32 contiguous", "bf16 autocast contiguous", "fp32 channels_last", "bf16 autocast channels_last"}
    assert all(r["ratio_to_fp32"] == r["median"] / rows[(r["config"], "fp32 contiguous")]["median"] for r in rows.values())
    for config in CONFIGS:
        per, calls = (result["profiles"][config][k] for k in ("seconds_per_step", "calls_per_step"))
        assert per["fp32"]["matrix products"] > 0 and per["bf16 autocast"]["matrix products"] > 0
        # autocast's casts: counted, not timed (a time comparison would depend on the machine's load)
        assert calls["bf16 autocast"]["casts (autocast)"] > calls["fp32"].get("casts (autocast)", 0.0)
    assert result["profiles"][convstems[0]]["seconds_per_step"]["fp32"]["convolutions"] > 0
    assert set(result["matmul_flops_per_sec"]) == {"float32", "bfloat16"}
    from reproductions.benchmarks.precision import BF16_FLAGS
    from tests.helpers import cpu_flags_listed

    assert set(result["cpu_flags"]) == (set(BF16_FLAGS) if cpu_flags_listed() else set())
    assert result["hardware"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert (group_of("aten::addmm"), group_of("aten::_to_copy"), group_of("aten::native_layer_norm"),
            group_of("aten::mkldnn_convolution"), group_of("aten::something_new")) == (
        "matrix products", "casts (autocast)", "normalisation", "convolutions", "other")



def test_precision_benchmark_times_compiled_steps_beside_the_eager_ones(tmp_path, monkeypatch):
    # the compile itself is stubbed (tens of seconds per step on a CPU): this checks which steps are
    # compiled, that each is timed in the same rounds and that the ratios are compiled over eager
    compiled = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: compiled.append(type(self).__name__))
    config = "reproductions/vit/configs/convstem_fashion_mnist_fast.yaml"
    result = _run(tmp_path, "precision", "--config", config, "--compile", "--batch-size", "2", "--profile-steps", "0",
                  *TINY_RUN)
    names = {r["name"]: r for r in result["steps"]}
    assert set(names) == {"fp32 contiguous", "bf16 autocast contiguous", "fp32 channels_last",
                          "bf16 autocast channels_last", "fp32 channels_last compiled",
                          "bf16 autocast channels_last compiled"}
    assert compiled == ["ConvStemViT", "ConvStemViT"]
    verdicts = [v for v in result["verdicts"] if "compiled / eager" in v]
    for prec in ("fp32", "bf16 autocast"):
        ratio = names[f"{prec} channels_last compiled"]["median"] / names[f"{prec} channels_last"]["median"]
        assert any(f"({prec}, channels_last) {ratio:.3f}x" in v for v in verdicts), verdicts

# ------------------------------------------------------------------------------------------- data
def test_data_benchmark_compares_loaders_with_model_steps(tmp_path, capsys):
    result = _run(tmp_path, "data", "--source", "digits", "--behavior-samples", "2000", "--batch-size", "8",
                  "--data-steps", "2", "--jpeg-images", "3", "--jpeg-size", "96x128", "--gpu-images-per-sec", "500",
                  "--resident-images", "64", *TINY_RUN)
    for side, net in (("images", "models.vit.ViT"), ("behaviour", "models.ctr.BST")):
        r = result[side]
        assert r["net"] == net and r["batch_size"] == 8 and r["target"] == 2.0
        assert r["ratio"] == r["median_loader"] / r["median_model"] and r["pass"] == (r["ratio"] >= 2.0)
    assert result["images"]["source"] == "digits" and result["images"]["augment"] == "crop_flip"
    aug = result["augmentation"]
    assert len(aug["before_images_per_sec"]) == len(aug["after_images_per_sec"]) >= 1
    assert aug["ratio"] == pytest.approx(statistics.median(aug["after_images_per_sec"]) / statistics.median(aug["before_images_per_sec"]))
    jpeg = result["jpeg224"]  # decode + DeiT augmentation at 224 px, per core, both decoders; workers per GPU
    assert jpeg["jpeg_size"] == [96, 128] and jpeg["images"] == 3
    assert set(jpeg["per_core_median"]) == {
        "torchvision decode_jpeg + DataModule augmentation (default)", "Pillow + DataModule augmentation",
        "Pillow + timm create_transform (PIL pipeline)", "decode only: torchvision decode_jpeg", "decode only: Pillow"}
    assert all(r > 0 for r in jpeg["per_core_median"].values()) and jpeg["pixel_mean_abs_diff"] < 1.0
    workers = jpeg["workers"]["yours (--gpu-images-per-sec)"]
    default = jpeg["per_core_median"][jpeg["default"]]
    assert workers["images_per_sec"] == 500 and workers["workers_default"] == math.ceil(500 / default)
    assert "RTX 3090" in jpeg["workers"] and jpeg["workers"]["RTX 3090"]["images_per_sec"] == 391.0
    out = capsys.readouterr().out
    assert "target >= 2x" in out and "batched CropFlip (after)" in out
    assert "Loader worker cores one GPU training ViT-B/16" in out and "jpeg 224:" in out
    resident = result["resident"]  # the device-resident loader against the ordinary one, batches of 8
    assert resident["batch_size"] == 8 and resident["images"] == 64 and resident["device"] == "cpu"
    assert resident["ratio"] == pytest.approx(statistics.median(resident["resident_images_per_sec"])
                                              / statistics.median(resident["ordinary_images_per_sec"]))
    assert "Images held on the device" in out and "on_device=True (cpu)" in out


def test_data_benchmark_resident_only(tmp_path, capsys):
    result = _run(tmp_path, "data", "--resident-only", "--resident-images", "32", "--batch-size", "8", *TINY_RUN)
    assert set(result) >= {"settings", "resident"} and "images" not in result and "jpeg224" not in result
    assert len(result["resident"]["ordinary_images_per_sec"]) == len(result["resident"]["resident_images_per_sec"]) >= 1
    assert "images on the device:" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- bst
def test_bst_benchmark_grid_and_evaluation(tmp_path, capsys):
    result = _run(tmp_path, "bst", "--seq-lens", "4,6", "--blocks", "1,2", "--batch-size", "4", *TINY_RUN,
                  "--n-preds", "20000", "--n-users", "100", "--ref-users", "20")
    grid = [(r["seq_len"], r["blocks"]) for r in result["training"]]
    assert grid == [(4, 1), (4, 2), (6, 1), (6, 2)]
    for r in result["training"]:
        assert r["ours"]["params"] == r["reference"]["params"]
        assert r["ratio"] == r["ours"]["median"] / r["reference"]["median"]
    ev = result["evaluation"]
    assert ev["agree"] and ev["n_preds"] == 20000 and ev["n_preds_subset"] < 20000
    assert ev["checks"]["gauc_subset_abs_diff"] <= 1e-9 and ev["checks"]["auc_abs_diff"] <= 1e-5
    assert ev["values"]["gauc_ours_subset"] == pytest.approx(ev["values"]["gauc_reference_subset"], abs=1e-6)
    out = capsys.readouterr().out
    assert "AGREE" in out and ("PASS: BST" in out or "FAIL: BST" in out)


@pytest.mark.parametrize("blocks", [1, 3])
def test_transformer_encoder_reference_is_bst_with_torch_blocks(blocks):
    """Same parameter count, and with BST's weights copied over the same outputs (eval mode, padding included)."""
    kwargs = bst_kwargs()
    bst = our_bst(kwargs, seq_len=10, blocks=blocks)
    ref = TorchEncoderBST(bst)
    assert count_parameters(ref) == count_parameters(bst)
    assert len(ref.encoder.layers) == blocks and len(bst.blocks) == blocks  # building the reference left BST intact
    layer = ref.encoder.layers[0]
    assert layer.norm_first is False and layer.self_attn.batch_first and layer.self_attn.dropout == 0.0
    assert layer.dropout.p == 0.0 and layer.dropout1.p == layer.dropout2.p == bst.blocks[0].dropout.p == 0.2
    copy_block_weights(bst, ref)
    batch = random_batch(kwargs, 16, 10)
    assert not batch["hist_mask"].all()  # some padding
    bst.eval(), ref.eval()
    torch.testing.assert_close(ref(batch), bst(batch), rtol=1e-5, atol=1e-5)


def test_evaluation_metrics_agree_with_sklearn():
    data = eval_data(30_000, 300)
    cpu = torch.device("cpu")
    assert ours_gauc_exact(data, cpu) == pytest.approx(reference_gauc(data), abs=1e-9)
    assert ours_gauc(data, 4096, cpu) == pytest.approx(reference_gauc(data), abs=1e-6)  # compute() is float32
    assert ours_auc(data, 4096, cpu) == pytest.approx(reference_auc(data), abs=1e-5)


def test_fuxictr_peer_is_skipped_with_one_line_without_fuxictr(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fuxictr_peer, "available", lambda: "ModuleNotFoundError: No module named 'fuxictr'")
    out = tmp_path / "bst.json"
    assert main(["bst", "--peers", "fuxictr", "--seq-lens", "4", "--blocks", "1", "--batch-size", "4", *TINY_RUN,
                 "--skip-eval", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    lines = [line for line in printed if "FuxiCTR" in line]
    assert len(lines) == 1 and "skipped" in lines[0] and "scripts/bench_env.sh" in lines[0]
    result = json.loads(out.read_text())
    assert "No module named 'fuxictr'" in result["fuxictr"]["skipped"] and "training" not in result


def test_paired_result_reports_the_median_ratio_and_its_spread():
    ours, peer = common.Measurement("ours", [2.0, 4.0, 6.0], 4.0), common.Measurement("peer", [1.0, 4.0, 2.0], 2.0)
    r = paired_result(ours, peer)
    assert r["paired_ratios"] == [2.0, 1.0, 3.0] and r["median_paired_ratio"] == 2.0
    assert r["spread"] == [1.0, 3.0] and r["ratio"] == 2.0


def test_peer_list_accepts_known_peers_only():
    assert peer_list("fuxictr, torch_encoder") == ["fuxictr", "torch_encoder"]
    with pytest.raises(Exception, match="subset"):
        peer_list("deepctr")


def test_peer_comparison_table_on_a_tiny_shape(tmp_path, capsys, monkeypatch):
    """The FuxiCTR part's grid, ratios and table, with a stand-in peer (our own BST) where fuxictr is absent."""
    stand_in = Peer(label="FuxiCTR BST", skip_line=lambda: None, version=lambda: "stand-in",
                    build=lambda kwargs, seq_len, blocks, device: our_bst(kwargs, seq_len, blocks, seed=1),
                    batch=lambda batch, kwargs: batch)
    monkeypatch.setattr(bst_bench, "FUXICTR", stand_in)
    result = _run(tmp_path, "bst", "--peers", "fuxictr", "--seq-lens", "4,6", "--blocks", "1", "--batch-size", "4",
                  *TINY_RUN, "--rounds", "2", "--skip-eval")
    fx = result["fuxictr"]
    assert fx["skipped"] is None and fx["version"] == "stand-in" and "training" not in result
    assert [(r["seq_len"], r["blocks"]) for r in fx["rows"]] == [(4, 1), (6, 1)]
    for r in fx["rows"]:
        assert r["params"] == r["peer_params"]
        for phase in ("training", "inference"):
            split = r[phase]
            assert set(split) == {"total", "equal_work", "target_only"}
            for p in split.values():
                assert len(p["ours"]["rates"]) == len(p["peer"]["rates"]) == 2
                assert p["paired_ratios"] == [a / b for a, b in zip(p["ours"]["rates"], p["peer"]["rates"])]
                assert p["median_paired_ratio"] == statistics.median(p["paired_ratios"])
                assert p["spread"] == [min(p["paired_ratios"]), max(p["paired_ratios"])]
            # the three ratios come from the same three measurements: total = equal work x target-only
            assert split["total"]["ours"] == split["target_only"]["ours"]
            assert split["total"]["peer"] == split["equal_work"]["peer"]
            assert split["equal_work"]["ours"] == split["target_only"]["peer"]
            for t, e, o in zip(*(split[k]["paired_ratios"] for k in ("total", "equal_work", "target_only"))):
                assert t == pytest.approx(e * o)
    assert fx["pass"] == all(r["training"]["total"]["median_paired_ratio"] >= PEER_TARGET for r in fx["rows"])
    (table,) = result["tables"]
    assert len(table["rows"]) == 4  # two lengths x (training, inference)
    columns = table["columns"]
    assert {"BST every-token samples/s", "equal work: every-token x FuxiCTR", "target-only x every-token"} <= set(columns)
    first = dict(zip(columns, table["rows"][0]))
    t = fx["rows"][0]["training"]
    assert first["phase"] == "training"
    assert first["BST x FuxiCTR (spread)"].startswith(f"{t['total']['median_paired_ratio']:.3f}x (")
    assert first["equal work: every-token x FuxiCTR"].startswith(f"{t['equal_work']['median_paired_ratio']:.3f}x (")
    out = capsys.readouterr().out
    assert "at equal work (ours computing every token)" in out and "BST vs FuxiCTR's BST, training:" in out


def test_fuxictr_peer_has_our_shape():
    """Where fuxictr is installed (scripts/bench_env.sh): the same widths and parameters but the position
    tables, FuxiCTR's masks, one training step."""
    pytest.importorskip("fuxictr")
    kwargs, L = bst_kwargs(), 10
    peer, ours = fuxictr_peer.fuxictr_bst(kwargs, L, 1), our_bst(kwargs, L, 1)
    position = kwargs["position_dim"]
    position_tables = (L + 1) * position, kwargs["n_position_buckets"] * position
    assert count_parameters(peer) - position_tables[0] == count_parameters(ours) - position_tables[1]
    batch = random_batch(kwargs, 16, L)
    theirs = fuxictr_peer.fuxictr_batch(batch, kwargs)
    padding, attn = fuxictr_peer.padding_and_attention_masks(theirs["click_history"], kwargs["num_heads"])
    assert padding[:, :-1].equal(~batch["hist_mask"]) and not padding[:, -1].any()
    assert attn.shape == (16 * kwargs["num_heads"], L + 1, L + 1) and not attn.diagonal(dim1=1, dim2=2).any()
    out = peer(theirs)
    assert out.shape == (16,) and torch.isfinite(out).all()
    torch.nn.functional.binary_cross_entropy_with_logits(out, batch["label"]).backward()
    assert all(p.grad is not None for p in peer.transformer.parameters())


# ------------------------------------------------------------------------------------------- gpu
def test_gpu_check_exits_2_without_cuda(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert main(["gpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device" in err and "--device cpu --tiny" in err
    assert not out.exists()


def test_gpu_check_runs_tiny_on_cpu(tmp_path, capsys):
    result = _run(tmp_path, "gpu", "--device", "cpu", "--tiny", "--rounds", "1", "--threads", "1")
    assert result["device_name"] == "cpu" and result["peak_source"].startswith("measured")
    assert result["peak_flops"] == result["measured_bf16_matmul_flops_per_sec"] > 0
    assert result["vit"]["mfu"] > 0 and result["vit"]["ratio_to_timm"] > 0
    items = result["vit"]["comparison"]["items"]
    assert len({v["params"] for v in items.values()}) == 1  # ours and timm: same parameter count
    assert result["bst"]["training"] and all(r["ours"]["mfu"] > 0 for r in result["bst"]["training"])
    assert result["bst"]["skipped_seq_lens"] == []  # no --budget: the whole grid
    assert "MFU" in capsys.readouterr().out


def test_gpu_check_budget_cuts_the_bst_grid_and_keeps_what_was_measured(tmp_path, capsys):
    """--budget 0: the ViT is measured (it comes first), every BST length is left out and named, and the
    JSON is still written (scripts/gpu_check.sh relies on it to keep what a cut-short stage measured)."""
    result = _run(tmp_path, "gpu", "--device", "cpu", "--tiny", "--no-timm", "--seq-lens", "4,8", "--rounds", "1",
                  "--threads", "1", "--budget", "0")
    assert result["vit"]["mfu"] > 0 and len(result["tables"]) == 1
    assert result["bst"]["training"] == [] and result["bst"]["skipped_seq_lens"] == [4, 8]
    assert result["bst"]["geomean_ratio"] is None
    assert "BST sequence lengths [4, 8] not measured: the --budget of 0 s was spent" in result["verdicts"]
    assert "left out" in capsys.readouterr().out


def test_peak_table_by_device_name():
    assert table_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert table_peak("NVIDIA H200") == 989e12
    assert table_peak("NVIDIA H100 PCIe") == 756e12
    assert table_peak("NVIDIA A100-SXM4-80GB") == 312e12
    assert table_peak("Tesla T4") is None
