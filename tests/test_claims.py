"""The claims page (reproductions/commands/claims.py, reproductions/sweeping/claims_page.py) on hand-made
results.json files: a verdict per claim and profile, rows in scale order, a figure for a claim
measured at two scales only, the profiles without runs listed, bad scales and empty roots refused."""

from __future__ import annotations

import re

import pytest

from reproductions.__main__ import commands_help, main as repro_main
from reproductions.commands.claims import main as claims_main
from reproductions.run.results import RESULTS_FILE, atomic_write_json
from reproductions.sweeping.records import REGISTRY_DIR
from reproductions.sweeping.spec import Scale, SweepError, load_sweep
from tests.report_helpers import PNG, result, write_report_sweep
from tests.sweep_helpers import SWEEPS

CPU = {"device": "cpu", "cpu": "Test CPU 9000 (family 25, model 1)", "cpu_capability": "AVX2"}

#: accuracies per profile and variant (3 seeds each); "large" comes first in the file, "small"
#: is the smaller scale: the rows must come out small, then large
ACCS = {
    "small": {"none": [0.76, 0.77, 0.78], "learned": [0.95, 0.96, 0.97], "relative": [0.90, 0.91, 0.92],
              "sincos": [0.70, 0.71, 0.72]},
    "large": {"none": [0.84, 0.85, 0.86], "learned": [0.87, 0.88, 0.89], "relative": [0.84, 0.86, 0.88]},
    "smoke": {"none": [0.10], "learned": [0.90]},
}  # fmt: skip


def claims_sweep(tmp_path, **profiles):
    return write_report_sweep(
        tmp_path / "pos.yaml", aliases={"pos_embed": "model.net.init_args.pos_embed"},
        variants=[{"name": n, "overrides": {"pos_embed": n}} for n in ("none", "learned", "relative", "sincos")],
        claims=["A clear gap between none and any embedding."],
        report={"plot": "bars", "check": "baseline", "baseline": "none"},
        profiles=profiles or {
            "large": {"seeds": 3, "scale": {"axis": "tokens", "value": 49, "data": "fashion_mnist"}},
            "huge": {"seeds": 3, "scale": {"axis": "tokens", "value": 196, "data": "imagenet"}},
            "small": {"seeds": 3, "scale": {"axis": "tokens", "value": 16, "data": "digits"}},
            "smoke": {"seeds": 1, "scale": {"axis": "tokens", "value": 16, "data": "digits"}},
        },
    )  # fmt: skip


def put_runs(root, sweep_name="pos"):
    for profile, by_variant in ACCS.items():
        for variant, values in by_variant.items():
            for seed, acc in enumerate(values):
                r = {**result(variant, seed, acc, experiment=f"{sweep_name}-{profile}"), "hardware": CPU}
                atomic_write_json(root / f"{sweep_name}-{profile}" / variant / f"seed{seed}" / RESULTS_FILE, r)


