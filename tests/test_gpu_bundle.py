"""The GPU check's wheel bundle (scripts/gpu_wheels.sh) against the GPU machine's image
(scripts/gpu_image_packages.txt): it carries exactly what the check's code path needs beyond the image.

The path is the preflight (scripts/gpu_preflight.py: the modules of ``bench gpu`` and of the fit runs, and
the fit command line parsed to the end), run in a subprocess behind a fence that hides every installed
distribution outside the image and the given carried ones, both from imports and from ``importlib.metadata``
(Lightning checks ``jsonargparse[signatures]`` by metadata): a finder in PathFinder's place on
``sys.meta_path`` answers for them as if they were not installed, and records what outside the image the
path used. The usage errors and the SIGTERM path of scripts/gpu_check.sh are here
too; its GPU_CHECK_SMOKE run is in tests/test_fsdp.py, its rehearsal in the GPU image's versions is
scripts/gpu_rehearsal.sh (too slow for the suite: docs/scaling.md)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "scripts" / "gpu_wheels.sh"
IMAGE = REPO / "scripts" / "gpu_image_packages.txt"
PREFLIGHT = REPO / "scripts" / "gpu_preflight.py"
OWN = "attention-repro"  # this repository, when installed (editable): never hidden


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> dict[str, str | None]:
    out = {}
    for line in IMAGE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            out[norm(name)] = version or None
    return out


def bundle() -> dict[str, str]:
    listed = subprocess.run(["bash", str(WHEELS), "--list"], capture_output=True, text=True, check=True).stdout
    return {norm(n): v for n, v in (line.split("==") for line in listed.split())}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}


# Runs in the subprocess: python -c FENCE IMAGE_FILE CARRIED(comma-separated) REPORT SCRIPT ARGS...
FENCE = r'''
import atexit, importlib.abc, importlib.machinery, json, re, runpy, sys
from importlib import metadata as md

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image_file, carried, report, script, *args = sys.argv[1:]
image = {norm(l.split("==")[0].strip()) for l in open(image_file) if l.strip() and not l.startswith("#")}
own = {"%(own)s"}
allowed = image | {norm(c) for c in carried.split(",") if c} | own
installed = {norm(d.metadata["Name"]): d for d in md.distributions()}
# this environment's versions of the image's packages may need other packages than the image's versions:
# those dependencies (transitively) count as the image's
from packaging.requirements import Requirement

todo = [n for n in image if n in installed]
while todo:
    for line in installed[todo.pop()].requires or []:
        req = Requirement(line)
        dep = norm(req.name)
        if dep in installed and dep not in image and (req.marker is None or req.marker.evaluate({"extra": ""})):
            image.add(dep)
            todo.append(dep)
hidden = set(installed) - allowed - image
owners = {mod: {norm(d) for d in dists} - own for mod, dists in md.packages_distributions().items()}
used, refused = set(), set()
PathFinder = importlib.machinery.PathFinder


class Fence(importlib.abc.MetaPathFinder):
    """In place of PathFinder: hidden distributions' modules and metadata are not found (find_spec and
    distribution() answer as if they were not installed); what the path uses outside the image is recorded."""

    def find_spec(self, name, path=None, target=None):
        dists = owners.get(name.partition(".")[0], set())
        if dists and dists <= hidden:
            refused.update(dists)
            return None
        used.update(dists - image)
        return PathFinder.find_spec(name, path, target)

    def find_distributions(self, context=md.DistributionFinder.Context()):
        for dist in PathFinder.find_distributions(context):
            n = norm(dist.metadata["Name"])
            asked = context.name is not None  # distribution(name), not a listing of all
            if n in hidden:
                if asked:
                    refused.add(n)
                continue
            if asked and n not in image and n not in own:
                used.add(n)
            yield dist


sys.meta_path[sys.meta_path.index(PathFinder)] = Fence()
atexit.register(lambda: open(report, "w").write(json.dumps({"used": sorted(used), "refused": sorted(refused)})))
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
''' % {"own": OWN}


def fenced_preflight(tmp_path, carried: list[str]) -> tuple[subprocess.CompletedProcess, dict, dict]:
    report, out = tmp_path / "fence.json", tmp_path / "preflight.json"
    proc = subprocess.run([sys.executable, "-c", FENCE, str(IMAGE), ",".join(carried), str(report), str(PREFLIGHT),
                           str(out)], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=600)
    return proc, json.loads(report.read_text()), json.loads(out.read_text())


@pytest.mark.subprocess
def test_the_bundle_is_pinned_and_holds_nothing_the_image_has():
    carried, image = bundle(), image_packages()
    assert carried and not set(carried) & set(image)
    assert {"torch", "lightning", "timm", "torchmetrics", "pyarrow", "xxhash", "fsspec"} <= set(image)
    assert {"jsonargparse", "datasets", "wandb"}.isdisjoint(image)
    # the same list as the preflight reads, and requirements.txt's pins where it names the package
    sys.path.insert(0, str(PREFLIGHT.parent))
    try:
        from gpu_preflight import bundle_specs
    finally:
        sys.path.remove(str(PREFLIGHT.parent))
    assert {norm(n): v for n, v in bundle_specs().items()} == carried
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        spec = line.split("#")[0].strip()
        if "==" in spec:
            name, version = spec.split("==")
            pins[norm(name.split("[")[0])] = version.strip()
    for name, version in carried.items():
        assert pins.get(name, version) == version, name
        assert metadata.version(name) == version, f"{name}: the tests run another version than the bundle's"


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_check_needs_exactly_the_bundle_beyond_the_image(tmp_path):
    carried = bundle()
    proc, fence, pre = fenced_preflight(tmp_path, list(carried))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert pre["ok"] and all(c["ok"] for c in pre["checks"].values())
    # every carried package is used by the path, and nothing else outside the image is
    assert set(fence["used"]) == set(carried), fence
    assert not pre["unmet"]  # here: the test environment meets the carried packages' requirements


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.parametrize("left_out", sorted(bundle()))
def test_each_carried_package_is_needed(tmp_path, left_out):
    """Without any one of them the fit path fails (a module or, for jsonargparse[signatures]'s extras,
    Lightning's metadata check), so the bundle carries nothing the path could do without."""
    proc, fence, pre = fenced_preflight(tmp_path, [n for n in bundle() if n != left_out])
    assert proc.returncode == 1 and not pre["checks"]["fit"]["ok"] and pre["checks"]["bench"]["ok"]
    assert left_out in fence["refused"]


@pytest.mark.subprocess
@pytest.mark.slow
def test_without_the_bundle_the_fit_path_fails_and_the_bench_does_not(tmp_path):
    carried = bundle()
    proc, fence, pre = fenced_preflight(tmp_path, [])
    assert proc.returncode == 1
    checks = pre["checks"]
    assert checks["torch"]["ok"] and checks["bench"]["ok"]  # bench gpu needs nothing carried
    assert not checks["fit"]["ok"]
    assert set(fence["refused"]) & set(carried) and not set(fence["used"])
    failed = [line for line in proc.stderr.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and failed[0].startswith("preflight: fit FAILED: ")
    missing = checks["fit"]["missing"]
    assert missing and norm(missing.split(".")[0]) in carried, checks["fit"]
    assert "scripts/gpu_wheels.sh" in failed[0]
    assert all(v["version"] is None for v in pre["bundle"].values())


# --------------------------------------------------------------------------- scripts/gpu_check.sh
@pytest.mark.subprocess
def test_usage_errors_end_in_one_line_before_any_work(tmp_path):
    empty = tmp_path / "wheels"
    empty.mkdir()
    cases = [({"GPU_CHECK_WHEELS": str(empty)}, f"error: GPU_CHECK_WHEELS={empty} holds no .whl file"),
             ({"GPU_CHECK_BUDGET": "5m"}, "error: GPU_CHECK_BUDGET=5m is not a number of seconds >= 60")]
    for extra, start in cases:
        proc = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path / "out")], cwd=REPO, capture_output=True,
                              text=True, env={**env(), "PYTHON": sys.executable, "GPU_CHECK_SMOKE": "1", **extra},
                              timeout=60)
        assert proc.returncode == 2 and proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(start), proc.stderr
        assert not (tmp_path / "out").exists()
    proc = subprocess.run(["bash", str(WHEELS)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.startswith("error: usage: scripts/gpu_wheels.sh DIR")


@pytest.mark.subprocess
@pytest.mark.slow
def test_sigterm_stops_the_running_stage_and_still_writes_the_json(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", "scripts/gpu_check.sh", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**env(), "PYTHON": sys.executable, "GPU_CHECK_SMOKE": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (out / "preflight.log").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, stderr
    report = json.loads((out / "gpu_check.json").read_text())
    stages = report["stages"]
    assert list(stages) == ["preflight", "bench", "fsdp", "compile"]
    assert stages["preflight"]["status"] == "failed" and stages["preflight"]["rc"] != 0
    for name in ("bench", "fsdp", "compile"):
        assert stages[name]["status"] == "skipped" and stages[name]["why"] == "stopped by SIGTERM"
    assert report["ok"] is False and report["budget_s"] == 450 * 5
    assert stdout.splitlines()[-1] == f"gpu_check: wrote {out / 'gpu_check.json'}"
