"""Sweep files (reproductions/sweeping/spec.py): every sweep file of the repository expands at
every profile, the papers' grids and numbers, the expansion rules, and bad files named with the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from reproductions.commands.report import main as report_main
from reproductions.commands.sweep import main as sweep_main
from reproductions.sweeping.plan import cli_value, make_plan
from reproductions.sweeping.records import split_derived
from reproductions.sweeping.estimate import resolved_config
from reproductions.sweeping.spec import SweepError, load_sweep
from tests.cli_helpers import build_only
from tests.images_helpers import write_folder
from tests.sweep_helpers import REPO, SWEEPS, config_value, sets, write_sweep

#: the papers' ablations run at every scale; the helper sweeps (tuning, probes) at their data's
ABLATIONS = [s for s in SWEEPS if s not in ("bst/tune", "bst/probe", "vit/tune", "vit/time_to_accuracy_cifar10",
                                               "vit/attention_distance", "vit/attention_data")]  # studies, not ablations
#: (sweep, profile) of every profile a user runs (not smoke nor smoke-*, which the smoke tests run; not
#: imagenet, whose ViT-B/16 builds take long: its configs build in tests/test_images_recipes.py)
#: every profile a user runs, but vit/data_size cpu-whole-schedule, cpu-crop-flip and cpu-16000steps, whose configs
#: are cpu's without one callback and then with another augmentation or step count (tests/test_vit_fmnist_profiles.py
#: proves each), so building cpu builds them
SAME_AS_CPU = ("cpu-whole-schedule", "cpu-crop-flip", "cpu-16000steps")
BUILT = [(s, p) for s in SWEEPS for p in load_sweep(s).profiles if p != "imagenet" and not p.startswith("smoke")
         and not (s == "vit/data_size" and p in SAME_AS_CPU)]


# --------------------------------------------------------------------------- the sweep files


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_file_expands_and_dry_runs_every_profile(sweep, tmp_path, capsys):
    s = load_sweep(sweep)
    assert {"smoke", "cpu", "gpu"} <= set(s.profiles) if sweep in ABLATIONS else {"smoke"} < set(s.profiles)
    for profile in s.profiles:
        plan = make_plan(sweep, profile, root=tmp_path)
        variants = s.profiles[profile].variants or s.variants
        assert len(plan.runs) == len(variants) * len(plan.seeds)
        assert plan.experiment == f"{sweep}-{profile}"  # the profile is part of the experiment: never mixed
        names = [r.variant.name for r in plan.runs]
        assert len(set(zip(names, (r.seed for r in plan.runs)))) == len(plan.runs)
        for run in plan.runs:
            assert run.run_dir == tmp_path / plan.experiment / run.variant.name / f"seed{run.seed}"
            assert run.args[:2] == ["fit", "--config"] and Path(run.args[2]).is_file()
            args = run.args
            assert args[args.index("--run.variant") + 1] == run.variant.name
            assert args[args.index("--seed_everything") + 1] == str(run.seed)
            assert args[args.index("--run.group") + 1] == plan.experiment
            assert s.axis in json.loads(args[args.index("--run.tags") + 1])
            for key, value in run.variant.overrides.items():  # the variant's overrides, after the profile's
                i = len(args) - 1 - args[::-1].index(f"--{key}")
                assert args[i + 1] == cli_value(value)
        assert sweep_main([sweep, "--profile", profile, "--dry-run", "--root", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert out.count("-m reproductions fit --config") == len(plan.runs)
        assert f"{len(plan.runs)} to run" in out
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_position_sweep_is_table8_plus_our_extras_with_the_papers_numbers():
    s = load_sweep("vit/position")
    pairs = {(v.axes["pos_embed"], v.axes["pos_placement"]): v for v in s.variants}
    placements = ("stem", "every_layer", "every_layer_shared")
    table8 = {("none", "stem"), ("relative", "stem")} | {(k, p) for k in ("learned_1d", "learned_2d") for p in placements}
    extras = {("sincos_2d", p) for p in placements} | {("relative_2d", "stem")}
    assert set(pairs) == table8 | extras
    paper = {k: pairs[k].paper["table8"].value for k in table8}
    assert paper == {  # the paper's Table 8
        ("none", "stem"): 0.61382, ("learned_1d", "stem"): 0.64206, ("learned_1d", "every_layer"): 0.63964,
        ("learned_1d", "every_layer_shared"): 0.64292, ("learned_2d", "stem"): 0.64001,
        ("learned_2d", "every_layer"): 0.64046, ("learned_2d", "every_layer_shared"): 0.64022,
        ("relative", "stem"): 0.64032,
    }  # fmt: skip
    assert all("table8" not in pairs[k].paper for k in extras)
    small = {k: v.paper["small_cifar10"].value for k, v in pairs.items() if "small_cifar10" in v.paper}
    assert small == {("none", "stem"): 79.63, ("learned_1d", "stem"): 86.52, ("sincos_2d", "stem"): 86.09,
                     ("relative", "stem"): 90.57}  # fmt: skip
    v = pairs[("learned_2d", "every_layer")]
    assert v.name == "learned_2d-every_layer"
    assert v.overrides == {"model.net.init_args.pos_embed": "learned_2d", "model.net.init_args.pos_placement": "every_layer"}
    assert {r.key: r.scale for r in s.references} == {"table8": "fraction", "small_cifar10": "percent"}
    assert "not directly comparable" in next(r.note for r in s.references if r.key == "table8").lower()


def test_patch_and_pooling_grids_fit_their_images():
    patch = load_sweep("vit/patch_size")
    assert [v.axes["patch_size"] for v in patch.variants] == [4, 2, 1]  # 8 px digits (cpu, smoke)
    assert [v.axes["patch_size"] for v in patch.profile("gpu").variants] == [8, 4, 2]  # 32 px CIFAR
    assert "cifar10" in patch.profile("gpu").base
    pooling = load_sweep("vit/pooling")
    assert {v.axes["pool"] for v in pooling.variants} == {"cls", "gap"}
    assert len(pooling.variants) == 2 * len({v.axes["lr"] for v in pooling.variants}) >= 6
    assert all(v.overrides["model.init_args.lr"] == v.axes["lr"] for v in pooling.variants)
    assert [v.name for v in load_sweep("vit/attention").variants] == ["dot", "additive"]


@pytest.mark.slow
@pytest.mark.parametrize("sweep, profile", BUILT)
def test_every_profile_builds_through_the_cli(sweep, profile, tmp_path):
    """Every run of every profile a user runs (cpu, gpu, the real-data ones) parses and instantiates (model, data, trainer) through
    ReproductionCLI without training: keys, types and the model's own checks (patch divides image,
    valid kind/placement) hold. CIFAR is not downloaded: nothing reads data before fit. Runs that differ
    only in their name, learning rate and weight decay (a tuning grid's points) build once: those two values
    reach nothing before the optimiser is made at fit."""
    def plan_overrides(sweep, profile):
        s = load_sweep(sweep)
        return {**s.overrides, **s.profile(profile).overrides}

    def folder(sweep, profile):  # set by an override or by an overlay config (the h200 profiles')
        plan = make_plan(sweep, profile, seeds=1)
        return any(resolved_config(plan, r)["data"]["init_args"].get("source") == "folder" for r in plan.runs)

    extra, replaced = [], set()
    if folder(sweep, profile):  # the user's folder, after '--'
        write_folder(tmp_path / "images", classes=[f"c{i}" for i in range(10)], per_class=1, size=(32, 32))
        extra, replaced = ["--data.data_dir", str(tmp_path / "images")], {"data.init_args.data_dir"}
    built = set()
    for run in make_plan(sweep, profile, root=tmp_path, seeds=1, extra=extra).runs:  # seeds differ only in one number
        shape, _ = split_derived(run.args)  # a tuning grid's points differ in lr, weight decay and name alone
        if shape in built:
            continue
        built.add(shape)
        cli = build_only(run.args, trainer=True)
        cfg = cli.config["fit"].as_dict()
        for key, value in {**plan_overrides(sweep, profile), **run.variant.overrides}.items():
            assert key in replaced or sets(config_value(cfg, key), value), (sweep, run.label, key)
        assert cli.datamodule is not None
        if sweep.startswith("vit/"):
            assert cli.model.net.num_classes == 10


@pytest.mark.parametrize("command", ["sweep", "report"])
def test_help_lists_every_profile_of_every_sweep(command, capsys):
    """``repro sweep --help`` / ``repro report --help`` name each sweep's profiles as its file has them."""
    main = sweep_main if command == "sweep" else report_main
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert len(SWEEPS) >= 13
    for sweep in SWEEPS:
        paper, name = sweep.split("/")
        profiles = list(yaml.safe_load((REPO / "reproductions" / paper / "sweeps" / f"{name}.yaml").read_text())["profiles"])
        assert f"  {sweep}: {', '.join(profiles)}\n" in text, sweep
    for profile in ("fmnist", "fmnist-196", "cpu-movielens", "imagenet", "gpu-amazon"):
        assert f", {profile}" in text
    assert "smoke, cpu or gpu" not in text


# --------------------------------------------------------------------------- expansion rules


def test_product_axes_aliases_seeds_and_profile_replacements(tmp_path):
    path = write_sweep(
        tmp_path / "grid.yaml",
        aliases={"pool": "model.net.init_args.pool", "lr": "model.init_args.lr"},
        product={"pool": ["cls", "gap"], "lr": [3.0e-4, 1.0e-3, 3.0e-3]},
        seeds=2,
        overrides={"trainer.max_epochs": 3},
        profiles={
            "smoke": {"overrides": {"trainer.max_epochs": 1, "lr": 0.5}},
            "cpu": {"seeds": [5, 7], "product": {"pool": ["gap"], "lr": [1.0e-2]}},
        },
    )
    plan = make_plan(path, "smoke", root=tmp_path / "runs")
    assert [v.name for v in plan.variants] == [
        "pool=cls,lr=0.0003", "pool=cls,lr=0.001", "pool=cls,lr=0.003",
        "pool=gap,lr=0.0003", "pool=gap,lr=0.001", "pool=gap,lr=0.003",
    ]  # fmt: skip
    assert plan.seeds == [0, 1] and len(plan.runs) == 12
    assert plan.experiment == "grid-smoke"
    v = plan.variants[4]
    assert v.overrides == {"model.net.init_args.pool": "gap", "model.init_args.lr": 0.001}
    assert v.axes == {"pool": "gap", "lr": 0.001}
    args = plan.runs[8].args  # variant 4, seed 0
    # one value per key; later ones win: sweep (max_epochs 3) < profile (1, lr 0.5) < variant (lr 0.001)
    assert [args[i + 1] for i, a in enumerate(args) if a == "--model.init_args.lr"] == ["0.001"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--trainer.max_epochs"] == ["1"]
    cpu = make_plan(path, "cpu", root=tmp_path)
    assert [r.label for r in cpu.runs] == ["pool=gap,lr=0.01 seed5", "pool=gap,lr=0.01 seed7"]
    assert make_plan(path, "cpu", seeds=3).seeds == [0, 1, 2]  # --seeds N: seeds 0..N-1


def test_a_product_of_several_grids_is_their_points_in_turn(tmp_path):
    """``product: [grid, grid]``: a wider grid for one part (4 learning rates at the smallest size, 2 at
    the largest), crossed with the variants like one grid; grids over other axes, or sharing a point,
    are errors naming the grid."""
    grids = [{"train_samples": [1000], "lr": [1.0e-3, 2.0e-3, 4.0e-3, 8.0e-3]},
             {"train_samples": [54000], "lr": [1.0e-3, 2.0e-3]}]  # fmt: skip
    aliases = {"lr": "model.init_args.lr", "train_samples": "data.init_args.train_samples"}
    path = write_sweep(tmp_path / "union.yaml", aliases=aliases,
                       variants=[{"name": "ViT"}, {"name": "ResNet"}], product=grids, profiles={"smoke": {}})  # fmt: skip
    plan = make_plan(path, "smoke", root=tmp_path / "runs")
    names = [v.name for v in plan.variants]
    assert names[:6] == ["ViT,train_samples=1000,lr=0.001", "ViT,train_samples=1000,lr=0.002",
                         "ViT,train_samples=1000,lr=0.004", "ViT,train_samples=1000,lr=0.008",
                         "ViT,train_samples=54000,lr=0.001", "ViT,train_samples=54000,lr=0.002"]  # fmt: skip
    assert len(names) == 12 and names[6].startswith("ResNet,")
    assert plan.variants[3].overrides == {"data.init_args.train_samples": 1000, "model.init_args.lr": 0.008}
    assert plan.variants[3].axes == {"train_samples": 1000, "lr": 0.008}
    other_axes = [grids[0], {"lr": [1.0e-3], "train_samples": [54000]}]
    with pytest.raises(SweepError, match=r"product\[1\]: axes \['lr', 'train_samples'\]"):
        load_sweep(write_sweep(tmp_path / "bad.yaml", variants=[{"name": "a"}], product=other_axes, profiles={"smoke": {}}))
    overlapping = [grids[0], {"train_samples": [1000], "lr": [8.0e-3]}]
    with pytest.raises(SweepError, match="variant names repeat"):
        load_sweep(write_sweep(tmp_path / "dup.yaml", variants=[{"name": "a"}], product=overlapping, profiles={"smoke": {}}))
    with pytest.raises(SweepError, match=r"product: expected a mapping"):
        load_sweep(write_sweep(tmp_path / "empty.yaml", variants=[{"name": "a"}], product=[], profiles={"smoke": {}}))


def test_a_profile_report_replaces_the_sweeps_report_keys_for_that_profile_only(tmp_path):
    """A profile's ``report`` keys (another target and budget) win over the sweep's in that
    profile's plan, the sweep's others stay, and the other profiles keep the sweep's."""
    path = write_sweep(
        tmp_path / "tta.yaml",
        variants=[{"name": "a"}],
        report={"plot": "curves", "check": "time_to_target", "target": 0.92, "budget_s": 900},
        profiles={"smoke": {}, "fast": {"report": {"target": 0.93, "budget_s": 600}}},
    )
    fast, smoke = make_plan(path, "fast", root=tmp_path), make_plan(path, "smoke", root=tmp_path)
    assert fast.sweep.report == {"plot": "curves", "check": "time_to_target", "target": 0.93, "budget_s": 600}
    assert smoke.sweep.report["target"] == 0.92 and smoke.sweep.report["budget_s"] == 900
    assert load_sweep(path).report["target"] == 0.92  # the loaded sweep is not changed


def test_variants_crossed_with_a_product_carry_both_axes_and_their_own_base(tmp_path):
    """``variants`` + ``product``: every variant at every product point (the data-size study: each
    model at each training-set size), named ``<variant>,<axis>=<value>``, with the variant's base
    config, its declared ``axes`` and the point's; a profile's ``product`` crosses the sweep's variants."""
    resnet = REPO / "reproductions" / "vit" / "configs" / "resnet_fashion_mnist.yaml"
    path = write_sweep(
        tmp_path / "cross.yaml",
        aliases={"n": "data.init_args.train_samples", "dim": "model.net.init_args.embed_dim"},
        variants=[
            {"name": "ViT-S", "axes": {"model": "ViT", "size": "S"}, "overrides": {"dim": 32}},
            {"name": "ResNet-S", "axes": {"model": "ResNet", "size": "S"}, "base": str(resnet)},
        ],
        product={"n": [100, 300]},
        profiles={"smoke": {"seeds": 1}, "gpu": {"product": {"n": [1000]}}},
    )
    plan = make_plan(path, "smoke", root=tmp_path / "runs")
    assert [v.name for v in plan.variants] == ["ViT-S,n=100", "ViT-S,n=300", "ResNet-S,n=100", "ResNet-S,n=300"]
    vit, res = plan.variants[1], plan.variants[2]
    assert vit.axes == {"dim": 32, "model": "ViT", "size": "S", "n": 300}
    assert vit.overrides == {"model.net.init_args.embed_dim": 32, "data.init_args.train_samples": 300}
    assert vit.base is None and res.base == str(resnet)
    assert res.overrides == {"data.init_args.train_samples": 100}
    gpu = make_plan(path, "gpu", root=tmp_path / "runs")
    assert [v.name for v in gpu.variants] == ["ViT-S,n=1000", "ResNet-S,n=1000"]


def test_variant_overrides_set_values_per_variant_after_its_own_in_that_profile_only(tmp_path):
    """A profile's ``variant_overrides`` (values tuned per family and size) go after the named variant's
    own overrides, in that profile alone; the other variants and profiles keep theirs, the axes stay."""
    path = write_sweep(
        tmp_path / "tuned.yaml",
        aliases={"n": "data.init_args.train_samples", "lr": "model.init_args.lr"},
        variants=[{"name": "A", "overrides": {"lr": 0.1}}, {"name": "B"}],
        product={"n": [100, 300]},
        profiles={"smoke": {"seeds": 1}, "cpu": {"variant_overrides": {"A,n=300": {"lr": 0.5}, "B,n=100": {"lr": 0.2}}}},
    )
    cpu = {v.name: v for v in make_plan(path, "cpu", root=tmp_path).variants}
    assert cpu["A,n=300"].overrides == {"model.init_args.lr": 0.5, "data.init_args.train_samples": 300}
    assert cpu["A,n=100"].overrides["model.init_args.lr"] == 0.1
    assert cpu["B,n=100"].overrides["model.init_args.lr"] == 0.2 and "model.init_args.lr" not in cpu["B,n=300"].overrides
    assert cpu["A,n=300"].axes == {"lr": 0.1, "n": 300}  # the grid's axes, not the tuned values
    args = next(r.args for r in make_plan(path, "cpu", root=tmp_path).runs if r.variant.name == "A,n=300")
    assert [args[i + 1] for i, a in enumerate(args) if a == "--model.init_args.lr"] == ["0.5"]
    smoke = {v.name: v for v in make_plan(path, "smoke", root=tmp_path).variants}
    assert smoke["A,n=300"].overrides["model.init_args.lr"] == 0.1
    bad = write_sweep(tmp_path / "bad.yaml", variants=[{"name": "A"}], profiles={"smoke": {"variant_overrides": {"C": {}}}})
    with pytest.raises(SweepError, match=r"variant_overrides: unknown keys \['C'\]; allowed: \['A'\]"):
        load_sweep(bad)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"variants": [{"name": "a", "overrides": {"x": 2}}], "product": {"x": [1]}}, "sets ['x'], an axis of 'product'"),
        ({}, "give 'variants' (a list), 'product' (axes) or both"),
        ({"variants": [{"name": "a", "axes": [1]}]}, "expected a mapping"),
        ({"variants": [{"name": "a/b"}]}, "no '/'"),
        ({"variants": [{"name": "a"}, {"name": "a"}]}, "repeat"),
        ({"variants": [{"name": "a", "overide": {}}]}, "unknown keys ['overide']"),
        ({"variants": [{"name": "a", "paper": {"t9": 1.0}}]}, "unknown references ['t9']"),
        ({"variants": [{"name": "a"}], "seeds": 0}, "at least 1"),
        ({"variants": [{"name": "a"}], "grid": {}}, "unknown keys ['grid']"),
        ({"variants": [{"name": "a"}], "base": "no/such.yaml"}, "base config 'no/such.yaml' not found"),
        ({"variants": [{"name": "a"}], "profiles": {"smoke": {"report": [0.9]}}}, "profiles.smoke.report=[0.9]: expected a mapping"),
    ],
)
def test_bad_sweep_files_fail_with_the_key_and_the_file(tmp_path, spec, message):
    path = write_sweep(tmp_path / "bad.yaml", **spec)
    with pytest.raises(SweepError, match=re.escape(message)) as err:
        make_plan(path, "smoke")
    assert "bad.yaml" in str(err.value)


@pytest.mark.parametrize("text, where, what", [
    ("name: x\nvariants:\n\t- a\n", "line 3, column 1", "a tab character where YAML expects spaces"),
    ("name: x\nvariants: [a, b\n", "line 3, column 1", "expected ',' or ']', but got the end of the file"),
])
def test_a_sweep_file_that_is_not_yaml_names_file_line_and_cause(tmp_path, text, where, what):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SweepError) as err:
        make_plan(path, "smoke")
    message = str(err.value)
    assert message.startswith(f"{path}, {where}: {what}") and "\n" not in message
    assert "while scanning" not in message and "<unicode string>" not in message
