"""The GPU campaign (scripts/gpu_campaign.sh, scripts/gpu_campaign.py): usage errors in one line before any
work; the budget stops the run in flight with SIGTERM (then SIGKILL after the grace), a stopped run is never
recorded as finished, an interrupted run resumes only from its own checkpoint; and the CPU rehearsal
(GPU_CAMPAIGN_SMOKE=1) stops at its budget and a second campaign into the same folder skips what finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gpu_campaign  # noqa: E402

from reproductions.sweeping.plan import Run  # noqa: E402
from reproductions.sweeping.spec import Variant  # noqa: E402


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline", **extra}  # fmt: skip


def campaign(out: Path, timeout: int, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/gpu_campaign.sh", str(out)], cwd=REPO, capture_output=True, text=True,
                          env=env(**extra), timeout=timeout)  # fmt: skip


@pytest.mark.subprocess
def test_usage_errors_end_in_one_line_before_any_work(tmp_path):
    empty = tmp_path / "wheels"
    empty.mkdir()
    smoke = {"GPU_CAMPAIGN_SMOKE": "1"}
    cases = [
        ({**smoke, "GPU_CAMPAIGN_WHEELS": str(empty)}, f"error: GPU_CAMPAIGN_WHEELS={empty} holds no .whl file"),
        ({**smoke, "GPU_CAMPAIGN_BUDGET": "9m"}, "error: GPU_CAMPAIGN_BUDGET=9m is not a number of seconds >= 30"),
        ({**smoke, "GPU_CAMPAIGN_SWEEPS": "vit/patch_size vit/attention"},
         "error: GPU_CAMPAIGN_SWEEPS names vit/attention, which is not a sweep with an h200 profile"),
        ({}, "error: GPU_CAMPAIGN_DATA is not set; give the CIFAR-10 training JPEG folder"),
        ({"GPU_CAMPAIGN_DATA": str(tmp_path / "nope.zip")}, f"error: GPU_CAMPAIGN_DATA={tmp_path / 'nope.zip'} is neither"),
    ]  # fmt: skip
    for extra, start in cases:
        proc = campaign(tmp_path / "out", 60, **extra)
        assert proc.returncode == 2 and proc.stdout == "", (extra, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(start), proc.stderr
        assert not (tmp_path / "out").exists()


def fake_run(tmp_path: Path, code: str) -> Run:
    run_dir = tmp_path / "runs" / "v" / "seed0"
    return Run(Variant("v", {}), 0, run_dir, [], [sys.executable, "-c", code])


#: a stand-in for a fit: says it started, then on SIGTERM writes results.json "interrupted" and exits 143
#: (or, ignoring SIGTERM, has to be killed)
FIT = """
import json, signal, sys, time
from pathlib import Path
out = Path(sys.argv[0] if False else "{run_dir}")
def stop(*_):
    (out / "results.json").write_text(json.dumps({{"status": "interrupted", "checkpoint": None}}))
    sys.exit(143)
signal.signal(signal.SIGTERM, {handler})
print("started", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_the_budget_stops_the_run_in_flight(tmp_path, ignores_sigterm):
    run = fake_run(tmp_path, "")
    run.run_dir.mkdir(parents=True)
    handler = "signal.SIG_IGN" if ignores_sigterm else "stop"
    run.command[-1] = FIT.format(run_dir=run.run_dir, handler=handler)
    c = gpu_campaign.Campaign(budget=2.0, grace=2.0, min_start=1.0)
    assert c.can_start()
    t0 = time.monotonic()
    rc = c.run(run, dict(os.environ))
    took = time.monotonic() - t0
    assert c.stopped == "budget" and c.cut == [run.label]
    if ignores_sigterm:  # killed after the grace
        assert rc == -9 and 3.5 < took < 10 and not (run.run_dir / "results.json").exists()
    else:
        assert rc == 143 and took < 6
        assert json.loads((run.run_dir / "results.json").read_text())["status"] == "interrupted"
    assert "started" in run.log_path.read_text()
    assert not c.can_start()  # nothing more starts once stopped


def test_an_interrupted_run_resumes_only_from_its_own_checkpoint(tmp_path):
    run = fake_run(tmp_path, "")
    ckpt = run.run_dir / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"x")
    elsewhere = tmp_path / "other.ckpt"
    elsewhere.write_bytes(b"x")
    results = run.run_dir / "results.json"
    for status, path, expected in [("interrupted", ckpt, ckpt), ("interrupted", elsewhere, None),
                                   ("failed", ckpt, None), ("interrupted", None, None),
                                   ("interrupted", run.run_dir / "checkpoints" / "gone.ckpt", None)]:  # fmt: skip
        results.write_text(json.dumps({"status": status, "checkpoint": None if path is None else str(path)}))
        assert gpu_campaign.resume_checkpoint(run) == expected, (status, path)
    results.write_text("{not json")
    assert gpu_campaign.resume_checkpoint(run) is None


