"""Shared by the report tests: a small sweep file and hand-made results.json files."""

from __future__ import annotations

from pathlib import Path

from reproductions.run.results import RESULTS_FILE, atomic_write_json
from tests.sweep_helpers import REPO, write_sweep  # noqa: F401 - REPO: the report tests import it from here

PNG = b"\x89PNG\r\n\x1a\n"


def write_report_sweep(path: Path, **spec) -> Path:
    """A sweep file for the report tests (``sweep_helpers.write_sweep`` with a position axis, a
    title and a 3-seed smoke profile unless given)."""
    spec.setdefault("axis", "position")
    spec.setdefault("title", "Test sweep")
    spec.setdefault("profiles", {"smoke": {"seeds": 3}})
    return write_sweep(path, **spec)


def result(variant: str, seed: int, acc: float, *, experiment=None, params=136138, flops=4.76e6, train_flops=7.3e11,
           fit_time=30.0, speed=150.0) -> dict:  # fmt: skip
    """A finished run's results; ``experiment`` None: not recorded (as in results.json files of old)."""
    return {
        "status": "finished", "experiment": experiment, "variant": variant, "seed": seed,
        "test": {"test/acc": acc, "test/loss": 0.5}, "test_ckpt": "final",
        "model": {"params": params, "flops_per_sample": flops},
        "training": {"epochs": 40, "steps": 800, "global_batch_size": 64, "total_train_flops": train_flops,
                     "devices": 1, "precision": "32-true", "fit_time_s": fit_time, "samples_per_sec": speed},
        "data": {"source": "digits", "train_size": 1294, "val_size": 144, "test_size": 359, "input_shape": [1, 8, 8]},
        "git": {"commit": "abcdef1234567890", "dirty": False}, "versions": {"torch": "2.x"}, "host": "box",
    }  # fmt: skip


def bst_result(seed: int = 0) -> dict:
    """A finished results.json of another paper's sweep (BST, CTR metrics, its own FLOPs)."""
    return {
        "status": "finished", "experiment": "bst/position-smoke", "variant": "position=index", "seed": seed,
        "test": {"test/auc": 0.5403, "test/gauc": 0.5131, "test/logloss": 0.6975}, "test_ckpt": "final",
        "model": {"module": "CTRModule", "net": "BST", "params": 64793, "flops_per_sample": 579232},
        "training": {"epochs": 1, "steps": 2, "global_batch_size": 256, "total_train_flops": 8.9e8,
                     "devices": 1, "precision": "32-true", "fit_time_s": 0.4, "samples_per_sec": 9000.0},
    }  # fmt: skip


def put(root: Path, experiment: str, variant: str, seed: int, **kw) -> None:
    atomic_write_json(root / experiment / variant / f"seed{seed}" / RESULTS_FILE,
                      result(variant, seed, experiment=experiment, **kw))


def position_sweep(tmp_path: Path) -> Path:
    return write_report_sweep(
        tmp_path / "pos.yaml",
        aliases={"pos_embed": "model.net.init_args.pos_embed"},
        variants=[
            {"name": "none", "overrides": {"pos_embed": "none"}, "paper": {"t8": 0.61382, "readme": 79.63}},
            {"name": "learned", "overrides": {"pos_embed": "learned_1d"},
             "paper": {"t8": 0.64206, "readme": {"value": 86.52, "unverified": True}}},
            {"name": "relative", "overrides": {"pos_embed": "relative"}, "paper": {"t8": 0.64032}},
            {"name": "sincos", "overrides": {"pos_embed": "sincos_2d"}},
        ],  # fmt: skip
        references={
            "t8": {"label": "Table 8 (%)", "scale": "fraction", "note": "ImageNet 5-shot; not directly comparable"},
            "readme": {"label": "README CIFAR-10 (%)", "scale": "percent"},
        },
        claims=["A clear gap between none and any embedding."],
        report={"plot": "bars", "check": "baseline", "baseline": "none"},
    )

