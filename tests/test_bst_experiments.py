"""The BST experiments (reproductions/bst/): the configs, the two sweeps, their reports.

Checks the experiment files themselves (every config runs a batch; the nets' vocabularies are
the data's; the MovieLens config and source fragment run on a tiny file in the ml-1m format),
the sweeps (every profile expands and dry-runs; both complete at the smoke profile through the
real CLI and report the CTR columns) and the report's CTR columns on hand-made results
(RelaImpr, the ceiling, the paper's AUC, the ordering check).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from reproductions.run.cli import main as cli_main
from reproductions.run.results import RESULTS_FILE, atomic_write_json, read_results
from reproductions.commands.sweep import main as sweep_main
from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.sweep_report import REPORT_FILE, write_report
from reproductions.sweeping.spec import SweepError, load_sweep
from tests.cli_helpers import QUIET
from tests.helpers import inprocess_runner
from tests.sweep_helpers import run_smoke_sweeps

REPO = Path(__file__).resolve().parents[1]
BST = REPO / "reproductions" / "bst"
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (BST / "configs").glob("*.yaml"))
SWEEPS = ["bst/table", "bst/position"]
MODELS = ["WDL", "WDL+Seq", "DIN", "BST-b1", "BST-b2", "BST-b3"]
PAPER_AUC = {"WDL": 0.7734, "WDL+Seq": 0.7846, "DIN": 0.7866, "BST-b1": 0.7894, "BST-b2": 0.7885, "BST-b3": 0.7823}
SOURCE_ML1M = "reproductions/bst/sources/movielens_1m.yaml"
SMALL_SYNTHETIC = ["--data.synthetic_samples", "4000", "--data.use_cache", "false"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _behavior_cache(tmp_path_factory, monkeypatch):
    """Preprocessed behaviour data goes to the test's temporary folder, not ~/.cache."""
    monkeypatch.setenv("BEHAVIOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "behavior-cache"))


# --------------------------------------------------------------------------- helpers


def write_movielens(folder: Path, n_users: int = 12, n_movies: int = 30, per_user: int = 10, seed: int = 0) -> Path:
    """A tiny ml-1m folder in the documented format (``::``-separated, latin-1)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    genres = ["Action", "Comedy", "Drama", "Horror", "Romance", "Thriller", "Children's"]
    movies = [f"{m}::Movie {m} (19{50 + m % 50})::{genres[m % 7]}|{genres[(m * 3) % 7]}" for m in range(1, n_movies + 1)]
    ages, users, ratings = [1, 18, 25, 35, 45, 50, 56], [], []
    for u in range(1, n_users + 1):
        users.append(f"{u}::{'MF'[u % 2]}::{ages[u % 7]}::{u % 21}::{10000 + 7919 * u % 89999:05d}")
        t = 978_300_000 + int(rng.integers(0, 10**6))
        for m in rng.choice(np.arange(1, n_movies + 1), size=per_user, replace=False):
            t += int(rng.integers(1, 10**5))
            ratings.append(f"{u}::{m}::{int(rng.integers(1, 6))}::{t}")
    for name, lines in (("movies.dat", movies), ("users.dat", users), ("ratings.dat", ratings)):
        (folder / name).write_text("\n".join(lines) + "\n", encoding="latin-1")
    return folder


def net_args(config: str) -> dict:
    return yaml.safe_load((REPO / config).read_text())["model"]["init_args"]["net"]["init_args"]


def data_args(config: str) -> dict:
    return yaml.safe_load((REPO / config).read_text())["data"]["init_args"]


def overrides_of(run) -> dict[str, str]:
    """The overrides a run's command sets (last one wins), without the position kind (the BST default)."""
    args = run.args[3 : run.args.index("--seed_everything")]
    return {k: v for k, v in zip(args[::2], args[1::2]) if k != "--model.net.init_args.position"}


def table_rows(markdown: str) -> dict[str, list[str]]:
    """The report table's rows by their first cell (the header under 'variant')."""
    rows = {}
    for line in markdown[markdown.index("## Results"):].splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells
        elif rows and not line.strip():
            break
    return rows


# --------------------------------------------------------------------------- the experiment configs


def test_each_model_has_a_config_with_its_command_and_measurement_in_the_header():
    names = {Path(c).stem for c in CONFIGS}
    assert {"bst", "din", "wdl", "wdl_seq", "bst_movielens_1m"} <= names
    classes = {"bst": "BST", "din": "DIN", "wdl": "WDL", "wdl_seq": "WDLSeq", "bst_movielens_1m": "BST"}
    for config in CONFIGS:
        text = (REPO / config).read_text()
        header = text[: text.index("seed_everything")]
        assert f"repro fit --config {config}" in header, config
        assert "Measured:" in header, config
        cfg = yaml.safe_load(text)
        assert cfg["model"]["init_args"]["net"]["class_path"] == f"models.ctr.{classes[Path(config).stem]}"
        assert cfg["run"]["test_ckpt"] == "best"  # the test uses the best validation epoch
    bst = net_args("reproductions/bst/configs/bst.yaml")  # the paper's profile
    assert (bst["num_blocks"], bst["num_heads"], bst["dropout"], bst["seq_len"], bst["mlp_dims"]) == (1, 8, 0.2, 20, [1024, 512, 256])
    assert bst["position"] == "time_delta"
    ml = (REPO / "reproductions/bst/configs/bst_movielens_1m.yaml").read_text()
    assert "files.grouplens.org/datasets/movielens/ml-1m.zip" in ml
    assert data_args("reproductions/bst/configs/bst_movielens_1m.yaml")["data_dir"] is None


@pytest.mark.parametrize("config", CONFIGS)
def test_every_bst_config_runs_fast_dev_run(config, tmp_path):
    """One train/val/test batch through the CLI; synthetic configs on a small world, MovieLens
    on a tiny file in the ml-1m format (the real one is a download)."""
    source = data_args(config)["source"]
    if source == "synthetic":
        extra = SMALL_SYNTHETIC
    else:
        assert source == "movielens_1m", f"{config}: add a fixture for {source}"
        extra = ["--data.data_dir", str(write_movielens(tmp_path / "ml-1m"))]
    cli_main(["fit", "--config", config, "--run.root", str(tmp_path / "runs"), "--trainer.fast_dev_run", "true",
              *QUIET, *extra])  # fmt: skip
    assert not list((tmp_path / "runs").rglob(RESULTS_FILE))  # a smoke run is not a result


@pytest.mark.parametrize("config", [c for c in CONFIGS if "movielens" not in c])
def test_synthetic_configs_give_the_nets_exactly_the_datas_vocabularies(config):
    """Explicit sizes in the YAML (no link to the data): they must be the generator's, and
    CTRModule.setup would refuse smaller ones."""
    from datamodules.behavior import BehaviorDataModule

    args = {**data_args(config), "synthetic_samples": 2000, "use_cache": False}
    data = BehaviorDataModule(**args).feature_sizes
    net = net_args(config)
    for key in ("n_users", "n_items", "n_categories", "profile_sizes"):
        assert net[key] == data[key], (config, key)
    if "n_position_buckets" in net:
        assert net["n_position_buckets"] == data["n_position_buckets"] and net["seq_len"] == data["seq_len"]


def test_movielens_sizes_hold_the_data_and_a_missing_folder_says_where_to_download(tmp_path, capsys):
    from datamodules.behavior import BehaviorDataModule
    from lightning_modules.ctr import check_feature_sizes

    config = "reproductions/bst/configs/bst_movielens_1m.yaml"
    fixture = BehaviorDataModule(source="movielens_1m", data_dir=str(write_movielens(tmp_path / "ml")), use_cache=False)
    for sizes in (net_args(config), yaml.safe_load((REPO / SOURCE_ML1M).read_text())["model"]["init_args"]["net"]["init_args"]):
        check_feature_sizes(sizes, fixture.feature_sizes)  # the real ml-1m: 6040 users, 3883 movies, 18 genres
        assert sizes["n_users"] == 6041 and sizes["n_items"] == 3884 and sizes["n_categories"] == 19
        assert len(sizes["profile_sizes"]) == len(fixture.feature_sizes["profile_sizes"]) == 4
    with pytest.raises((ValueError, SystemExit)) as err:
        cli_main(["fit", "--config", config, "--run.root", str(tmp_path / "runs"), *QUIET])
    shown = str(err.value) + capsys.readouterr().err
    assert "needs data_dir" in shown and "https://files.grouplens.org/datasets/movielens/ml-1m.zip" in shown


@pytest.mark.parametrize("model", ["wdl", "din"])
def test_movielens_source_fragment_turns_any_model_config_to_movielens(model, tmp_path):
    folder = write_movielens(tmp_path / "ml-1m")
    cli_main(["fit", "--config", f"reproductions/bst/configs/{model}.yaml", "--config", SOURCE_ML1M,
              "--data.data_dir", str(folder), "--run.root", str(tmp_path / "runs"), "--trainer.fast_dev_run", "true",
              *QUIET])  # fmt: skip


# --------------------------------------------------------------------------- the sweep files


@pytest.mark.parametrize("sweep", SWEEPS)
def test_bst_sweeps_expand_and_dry_run_every_profile(sweep, tmp_path, capsys):
    s = load_sweep(sweep)
    assert {"smoke", "cpu", "gpu"} <= set(s.profiles)
    assert s.metric.key == "test/auc" and [c.key for c in s.columns] == ["test/gauc", "test/logloss"]
    assert s.metric.ceiling == "data.ceiling.test_auc" and s.report["relaimpr"]["baseline"] in {v.name for v in s.variants}
    for profile in s.profiles:
        plan = make_plan(sweep, profile, root=tmp_path)
        assert len(plan.runs) == len(plan.variants) * len(plan.seeds)
        for run in plan.runs:
            args = run.args
            config = Path(args[2])
            assert config.is_file() and args[args.index("--run.variant") + 1] == run.variant.name
            if sweep == "bst/table":
                expected = {"WDL": "wdl", "WDL+Seq": "wdl_seq", "DIN": "din"}.get(run.variant.name, "bst")
                assert config.name == f"{expected}.yaml", run.label
        assert sweep_main([sweep, "--profile", profile, "--dry-run", "--root", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert out.count("-m reproductions fit --config") == len(plan.runs)
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_table_sweep_is_the_papers_comparison_at_every_scale():
    s = load_sweep("bst/table")
    for profile in ("smoke", "cpu", "gpu", "gpu-amazon"):
        variants = s.profiles[profile].variants or s.variants
        assert [v.name for v in variants] == MODELS
        assert {v.name: v.paper["paper"].value for v in variants} == PAPER_AUC  # PAPERS.md, BST table
        blocks = {v.name: v.overrides.get("model.net.init_args.num_blocks") for v in variants}
        assert (blocks["BST-b1"], blocks["BST-b2"], blocks["BST-b3"]) == (1, 2, 3)
    assert s.references[0].unverified and s.references[0].scale == "fraction"
    cpu, gpu = s.profile("cpu"), s.profile("gpu")
    assert (cpu.seeds, cpu.jobs, cpu.threads) == ([0, 1, 2], 2, 1)
    assert gpu.overrides["data.source"] == "taobao_user_behavior" and gpu.overrides["trainer.precision"] == "bf16-mixed"
    assert s.profile("gpu-amazon").overrides["data.source"] == "amazon_electronics"
    # the CPU-sized nets: the same embedding widths and MLP for every model, BST tokens of width 32
    assert cpu.overrides["model.net.init_args.mlp_dims"] == [256, 128]
    assert all(v.overrides.get("model.net.init_args.position_dim") == 8 for v in cpu.variants if v.name.startswith("BST"))
    position = load_sweep("bst/position")
    assert [v.name for v in position.variants] == ["position=time_delta", "position=index", "position=none"]
    # the position sweep's time_delta run is the table's BST-b1 run: one recipe
    table_b1 = make_plan("bst/table", "cpu").runs[3 * 3]
    pos_td = make_plan("bst/position", "cpu").runs[0]
    assert table_b1.variant.name == "BST-b1" and pos_td.variant.name == "position=time_delta"
    assert table_b1.args[2] == pos_td.args[2]
    assert overrides_of(table_b1) == {**overrides_of(pos_td), "--model.net.init_args.num_blocks": "1"}


def test_movielens_at_the_cpu_profile_is_an_extra_override(tmp_path, capsys):
    argv = ["bst/table", "--profile", "cpu", "--experiment", "bst/table-cpu-movielens_1m", "--root", str(tmp_path),
            "--dry-run", "--", "--config", SOURCE_ML1M, "--data.data_dir", "/data/ml-1m"]  # fmt: skip
    assert sweep_main(argv) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if " fit --config " in line]
    assert len(commands) == 18
    assert all(c.endswith(f"--config {SOURCE_ML1M} --data.data_dir /data/ml-1m") for c in commands)
    assert all("--run.experiment bst/table-cpu-movielens_1m" in c for c in commands)


def test_a_variant_with_its_own_base_config(tmp_path):
    """Sweep files: a variant's ``base`` wins over the profile's and the sweep's; a wrong path fails early."""
    spec = {
        "axis": "model", "base": "reproductions/bst/configs/bst.yaml",
        "variants": [{"name": "W", "base": "reproductions/bst/configs/wdl.yaml"}, {"name": "B"}],
        "profiles": {"smoke": {}, "other": {"base": "reproductions/bst/configs/din.yaml"}},
    }  # fmt: skip
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    configs = {r.variant.name: Path(r.args[2]).name for r in make_plan(path, "smoke").runs}
    assert configs == {"W": "wdl.yaml", "B": "bst.yaml"}
    configs = {r.variant.name: Path(r.args[2]).name for r in make_plan(path, "other").runs}
    assert configs == {"W": "wdl.yaml", "B": "din.yaml"}
    spec["variants"][0]["base"] = "reproductions/bst/configs/nope.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SweepError, match="nope.yaml"):
        make_plan(path, "smoke")
    spec["variants"][0]["base"] = "reproductions/bst/configs/wdl.yaml"
    for bad, message in (({"columns": [{"key": "test/auc"}], "metric": {"key": "test/auc"}}, "repeat a key"),
                         ({"metric": {"key": "test/auc", "digits": 12}}, "digits=12"),
                         ({"columns": [{"label": "no key"}]}, "every column needs a key")):  # fmt: skip
        path.write_text(yaml.safe_dump({**spec, **bad}))
        with pytest.raises(SweepError, match=re.escape(message)):
            load_sweep(path)


# --------------------------------------------------------------------------- the report's CTR columns


def ctr_result(variant: str, seed: int, auc: float, gauc: float, logloss: float, ceiling=(0.80, 0.79, 0.54)) -> dict:
    return {
        "status": "finished", "variant": variant, "seed": seed,
        "test": {"test/auc": auc, "test/gauc": gauc, "test/logloss": logloss},
        "model": {"params": 150_000, "flops_per_sample": 1.5e6},
        "training": {"epochs": 1, "steps": 1250, "global_batch_size": 256, "total_train_flops": 1.4e12,
                     "fit_time_s": 60.0, "samples_per_sec": 5000.0, "devices": 1, "precision": "32-true"},
        "data": {"source": "synthetic", "splits": {"train": {"samples": 320000}, "val": {"samples": 40000},
                 "test": {"samples": 40000}}, "seq_len": 20,
                 "ceiling": {"test_auc": ceiling[0], "test_gauc": ceiling[1], "test_logloss": ceiling[2]}},
    }  # fmt: skip


def test_report_of_hand_made_ctr_results(tmp_path):
    """Known means: RelaImpr against WDL, the distance to the ceiling, the ceiling row, the paper's
    AUC as a fraction, and the ordering check, on the real bst/table sweep file."""
    root, exp = tmp_path / "runs", "bst/table-cpu"
    aucs = {"WDL": [0.70, 0.72, 0.74], "WDL+Seq": [0.73, 0.73, 0.73], "DIN": [0.74, 0.745, 0.75],
            "BST-b1": [0.75, 0.76, 0.77], "BST-b2": [0.755, 0.755, 0.755]}  # BST-b3: never ran  # fmt: skip
    for name, values in aucs.items():
        for seed, auc in enumerate(values):
            atomic_write_json(root / exp / name / f"seed{seed}" / RESULTS_FILE,
                              ctr_result(name, seed, auc, auc - 0.01, 1.0 - auc))  # fmt: skip
    report = write_report(make_plan("bst/table", "cpu", root=root), out=io.StringIO())
    rows = table_rows(report.markdown)
    header = rows["variant"]
    assert header[:7] == ["variant", "ours: test AUC, mean ± std", "n", "test GAUC, mean ± std",
                          "test logloss, mean ± std", "RelaImpr vs WDL (%)", "to ceiling (test AUC)"]  # fmt: skip
    assert header[7:] == ["paper: offline AUC, Taobao", "params", "FLOPs/sample", "training FLOPs", "train samples/s", "time/run"]
    assert rows["WDL"][:8] == ["WDL", "0.7200 ± 0.0200", "3", "0.7100 ± 0.0200", "0.2800 ± 0.0200", "+0.00", "0.0800",
                               "0.7734 (unverified)"]  # fmt: skip
    # RelaImpr = ((0.76 - 0.5) / (0.72 - 0.5) - 1) x 100 = 18.18 %
    assert rows["BST-b1"][:8] == ["BST-b1", "0.7600 ± 0.0100", "3", "0.7500 ± 0.0100", "0.2400 ± 0.0100", "+18.18",
                                  "0.0400", "0.7894 (unverified)"]  # fmt: skip
    assert rows["WDL+Seq"][5] == "+4.55" and rows["DIN"][5] == "+11.36"
    assert rows["BST-b3"][1:3] == ["–", "0"] and rows["BST-b3"][5:7] == ["–", "–"]  # kept, not dropped
    assert rows["ceiling: true click probabilities"][:7] == ["ceiling: true click probabilities", "0.8000", "–",
                                                             "0.7900", "0.5400", "+36.36", "0.0000"]  # fmt: skip
    assert rows["BST-b1"][8:10] == ["150k", "1.5M"]
    md = report.markdown
    assert "fractions, as the paper prints them" in md and "`synthetic` (train 320000, val 40000, test 40000 samples" in md
    assert "our order (mean test AUC): BST-b1 (0.7600) > BST-b2 (0.7550) > DIN (0.7450) > WDL+Seq (0.7300) > WDL (0.7200)" in md
    assert "claimed: BST-b1 > DIN > WDL+Seq > WDL: 6 of 6 pairs in that order here" in md
    assert "BST-b1 > DIN? holds: BST-b1 - DIN = +0.0150 AUC (± 0.0065 s.e.)" in md
    assert "WDL+Seq > WDL? within noise (under 2 s.e.): WDL+Seq - WDL = +0.0100 AUC (± 0.0115 s.e.)" in md
    assert "BST-b2 > BST-b3? no result" in md
    assert "by the paper column: BST-b1 > BST-b2 > DIN > WDL+Seq > BST-b3 > WDL: 10 of 10 pairs in that order here" in md
    assert "ceiling 0.8000 (test AUC of the true probabilities); distance to it: BST-b1 0.0400, BST-b2 0.0450" in md
    assert "`BST-b3` seed 0: not run" in md
    assert report.figures[0].name == "model.png" and report.figures[0].read_bytes()[:8] == PNG


# --------------------------------------------------------------------------- end to end at the smoke profile


@pytest.mark.slow
def test_both_sweeps_complete_at_the_smoke_profile_and_report_the_ctr_columns(tmp_path):
    root = tmp_path / "runs"
    printed = run_smoke_sweeps(root)
    for sweep, baseline in (("bst/table", "WDL"), ("bst/position", "position=none")):
        plan = make_plan(sweep, "smoke", root=root)
        results = {}
        for run in plan.runs:
            res = read_results(run.run_dir)
            assert res is not None, (run.label, run.log_path.read_text()[-2000:])
            assert {"test/auc", "test/gauc", "test/logloss"} <= set(res["test"]) and res["data"]["ceiling"]["test_auc"] > 0.5
            results[run.variant.name] = res
        for name in ("WDL", "DIN", "BST-b2"):
            if name in results:
                cfg = yaml.safe_load((plan.experiment_dir / name / "seed0" / "config.yaml").read_text())
                expected = {"WDL": "WDL", "DIN": "DIN", "BST-b2": "BST"}[name]
                assert cfg["model"]["init_args"]["net"]["class_path"] == f"models.ctr.{expected}"
        md = (plan.experiment_dir / REPORT_FILE).read_text()
        rows = table_rows(md)
        assert rows["variant"][5:7] == [f"RelaImpr vs {baseline} (%)", "to ceiling (test AUC)"]
        assert rows[baseline][5] == "+0.00"  # RelaImpr of the baseline against itself
        base_auc = results[baseline]["test"]["test/auc"]
        ceiling = results[baseline]["data"]["ceiling"]["test_auc"]
        for name, res in results.items():
            auc = res["test"]["test/auc"]
            assert rows[name][1] == f"{auc:.4f}" and rows[name][2] == "1"
            assert rows[name][3] == f"{res['test']['test/gauc']:.4f}" and rows[name][4] == f"{res['test']['test/logloss']:.4f}"
            if base_auc > 0.5:
                assert float(rows[name][5]) == pytest.approx(((auc - 0.5) / (base_auc - 0.5) - 1) * 100, abs=0.006)
            assert float(rows[name][6]) == pytest.approx(ceiling - auc, abs=6e-5)
        assert rows["ceiling: true click probabilities"][1] == f"{ceiling:.4f}"
        if sweep == "bst/table":
            assert rows["DIN"][7] == "0.7866 (unverified)"
        assert "None: every planned run finished." in md
        assert (plan.experiment_dir / f"{plan.sweep.axis}.png").read_bytes()[:8] == PNG
        assert "report.md" in printed[sweep]


# the smoke profile's sizes, on top of a real-data profile: one short epoch of tiny nets
REAL_DATA_SMOKE = [
    "--model.net.init_args.item_dim", "8", "--model.net.init_args.category_dim", "8",
    "--model.net.init_args.mlp_dims", "[32, 16]", "--trainer.max_epochs", "1",
    "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
    "--trainer.log_every_n_steps", "1",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("sweep", ["bst/table", "bst/position", "bst/tune", "bst/probe"])
def test_real_data_profiles_complete_on_a_slice_of_ml_latest_small(sweep, tmp_path):
    """Each cpu-movielens profile, with the smoke sizes, on the first 40 users of the real
    ml-latest-small (copied into a temporary folder): every run finishes on the movielens_csv
    source with the user_fraction split and GAUC is defined where the run is tested. The table
    and position sweeps run whole and write their report; of the tuning grid and the probes, the
    first two planned runs, by their planned commands."""
    from tests.behavior_files import ml_latest_small

    data = ml_latest_small(tmp_path / "ml-latest-small", n_users=40)
    root = tmp_path / "runs"
    extra = ["--data.data_dir", str(data), "--data.cache_dir", str(tmp_path / "cache"), *REAL_DATA_SMOKE]
    plan = make_plan(sweep, "cpu-movielens", root=root, extra=extra)
    whole = sweep in ("bst/table", "bst/position")
    if whole:
        out = io.StringIO()
        rc = sweep_main([sweep, "--profile", "cpu-movielens", "--root", str(root), "--jobs", "1", "--", *extra],
                        runner=inprocess_runner, out=out)
        assert rc == 0, out.getvalue()
        assert (plan.experiment_dir / REPORT_FILE).is_file()
    else:
        for run in plan.runs[:2]:
            cli_main(run.args)
    for run in plan.runs if whole else plan.runs[:2]:
        res = read_results(run.run_dir)
        assert res is not None and res["status"] == "finished", run.label
        assert res["data"]["source"] == "movielens_csv" and res["data"]["split"]["rule"] == "user_fraction"
        assert res["best"]["score"] is not None  # what bst/tune ranks by
        if whole:
            assert 0.0 <= res["test"]["test/gauc"] <= 1.0 and res["test"]["test/gauc_users"] >= 1