def test_an_interrupted_run_is_resumed_with_its_checkpoint_and_its_log_kept(tmp_path):
    run = fake_run(tmp_path, "import sys; print('argv', sys.argv[1:])")
    run.command.extend(["--seed_everything", "0"])
    ckpt = run.run_dir / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"x")
    run.log_path.write_text("the first segment\n")
    (run.run_dir / "results.json").write_text(json.dumps({"status": "interrupted", "checkpoint": str(ckpt)}))
    c = gpu_campaign.Campaign(budget=60.0, grace=5.0, min_start=1.0)
    assert c.run(run, dict(os.environ)) == 0 and c.stopped is None
    log = run.log_path.read_text()
    assert log.startswith("the first segment\n") and f"'--ckpt_path', '{ckpt}'" in log
    (run.run_dir / "results.json").write_text(json.dumps({"status": "failed"}))  # a failed run starts afresh
    assert c.run(run, dict(os.environ)) == 0
    assert "--ckpt_path" not in run.log_path.read_text() and "first segment" not in run.log_path.read_text()


@pytest.mark.subprocess
@pytest.mark.slow
def test_smoke_campaign_stops_at_the_budget_and_continues(tmp_path):
    """Two campaigns into one folder on the CPU (tiny runs, 31 of them in all, 10-60 s each here): the first
    finishes a run or more in priority order and is stopped by its budget with the rest not finished; the
    second (of the first sweep alone, to be short) skips what finished."""
    out, cache = tmp_path / "out", str(tmp_path / "hf")
    common = {"GPU_CAMPAIGN_SMOKE": "1", "HF_DATASETS_CACHE": cache}
    first = campaign(out, 600, GPU_CAMPAIGN_BUDGET="75", **common)
    assert first.returncode == 3, first.stdout[-2000:] + first.stderr[-3000:]
    summary = json.loads((out / "campaign.json").read_text())
    assert summary["stopped"] == "budget" and not summary["complete"] and summary["budget_s"] == 75
    assert list(summary["sweeps"]) == ["vit/patch_size", "vit/pooling", "vit/position", "vit/hybrid", "vit/data_size",
                                      "vit/attention_data", "vit/time_to_accuracy_cifar10"]
    runs = {f"{sweep} {label}": r for sweep, s in summary["sweeps"].items() for label, r in s["runs"].items()}
    assert len(runs) == 31 and list(runs)[:3] == [f"vit/patch_size patch_size={p} seed0" for p in (8, 4, 2)]
    finished = [label for label, r in runs.items() if r["status"] == "finished"]
    assert finished and finished == list(runs)[: len(finished)] and len(finished) < 31  # in priority order
    for label, r in runs.items():
        run_dir = Path(r["run_dir"])
        assert run_dir.is_relative_to(out / "runs" / "vit") and run_dir.name == label.split()[-1]  # "seed0"
        results = run_dir / "results.json"
        on_disk = json.loads(results.read_text())["status"] if results.exists() else "not started"
        assert on_disk == r["status"]  # a stopped run: interrupted or not started, never finished
        if label in finished:
            assert not list(run_dir.rglob("*.ckpt"))  # the finished runs' checkpoints are removed
    assert "gpu_campaign: " in first.stdout and "run the campaign again to continue" in first.stdout
    for line in (out / "runs.log").read_text().splitlines():  # a run stopped while running: not finished,
        if line.strip().startswith("stopping "):  # unless its results were whole before the signal came
            cut = " ".join(line.split()[1:3])  # "patch_size=2 seed0"
            (r,) = [r for label, r in runs.items() if label.endswith(f" {cut}")]
            if r["status"] == "finished":  # every planned step trained, tested, results written: then stopped
                results = json.loads((Path(r["run_dir"]) / "results.json").read_text())
                assert results["training"]["steps"] == 2 and "test/acc" in results["test"], (line, results)
    stages = dict(line.split("\t")[:2] for line in (out / "stages.tsv").read_text().splitlines())
    assert stages["preflight"] == "0" and stages["data"] == "0" and stages["runs"] == "3"

    stamps = {label: (Path(runs[label]["run_dir"]) / "results.json").stat().st_mtime_ns for label in finished}
    first_sweep = [label for label in finished if label.startswith("vit/patch_size ")]
    second = campaign(out, 600, GPU_CAMPAIGN_BUDGET="30", GPU_CAMPAIGN_SWEEPS="vit/patch_size", **common)
    assert second.returncode in (0, 3), second.stderr[-3000:]
    log = (out / "runs.log").read_text()
    assert f"vit/patch_size --profile h200: 3 runs, {len(first_sweep)} finished earlier" in log
    for label in finished:  # skipped: not run again
        assert (Path(runs[label]["run_dir"]) / "results.json").stat().st_mtime_ns == stamps[label]
        assert f"] {label.split(' ', 1)[1]} |" not in log


