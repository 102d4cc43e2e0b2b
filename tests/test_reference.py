"""A rerun beside the registry's reference (reproductions/sweeping/reference.py, comparable.py):
a verdict only where the data, the model, the budget and the other settings are the reference's;
else the row says "not comparable" and names what differs. Hand-made records and run directories
of vit/pooling's cpu profile (no training)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from reproductions.run.results import RESULTS_FILE, atomic_write_json
from reproductions.sweeping.collect import collect
from reproductions.sweeping.comparable import describe, differences
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.records import make_record, record_path
from reproductions.sweeping.reference import against_reference, reference_table
from reproductions.sweeping.sweep_report import render
from tests.report_helpers import result

SWEEP, PROFILE = "vit/pooling", "cpu"
VARIANT = "pool=cls,lr=0.002"
CPU = {"device": "cpu", "cpu": "Test CPU 9000 (family 25, model 1)", "cpu_capability": "AVX2"}
OTHER_CPU = {"device": "cpu", "cpu": "Other CPU (family 6, model 2)", "cpu_capability": "AVX512"}
#: the reference's resolved config (a few keys of each part), as config.yaml nests it
CONFIG = {
    "seed_everything": 0,
    "trainer": {"accelerator": "cpu", "devices": 1, "max_epochs": 40, "max_steps": -1, "precision": "32-true"},
    "model": {"class_path": "lightning_modules.image_classifier.ImageClassifier",
              "init_args": {"lr": 0.002, "net": {"class_path": "models.vit.ViT", "init_args": {"num_classes": 10, "depth": 4}}}},
    "data": {"class_path": "datamodules.images.ImageDataModule",
             "init_args": {"source": "digits", "batch_size": 64, "data_dir": "/home/someone/data/digits", "num_workers": 2}},
    "run": {"experiment": f"{SWEEP}-{PROFILE}", "variant": VARIANT},
}  # fmt: skip
DIGITS = {"source": "digits", "origin": "sklearn.datasets.load_digits (/usr/lib/python3/digits.csv.gz)", "train_size": 1294,
          "val_size": 144, "test_size": 359, "num_classes": 10, "batch_size": 64}  # fmt: skip
FMNIST = {"source": "fashion_mnist", "origin": "idx files (/usr/share/fashion-mnist)", "train_size": 54000,
          "val_size": 6000, "test_size": 10000, "num_classes": 10, "batch_size": 64}  # fmt: skip


def run_results(seed: int, acc: float, *, data=DIGITS, hardware=OTHER_CPU, at="2026-12-01T10:00:00+00:00") -> dict:
    return {**result(VARIANT, seed, acc, experiment=f"{SWEEP}-{PROFILE}"), "data": data, "hardware": hardware,
            "finished_at": at, "best": {"monitor": "val/acc", "score": acc}, "final": {"val/acc": acc}}  # fmt: skip


def with_key(config: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(config)
    *path, last = dotted.split(".")
    node = out
    for p in path:
        node = node[p]
    node[last] = value
    return out


def setup(tmp_path: Path, mine: list[float], *, config=CONFIG, data=DIGITS, hardware=OTHER_CPU) -> Path:
    """Three records of the variant (0.95, 0.96, 0.97 on ``CPU``), and the user's runs (one per
    value of ``mine``) with ``config`` as their config.yaml and ``data`` as their description."""
    registry, root = tmp_path / "results", tmp_path / "runs"
    for seed, acc in enumerate([0.95, 0.96, 0.97]):
        cfg = with_key(CONFIG, "seed_everything", seed)
        rec = make_record(registry, run_results(seed, acc, hardware=CPU), cfg, SWEEP, PROFILE, cfg)
        atomic_write_json(record_path(registry, rec), rec)
    for seed, acc in enumerate(mine):
        run_dir = root / f"{SWEEP}-{PROFILE}" / VARIANT / f"seed{seed}"
        atomic_write_json(run_dir / RESULTS_FILE, run_results(seed, acc, data=data, hardware=hardware, at=f"2026-12-02T0{seed}:00:00+00:00"))
        (run_dir / "config.yaml").write_text(json.dumps(with_key(config, "seed_everything", seed)))  # JSON is YAML
    return tmp_path


def row(tmp_path: Path) -> dict[str, str]:
    """The reference table's row of ``VARIANT``, by column."""
    plan = make_plan(SWEEP, PROFILE, root=tmp_path / "runs")
    rows = against_reference(plan, collect(plan), collect(plan, registry=tmp_path / "results", local=False))
    header, body = reference_table(plan, rows)
    return next(dict(zip(header, r)) for r in body if r[0] == VARIANT)


