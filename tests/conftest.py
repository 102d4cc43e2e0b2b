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


# --------------------------------------------------------------------------- what a test needs
#: the markers that say what a test needs beyond this process (pyproject.toml registers them); the
#: everyday selection leaves them out: pytest -m "not slow and not subprocess and not distributed and not notebook"
NEEDS = ("subprocess", "distributed", "notebook")
_current: dict = {"item": None}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _current["item"] = item  # module fixtures are set up here too: what they start is this test's


def _needs(argv: list[str], env: dict | None) -> set[str]:
    """What starting ``argv`` makes a test need: ``subprocess`` for the repository's command line or
    one of its scripts, ``distributed`` for a run over several processes, ``notebook`` for a
    notebook's kernel."""
    needs = {"notebook"} if "ipykernel_launcher" in argv else set()
    head = argv[:4]
    if ("-m" in head and "reproductions" in head) or any(a.endswith(".sh") for a in head):
        needs.add("subprocess")
    for flag in ("--trainer.devices", "--trainer.num_nodes"):
        if flag in argv[:-1] and argv[argv.index(flag) + 1] not in ("1", "auto"):
            needs.add("distributed")
    if env is not None and "LOCAL_RANK" in env and env.get("WORLD_SIZE", "1") != "1":
        needs.add("distributed")
    return needs


def _check_marks(needs: set[str], what: str) -> None:
    item = _current["item"]
    if item is None or not needs:
        return
    missing = sorted(n for n in needs if item.get_closest_marker(n) is None)
    if not missing:
        return
    report = os.environ.get("REPRO_TEST_MARKS_REPORT")
    if report:  # collect instead of failing (for marking a suite)
        with open(report, "a") as f:
            f.write(f"{item.nodeid}\t{','.join(missing)}\n")
        return
    pytest.fail(f"{item.nodeid} starts {what}: mark it "
                + " and ".join(f"@pytest.mark.{m}" for m in missing) + " (tests/conftest.py NEEDS)", pytrace=False)


def pytest_configure(config):
    import shlex
    import subprocess

    import torch.multiprocessing as mp

    spawn_module = sys.modules["torch.multiprocessing.spawn"]  # mp.spawn calls its start_processes
    real_init, real_start = subprocess.Popen.__init__, spawn_module.start_processes

    def popen_init(self, args, *rest, **kwargs):
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else shlex.split(str(args))
        _check_marks(_needs(argv, kwargs.get("env")), f"`{shlex.join(argv[:4])} ...`")
        real_init(self, args, *rest, **kwargs)

    def start_processes(fn, args=(), nprocs=1, *rest, **kwargs):
        _check_marks({"distributed"} if nprocs > 1 else set(), f"{nprocs} processes ({getattr(fn, '__name__', fn)})")
        return real_start(fn, args, nprocs, *rest, **kwargs)

    subprocess.Popen.__init__ = popen_init
    mp.start_processes = spawn_module.start_processes = start_processes
