"""W&B end to end, offline: one W&B run per run directory across fit and resume, the run's files
under its directory, ``sync``, an unreachable server, the report run as data.

The runs are real command lines in subprocesses with ``HOME`` pointed at an empty folder, so
anything W&B writes outside the run directory shows up there. The offline ``.wandb`` files are
read back with ``tests.helpers.wandb_records``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from reproductions.sweeping.plan import make_plan
from reproductions.sweeping.publish import claims_table, numbers_table
from reproductions.sweeping.checks import ClaimLine, Comparison
from reproductions.sweeping.collect import Stat, collect
from reproductions.commands import sync
from reproductions.run.artifacts import PENDING_FILE, keep_pending, read_pending
from reproductions.commands.sync import find_offline_runs, main as sync_main
from reproductions.run.tracking import RUN_ID_FILE, offline_folder, read_run_id
from tests.cli_helpers import DIGITS, SMALL, cli_env, run_repro
from tests.helpers import history_values, wandb_records
from tests.report_helpers import position_sweep, put



def env_for(tmp_path: Path, **extra: str | None) -> dict:
    """``cli_env`` with a home and netrc of the test's own, so no key of the caller's is found."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return cli_env(HOME=str(home), NETRC=str(tmp_path / "no-netrc"), **extra)


def repro(tmp_path: Path, *args: str, timeout: float = 300, **env: str | None) -> subprocess.CompletedProcess:
    return run_repro(*args, env=env_for(tmp_path, **env), timeout=timeout)


