"""LightningCLI for every experiment: ``python -m reproductions fit|validate|test --config X.yaml``.

On top of Lightning's CLI this adds the ``run`` group (``--run.*``), which decides where a run
writes and how it reports:

    runs/<experiment>/<variant>/seed<k>/
        config.yaml       the fully resolved config (replays the run)
        metrics.csv       CSV logs (train/loss, val/acc, ...)
        hparams.yaml      the module's hyper-parameters, parameter count, FLOPs per image
        checkpoints/      last.ckpt and the best by the module's monitored metric
        wandb/            the W&B run, when --run.wandb true
        results.json      written last and atomically, only when fit (and test) finished

``validate`` and ``test`` write their logs into ``<run dir>/<subcommand>/`` so they never
overwrite the training logs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lightning import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from lightning_modules.callbacks import EpochReseed, TrainingClock
from reproductions.results import RESULTS_FILE, environment, write_results
from reproductions.tracking import log_checkpoints, log_results, log_status, wandb_offline

REPRODUCTIONS_DIR = Path(__file__).resolve().parent
#: folders whose configs modify an experiment rather than name one (see ``experiment_name``)
OVERLAY_FOLDERS = {"overlays", "sources"}


@dataclass
class RunOptions:
    """Where a run writes, how it is named and how it reports.

    Args:
        root: directory that holds all runs.
        experiment: experiment name, the first level under ``root``; default: the config
            file's path under reproductions/ without ``configs/`` and the suffix
            (``reproductions/vit/configs/digits.yaml`` -> ``vit/digits``).
        variant: the ablation variant (a sweep sets it, e.g. ``pos_embed=learned_2d``).
        wandb: also log to Weights & Biases. Runs offline (files under the run directory,
            ``wandb sync`` later) unless an API key is configured or WANDB_MODE says otherwise.
        project: W&B project.
        group: W&B group; default: the experiment name, so a sweep's runs group together.
        tags: extra W&B tags; the experiment and variant are always added.
        log_model: at the end of a finished fit, log the last and the best checkpoint to W&B
            as one model artifact (aliases ``last``, ``best``, the variant and the seed). Offline
            runs keep it with the run and upload it on ``wandb sync``. Needs ``wandb: true``.
        test_after_fit: after ``fit``, evaluate on the test split and write results.json.
        test_ckpt: which weights the test after fit uses: ``final`` (the weights at the end
            of training) or ``best`` (the checkpoint with the best monitored validation metric).
    """

    root: str = "runs"
    experiment: str | None = None
    variant: str = "default"
    wandb: bool = False
    project: str = "attention-repro"
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    log_model: bool = False
    test_after_fit: bool = True
    test_ckpt: Literal["final", "best"] = "final"


def experiment_name(config_paths: list) -> str:
    """``reproductions/vit/configs/digits.yaml`` -> ``vit/digits``; no config -> ``default``.

    The last config names the experiment, skipping overlays: files in a folder named
    ``overlays`` (e.g. ``vit/configs/overlays/fsdp.yaml``: how a run is executed) or ``sources``
    (e.g. ``bst/sources/movielens_1m.yaml``: which data it reads). So ``--config
    bst/configs/wdl.yaml --config bst/sources/movielens_1m.yaml`` is ``bst/wdl``, and two models
    given the same overlay never share a run directory.
    """
    experiments = [p for p in config_paths if not OVERLAY_FOLDERS & set(Path(str(p)).parts[:-1])]
    if not experiments:
        return "default" if not config_paths else Path(str(config_paths[-1])).stem
    path = Path(str(experiments[-1])).resolve()
    try:
        rel = path.relative_to(REPRODUCTIONS_DIR)
    except ValueError:
        return path.stem
    parts = [p for p in rel.with_suffix("").parts if p != "configs"]
    return "/".join(parts)


class SaveAndLogConfig(SaveConfigCallback):
    """Save the resolved config.yaml (Lightning's behaviour) and send it to W&B as the run config."""

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        config = self.config.clone()
        config.pop("config", None)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.log_hyperparams(config.as_dict())


class ReproductionCLI(LightningCLI):
    """LightningCLI with run directories, results.json and a W&B switch."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("save_config_callback", SaveAndLogConfig)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)  # modules bind their own optimiser
        super().__init__(LightningModule, LightningDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(RunOptions, "run")

    # ------------------------------------------------------------------ run directory
    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand]
        run = cfg.run
        self.experiment = run.experiment or experiment_name(cfg.get("config") or [])
        self.seed = int(cfg.seed_everything)
        self.run_dir = Path(run.root) / self.experiment / run.variant / f"seed{self.seed}"
        self.log_dir = self.run_dir if self.subcommand == "fit" else self.run_dir / self.subcommand

    def _run_options(self) -> RunOptions:
        return RunOptions(**self.config[self.subcommand].run.as_dict())

    def _loggers(self, configured) -> list[Logger] | bool:
        if configured is False:
            return False
        run = self._run_options()
        loggers: list[Logger] = [CSVLogger(save_dir=str(self.log_dir), name="", version="")]
        if run.wandb:
            tags = list(dict.fromkeys([self.experiment, run.variant, *run.tags]))
            loggers.append(
                WandbLogger(
                    project=run.project,
                    group=run.group or self.experiment,
                    name=f"{self.experiment}/{run.variant}/seed{self.seed}",
                    tags=tags,
                    save_dir=str(self.log_dir),
                    offline=wandb_offline(),
                    job_type=self.subcommand,
                    # a run left open in this process (an earlier in-process run, a notebook) is
                    # closed first; wandb's default would hand that old run back instead
                    reinit="finish_previous",
                )
            )
        if isinstance(configured, Logger):
            loggers.append(configured)
        elif isinstance(configured, (list, tuple)):
            loggers.extend(configured)
        return loggers

    def instantiate_trainer(self, **kwargs) -> Trainer:
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        callbacks: list[Callback] = list(trainer_cfg.get("callbacks") or [])
        self.clock = TrainingClock()
        callbacks += [self.clock, EpochReseed(self.seed)]
        monitor, mode = getattr(self.model, "monitor", ("val/loss", "min"))
        if self.subcommand == "fit" and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            ckpt_dir = str(self.run_dir / "checkpoints")
            # Two callbacks: Lightning's save_last only refreshes last.ckpt in epochs that also
            # save a new best, which would make resuming restart from an older epoch.
            callbacks += [
                ModelCheckpoint(  # first: trainer.checkpoint_callback, ckpt_path="best"
                    dirpath=ckpt_dir, filename="best-epoch{epoch:03d}", auto_insert_metric_name=False,
                    monitor=monitor, mode=mode, save_top_k=1,
                ),
                ModelCheckpoint(  # every epoch end, overwritten: what --ckpt_path resumes from
                    dirpath=ckpt_dir, filename="last", monitor=None, save_top_k=1,
                    enable_version_counter=False,
                ),
            ]
        kwargs.setdefault("callbacks", callbacks)
        kwargs.setdefault("logger", self._loggers(trainer_cfg.get("logger")))
        kwargs.setdefault("default_root_dir", str(self.run_dir))
        return super().instantiate_trainer(**kwargs)

    # ------------------------------------------------------------------ fit -> test -> results
    def before_fit(self) -> None:
        if self.trainer.is_global_zero:
            # A rerun into the same directory must not leave an old result looking current.
            (self.run_dir / RESULTS_FILE).unlink(missing_ok=True)
        rank_zero_info(f"run directory: {self.run_dir}")

    def _finish_wandb(self) -> None:
        """Close this run's W&B run (flushes its files; the next run in this process gets its own)."""
        for logger in self.trainer.loggers:
            if isinstance(logger, WandbLogger) and self.trainer.is_global_zero:
                logger.experiment.finish()

    def after_validate(self) -> None:
        self._finish_wandb()

    def after_test(self) -> None:
        self._finish_wandb()

    def after_fit(self) -> None:
        try:
            self._after_fit()
        finally:
            self._finish_wandb()

    def _after_fit(self) -> None:
        trainer = self.trainer
        if trainer.interrupted or trainer.state.status.value != "finished":
            rank_zero_info("fit did not finish: no results.json written")
            log_status(trainer.loggers, "interrupted" if trainer.interrupted else "failed")
            return
        run = self._run_options()
        if trainer.fast_dev_run:
            if run.test_after_fit:
                trainer.test(self.model, datamodule=self.datamodule, verbose=False)
            rank_zero_info("fast_dev_run: a smoke test, so no results.json is written")
            return
        # trainer.test resets callback_metrics: keep the end-of-training values first
        final_metrics = {
            k: float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith(("train/", "val/")) and not k.endswith("samples_per_sec")  # timing is in "training"
        }
        test_metrics: dict = {}
        if run.test_after_fit:
            ckpt = "best" if run.test_ckpt == "best" else None
            outputs = trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt, verbose=False)
            test_metrics = dict(outputs[0]) if outputs else {}
        if trainer.is_global_zero:
            results = self.collect_results(test_metrics, final_metrics)
            write_results(self.run_dir, results)
            log_results(trainer.loggers, results)  # the same numbers into the W&B run summary
            if run.log_model:
                log_checkpoints(trainer.loggers, self.run_dir / "checkpoints", results)
            shown = ", ".join(f"{k} = {v:.4f}" for k, v in sorted(test_metrics.items()))
            print(f"\n{self.experiment}/{run.variant}/seed{self.seed}: {shown or 'no test run'}")
            print(f"results: {self.run_dir / RESULTS_FILE}", flush=True)

    def collect_results(self, test_metrics: dict, final_metrics: dict) -> dict:
        trainer, model, data = self.trainer, self.model, self.datamodule
        run = self._run_options()
        ckpt = trainer.checkpoint_callback
        flops = getattr(model, "flops_per_sample", None)
        clock = self.clock.summary()
        global_batch = getattr(data, "batch_size", None)
        samples_seen = None
        if global_batch is not None:
            samples_seen = int(trainer.global_step * global_batch * trainer.accumulate_grad_batches)
        return {
            "status": "finished",
            "experiment": self.experiment,
            "variant": run.variant,
            "seed": self.seed,
            "run_dir": str(self.run_dir),
            "test": {k: float(v) for k, v in test_metrics.items()},
            "test_ckpt": run.test_ckpt,
            "final": final_metrics,
            "best": {
                "monitor": getattr(ckpt, "monitor", None),
                "score": None if ckpt is None or ckpt.best_model_score is None else float(ckpt.best_model_score),
                "path": None if ckpt is None else ckpt.best_model_path or None,
            },
            "model": {
                "module": type(model).__name__,
                "net": type(getattr(model, "net", model)).__name__,
                "params": getattr(model, "num_params", None),
                "flops_per_sample": flops,
            },
            "training": {
                "epochs": trainer.current_epoch,
                "steps": trainer.global_step,
                "global_batch_size": global_batch,
                "samples_seen": samples_seen,
                # backward ~ 2x forward: the usual 3x forward FLOPs per training sample
                "total_train_flops": None if flops is None or samples_seen is None else 3 * flops * samples_seen,
                "devices": trainer.world_size,
                "num_nodes": trainer.num_nodes,
                "precision": str(trainer.precision),
                # the lr the optimiser got: the configured one, scaled to the global batch if
                # the module's lr_scaling says so
                "lr_scaling": getattr(model, "hparams", {}).get("lr_scaling"),
                "effective_lr": getattr(model, "effective_lr", None),
                **clock,
            },
            "data": data.describe() if hasattr(data, "describe") else {"class": type(data).__name__},
            **environment(),
        }


def main(args: list[str] | None = None) -> ReproductionCLI:
    return ReproductionCLI(args=args)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
