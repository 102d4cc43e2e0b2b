"""The runs of the GPU campaign (scripts/gpu_campaign.sh runs this after the install, the preflight and the data):
the ``h200`` profiles of the given sweeps, in the order given, until a budget of seconds is spent.

    python scripts/gpu_campaign.py --out OUT_DIR --budget 540 --data-dir DIR [--smoke] vit/patch_size vit/pooling ...

Each sweep is planned as ``repro sweep SWEEP --profile h200 --root OUT_DIR/runs -- --data.data_dir DIR`` plans it
(``reproductions.sweeping.plan``) and its runs go through the sweep's own runner loop
(``reproductions.sweeping.launch.execute``), one at a time: a run whose results.json says finished is skipped, so
a later campaign continues where this one stopped. A run the results registry (``results/``) already holds at
``h200`` with the config it would run now (a record brought back from an earlier campaign on another machine,
``repro sweep --skip-recorded``'s rule) is skipped too: it is not trained again. A run that an earlier campaign stopped (results.json
``interrupted``, its checkpoint in its directory) is resumed from that checkpoint. No run starts with less than
``--min-start`` seconds left. At the budget (or on SIGTERM/SIGINT) the running run gets SIGTERM: it saves a
checkpoint at the current step and writes results.json with status ``interrupted``, never ``finished``; after
``--grace`` seconds it is killed. (A run whose training had ended when the signal came completes its test:
that run is finished, its training whole.) The checkpoints of finished runs are removed (their sizes recorded) unless
``--keep-checkpoints``.

OUT_DIR/campaign.json (written atomically at the end, also after a signal): the budget, the time spent, why it
stopped, and per sweep its runs: finished (with the run directory: ``repro registry add PATH`` records it),
recorded (with its record), interrupted or not started. Exit status: 0 every run of every sweep finished, 3 stopped at the budget or by a
signal with runs left (run the campaign again to continue), 1 a run failed (it is retried next time), 2 a
usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reproductions.sweeping.launch import execute  # noqa: E402
from reproductions.sweeping.plan import Run, make_plan  # noqa: E402
from reproductions.sweeping.records import recorded_twins  # noqa: E402
from reproductions.sweeping.spec import SweepError  # noqa: E402
from utils.atomic import atomic_write_text  # noqa: E402

PROFILE = "h200"
RESULTS = "results.json"
#: the smoke run's sizes (GPU_CAMPAIGN_SMOKE=1): every run of every profile, on the CPU, two steps
SMOKE_ARGS = [
    "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.max_epochs", "1",
    "--trainer.max_steps", "2", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
    "--trainer.limit_test_batches", "2", "--trainer.val_check_interval", "1", "--trainer.check_val_every_n_epoch", "1",
    "--data.batch_size", "16", "--data.train_samples", "100",
]  # fmt: skip


def record(run_dir: Path) -> dict:
    """The run's results.json, whatever its status ({} if there is none or it does not parse)."""
    try:
        return json.loads((run_dir / RESULTS).read_text())
    except (OSError, ValueError):
        return {}


def resume_checkpoint(run: Run) -> Path | None:
    """The checkpoint an interrupted run saved in its own directory, if it is still there."""
    rec = record(run.run_dir)
    ckpt = rec.get("checkpoint") if rec.get("status") == "interrupted" else None
    if not ckpt:
        return None
    path = Path(ckpt) if Path(ckpt).is_absolute() else REPO / ckpt
    try:
        path.resolve().relative_to(run.run_dir.resolve())
    except ValueError:
        return None
    return path if path.is_file() else None


class Campaign:
    """The budget and the one run in flight: stops it at the deadline or on a signal."""

    def __init__(self, budget: float, grace: float, min_start: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.grace, self.min_start = grace, min_start
        self.stopped: str | None = None  # "budget" or "SIGTERM"/"SIGINT"
        self.cut: list[str] = []  # runs stopped while running

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def signal(self, signum: int, _frame) -> None:
        self.stopped = self.stopped or signal.Signals(signum).name

    def can_start(self) -> bool:
        if self.stopped is None and self.left() < self.min_start:
            self.stopped = "budget"
        return self.stopped is None

    def run(self, run: Run, env: dict[str, str]) -> int:
        """The runner ``execute`` calls: the run's command (resumed from its checkpoint if it has one), stopped
        with SIGTERM at the deadline, killed ``grace`` seconds later."""
        ckpt = resume_checkpoint(run)
        command = [*run.command, *(["--ckpt_path", str(ckpt)] if ckpt else [])]
        run.run_dir.mkdir(parents=True, exist_ok=True)
        with open(run.log_path, "a" if ckpt else "w") as log:
            log.write(f"$ {shlex.join(command)}\n")
            log.flush()
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                    start_new_session=True)  # fmt: skip
            termed_at = None
            while True:
                try:
                    return proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
                if self.stopped is None and self.left() <= 0:
                    self.stopped = "budget"
                if self.stopped is not None and termed_at is None:
                    print(f"    stopping {run.label} ({self.stopped}): SIGTERM, it saves a checkpoint", flush=True)
                    self.cut.append(run.label)
                    os.killpg(proc.pid, signal.SIGTERM)
                    termed_at = time.monotonic()
                elif termed_at is not None and time.monotonic() - termed_at > self.grace:
                    os.killpg(proc.pid, signal.SIGKILL)