def rows_of(md: str, claim: str) -> list[list[str]]:
    table = md.split(f"### {claim}\n\n", 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


@pytest.fixture
def page(tmp_path, capsys):
    sweep, root = claims_sweep(tmp_path), tmp_path / "runs"
    put_runs(root)
    other = write_report_sweep(tmp_path / "other.yaml", title="Never run", variants=[{"name": "a"}], profiles={"cpu": {}, "gpu": {}})
    out, figures = tmp_path / "docs" / "claims.md", tmp_path / "docs" / "figures" / "claims"
    argv = ["--sweep", str(sweep), "--sweep", str(other), "--root", str(root), "--out", str(out), "--figures", str(figures)]
    assert claims_main(argv) == 0
    return out.read_text(), out, figures, capsys.readouterr().out


def test_each_verdict_from_the_constructed_numbers_rows_in_scale_order(page):
    md = page[0]
    # small: relative 91 +- 1 vs none 77 +- 1: +14, s.e. 0.82: holds; large: 86 +- 2 vs 85 +- 1: +1, s.e. 1.29
    assert rows_of(md, "relative > none") == [
        ["`small`", "16 tokens (digits)", "3 / 3", "+14.00 points (± 0.82 s.e.)", "holds"],
        ["`large`", "49 tokens (fashion_mnist)", "3 / 3", "+1.00 points (± 1.29 s.e.)", "within noise"],
    ]
    assert rows_of(md, "learned > none")[1] == ["`large`", "49 tokens (fashion_mnist)", "3 / 3", "+3.00 points (± 0.82 s.e.)", "holds"]
    # sincos 71 +- 1 vs none 77 +- 1: -6, s.e. 0.82; run at the small scale only
    assert rows_of(md, "sincos > none") == [["`small`", "16 tokens (digits)", "3 / 3", "-6.00 points (± 0.82 s.e.)", "does not hold"]]


def test_figure_for_a_claim_at_two_scales_only_linked_relative(page):
    md, out, figures, _ = page
    pngs = sorted(figures.glob("*.png"))
    assert len(pngs) == 2 and all(p.read_bytes()[:8] == PNG for p in pngs)  # learned and relative > none
    links = re.findall(r"!\[([^]]*)\]\(([^)]+)\)", md)
    assert sorted(claim for claim, _ in links) == ["learned > none", "relative > none"]
    assert all(not link.startswith("/") and (out.parent / link).resolve() in pngs for _, link in links)
    sincos = md.split("### sincos > none", 1)[1].split("###", 1)[0]
    assert "![" not in sincos
    assert not [p for p in out.parent.rglob("*") if p.name.endswith(".tmp")]


def test_head_commands_hardware_and_profiles_without_runs(page, tmp_path):
    md, _, _, printed = page
    assert f"repro sweep {tmp_path / 'pos.yaml'} --profile small --root {tmp_path / 'runs'}" in md
    assert f"repro claims --root {tmp_path / 'runs'} --out " in md
    assert "- CPU Test CPU 9000 (family 25, model 1) (AVX2); host `box`: pos `small` (12 runs); pos `large` (9 runs)" in md
    assert "- Not measured: huge" in md  # smoke is not a result: neither measured nor missing
    assert md.endswith("## Sweeps not measured\n\n- `other` (Never run): cpu, gpu\n")
    assert "the 0 records of the results registry (`results/`) and 21 finished local runs under" in md
    assert "`smoke`" not in md and "- Paper: A clear gap between none and any embedding." in md
    assert "pos: small, large; 3 claims; not measured: huge" in printed


def test_smoke_profiles_on_request(tmp_path):
    sweep, root = claims_sweep(tmp_path), tmp_path / "runs"
    put_runs(root)
    out = tmp_path / "claims.md"
    assert claims_main(["--sweep", str(sweep), "--root", str(root), "--out", str(out), "--figures", str(tmp_path / "f"), "--smoke"]) == 0
    md = out.read_text()
    # the same scale as small: the sweep file's order after it
    assert rows_of(md, "learned > none")[1] == ["`smoke`", "16 tokens (digits)", "1 / 1", "+80.00 points", "holds (one seed: no s.e.)"]
    assert "--smoke" in md


def test_a_scale_names_its_budget_beside_its_axis():
    assert Scale("tokens", 49, "fashion_mnist", "4 epochs").label == "49 tokens (fashion_mnist), 4 epochs"
    assert Scale("epochs", 16, "fashion_mnist").label == "16 epochs (fashion_mnist)"
    assert load_sweep("vit/position").profiles["fmnist"].scale.budget == "4 epochs"


def test_two_profiles_at_one_scale_are_told_apart_by_name_in_labels_and_by_series_in_figures():
    """Protocols at one budget (vit/data_size cpu, cpu-whole-schedule and cpu-crop-flip, all 8,000 steps): the
    README's verdict cells name the profile; a claim's figure keeps the budget axis, sets the points of each
    series (the scales' `series`) a little apart, and joins a point only to points of its own series."""
    from types import SimpleNamespace

    from reproductions.sweeping.claims_page import _figure_points, scale_labels
    from reproductions.sweeping.figures import plot_claim_by_scale

    sweep = load_sweep("vit/data_size")
    cpu, whole, flip, short, long = (sweep.profiles[p] for p in ("cpu", "cpu-whole-schedule", "cpu-crop-flip", "cpu-600steps",
                                                                 "cpu-16000steps"))  # fmt: skip
    assert scale_labels([short, cpu, whole]) == [
        "600 training steps (fashion_mnist)",
        "8,000 training steps (fashion_mnist), `cpu`",
        "8,000 training steps (fashion_mnist), `cpu-whole-schedule`",
    ]
    assert scale_labels([short, cpu]) == ["600 training steps (fashion_mnist)", "8,000 training steps (fashion_mnist)"]

    def row(profile, difference):
        return SimpleNamespace(profile=profile), SimpleNamespace(difference=difference, se=0.5)

    points, xlabel = _figure_points([row(short, -3.0), row(cpu, 2.0)])
    assert xlabel == "training steps" and [p[1] for p in points] == [600.0, 8000.0]
    points, xlabel = _figure_points([row(short, -3.0), row(cpu, 2.0), row(whole, 3.0), row(flip, 4.0), row(long, 3.5)])
    assert xlabel == "training steps" and [p[1] for p in points] == [600.0, 8000.0, 8000.0, 8000.0, 16000.0]
    assert [p[4] for p in points] == ["early stopping", "early stopping", None, "crop + flip", None]
    fig = plot_claim_by_scale("a > b", points, xlabel=xlabel, ylabel="a - b", title="t")
    zero = fig.axes[0].get_lines()[-1]  # axhline(0), drawn after the points
    lines = sorted(tuple(line.get_xdata()) for line in fig.axes[0].get_lines() if len(line.get_xdata()) > 1 and line is not zero)
    at_8000 = sorted(float(c.lines[0].get_xdata()[0]) for c in fig.axes[0].containers if 7000 < c.lines[0].get_xdata()[0] < 9000)
    assert len(at_8000) == 3 and len(set(at_8000)) == 3  # the three protocols side by side, not on top of each other
    early, whole_x = (min(at_8000), at_8000[1])
    assert lines == sorted([(600.0, early), (whole_x, 16000.0)])  # early stopping joined, the whole schedule joined
    same, _ = _figure_points([row(cpu, 2.0), row(SimpleNamespace(**{**vars(cpu), "name": "again"}), 3.0)])
    assert [p[1] for p in same] == [None, None]  # one series twice at one value: by name


@pytest.mark.parametrize("scale, message", [
    ({"axis": "pixels", "value": 8}, r"profiles\.cpu\.scale\.axis='pixels' is not one of \['tokens', 'train_images', 'samples', 'dataset', 'epochs', 'train_steps'\]"),
    ({"axis": "epochs", "value": 16, "budget": "16 epochs"}, r"profiles\.cpu\.scale\.budget='16 epochs' must be the training budget in words"),
    ({"axis": "tokens", "value": 16, "budget": 4}, r"profiles\.cpu\.scale\.budget=4 must be the training budget in words"),
    ({"axis": "tokens", "value": -16}, r"profiles\.cpu\.scale\.value=-16 must be a positive number of tokens"),
    ({"axis": "dataset", "value": 3}, r"profiles\.cpu\.scale\.value=3: on the dataset axis the value is the data set's name"),
    ({"axis": "tokens", "value": 16, "size": 1}, r"profiles\.cpu\.scale: unknown keys \['size'\]"),
    ({"axis": "epochs", "value": 3, "series": " "}, r"profiles\.cpu\.scale\.series=' ' must name the protocol in words"),
])  # fmt: skip
def test_a_bad_scale_is_refused_naming_the_file_and_the_profile(tmp_path, capsys, scale, message):
    bad = claims_sweep(tmp_path, cpu={"scale": scale})
    with pytest.raises(SweepError, match=re.escape(str(bad)) + r".*" + message):
        load_sweep(bad)
    assert claims_main(["--sweep", str(bad), "--root", str(tmp_path)]) == 2
    assert re.search(message, capsys.readouterr().err)


def test_an_empty_root_is_one_error_line_naming_it_and_the_command_that_makes_runs(tmp_path, capsys):
    sweep, root = claims_sweep(tmp_path), tmp_path / "nothing"
    out = tmp_path / "claims.md"
    assert repro_main(["claims", "--sweep", str(sweep), "--root", str(root), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: no records in {REGISTRY_DIR} and no finished runs under {root}: "
                                               "make some first, e.g. repro sweep ")
    assert "--profile large" in err[0] and not out.exists()


def test_the_command_is_in_repro_help_and_every_profile_of_the_repository_names_its_scale():
    assert re.search(r"^  claims +every sweep's claims at every scale", commands_help(), re.MULTILINE)
    unscaled = [f"{s}:{name}" for s in SWEEPS for name, p in load_sweep(s).profiles.items() if p.scale is None]
    assert unscaled == []


def put_distances(run_dir, heads_by_layer, grid=(7, 7), uniform=14.44):
    rows = [{"layer": i + 1, "mean": sum(h) / len(h), "min": min(h), "max": max(h), "heads": h}
            for i, h in enumerate(heads_by_layer)]
    atomic_write_json(run_dir / "analysis" / "attention_distance.json",
                      {"num_images": 128, "grid_size": list(grid), "uniform_attention_distance": uniform,
                       "attention_distance": rows})  # fmt: skip
    (run_dir / "analysis" / "attention_distance.png").write_bytes(PNG)


def test_attention_distance_section_pools_seeds_orders_by_scale_and_copies_the_longest_runs_figure(tmp_path):
    root = tmp_path / "runs"
    long = {**result("default", 0, 0.9, experiment="vit/long"), "training": {"epochs": 20, "steps": 8000, "samples_seen": 1_080_000}}
    short = {**result("default", 0, 0.8, experiment="vit/short"), "training": {"epochs": 4, "steps": 1600, "samples_seen": 216_000}}
    for name, res, layers in [
        ("long/default/seed0", long, [[5.0, 14.0], [15.0, 16.0]]),
        ("long/default/seed1", {**long, "seed": 1}, [[9.0, 14.0], [15.0, 15.0]]),  # pooled layer 1: 7.0 and 14.0
        ("short/default/seed0", short, [[14.0, 15.0], [13.0, 14.0]]),
        ("digits/default/seed0", {**result("default", 0, 0.9, experiment="vit/digits")}, [[2.0, 3.0], [3.0, 3.5]]),
    ]:
        atomic_write_json(root / name / RESULTS_FILE, res)
        put_distances(root / name, layers, **({"grid": (4, 4), "uniform": 3.41} if "digits" in name else {}))
    atomic_write_json(root / "failed" / "default" / "seed0" / RESULTS_FILE, {**short, "status": "failed"})
    put_distances(root / "failed" / "default" / "seed0", [[1.0, 1.0], [9.0, 9.0]])
    out, figures = tmp_path / "docs" / "claims.md", tmp_path / "docs" / "figures" / "claims"
    assert claims_main(["--root", str(root), "--registry", str(tmp_path / "no-records"), "--out", str(out),
                        "--figures", str(figures)]) == 0  # fmt: skip
    section = out.read_text().split("## Attention distance", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("| vit/")]
    assert [r[0] for r in rows] == ["vit/digits", "vit/short", "vit/long"]  # 16 tokens first, then by samples
    assert [r[1] for r in rows] == ["16", "49", "49"]
    long_row = rows[2]
    assert long_row[3] == "2" and long_row[5] == "7.00 - 14.00" and long_row[7] == "1 of 2"
    assert long_row[8] == "**holds** (holds, holds)"
    assert rows[1][8].startswith("**does not hold**")  # no local head, shrinking with depth
    assert rows[0][7] == "1 of 2" and rows[0][8].startswith("**holds**")  # 2.0 < 0.75 x 3.41
    [figure] = figures.glob("attention-distance-*.png")
    assert figure.read_bytes() == PNG and "vit-long" in figure.name
    assert f"](figures/claims/{figure.name})" in section


def test_corrupt_results_are_named_one_warning_each(tmp_path, capsys):
    """A truncated and an empty results.json among finished runs: the page is written from the
    rest, and each is named with what to do (not silently counted out)."""
    sweep, root = claims_sweep(tmp_path), tmp_path / "runs"
    put_runs(root)
    truncated = root / "pos-small" / "learned" / "seed1" / RESULTS_FILE
    truncated.write_text(truncated.read_text()[:40])
    empty = root / "pos-large" / "none" / "seed2" / RESULTS_FILE
    empty.write_text("")
    out = tmp_path / "claims.md"
    assert claims_main(["--sweep", str(sweep), "--root", str(root), "--out", str(out), "--figures", str(tmp_path / "f")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    why = f"corrupt {RESULTS_FILE} (not a complete JSON object): delete it and rerun"
    assert warnings == [f"warning: {empty.parent}: {why}", f"warning: {truncated.parent}: {why}"]  # the sweep file's order
    assert rows_of(out.read_text(), "learned > none")[0][2] == "2 / 3"  # the page counts what is left


def test_check_compares_the_page_and_figures_and_a_write_removes_figures_no_longer_shown(tmp_path, capsys):
    sweep, root = claims_sweep(tmp_path), tmp_path / "runs"
    put_runs(root)
    out, figures = tmp_path / "claims.md", tmp_path / "figs"
    argv = ["--sweep", str(sweep), "--root", str(root), "--out", str(out), "--figures", str(figures)]
    assert claims_main([*argv, "--check"]) == 1  # nothing written yet
    assert f"out of date: {out}" in capsys.readouterr().out and not out.exists()
    assert claims_main(argv) == 0 and claims_main([*argv, "--check"]) == 0
    old = figures / "a-claim-no-longer-measured.png"
    old.write_bytes(PNG)
    assert claims_main([*argv, "--check"]) == 1 and f"out of date: {old}" in capsys.readouterr().out
    assert claims_main(argv) == 0 and not old.exists() and len(list(figures.glob("*.png"))) == 2


def test_same_picture_tolerates_a_few_moved_pixels_not_another_figure(tmp_path):
    import io

    import numpy as np
    from PIL import Image

    from reproductions.commands.claims import same_picture

    def png(array) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(array.astype(np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    base = np.full((60, 80, 3), 255)
    base[20:40, 10:70] = 0
    moved = base.copy()
    moved[20, 10:14] = 255  # a few pixels of a label
    other = np.full((60, 80, 3), 255)
    other[5:55, 30:50] = 0
    assert same_picture(png(base), png(base)) and same_picture(png(base), png(moved))
    assert not same_picture(png(base), png(other)) and not same_picture(png(base), png(base[:50]))


def test_the_page_as_a_wandb_run_holds_its_comparisons_figures_and_markdown(tmp_path, monkeypatch, capsys):
    """``--wandb`` (offline): one claims run kept in <root>/claims, its config the page's command; its
    table (waiting for sync as a relocatable file) has one row per claim and profile with the page's
    verdicts; each scale figure is an image in its history; the Markdown is a file of the run."""
    import wandb

    from reproductions.run.artifacts import read_pending, read_table
    from reproductions.run.tracking import read_run_id
    from tests.helpers import history_values, wandb_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    sweep, root = claims_sweep(tmp_path), tmp_path / "runs"
    put_runs(root)
    out, figures = tmp_path / "docs" / "claims.md", tmp_path / "docs" / "figures" / "claims"
    argv = ["--sweep", str(sweep), "--root", str(root), "--out", str(out), "--figures", str(figures), "--wandb"]
    assert claims_main(argv) == 0
    wandb.teardown()
    printed = capsys.readouterr()
    assert "W&B: offline (WANDB_MODE=offline)" in printed.err and "W&B: claims run" in printed.out
    directory = root / "claims"
    run_id = read_run_id(directory)
    [folder] = (directory / "wandb").glob(f"offline-run-*-{run_id}")
    records = wandb_records(next(folder.glob("run-*.wandb")))
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.job_type, run.run_group, run.display_name) == ("claims", "claims", "claims")
    [entry] = read_pending(directory)
    table = read_table(directory / entry["files"][0]["path"])
    md = out.read_text()
    rows = {(r[1], r[2]): r for r in table["data"]}
    small = rows_of(md, "learned > none")
    assert rows[("learned > none", "small")][-1] == small[0][-1].split(" ")[0].strip("*")  # the page's verdict
    assert {p for (_, p) in rows} == {"small", "large"}
    images = [v for v in history_values(records).values() if isinstance(v, dict) and v.get("_type") == "image-file"]
    assert all((folder / "files" / v["path"]).is_file() for v in images)  # media: relative to files/
    assert len(images) == len(list(figures.glob("*.png"))) > 0
    saved = {f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files}
    assert "claims.md" in saved and (folder / "files" / "claims.md").read_text() == md


def test_the_committed_verdicts_say_one_seed_and_their_own_metric():
    """A verdict with no standard error (a side with one run) says so in the README summary, and a claim table
    of the claims page names the claim's own metric (a 5-shot claim's difference is not test accuracy)."""
    from reproductions.sweeping.spec import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text()
    block = readme[readme.index("<!-- registry-claims -->"):readme.index("<!-- /registry-claims -->")]
    cells = re.findall(r"\*\*(?:holds|does not hold|within noise|under-trained)\*\*, ([^<|]*)", block)
    assert cells and all(("s.e." in c) != ("(one seed)" in c) for c in cells), [c for c in cells if ("s.e." in c) == ("(one seed)" in c)]
    page = (REPO_ROOT / "docs" / "claims.md").read_text()
    tables = re.findall(r"### ([^\n]*)\n\n(\| profile [^\n]*)", page)
    shots = [(claim, header) for claim, header in tables if claim.startswith("5-shot linear (%)")]
    assert shots and all("a - b (5-shot linear (%))" in header for _, header in shots), shots
    assert all("a - b (test acc. (%))" in header for claim, header in tables if claim.startswith("test acc. (%)"))


def test_a_claims_figure_draws_the_floor_of_its_own_subset():
    """A claim at one training-subset size (vit/data_size at 1k) draws that size's pixel floor, the one its
    sides' verdict used (each side's Stat), not the floor of the whole profile's runs (several sizes: none)."""
    from types import SimpleNamespace

    from reproductions.sweeping.claims_page import _sides
    from reproductions.sweeping.collect import Stat

    def row(a_floor, b_floor, difference=3.0):
        c = SimpleNamespace(difference=difference, stat_a=Stat(82.4, 0.2, 3, floor=a_floor), stat_b=Stat(78.5, 0.5, 3, floor=b_floor))
        return SimpleNamespace(profile=None), c

    assert _sides([row(79.4, 79.4), row(None, 81.9), row(None, None), row(79.4, 79.4, difference=None)]) == [
        (82.4, 78.5, 79.4), (82.4, 78.5, 81.9), (82.4, 78.5, None)]