def test_a_run_the_registry_holds_at_h200_is_not_trained_again(tmp_path, monkeypatch, capsys):
    """A second GPU session starts on a bare machine: the runs an earlier campaign brought back and recorded are
    skipped (same variant, seed and config), the others stay to run, and campaign.json says which is which."""
    import reproductions.sweeping.records as records
    from reproductions.sweeping.records import definition_config, make_record, record_path
    from reproductions.run.results import atomic_write_json

    registry = tmp_path / "results"
    monkeypatch.setattr(records, "REGISTRY_DIR", registry)
    data = tmp_path / "cifar10"
    data.mkdir()
    plan = gpu_campaign.make_plan("vit/patch_size", "h200", root=tmp_path / "out" / "runs")
    first = plan.runs[0]
    # the sweep file's config, without the campaign's --data.data_dir: where the data lay is no part of what ran
    config = definition_config("vit/patch_size", "h200", first.variant.name, first.seed)
    results = {"status": "finished", "experiment": plan.experiment, "variant": first.variant.name, "seed": first.seed,
               "test": {"test/acc": 0.8}, "training": {"fit_time_s": 60.0}, "hardware": {"device": "cuda", "gpu": "H100"}, "finished_at": "2026-12-07"}
    rec = make_record(tmp_path, results, config, "vit/patch_size", "h200", config)
    atomic_write_json(record_path(registry, rec), rec)
    # min-start above the budget: nothing starts, so the test trains nothing
    rc = gpu_campaign.main(["--out", str(tmp_path / "out"), "--budget", "30", "--min-start", "60",
                            "--data-dir", str(data), "vit/patch_size"])  # fmt: skip
    assert rc == 3
    out = capsys.readouterr().out
    assert f"{len(plan.runs)} runs, 0 finished earlier, 1 recorded in results/ (skipped), {len(plan.runs) - 1} to run" in out
    assert "runs finished (1 of them recorded earlier)" in out
    runs = json.loads((tmp_path / "out" / "campaign.json").read_text())["sweeps"]["vit/patch_size"]["runs"]
    assert runs[first.label]["status"] == "recorded" and runs[first.label]["record"].endswith(record_path(registry, rec).name)
    assert all(r["status"] == "not started" for label, r in runs.items() if label != first.label)
