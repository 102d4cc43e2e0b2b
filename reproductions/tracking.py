"""Weights & Biases: whether to run offline, and what a run puts into its W&B summary.

A run logged with ``--run.wandb true`` carries, besides the per-step metrics and the resolved
config (the run config), its results in the run summary: ``results_summary`` maps the fields
of results.json onto flat summary keys, so the W&B runs table can sort and group by test
accuracy, fit time, throughput or FLOPs like the sweep report does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def wandb_offline() -> bool:
    """Offline unless the user has a W&B key (env or netrc) or chose a mode via WANDB_MODE."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode in ("offline", "dryrun")
    if os.environ.get("WANDB_API_KEY"):
        return False
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" not in netrc.read_text()
    except OSError:
        return True


#: results.json fields (dotted paths) that go into the W&B run summary, under ``results/<name>``
_SUMMARY_FIELDS = {
    "fit_time_s": "training.fit_time_s",
    "samples_per_sec": "training.samples_per_sec",
    "flops_per_sample": "model.flops_per_sample",
    "total_train_flops": "training.total_train_flops",
    "params": "model.params",
    "epochs": "training.epochs",
    "steps": "training.steps",
    "global_batch_size": "training.global_batch_size",
    "devices": "training.devices",
    "precision": "training.precision",
    "effective_lr": "training.effective_lr",
    "best_score": "best.score",
    "best_monitor": "best.monitor",
    "test_ckpt": "test_ckpt",
    "variant": "variant",
    "seed": "seed",
    "git_commit": "git.commit",
}


def _get(data: dict, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def results_summary(results: dict) -> dict[str, Any]:
    """The W&B run summary of a run: what its results.json says, as flat keys.

    ``status``; the test metrics at the tested checkpoint under their own keys (``test/acc``,
    ``test/auc``, ...); the metrics at the end of training as ``final/<key>``; and
    ``results/<name>`` for fit time, throughput, FLOPs, parameters and the rest of
    ``_SUMMARY_FIELDS``. Missing values are left out.
    """
    summary: dict[str, Any] = {"status": results.get("status")}
    summary.update(results.get("test") or {})
    summary.update({f"final/{k}": v for k, v in (results.get("final") or {}).items()})
    summary.update({f"results/{name}": _get(results, path) for name, path in _SUMMARY_FIELDS.items()})
    return {k: v for k, v in summary.items() if v is not None}


def wandb_runs(loggers) -> list:
    """The live W&B runs among a trainer's loggers (rank zero holds them)."""
    from lightning.pytorch.loggers import WandbLogger

    return [logger.experiment for logger in loggers if isinstance(logger, WandbLogger)]


def log_results(loggers, results: dict) -> None:
    """Put ``results_summary(results)`` into the summary of every W&B run among ``loggers``."""
    summary = results_summary(results)
    for run in wandb_runs(loggers):
        run.summary.update(summary)


def log_status(loggers, status: str) -> None:
    """Mark the W&B runs among ``loggers`` with ``status`` (a run that did not finish)."""
    for run in wandb_runs(loggers):
        run.summary["status"] = status


def log_checkpoints(loggers, checkpoint_dir: Path, results: dict) -> None:
    """Log the run's last and best checkpoints as one W&B model artifact (``model-<run id>``),
    with the run's results as the artifact's metadata. Works offline: the artifact is kept
    with the offline run and uploaded by ``wandb sync``."""
    import wandb

    files = {"last": checkpoint_dir / "last.ckpt"}
    best = _get(results, "best.path")
    if best:
        files["best"] = Path(best)
    files = {alias: path for alias, path in files.items() if path.is_file()}
    if not files:
        return
    for run in wandb_runs(loggers):
        artifact = wandb.Artifact(f"model-{run.id}", type="model", metadata=results_summary(results))
        for path in dict.fromkeys(files.values()):
            artifact.add_file(str(path), name=path.name)
        aliases = [*files, f"variant-{results.get('variant')}", f"seed-{results.get('seed')}"]
        run.log_artifact(artifact, aliases=[a.replace("=", "-").replace("/", "-") for a in aliases])
