"""The repository's command line the way the tests run it: in a subprocess from the repository root,
offline, one thread, no GPU, nothing of the caller's debug, SLURM or W&B settings (``cli_env``,
``run_repro``; ``repro`` and ``start``/``finish`` time it and keep the output), or in this process
(``repro_here``); the tiny digits runs' overrides; checks of what a command printed."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DIGITS = "reproductions/vit/configs/digits.yaml"
#: no progress bar, no model summary: a run's output is its own lines
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
#: the digits ViT at 1 block of width 32, 2 heads: a few seconds a run
NET = "--model.init_args.net.init_args."
TINY = [
    *QUIET, f"{NET}depth", "1", f"{NET}embed_dim", "32", f"{NET}num_heads", "2",
    "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
]
#: the same net with 6 / 3 / 3 batches per epoch (enough steps for the logs the W&B and CLI tests read)
SMALL = [
    *QUIET, f"{NET}depth", "1", f"{NET}embed_dim", "32", f"{NET}num_heads", "2",
    "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "3", "--trainer.limit_test_batches", "3",
]
#: where a digits fit with the default variant and seed writes, under its root
RUN = Path("vit") / "digits" / "default" / "seed0"


def cli_env(**extra: str | None) -> dict[str, str]:
    """The environment of a test's ``repro`` subprocess: this one's, without ``REPRO_DEBUG``, ``SLURM_*``
    and ``WANDB_*``, with the repository importable, one thread, no GPU, W&B and the Hugging Face hub
    offline and unbuffered output; then ``extra`` (a value None removes the variable)."""
    env = {k: v for k, v in os.environ.items()
           if k != "REPRO_DEBUG" and not k.startswith(("SLURM_", "WANDB_"))}  # fmt: skip
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")  # fmt: skip
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def run_repro(*args: str, env: dict[str, str] | None = None, timeout: float = 600, merge: bool = False,
              **kwargs) -> subprocess.CompletedProcess:
    """``python -m reproductions ARGS`` from the repository root with ``env`` (default ``cli_env()``),
    its output as text: stdout and stderr apart, or together in stdout with ``merge``."""
    streams = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT) if merge else dict(capture_output=True)
    return subprocess.run([sys.executable, "-m", "reproductions", *args], cwd=REPO, env=env or cli_env(),
                          text=True, timeout=timeout, **streams, **kwargs)  # fmt: skip


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float

    @property
    def lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.strip()]

    @property
    def last(self) -> str:
        return self.lines[-1] if self.lines else ""



def _log(case: str, result: Result) -> None:
    path = os.environ.get("REPRO_FAULTS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"case": case, "returncode": result.returncode, "seconds": round(result.seconds, 1),
                                "last": result.last}) + "\n")


def repro(*args: str, case: str = "", timeout: float = 600, preexec_fn=None, env: dict | None = None) -> Result:
    start = time.monotonic()
    proc = run_repro(*args, env=env, timeout=timeout, merge=True, preexec_fn=preexec_fn)
    result = Result(proc.returncode, proc.stdout, time.monotonic() - start)
    _log(case or " ".join(args[:2]), result)
    return result


def repro_here(*args: str, case: str, capfd, monkeypatch, **env: str) -> Result:
    """The same entry point, ``reproductions.__main__.main(argv)``, in this process (from the
    repository root, with ``env`` set): for errors found before any data is loaded or any process
    started, a subprocess adds only the ~10 s import of torch and Lightning. The real command line
    in a subprocess is exercised by the ``repro`` cases (the DDP batch, ``--debug``, the runs)."""
    from reproductions.__main__ import main

    monkeypatch.chdir(REPO)
    monkeypatch.delenv("REPRO_DEBUG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    capfd.readouterr()
    start = time.monotonic()
    code = main(list(args))
    out, err = capfd.readouterr()
    result = Result(code, out + err, time.monotonic() - start)
    _log(case, result)
    return result


def start(*args: str, log: Path) -> tuple[subprocess.Popen, float]:
    f = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "reproductions", *args], cwd=REPO, env=cli_env(),
                            stdout=f, stderr=subprocess.STDOUT, text=True)
    f.close()
    return proc, time.monotonic()


def finish(proc: subprocess.Popen, log: Path, started: float, case: str, timeout: float = 300) -> Result:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    result = Result(proc.returncode, log.read_text(), time.monotonic() - started)
    _log(case, result)
    return result


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.1)


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its SHA-256 (what 'byte-identical' compares)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.output, result.output[-3000:]


def usage_error(result: Result, *needles: str) -> None:
    assert result.returncode == 2, result.output[-3000:]
    assert result.last.startswith("error: "), result.output[-3000:]
    for needle in needles:
        assert needle in result.last, result.last
    assert len(result.last) < 700
    no_traceback(result)


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny run (2 epochs); tests copy it before changing anything."""
    root = tmp_path_factory.mktemp("finished")
    result = repro("fit", "--config", DIGITS, "--run.root", str(root), *TINY, "--trainer.max_epochs", "2",
                   case="finished run (fixture)")
    assert result.returncode == 0, result.output[-3000:]
    return root


def copy_run(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "runs"
    shutil.copytree(finished, root)
    return root, root / RUN


def build_only(args: list[str], trainer: bool = False):
    """ReproductionCLI up to the instantiated classes; ``trainer``: a Trainer too, else the
    Trainer's own config (Lightning's FSDP refuses a CPU-only machine at Trainer construction)."""
    from reproductions.run.cli import ReproductionCLI

    class BuildOnly(ReproductionCLI):
        def instantiate_trainer(self, **kwargs):
            self.trainer_config = self._get(self.config_init, "trainer")
            return super().instantiate_trainer(**kwargs) if trainer else None

        def _run_subcommand(self, subcommand):
            pass

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return BuildOnly(args=args)


#: a line a Python warning prints (``file.py:12: UserWarning: ...``) or a library's own warning line
WARNING_LINE = re.compile(r"(^|\s)\S+\.py:\d+: |Warning: ")


def warning_lines(text: str) -> list[str]:
    return [line for line in text.replace("\r", "\n").splitlines() if WARNING_LINE.search(line)]