def fit(tmp_path: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    return repro(tmp_path, "fit", "--config", DIGITS, "--run.root", str(tmp_path / "runs"), *SMALL,
                 "--run.wandb", "true", *extra, **env)  # fmt: skip


def last_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def offline_folders(directory: Path) -> list[Path]:
    return sorted((directory / "wandb").glob("offline-run-*"))


def records_of(folder: Path) -> list:
    return wandb_records(next(folder.glob("run-*.wandb")))


def of_kind(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def config_of(records: list) -> dict:
    """The run config: what wandb.init got (in the run record) and every later update."""
    updates = [r.config for r in of_kind(records, "run")] + of_kind(records, "config")
    return {item.key: json.loads(item.value_json) for c in updates for item in c.update}


def assert_relocatable(folder: Path, old: Path) -> None:
    """Every path the offline run ``folder``'s records name for upload exists where the folder is
    now: saved files relative to its files folder and plain files there, no artifact (W&B would
    record its staged files by absolute path), links relative and resolving; none names ``old``."""
    records = records_of(folder)
    for name in (f.path for files in of_kind(records, "files") for f in files.files):
        assert not os.path.isabs(name) and str(old) not in name, name
        assert (folder / "files" / name).is_file() and not (folder / "files" / name).is_symlink(), name
    assert not of_kind(records, "artifact"), [a.name for a in of_kind(records, "artifact")]
    for value in history_values(records).values():
        if isinstance(value, dict) and "path" in value:  # a media file (an image), relative to files/
            assert not os.path.isabs(value["path"]) and (folder / "files" / value["path"]).is_file(), value
    links = [p for p in folder.rglob("*") if p.is_symlink()]
    assert all(not os.path.isabs(os.readlink(p)) and p.exists() for p in links), links


def history_steps(records: list) -> list[int]:
    return [h.step.num for h in of_kind(records, "history")]


RUN = Path("runs/vit/digits/default/seed0")


@pytest.mark.subprocess
@pytest.mark.slow
def test_fit_resume_test_and_overwrite_keep_one_run_per_directory_and_its_files_under_it(tmp_path):
    """fit, then resume from its checkpoint: one W&B id (kept in wandb/run_id), the resumed
    history going on at later steps; the model artifact's staged files, results.json and
    config.yaml all under the run directory and nothing of W&B in HOME; the config the resolved
    tree once (no flat lr/net copy) plus facts; test: its own run linked by group and fit_run_id;
    --run.overwrite true: a new id, the old folders then skipped by sync as replaced."""
    run_dir = tmp_path / RUN
    first = fit(tmp_path, "--trainer.max_epochs", "1", "--run.log_model", "true")
    assert first.returncode == 0, last_line(first)
    run_id = read_run_id(run_dir)
    assert run_id and (run_dir / RUN_ID_FILE).read_text().strip() == run_id
    resumed = fit(tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"))
    assert resumed.returncode == 0, last_line(resumed)
    folders = offline_folders(run_dir)
    assert [f.name.rsplit("-", 1)[1] for f in folders] == [run_id, run_id]
    before, after = (records_of(f) for f in folders)
    assert min(history_steps(after)) > max(history_steps(before)) > 0  # the step axis goes on

    # the run's records: config once, facts, files and artifact under the run directory
    [run] = of_kind(before, "run")
    assert (run.run_id, run.run_group, run.job_type) == (run_id, "vit/digits", "fit")
    assert list(run.tags) == ["vit/digits", "default", "seed0"]
    # the summary keeps the best and the last of the validation metrics; the step metric is the trainer's
    metrics: dict = {}
    for m in of_kind(before, "metric"):  # the explicit definition over the "*" glob's expansion
        if m.name and (m.name not in metrics or m.summary.max or m.summary.min):
            metrics[m.name] = m
    assert metrics["val/acc"].summary.max and metrics["val/acc"].summary.last
    assert metrics["val/loss"].summary.min and metrics["val/loss"].summary.last
    assert metrics["val/acc"].step_metric == "trainer/global_step"
    assert "train/samples_per_sec" not in metrics or not metrics["train/samples_per_sec"].summary.max
    config = config_of(before)
    assert {"run", "model", "data", "trainer", "seed_everything", "facts"} <= set(config)
    assert not {"lr", "net", "batch_size", "_instantiator"} & set(config)  # no flat copy of the module's hparams
    assert config["facts"]["git_commit"] and config["facts"]["hardware"]["device"] == "cpu"
    saved = {f.path for files in of_kind(before, "files") for f in files.files}
    assert {"results.json", "config.yaml", "metrics.csv"} <= saved
    for name in ("results.json", "config.yaml"):  # copies in each process's files folder, not links
        assert not (folders[0] / "files" / name).is_symlink() and (folders[0] / "files" / name).is_file()
        assert (folders[-1] / "files" / name).read_bytes() == (run_dir / name).read_bytes()  # the resumed fit's
    assert not of_kind(before, "artifact")  # offline, the model artifact waits for sync
    [pending] = read_pending(run_dir)
    assert (pending["name"], pending["run_id"], pending["uploaded"]) == (f"model-{run_id}", run_id, None)
    assert {f["path"] for f in pending["files"]} >= {"checkpoints/last.ckpt"}
    leaked = [p for p in (tmp_path / "home").rglob("*") if "wandb" in str(p).lower()]
    assert not leaked, leaked

    # test on the run's checkpoint: a run of its own, linked to the fit's
    tested = repro(tmp_path, "test", "--config", DIGITS, "--run.root", str(tmp_path / "runs"), *SMALL,
                   "--run.wandb", "true", "--ckpt_path", "last")  # fmt: skip
    assert tested.returncode == 0, last_line(tested)
    [test_folder] = offline_folders(run_dir / "test")
    test_records = records_of(test_folder)
    [test_run] = of_kind(test_records, "run")
    assert test_run.run_id != run_id and test_run.run_group == "vit/digits" and test_run.job_type == "test"
    assert test_run.display_name == "vit/digits/default/seed0/test"
    assert config_of(test_records)["fit_run_id"] == run_id
    assert read_run_id(run_dir) == run_id  # testing leaves the fit's id alone
    test_saved = {f.path for files in of_kind(test_records, "files") for f in files.files}
    assert {"results.json", "config.yaml", "metrics.csv"} <= test_saved  # what it evaluated, with it
    assert (test_folder / "files" / "config.yaml").read_bytes() == (run_dir / "config.yaml").read_bytes()
    assert "seed0" in test_run.tags

    # overwrite: a new id; sync lists only the current attempt (and the test run)
    again = fit(tmp_path, "--trainer.max_epochs", "1", "--run.overwrite", "true")
    assert again.returncode == 0, last_line(again)
    new_id = read_run_id(run_dir)
    assert new_id != run_id and offline_folders(run_dir)[-1].name.endswith(new_id)
    out = io.StringIO()
    assert sync_main([str(tmp_path / "runs"), "--dry-run"], out=out) == 0
    shown = out.getvalue()
    assert f"upload  vit/digits/default/seed0  {new_id}" in shown
    assert f"upload  vit/digits/default/seed0/test  {test_run.run_id}" in shown
    assert shown.count(f"skip    vit/digits/default/seed0  {run_id}") == 2 and "replaced attempt" in shown


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.slow
def test_two_ddp_processes_write_one_wandb_run(tmp_path):
    """Under DDP only global rank 0 logs: one offline run, the id file written once."""
    done = fit(tmp_path, "--trainer.max_epochs", "1", "--trainer.accelerator", "cpu", "--trainer.devices", "2",
               "--trainer.strategy", "ddp", "--data.batch_size", "32", "--run.test_after_fit", "false", timeout=600)
    assert done.returncode == 0, last_line(done)
    run_dir = tmp_path / RUN
    [folder] = offline_folders(run_dir)
    assert folder.name.endswith(read_run_id(run_dir))
    assert [f.name for f in tmp_path.rglob("offline-run-*")] == [folder.name]


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.subprocess
@pytest.mark.slow
def test_an_unreachable_server_does_not_hang_the_run(tmp_path):
    """A key but a server known to be down (connection refused): the run says so in its first W&B
    line and goes offline at once; with WANDB_MODE=online it stops with one error line before
    training. A server that accepts the connection but never answers: after WANDB_INIT_TIMEOUT one
    line, then offline under the same id, and the online attempt leaves no folder behind."""
    url = f"http://127.0.0.1:{_closed_port()}"
    server = dict(WANDB_API_KEY="f" * 40, WANDB_BASE_URL=url, WANDB_INIT_TIMEOUT="3", WANDB_MODE=None)
    start = time.monotonic()
    done = fit(tmp_path, "--trainer.max_epochs", "1", timeout=240, **server)
    took = time.monotonic() - start
    assert done.returncode == 0, last_line(done)
    text = done.stdout + done.stderr
    assert f"W&B: offline (server {url} is not reachable: connection to 127.0.0.1:" in text, text[-2000:]
    assert "did not start the run" not in text  # known at once: no wait
    run_dir = tmp_path / RUN
    [folder] = offline_folders(run_dir)
    assert folder.name.endswith(read_run_id(run_dir))
    assert json.loads((run_dir / "results.json").read_text())["status"] == "finished"
    print(f"refused server: fit finished offline in {took:.1f} s")

    online = fit(tmp_path, "--trainer.max_epochs", "1", "--run.overwrite", "true", timeout=240,
                 **{**server, "WANDB_MODE": "online"})  # fmt: skip
    assert online.returncode == 1
    assert last_line(online).startswith(f"error: W&B server {url} is not reachable") and "WANDB_MODE=online" in last_line(online)

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        done = fit(tmp_path, "--trainer.max_epochs", "1", "--run.overwrite", "true", timeout=240,
                   **{**server, "WANDB_BASE_URL": url})  # fmt: skip
    assert done.returncode == 0, last_line(done)
    text = done.stdout + done.stderr
    assert f"W&B: online (server {url}, key from WANDB_API_KEY)" in text
    assert "did not start the run within 3 s" in text and "going on offline" in text, text[-2000:]
    assert offline_folders(run_dir)[-1].name.endswith(read_run_id(run_dir))  # (the replaced attempt's kept too)
    assert not [p for p in (run_dir / "wandb").glob("run-*")]  # the failed online start left nothing


# --------------------------------------------------------------------------- sync


def _fake_run(directory: Path, stamp: str, run_id: str, synced: bool = False, suffix: str = "") -> Path:
    folder = directory / "wandb" / f"offline-run-{stamp}-{run_id}{suffix}"
    folder.mkdir(parents=True)
    (folder / f"run-{run_id}.wandb").write_bytes(b":W&B\x00\x00\x00")
    if synced:
        (folder / f"run-{run_id}.wandb.synced").touch()
    return folder


@pytest.mark.subprocess
def test_sync_dry_run_lists_what_it_would_upload_and_why_it_skips(tmp_path, capsys):
    runs = tmp_path / "runs"
    seed0, seed1 = runs / "s-cpu" / "a" / "seed0", runs / "s-cpu" / "a" / "seed1"
    (seed0 / "wandb").mkdir(parents=True)
    (seed0 / RUN_ID_FILE).write_text("bbb\n")
    _fake_run(seed0, "20250101_000000", "aaa")  # an attempt replaced by a fresh fit
    _fake_run(seed0, "20250102_000000", "bbb")
    _fake_run(seed0, "20250103_000000", "bbb")  # resumed: the same run
    _fake_run(seed0, "20250103_000000", "bbb", suffix="-1")  # resumed again within the same second: W&B adds -1
    _fake_run(seed1, "20250101_000000", "ccc", synced=True)
    _fake_run(runs / "s-cpu", "20250104_000000", "rep")  # the report run
    found = {(r.owner.relative_to(runs).as_posix(), r.run_id, r.state) for r in find_offline_runs(runs)}
    assert found == {("s-cpu/a/seed0", "aaa", "replaced"), ("s-cpu/a/seed0", "bbb", "to upload"),
                     ("s-cpu/a/seed1", "ccc", "uploaded"), ("s-cpu", "rep", "to upload")}  # fmt: skip
    out = io.StringIO()
    assert sync_main([str(runs), "--dry-run"], out=out) == 0
    text = out.getvalue()
    bbb = [r.folder.name for r in find_offline_runs(runs) if r.run_id == "bbb"]
    assert bbb == ["offline-run-20250102_000000-bbb", "offline-run-20250103_000000-bbb",
                   "offline-run-20250103_000000-bbb-1"]  # in the order they ran, none left out
    assert "would upload 4 (2 W&B run(s)), skipping 2" in text and text.rstrip().endswith("dry run: nothing uploaded")
    # uploading without a key: one error line before anything is uploaded
    env = env_for(tmp_path, WANDB_MODE=None)
    done = run_repro("sync", str(runs), env=env, timeout=120)
    assert done.returncode == 2 and last_line(done).startswith("error: no W&B key")
    # a key but no server: one error line at once (wandb sync itself would retry for minutes)
    env_key = env_for(tmp_path, WANDB_MODE=None, WANDB_API_KEY="f" * 40, WANDB_BASE_URL=f"http://127.0.0.1:{_closed_port()}")
    done = run_repro("sync", str(runs), env=env_key, timeout=120)
    assert done.returncode == 1 and "is not reachable" in last_line(done) and "nothing uploaded" in last_line(done)
    assert not list(runs.rglob("*.synced"))[1:]  # only the one marked before
    done = run_repro("sync", str(tmp_path / "nowhere"), env=env, timeout=120)
    assert done.returncode == 2 and "does not exist" in last_line(done)


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_moved_copy_of_runs_keeps_its_files_and_its_model_artifact(tmp_path):
    """An offline fit with --run.log_model true, then runs/ moved elsewhere: no link that points
    outside (or to the old place), no file record naming the old place, no staged artifact; sync
    --dry-run there lists the run and its pending model artifact with both checkpoints present,
    and a missing checkpoint as missing."""
    done = fit(tmp_path, "--trainer.max_epochs", "1", "--run.log_model", "true")
    assert done.returncode == 0, last_line(done)
    old, new = tmp_path / "runs", tmp_path / "elsewhere" / "runs"
    new.parent.mkdir()
    shutil.move(old, new)
    run_dir = new / RUN.relative_to("runs")
    run_id = read_run_id(run_dir)
    links = [p for p in new.rglob("*") if p.is_symlink()]
    assert links and all(not os.path.isabs(os.readlink(p)) and p.exists() for p in links), links
    [folder] = offline_folders(run_dir)
    records = records_of(folder)
    saved = [f.path for files in of_kind(records, "files") for f in files.files]
    assert {"results.json", "config.yaml", "metrics.csv", "hparams.yaml"} <= set(saved)
    for name in saved:  # relative to the files folder, a plain file there
        assert not os.path.isabs(name) and str(old) not in name
        assert (folder / "files" / name).is_file() and not (folder / "files" / name).is_symlink(), name
    assert not of_kind(records, "artifact") and not list((run_dir / "wandb").rglob("staging/*"))
    [pending] = read_pending(run_dir)
    assert pending["aliases"] == ["last", "best", "variant-default", "seed-0"] and len(pending["files"]) == 2
    assert all(not os.path.isabs(f["path"]) and (run_dir / f["path"]).is_file() for f in pending["files"])

    listed = repro(tmp_path, "sync", str(new), "--dry-run")
    assert listed.returncode == 0 and last_line(listed) == "dry run: nothing uploaded", listed.stdout + listed.stderr
    assert f"upload  vit/digits/default/seed0  {run_id}" in listed.stdout
    assert "model artifacts of offline runs: would upload 1, skipping 0" in listed.stdout
    [line] = [line for line in listed.stdout.splitlines() if line.startswith("  artifact")]
    assert f"vit/digits/default/seed0  model-{run_id} (model; last, best, variant-default, seed-0)" in line
    best = next(f["path"] for f in pending["files"] if f["name"] != "last.ckpt")
    for path in ("checkpoints/last.ckpt", best):  # present, with their sizes
        assert f"{path} {(run_dir / path).stat().st_size / 1e6:.2f} MB" in line
    assert "missing" not in line
    (run_dir / best).unlink()
    out = io.StringIO()
    assert sync_main([str(new), "--dry-run"], out=out) == 0
    assert f"{best} missing: files missing" in out.getvalue() and "would upload 0, skipping 1" in out.getvalue()


def _pending_run(runs: Path, run_id: str = "abc") -> Path:
    """A run directory with an offline run folder and a pending model artifact of two checkpoints."""
    run_dir = runs / "s-cpu" / "a" / "seed0"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"l" * 1000)
    (run_dir / "checkpoints" / "best-epoch000.ckpt").write_bytes(b"b" * 2000)
    _fake_run(run_dir, "20250101_000000", run_id)
    (run_dir / RUN_ID_FILE).write_text(run_id + "\n")
    keep_pending(run_dir, {
        "name": f"model-{run_id}", "type": "model", "run_id": run_id, "project": "proj", "entity": None,
        "aliases": ["last", "best", "variant-a", "seed-0"], "metadata": {"test/acc": 0.5},
        "files": [{"name": "last.ckpt", "path": "checkpoints/last.ckpt", "bytes": 1000},
                  {"name": "best-epoch000.ckpt", "path": "checkpoints/best-epoch000.ckpt", "bytes": 2000}],
    })  # fmt: skip
    return run_dir


def test_sync_logs_a_pending_model_artifact_into_its_uploaded_run_once(tmp_path, monkeypatch):
    """After ``wandb sync`` (stubbed: it marks the folders uploaded), sync resumes the run by id
    (resume="must", online), logs the artifact from the moved files with its aliases, finishes,
    and marks the entry uploaded; an upload that fails leaves it pending and exits 1; the next
    sync uploads it without syncing the run again, and the one after skips it."""
    run_dir = _pending_run(tmp_path / "old")
    new = tmp_path / "new"
    shutil.move(tmp_path / "old", new)
    run_dir = new / run_dir.relative_to(tmp_path / "old")
    calls: list = []
    fail = {"wait": True}

    class Artifact:
        def __init__(self, name, type, metadata=None):
            self.name, self.type, self.metadata, self.files = name, type, metadata, []

        def add_file(self, local_path, name=None, **kw):
            self.files.append((name, Path(local_path), kw.get("policy")))

        def wait(self, timeout=None):
            calls.append(("wait", timeout))
            if fail["wait"]:
                raise TimeoutError("artifact upload did not finish")
            return self

    class Run:
        def log_artifact(self, artifact, aliases=None):
            calls.append(("log_artifact", artifact, aliases))
            return artifact

        def finish(self, exit_code=None):
            calls.append(("finish",))

    def init(**kw):
        calls.append(("init", kw))
        return Run()

    stub = types.SimpleNamespace(init=init, Artifact=Artifact, Settings=dict, run=None)
    monkeypatch.setitem(sys.modules, "wandb", stub)
    monkeypatch.setattr(sync, "key_source", lambda url: "WANDB_API_KEY")
    monkeypatch.setattr(sync, "base_url", lambda: "https://wandb.example")
    monkeypatch.setattr(sync, "connection_problem", lambda url, timeout=None: None)
    synced: list = []

    def wandb_sync(command, env):
        synced.append(command)
        for arg in command:
            for f in Path(arg).glob("*.wandb") if Path(arg).is_dir() else []:
                Path(f"{f}.synced").touch()
        return 0

    monkeypatch.setattr(sync, "run_wandb_sync", wandb_sync)

    out = io.StringIO()
    assert sync_main([str(new), "--artifact-timeout", "5"], out=out) == 1  # the upload fails: still pending
    assert len(synced) == 1 and "not uploaded: model-abc (rerun to retry)" in out.getvalue()
    assert read_pending(run_dir)[0]["uploaded"] is None and calls[-1] == ("finish",)

    calls.clear()
    fail["wait"] = False
    out = io.StringIO()
    assert sync_main([str(new)], out=out) == 0, out.getvalue()
    assert len(synced) == 1  # the run itself was uploaded already
    [init_kw] = [c[1] for c in calls if c[0] == "init"]
    assert {k: init_kw[k] for k in ("id", "resume", "mode", "project")} == {
        "id": "abc", "resume": "must", "mode": "online", "project": "proj"}  # fmt: skip
    [(_, artifact, aliases)] = [c for c in calls if c[0] == "log_artifact"]
    assert (artifact.name, artifact.type, artifact.metadata) == ("model-abc", "model", {"test/acc": 0.5})
    assert aliases == ["last", "best", "variant-a", "seed-0"]
    assert [(n, p, pol) for n, p, pol in artifact.files] == [
        ("last.ckpt", run_dir / "checkpoints" / "last.ckpt", "immutable"),
        ("best-epoch000.ckpt", run_dir / "checkpoints" / "best-epoch000.ckpt", "immutable")]  # fmt: skip
    assert ("wait", 600) in calls and calls[-1] == ("finish",)
    assert read_pending(run_dir)[0]["uploaded"] and out.getvalue().rstrip().endswith("1 of 1 model artifact(s)")

    calls.clear()
    out = io.StringIO()
    assert sync_main([str(new)], out=out) == 0
    assert not calls and len(synced) == 1 and out.getvalue().rstrip().endswith("nothing to upload")
    assert "skip      s-cpu/a/seed0  model-abc" in out.getvalue() and "already uploaded" in out.getvalue()
    assert json.loads((run_dir / PENDING_FILE).read_text())["artifacts"][0]["name"] == "model-abc"


@pytest.mark.slow
def test_sync_dry_run_lists_every_run_of_a_smoke_sweep(tmp_path, monkeypatch):
    """A real smoke sweep with ``--wandb`` (its runs through the CLI in this process, offline W&B),
    then ``repro sync --dry-run`` on its directory: every training run and the report run listed."""
    from reproductions.commands.sweep import main as sweep_main
    from tests.helpers import inprocess_runner

    for key, value in env_for(tmp_path).items():
        if key != "PYTHONPATH":
            monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith("WANDB_") and k != "WANDB_MODE"]:
        monkeypatch.delenv(key)
    root = tmp_path / "runs"
    out = io.StringIO()
    status = sweep_main(["vit/patch_size", "--profile", "smoke", "--wandb", "--root", str(root)], runner=inprocess_runner,
                        out=out)  # fmt: skip
    assert status == 0, out.getvalue()[-3000:]
    plan = make_plan("vit/patch_size", "smoke", root=root)
    out = io.StringIO()
    assert sync_main([str(plan.experiment_dir), "--dry-run"], out=out) == 0, out.getvalue()
    listed = out.getvalue()
    for run in plan.runs:
        run_id = read_run_id(run.run_dir)
        assert f"upload  {run.run_dir.relative_to(plan.experiment_dir).as_posix()}  {run_id}" in listed
    report_id = read_run_id(plan.experiment_dir)
    assert f"upload  {plan.experiment_dir.name}  {report_id}" in listed
    assert f"would upload {len(plan.runs) + 1} ({len(plan.runs) + 1} W&B run(s)), skipping 0" in listed


# --------------------------------------------------------------------------- the report run


def test_claims_table_lists_the_checks_comparisons():
    lines = [
        ClaimLine("none: 77.00 ± 1.00; best other, learned: 96.00 ± 1.00: gap +19.00 points (± 0.82 s.e.)"),
        ClaimLine("  relative > none? within noise (under 2 s.e.): +1.00 points (± 1.29 s.e.)",
                  Comparison("relative", "none", Stat(78.0, 1.0, 3), Stat(77.0, 2.0, 3))),
        ClaimLine("  learned > none? holds (one seed: no s.e.): +3.00 points",
                  Comparison("learned", "none", Stat(80.0, None, 1), Stat(77.0, None, 1))),
        ClaimLine("at the shared lr=0.001: pool=gap - pool=cls: -2.00 points; pool=gap > pool=cls? does not hold",
                  Comparison("pool=gap", "pool=cls", Stat(80.0, 0.5, 3), Stat(82.0, 0.5, 3), context="at the shared lr=0.001")),
    ]  # fmt: skip
    columns, rows = claims_table(lines)
    assert columns == ["claim", "comparison", "difference", "s.e.", "verdict"]
    assert [r[0] for r in rows] == ["relative > none", "learned > none", "at the shared lr=0.001: pool=gap > pool=cls"]
    assert rows[0][1] == lines[1].text.strip()
    assert [(r[2], None if r[3] is None else round(r[3], 2), r[4]) for r in rows] == [
        (1.0, 1.29, "within noise"), (3.0, None, "holds"), (-2.0, 0.41, "does not hold")]  # fmt: skip


@pytest.mark.slow
def test_report_run_is_data_and_reporting_again_continues_it(tmp_path, monkeypatch):
    """``report --wandb`` twice: one report run (same id, kept in the sweep's directory), in the
    sweep's group, job type report, run.variant report; its numbers table has one numeric
    column per number and the axis values as their own column; the claims table has verdicts."""
    import wandb

    from reproductions.commands.report import main as report_main

    monkeypatch.setenv("WANDB_MODE", "offline")
    sweep = position_sweep(tmp_path)
    root = tmp_path / "runs"
    for seed, acc in enumerate((0.90, 0.92)):
        put(root, "pos-smoke", "learned", seed, acc=acc)
        put(root, "pos-smoke", "none", seed, acc=acc - 0.1)
    plan = make_plan(sweep, "smoke", root=root)
    columns, rows = numbers_table(plan, collect(plan))
    row = dict(zip(columns, next(r for r in rows if r[0] == "learned")))
    assert row["mean"] == pytest.approx(91.0) and row["std"] == pytest.approx(1.414, abs=1e-3) and row["n"] == 2
    assert row["s.e."] == pytest.approx(1.0) and row["pos_embed"] == "learned_1d"
    paper = next(c for c in columns if c.startswith("paper: "))
    assert isinstance(row[paper], float) and row["ours - " + paper] == pytest.approx(91.0 - row[paper])
    assert row["params"] == 136138 and row["GFLOPs/sample"] == pytest.approx(4.76e-3) and row["time/run (s)"] == 30.0

    for _ in range(2):
        assert report_main([str(sweep), "--profile", "smoke", "--root", str(root), "--wandb"]) == 0
    wandb.teardown()
    experiment = root / "pos-smoke"
    run_id = read_run_id(experiment)
    folders = offline_folders(experiment)
    # both reports in one second make a second folder ...-<id>-1: the same run either way
    assert len(folders) == 2 and all(offline_folder(f.name)[1] == run_id for f in folders)
    records = records_of(folders[-1])
    [run] = of_kind(records, "run")
    assert (run.run_group, run.job_type, run.display_name) == ("pos-smoke", "report", "pos-smoke/report")
    assert config_of(records)["run"]["variant"] == "report"
    assert history_steps(records) == [1] and history_steps(records_of(folders[0])) == [0]
    logged = history_values(records)
    assert not {"report/numbers", "report/claims", "report/table"} & set(logged)  # offline: kept, not staged
    config = config_of(records)
    assert config["seeds"] == [0, 1] and config["seeds_planned"] == plan.seeds and config["finished_runs"] == 4
    assert config["grid"] == {"none": [0, 1], "learned": [0, 1], "sincos": [], "relative": []}  # every variant shown
    assert config["made_by"] == plan.sweep_command()
    # the tables wait as files with one pending entry (relative paths) for repro sync to log
    [pending] = read_pending(experiment)
    assert (pending["type"], pending["run_id"], pending["uploaded"]) == ("tables", run_id, None)
    files = {f["name"]: f["path"] for f in pending["files"]}
    assert set(files) == {"report/numbers", "report/claims", "report/table"}
    assert all(not os.path.isabs(p) for p in files.values())
    numbers = json.loads((experiment / files["report/numbers"]).read_text())
    assert numbers["columns"] == columns and len(numbers["data"]) == len(rows)
    assert [r[columns.index("mean")] for r in numbers["data"]] == [r[columns.index("mean")] for r in rows]
    claims = json.loads((experiment / files["report/claims"]).read_text())
    assert claims["columns"] == ["claim", "comparison", "difference", "s.e.", "verdict"] and claims["data"]
    # moved elsewhere: no record names the old place, and sync lists the run and its tables from there
    old, new = tmp_path / "runs", tmp_path / "moved" / "runs"
    new.parent.mkdir()
    shutil.move(old, new)
    for folder in offline_folders(new / "pos-smoke"):
        assert_relocatable(folder, old)
    out = io.StringIO()
    assert sync_main([str(new / "pos-smoke"), "--dry-run"], out=out) == 0
    text = out.getvalue()
    assert "would upload 2 (1 W&B run(s))" in text and f"tables-{run_id} (tables; )" in text and "missing" not in text
    experiment, folders = new / "pos-smoke", offline_folders(new / "pos-smoke")
    [saved] = (folders[-1] / "files").glob("*.md")  # the report itself: a copy with the run, not a link
    assert not saved.is_symlink() and saved.read_text() == (experiment / saved.name).read_text()


def test_pending_tables_are_logged_into_the_resumed_run_from_where_they_lie(tmp_path, monkeypatch):
    """``keep_tables`` of an offline run writes each table as JSON with a relative pending entry; after
    the tree moved, ``upload_pending`` resumes the run online and logs them as ``wandb.Table``s with the
    same columns and rows, then marks the entry uploaded."""
    from reproductions.run.artifacts import TABLES, keep_tables, upload_pending

    old = tmp_path / "old" / "exp"
    old.mkdir(parents=True)
    offline = types.SimpleNamespace(id="rep1", project="proj", entity="")
    keep_tables(offline, old, {"report/numbers": (["variant", "mean"], [["a", 1.5], ["b", 2.5]]),
                               "report/claims": (["claim", "verdict"], [["a > b", "holds"]])})  # fmt: skip
    new = tmp_path / "new"
    shutil.move(tmp_path / "old", new)
    exp = new / "exp"
    [entry] = read_pending(exp)
    assert entry["type"] == TABLES and entry["run_id"] == "rep1" and entry["entity"] is None
    logged: list = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    class Run:
        def log(self, payload):
            logged.append({k: (v.columns, v.data) for k, v in payload.items()})

        def finish(self, exit_code=None):
            logged.append("finish")

    inits: list = []

    def init(**kw):
        inits.append(kw)
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init, Table=Table, Settings=lambda **kw: kw,
                                                                  run=None))
    upload_pending(exp, entry)
    assert inits[0]["id"] == "rep1" and inits[0]["resume"] == "must" and inits[0]["mode"] == "online"
    assert logged == [{"report/numbers": (["variant", "mean"], [["a", 1.5], ["b", 2.5]]),
                       "report/claims": (["claim", "verdict"], [["a > b", "holds"]])}, "finish"]  # fmt: skip
    assert read_pending(exp)[0]["uploaded"]
