"""The Fashion-MNIST profiles of the ViT ablations (reproductions/vit/configs/overlays/fmnist_ablation.yaml):
which sweeps have them, that they share one recipe, and that each completes with the smoke sizes
on a small folder of Fashion-MNIST idx files, with the attention-distance analysis written."""

from __future__ import annotations

import dataclasses
import json

import pytest

from reproductions.run.cli import main as cli_main
from reproductions.run.results import read_results
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.spec import load_sweep
from tests.images_helpers import isolated, write_fashion  # noqa: F401
from tests.sweep_helpers import SWEEPS

OVERLAY = "reproductions/vit/configs/overlays/fmnist_ablation.yaml"
FMNIST = [(s, p) for s in SWEEPS for p in load_sweep(s).profiles if p.startswith("fmnist")]
SMOKE_SIZES = [
    "--model.net.init_args.embed_dim", "16", "--model.net.init_args.depth", "1",
    "--model.net.init_args.num_heads", "2", "--trainer.max_epochs", "1",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
    "--trainer.limit_test_batches", "2", "--trainer.log_every_n_steps", "1",
    "--data.init_args.batch_size", "16",
]  # fmt: skip


def test_the_four_ablations_the_relative_study_and_the_tuning_have_an_fmnist_profile_on_one_recipe():
    assert {s for s, _ in FMNIST} == {
        "vit/position", "vit/pooling", "vit/attention", "vit/patch_size", "vit/relative", "vit/tune",
        "vit/attention_distance", "vit/attention_data",
    }
    for sweep, profile in FMNIST:
        prof = load_sweep(sweep).profile(profile)
        assert prof.configs == [OVERLAY], (sweep, profile)
        assert prof.base in (None, "reproductions/vit/configs/fashion_mnist.yaml"), (sweep, profile)
    plan = make_plan("vit/patch_size", "fmnist", seeds=1)
    assert sorted((28 // r.variant.axes["patch_size"]) ** 2 for r in plan.runs) == [16, 49, 196]
    for sweep in ("vit/patch_size", "vit/position"):  # the longer budget: 4x the epochs, on the epochs axis
        long = load_sweep(sweep).profile("fmnist-long")
        assert long.overrides["trainer.max_epochs"] == 16 and (long.scale.axis, long.scale.value) == ("epochs", 16)


#: the ``fmnist-long`` profiles are the same recipe at more epochs (which the smoke sizes replace): built in test_sweep_spec.py
RUN = [(s, p) for s, p in FMNIST if not p.endswith("-long")]


@pytest.mark.slow
@pytest.mark.parametrize("sweep, profile", RUN, ids=[f"{s}-{p}" for s, p in RUN])
def test_every_fmnist_profile_completes_with_the_smoke_sizes(sweep, profile, tmp_path):
    write_fashion(tmp_path / "fashion", n_train=200, n_test=40)
    extra = [
        "--data.init_args.data_dir", str(tmp_path / "fashion"),
        "--data.init_args.cache_dir", str(tmp_path / "cache"), *SMOKE_SIZES,
    ]
    if sweep == "vit/attention_data":  # its subsets and step-wise validation, at the smoke data's size
        extra += ["--data.init_args.train_samples", "100", "--trainer.val_check_interval", "1"]
    plan = make_plan(sweep, profile, root=tmp_path / "runs", extra=extra, seeds=1)
    for run in plan.runs[:2]:  # the first two planned runs, by their planned commands
        cli_main(run.args)
        res = read_results(run.run_dir)
        assert res is not None and res["status"] == "finished", run.label
        assert res["data"]["source"] == "fashion_mnist"
        assert res["best"]["score"] is not None
        if sweep == "vit/tune":  # tuned on validation: never tested
            assert not res.get("test")
        else:
            assert 0.0 <= res["test"]["test/acc"] <= 1.0
        distance = json.loads((run.run_dir / "analysis" / "attention_distance.json").read_text())
        assert distance  # the analysis of the overlay's callback


@pytest.mark.slow
def test_the_data_size_tuning_runs_each_family_on_validation_only(tmp_path):
    """vit/tune's data_size path (families x lr x weight decay on data_size's subsets, early stopping by
    steps, never tested) at the smoke profile's sizes: each family's first run completes with its lr and
    weight decay, a best validation score and no test metric."""
    write_fashion(tmp_path / "fashion", n_train=200, n_test=40)
    extra = ["--data.init_args.data_dir", str(tmp_path / "fashion"), "--data.init_args.cache_dir", str(tmp_path / "cache"),
             "--data.init_args.batch_size", "16", "--data.init_args.train_samples", "100"]  # fmt: skip
    plan = make_plan("vit/tune", "smoke-data_size", root=tmp_path / "runs", extra=extra)
    assert len(plan.runs) == 3 * 2 * 2
    full = make_plan("vit/tune", "data_size")
    families = ("ViT", "Hybrid", "ResNet")
    assert {(v.axes["model"], v.axes["train_samples"], v.axes["lr"], v.axes["wd"]) for v in full.variants} == {
        (m, 54000, lr, wd) for m in families for lr in (1e-3, 2e-3, 4e-3) for wd in (0.05, 0.2)} | {
        (m, n, lr, wd) for m in families for n in (1000, 10000)
        for lr in (1e-3, 2e-3, 4e-3, 8e-3) for wd in (0.05, 0.2, 0.5)}  # fmt: skip  # the 1k/10k grid widened
    assert len(full.variants) == 90
    for model in ("ViT", "Hybrid", "ResNet"):
        run = next(r for r in plan.runs if r.variant.axes["model"] == model and r.variant.axes["lr"] == 4e-3
                   and r.variant.axes["wd"] == 0.2)  # fmt: skip
        cli_main(run.args)
        res = read_results(run.run_dir)
        assert res is not None and res["status"] == "finished", run.label
        assert res["best"]["monitor"] == "val/acc" and res["best"]["score"] is not None and not res.get("test")
        config = (run.run_dir / "config.yaml").read_text()
        assert "lr: 0.004" in config and "weight_decay: 0.2" in config and "augment: none" in config


def test_the_whole_schedule_check_is_the_cpu_profiles_runs_without_early_stopping():
    """vit/data_size cpu-whole-schedule differs from cpu in one thing, so that it measures whether stopping early
    (while the cosine schedule's learning rate is still high) decides the cpu numbers: each of its runs has the
    config of the cpu run of the same name and seed, lr and weight decay included, but for EarlyStopping."""
    from reproductions.sweeping.estimate import resolved_config

    cpu, whole = make_plan("vit/data_size", "cpu"), make_plan("vit/data_size", "cpu-whole-schedule")
    same = {(r.variant.name, r.seed): r for r in cpu.runs}
    assert len(whole.runs) == len(cpu.runs) == 45

    def stopping(config):
        return [c for c in config["trainer"]["callbacks"] if c["class_path"].endswith("EarlyStopping")]

    for run in whole.runs:
        a, b = resolved_config(cpu, same[run.variant.name, run.seed]), resolved_config(whole, run)
        assert stopping(a) and not stopping(b), run.label
        a["trainer"]["callbacks"] = [c for c in a["trainer"]["callbacks"] if c not in stopping(a)]
        assert a == b, run.label
        assert b["run"]["test_ckpt"] == "best" and b["trainer"]["max_steps"] == 8000


#: cpu-crop-flip's variants at the augmented tuning's picks (vit/tune data_size-crop-flip; tests/test_picks.py holds
#: the sweep file to the recorded picks), with their lr and weight decay
RETUNED = {"ViT,train_samples=1000": (8.0e-3, 0.05), "ViT,train_samples=3000": (8.0e-3, 0.05),
           "ViT,train_samples=10000": (8.0e-3, 0.2)}


@pytest.mark.parametrize(("profile", "path", "whole_value", "value", "retuned"), [
    ("cpu-crop-flip", ("data", "init_args", "augment"), "none", "crop_flip", RETUNED),
    ("cpu-16000steps", ("trainer", "max_steps"), 8000, 16000, {}),
])
def test_a_whole_schedule_sibling_differs_from_it_where_its_file_says(profile, path, whole_value, value, retuned):
    """A sibling of vit/data_size cpu-whole-schedule has its 45 runs without early stopping and differs from it in
    one value, and in the lr and weight decay of the variants a tuning of its own picked for (``retuned``):
    cpu-crop-flip in the augmentation (a labelled deviation from the paper, for the sizes where no family beats
    the pixel floor without it), cpu-16000steps in the step count (the budget scale's second point). The budget
    profile sits at its own point of the scale, the augmented one at the same."""
    from reproductions.sweeping.estimate import resolved_config

    whole, other = make_plan("vit/data_size", "cpu-whole-schedule"), make_plan("vit/data_size", profile)
    same = {(r.variant.name, r.seed): r for r in whole.runs}
    assert len(other.runs) == len(whole.runs) == 45
    budget = path[-1] == "max_steps"  # the scale's axis is train_steps
    # the budget point continues the whole schedule's line; the augmented one is a series of its own at the same point
    assert other.profile.scale == (dataclasses.replace(whole.profile.scale, value=value) if budget
                                   else dataclasses.replace(whole.profile.scale, series="crop + flip"))  # fmt: skip
    *parents, leaf = path
    for run in other.runs:
        a, b = resolved_config(whole, same[run.variant.name, run.seed]), resolved_config(other, run)
        in_a, in_b = a, b
        for k in parents:
            in_a, in_b = in_a[k], in_b[k]
        assert in_a[leaf] == whole_value and in_b[leaf] == value, run.label
        in_a[leaf] = value
        if run.variant.name in retuned:
            lr, wd = retuned[run.variant.name]
            a["model"]["init_args"].update(lr=lr, weight_decay=wd)
        assert a == b, run.label


#: vit/hybrid's picks (vit/tune hybrid; tests/test_picks.py holds the sweep file to the recorded picks): lr, weight decay
HYBRID_PICKS = {"ViT-S": (1.6e-2, 0.2), "ViT-M": (4.0e-3, 0.05), "Hybrid-S": (1.6e-2, 0.2), "Hybrid-M": (8.0e-3, 0.5),
                "ResNet-S": (3.2e-2, 0.2), "ResNet-M": (3.2e-2, 0.2)}


@pytest.mark.parametrize(("profile", "epochs", "tuned"), [
    ("cpu-shared-recipe", 3, False), ("cpu-6epochs", 6, True), ("cpu-12epochs", 12, True),
])
def test_the_hybrid_budgets_differ_from_cpu_in_the_epochs_alone_and_the_shared_recipe_in_lr_and_wd(profile, epochs, tuned):
    """vit/hybrid's budget scale: cpu (3 epochs), cpu-6epochs and cpu-12epochs run every model at its own tuned lr and
    weight decay and differ in the epochs (the scale's value) alone; cpu-shared-recipe, the runs made before that
    tuning, is cpu at the configs' shared lr 2e-3 and weight decay 0.05, at the same point of the scale."""
    from reproductions.sweeping.estimate import resolved_config

    cpu, other = make_plan("vit/hybrid", "cpu"), make_plan("vit/hybrid", profile)
    same = {(r.variant.name, r.seed): r for r in cpu.runs}
    assert len(other.runs) == len(cpu.runs) == 18
    assert other.profile.scale == dataclasses.replace(cpu.profile.scale, value=epochs, series=None if tuned else "shared recipe")
    for run in other.runs:
        a, b = resolved_config(cpu, same[run.variant.name, run.seed]), resolved_config(other, run)
        lr, wd = HYBRID_PICKS[run.variant.name]
        assert (a["model"]["init_args"]["lr"], a["model"]["init_args"]["weight_decay"]) == (lr, wd), run.label
        assert a["trainer"]["max_epochs"] == 3 and b["trainer"]["max_epochs"] == epochs, run.label
        a["trainer"]["max_epochs"] = epochs
        if not tuned:
            assert (b["model"]["init_args"]["lr"], b["model"]["init_args"]["weight_decay"]) == (2.0e-3, 0.05), run.label
            a["model"]["init_args"].update(lr=2.0e-3, weight_decay=0.05)
        assert a == b, run.label