def test_a_rerun_on_other_data_is_not_judged_and_the_data_is_named(tmp_path):
    """Another dataset (its source, sizes and vocabulary follow it): no verdict, no difference; the
    data named (the model's data-sized keys count with the data), model and budget same."""
    config = with_key(with_key(CONFIG, "data.init_args.source", "fashion_mnist"), "model.init_args.net.init_args.num_classes", 12)
    setup(tmp_path, [0.80, 0.81, 0.82], config=config, data=FMNIST)
    got = row(tmp_path)
    assert got["verdict"] == ("not comparable: data differs (fashion_mnist vs digits; origin idx files (.../fashion-mnist) vs "
                              "sklearn.datasets.load_digits (.../digits.csv.gz); train_size 54,000 vs 1,294; and 3 more); "
                              "model same; budget same")  # fmt: skip
    assert got["yours - reference"] == "–" and got["yours: test acc. (%)"] == "81.00 ± 1.00" and got["your n"] == "3"


def test_a_rerun_with_another_budget_or_model_is_not_judged(tmp_path):
    setup(tmp_path / "budget", [0.96, 0.97], config=with_key(CONFIG, "trainer.max_epochs", 5))
    assert row(tmp_path / "budget")["verdict"] == "not comparable: data same; model same; budget differs (trainer.max_epochs 5 vs 40)"
    model = with_key(with_key(CONFIG, "model.init_args.lr", 0.001), "model.init_args.net.init_args.num_classes", 12)
    setup(tmp_path / "model", [0.96, 0.97], config=with_key(model, "data.init_args.batch_size", 128))
    got = row(tmp_path / "model")  # a data-sized key with the same data is the model's
    assert got["verdict"] == ("not comparable: data same; model differs (model.lr 0.001 vs 0.002; model.net.num_classes 12 vs 10); "
                              "budget differs (data.batch_size 128 vs 64)")  # fmt: skip
    setup(tmp_path / "other", [0.96], config=with_key(CONFIG, "trainer.precision", "bf16-mixed"))
    assert row(tmp_path / "other")["verdict"] == ("not comparable: data same; model same; budget same; "
                                                  "other settings differ (trainer.precision bf16-mixed vs 32-true)")  # fmt: skip


def test_a_rerun_of_the_same_experiment_keeps_its_verdict(tmp_path):
    """The same data (in another folder), model, budget and settings, run elsewhere (another
    accelerator, devices, data folder and loader workers): the verdict stands, reproduced or not."""
    elsewhere = with_key(with_key(CONFIG, "trainer.devices", 2), "data.init_args.data_dir", "/mnt/other/digits")
    elsewhere = with_key(with_key(elsewhere, "data.init_args.num_workers", 8), "run.experiment", "mine")
    setup(tmp_path / "same", [0.955, 0.965, 0.975], config=elsewhere)
    got = row(tmp_path / "same")
    assert got["verdict"].startswith("reproduced (within the reference's noise: 0.6 s.e.)") and got["yours - reference"] == "+0.50 ± 0.82"
    setup(tmp_path / "lower", [0.86, 0.861])
    assert row(tmp_path / "lower")["verdict"] == "differs by 17.2 s.e. (lower)"
    setup(tmp_path / "exact", [0.95, 0.96, 0.97], hardware=CPU)
    assert row(tmp_path / "exact")["verdict"] == "reproduced exactly (same hardware, same seeds)"


def test_the_reports_section_says_what_is_compared(tmp_path):
    setup(tmp_path, [0.80, 0.81], config=with_key(CONFIG, "data.init_args.source", "fashion_mnist"), data=FMNIST)
    report = render(make_plan(SWEEP, PROFILE, root=tmp_path / "runs"), tmp_path / "fig", registry=tmp_path / "results")
    section = report.markdown[report.markdown.index("## Beside the reference"):]
    assert "judged only where what decides its number is the same on both sides" in section
    assert f"| {VARIANT} | 96.00 ± 1.00 | 3 |" in section and "| – | not comparable: data differs (fashion_mnist vs digits;" in section


def test_differences_leave_out_the_seed_the_place_and_one_sided_keys(tmp_path):
    ref = make_record(tmp_path, run_results(0, 0.9), CONFIG, SWEEP, PROFILE, CONFIG)
    mine = with_key(with_key(CONFIG, "seed_everything", 7), "trainer.accelerator", "gpu")
    mine = with_key(with_key(mine, "trainer.num_nodes", 2), "model.init_args.a_new_option", 1)
    assert differences(run_results(7, 0.9), mine, {**ref, "source": "registry"}) == []
    assert differences({"data": {**DIGITS, "raw": {"rows": 3}}}, None, {"data": DIGITS}) == []  # a field only one side records
    diffs = differences({"data": {**DIGITS, "train_size": 1000}}, None, {"data": DIGITS})
    assert describe(diffs) == "data differs (train_size 1,000 vs 1,294); model same; budget same"
