"""Test-wide settings: offline, CPU, quiet; set before any library reads them at import."""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import pytest  # noqa: E402
import torch  # noqa: E402

# one thread per test process when pytest-xdist runs two of them (pyproject.toml), else two
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // _WORKERS))


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path_factory, monkeypatch):
    """Keep every cache a test writes out of the user's home."""
    cache = tmp_path_factory.getbasetemp() / "hf-cache"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setenv("BEHAVIOR_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "behavior-cache"))


@pytest.fixture(autouse=True)
def _no_wandb_run_left_open():
    """A W&B run left open by one test would be handed back to the next ``wandb.init``."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()


def pytest_collection_modifyitems(config, items):
    """The slow-marked tests (subprocess fits, DDP, resumes: 20-70 s each) first, in their
    collected order, then the rest: the two test processes start on the long ones and the
    short ones fill the end, so neither waits long for the other's last test."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: order kept within each part