def checkpoint_sizes(run_dir: Path, keep: bool) -> dict[str, float]:
    """MiB of each checkpoint of a finished run; removed unless ``keep``."""
    sizes = {}
    for ckpt in sorted(run_dir.rglob("*.ckpt")):
        sizes[str(ckpt.relative_to(run_dir))] = round(ckpt.stat().st_size / 2**20, 1)
        if not keep:
            ckpt.unlink()
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_campaign.py", description=__doc__.split("\n\n")[0])
    p.add_argument("sweeps", nargs="+", help="sweeps with an h200 profile, in priority order")
    p.add_argument("--out", required=True, help="the campaign's folder: runs/ and campaign.json go there")
    p.add_argument("--budget", type=float, required=True, help="seconds for the runs, from this command's start")
    p.add_argument("--data-dir", required=True, help="the CIFAR-10 training JPEG folder (train/<class>/*.jpg)")
    p.add_argument("--grace", type=float, default=90.0, help="seconds a stopped run gets to save and exit")
    p.add_argument("--min-start", type=float, default=45.0, help="no run starts with fewer seconds left")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (a rehearsal; its numbers mean nothing)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep the checkpoints of finished runs")
    args = p.parse_args(argv)
    out = Path(args.out)
    extra = ["--data.data_dir", str(Path(args.data_dir).resolve()), *(SMOKE_ARGS if args.smoke else [])]
    try:
        plans = [make_plan(s, PROFILE, root=out / "runs", extra=extra) for s in args.sweeps]
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    campaign = Campaign(args.budget, args.grace, args.min_start)
    signal.signal(signal.SIGTERM, campaign.signal)
    signal.signal(signal.SIGINT, campaign.signal)

    failed: list[str] = []
    recorded: dict[int, str] = {}  # id(run) -> its record in results/
    for plan in plans:
        pending = plan.pending()
        held = recorded_twins(pending, plan.sweep.id, PROFILE)
        recorded.update({k: os.path.relpath(r.path, REPO) for k, r in held.items()})
        finished_here = len(plan.runs) - len(pending)
        pending = [r for r in pending if id(r) not in held]
        expected = plan.profile.device_s
        print(f"\n{plan.sweep.id} --profile {PROFILE}: {len(plan.runs)} runs, {finished_here} finished earlier"
              + (f", {len(held)} recorded in results/ (skipped)" if held else "") + f", {len(pending)} to run"
              + (f"; all of them expected to take {expected:.0f} s" if expected else "")
              + f"; {max(0.0, campaign.left()):.0f} s of the budget left", flush=True)  # fmt: skip
        for run in pending:
            if not campaign.can_start():
                break
            resumed = resume_checkpoint(run)
            if resumed:
                print(f"    resuming {run.label} from {resumed}", flush=True)
            outcome = execute(plan, [run], runner=campaign.run)[0]
            if outcome.finished:
                checkpoint_sizes(run.run_dir, args.keep_checkpoints)
            elif run.label not in campaign.cut:
                failed.append(f"{plan.sweep.id} {run.label}")

    summary = {"budget_s": args.budget, "elapsed_s": round(time.monotonic() - campaign.start, 1),
               "stopped": campaign.stopped, "smoke": args.smoke, "data_dir": extra[1], "sweeps": {}}  # fmt: skip
    complete = True
    for plan in plans:
        runs = {}
        for run in plan.runs:
            rec = record(run.run_dir)
            status = rec.get("status") or ("recorded" if id(run) in recorded else "not started")
            complete &= status in ("finished", "recorded")
            runs[run.label] = {"status": status, "run_dir": str(run.run_dir),
                               **({"record": recorded[id(run)]} if status == "recorded" else {}),
                               **({"test": rec.get("test"), "samples_per_sec": (rec.get("training") or {}).get("samples_per_sec"),
                                   "fit_time_s": (rec.get("training") or {}).get("fit_time_s")} if status == "finished" else {})}  # fmt: skip
        summary["sweeps"][plan.sweep.id] = {"profile": PROFILE, "expected_s": plan.profile.device_s,
                                            "experiment": plan.experiment, "runs": runs}  # fmt: skip
    summary["complete"], summary["failed"] = complete, failed
    path = out / "campaign.json"
    atomic_write_text(path, json.dumps(summary, indent=2) + "\n")
    done = sum(r["status"] in ("finished", "recorded") for s in summary["sweeps"].values() for r in s["runs"].values())
    total = sum(len(s["runs"]) for s in summary["sweeps"].values())
    print(f"\ngpu_campaign: {done} of {total} runs finished" + (f" ({len(recorded)} of them recorded earlier)" if recorded else "")
          + ("" if complete else f"; stopped ({campaign.stopped or 'runs failed'}): run the campaign again to continue")
          + f"; wrote {path}", flush=True)  # fmt: skip
    if failed:
        return 1
    return 0 if complete else 3


if __name__ == "__main__":
    sys.exit(main())
