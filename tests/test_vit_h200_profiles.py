"""The one-GPU CIFAR-10 profiles of the ViT ablations (``h200``, reproductions/vit/configs/overlays/cifar10_h200.yaml):
which sweeps have them, that they load and plan, share one recipe with the data on the device, hold the
grids the claims need, state the device time that ``reproductions.sweeping.estimate`` computes from the
counted FLOPs, and that every run's command line parses; the older ``gpu`` profiles are untouched."""

from __future__ import annotations

import pytest

from reproductions.run.cli import main as cli_main
from reproductions.sweeping import estimate
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.spec import SweepError, load_sweep
from tests.sweep_helpers import SWEEPS, write_sweep

OVERLAY = "reproductions/vit/configs/overlays/cifar10_h200.yaml"
ORDER = ["vit/patch_size", "vit/pooling", "vit/position", "vit/hybrid", "vit/data_size", "vit/attention_data",
         "vit/time_to_accuracy_cifar10"]
#: the studies of the campaign's own, without a paper-shaped ``gpu`` profile
STUDIES = ("vit/attention_data", "vit/time_to_accuracy_cifar10")


def test_the_campaign_sweeps_have_an_h200_profile_on_one_recipe():
    assert sorted(s for s in SWEEPS if "h200" in load_sweep(s).profiles) == sorted(ORDER)
    for sweep in ORDER:
        s = load_sweep(sweep)
        prof = s.profile("h200")
        assert prof.configs == [OVERLAY] and prof.scale.data == "cifar10" and prof.device_s > 0, sweep
        assert "--data.data_dir" in prof.description
        if sweep == "vit/time_to_accuracy_cifar10":  # a time to accuracy: a mean over seeds, as airbench reports
            assert prof.seeds == [0, 1, 2] and prof.report == {"target": 0.94, "budget_s": 30}
        else:
            assert prof.seeds == [0] and "1 seed (the budget)" in prof.description
        if sweep not in STUDIES:
            assert "gpu" in s.profiles and s.profile("gpu").configs == []  # the paper-shaped profile stays as it was
        plan = make_plan(sweep, "h200", extra=["--data.data_dir", "DIR"])
        for run in plan.runs:
            config = estimate.resolved_config(plan, run)
            data = config["data"]["init_args"]
            assert data["on_device"] is True and data["source"] == "folder" and data["augment"] in ("crop_flip", "none")
            assert config["trainer"]["precision"] == "bf16-mixed" and config["model"]["init_args"]["net"]["init_args"]["img_size"] == 32


def test_the_grids_are_the_claims():
    tokens = sorted((32 // r.variant.axes["patch_size"]) ** 2 for r in make_plan("vit/patch_size", "h200").runs)
    assert tokens == [16, 64, 256]
    kinds = [r.variant.overrides["model.net.init_args.pos_embed"] for r in make_plan("vit/position", "h200").runs]
    assert kinds == ["none", "learned_1d", "learned_2d", "sincos_2d", "relative"]
    pooling = [(r.variant.axes["pool"], r.variant.axes["lr"]) for r in make_plan("vit/pooling", "h200").runs]
    assert {p for p, _ in pooling} == {"cls", "gap"} and len(pooling) == 6  # each pool at three learning rates
    sizes = {(r.variant.axes["model"], r.variant.axes["train_samples"]) for r in make_plan("vit/data_size", "h200").runs}
    assert sizes == {(m, n) for m in ("ViT", "ResNet") for n in (5000, 20000, 40500)}
    cutmix = {(r.variant.axes["cutmix"], r.variant.axes["train_samples"]) for r in make_plan("vit/attention_data", "h200").runs}
    assert cutmix == {(c, n) for c in (0.0, 1.0) for n in (5000, 20000, 40500)}


def test_the_hybrid_and_the_vit_cost_the_same():
    plan = make_plan("vit/hybrid", "h200")
    flops = {r.variant.axes["model"]: estimate.net_flops(estimate.resolved_config(plan, r)) for r in plan.runs}
    assert set(flops) == {"ViT", "Hybrid"} and abs(flops["Hybrid"] / flops["ViT"] - 1) < 0.02, flops


@pytest.mark.parametrize("sweep", ORDER)
def test_the_stated_device_time_is_the_estimate(sweep):
    runs = estimate.estimate_profile(sweep, "h200")
    total = sum(r.total_s for r in runs)
    stated = load_sweep(sweep).profile("h200").device_s
    assert abs(stated - total) <= 2, f"{sweep}: device_s {stated} but the estimate is {total:.0f} s; update the profile"
    for r in runs:  # the floor or the scaled FLOPs, whichever is slower; never faster than the reference's FLOP rate
        assert r.train_s >= r.flops_only_train_s > 0 and r.images_per_s <= estimate.REFERENCE_TRAIN_FLOPS_PER_S / (3 * r.flops)


def test_the_estimate_scales_by_flops_above_the_floor():
    config = {"data": {"init_args": {"batch_size": 512, "test_fraction": 0.1}}, "trainer": {"max_epochs": 2}}
    big = estimate.estimate_run("b", config, flops=10**10, data_images=50_000)  # ViT-B-like: the FLOPs decide
    assert big.steps == 2 * (40_500 // 512)
    assert big.images_per_s == pytest.approx(estimate.REFERENCE_TRAIN_FLOPS_PER_S / (3 * 10**10))
    small = estimate.estimate_run("s", config, flops=10**6, data_images=50_000)  # the step floor decides
    assert small.images_per_s == pytest.approx(512 / estimate.STEP_FLOOR_S)


def test_device_s_must_be_a_positive_number(tmp_path):
    for bad in (0, -5, "fast", True):
        path = write_sweep(tmp_path / "s.yaml", product={"patch_size": [2]}, profiles={"x": {"device_s": bad}})
        with pytest.raises(SweepError, match=r"profiles\.x\.device_s=.* must be a positive number of seconds"):
            load_sweep(path)


@pytest.mark.slow
@pytest.mark.parametrize("sweep", ORDER)
def test_every_h200_run_command_parses(sweep, capsys):
    plan = make_plan(sweep, "h200", extra=["--data.data_dir", "DIR", "--trainer.accelerator", "cpu"])
    for run in plan.runs:
        with pytest.raises(SystemExit) as done:
            cli_main([*run.args, "--print_config"])
        assert done.value.code in (0, None), run.label
        printed = capsys.readouterr().out
        assert "on_device: true" in printed and "batch_size: 512" in printed, run.label
