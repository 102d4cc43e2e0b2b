"""Shared by the sweep tests: small sweep files, fake results and runners, config lookups."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from reproductions.commands.sweep import main as sweep_main
from reproductions.run.results import RESULTS_FILE, atomic_write_json
from reproductions.sweeping.spec import sweep_id
from tests.helpers import inprocess_runner

REPO = Path(__file__).resolve().parents[1]
DIGITS = REPO / "reproductions/vit/configs/digits.yaml"
SWEEP_FILES = sorted((REPO / "reproductions").glob("*/sweeps/*.yaml"))
SWEEPS = [sweep_id(p) for p in SWEEP_FILES]
SMOKE = {
    "model.net.init_args.embed_dim": 16, "model.net.init_args.depth": 1, "model.net.init_args.num_heads": 2,
    "trainer.max_epochs": 1, "trainer.limit_train_batches": 2, "trainer.limit_val_batches": 2,
    "trainer.limit_test_batches": 2, "trainer.enable_progress_bar": False, "trainer.enable_model_summary": False,
}  # fmt: skip


def config_value(cfg: dict, key: str):
    """The value of an override key (``model.net.init_args.pool``) in a resolved config dict,
    where LightningCLI nests subclass arguments under ``init_args``."""
    parts = key.split(".")
    if parts[0] in ("model", "data") and parts[1] not in ("class_path", "init_args"):
        parts.insert(1, "init_args")
    for part in parts:
        cfg = cfg[part]
    return cfg


def sets(resolved, given) -> bool:
    """The resolved config value holds the override: equal scalars (or the scalar's word, where the
    type is a union with str); for mappings every given key
    (a callback's resolved init_args also carry its defaults); lists item by item."""
    if isinstance(given, dict):
        return isinstance(resolved, dict) and all(k in resolved and sets(resolved[k], v) for k, v in given.items())
    if isinstance(given, list):
        return isinstance(resolved, list) and len(resolved) == len(given) and all(map(sets, resolved, given))
    # a union type that takes strings first keeps the word (trainer.devices: "2"; Lightning reads it as 2)
    return resolved == given or (isinstance(resolved, str) and resolved == str(given))


def write_sweep(path: Path, **spec) -> Path:
    spec.setdefault("axis", "patch_size")
    spec.setdefault("base", str(DIGITS))
    spec.setdefault("profiles", {"smoke": {"seeds": 1, "overrides": SMOKE}})
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def fake_result(run, acc: float = 0.9) -> dict:
    return {
        "status": "finished", "variant": run.variant.name, "seed": run.seed, "test": {"test/acc": acc},
        "model": {"params": 1000, "flops_per_sample": 1e6},
        "training": {"total_train_flops": 3e9, "fit_time_s": 1.0, "samples_per_sec": 100.0},
    }  # fmt: skip


def fake_runner(fail=(), calls=None):
    """A runner that 'trains' instantly: writes a log and, unless the variant is in ``fail``, results."""

    def runner(run, env):
        if calls is not None:
            calls.append(run.label)
        run.run_dir.mkdir(parents=True, exist_ok=True)
        if run.variant.name in fail:
            run.log_path.write_text("Traceback ...\nValueError: patch_size=3 does not divide img_size=8\n")
            return 1
        run.log_path.write_text("ok\n")
        atomic_write_json(run.run_dir / RESULTS_FILE, fake_result(run))
        return 0

    return runner


def run_smoke_sweeps(root: Path, sweeps=("bst/table", "bst/position")) -> dict[str, str]:
    """Sweeps (by default both BST sweeps) at the smoke profile, in this process; returns what each printed."""
    printed = {}
    for sweep in sweeps:
        out = io.StringIO()
        rc = sweep_main([sweep, "--profile", "smoke", "--root", str(root)], runner=inprocess_runner, out=out)
        assert rc == 0, out.getvalue()
        printed[sweep] = out.getvalue()
    return printed
