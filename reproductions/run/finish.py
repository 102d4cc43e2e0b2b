"""The end of a subcommand: after a fit the test and results.json (written last and atomically, only
when the fit finished), the same numbers and files in W&B, the model artifact; after a validation
or test their W&B run's files. A part of ``ReproductionCLI`` (``reproductions/run/cli.py``)."""

from __future__ import annotations

import sys

from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info

from reproductions.run.artifacts import log_checkpoints
from reproductions.run.curve import plateau, read_curve
from reproductions.run.results import RESULTS_FILE, environment, fit_record, git_at_end, git_state, write_results
from reproductions.run.tracking import RUN_FILES, log_results, log_status, save_with_run, wandb_runs
from utils.stop import pause_at


class WritesResults:
    """``ReproductionCLI``'s Lightning hooks around a subcommand (``before_fit``, ``after_fit``,
    ``after_validate``, ``after_test``) and the run's environment record."""

    def before_fit(self) -> None:
        self.git_at_start = git_state()  # the code this run trains with, whatever the checkout does meanwhile
        rank_zero_info(f"run directory: {self.run_dir}")

    def _environment(self) -> dict:
        start = self.git_at_start
        trainer = getattr(self, "trainer", None)
        try:
            device = trainer.strategy.root_device.type if trainer is not None else None
        except Exception:  # noqa: BLE001 - a strategy that never set up: the default device
            device = None
        return environment(git=None if start is None else git_at_end(start), device=device)

    def _finish_wandb(self) -> None:
        """Close this run's W&B run (flushes its files; the next run in this process gets its own)."""
        for logger in self.trainer.loggers:
            # a run that never started W&B (failed before setup) does not start it now to close it
            if isinstance(logger, WandbLogger) and self.trainer.is_global_zero and logger._experiment is not None:
                logger.experiment.finish()

    def _keep_files_with_evaluation(self) -> None:
        """An evaluation's W&B run gets copies of the run directory's files it evaluated (the fit's
        config.yaml, results.json, metrics.csv), as a fit's run has them."""
        if self.trainer.is_global_zero:
            for run in wandb_runs(self.trainer.loggers):
                save_with_run(run, self.run_dir, RUN_FILES)

    def after_validate(self) -> None:
        try:
            self._keep_files_with_evaluation()
        finally:
            self._finish_wandb()

    def after_test(self) -> None:
        try:
            self._keep_files_with_evaluation()
        finally:
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
        self.training_done = True
        self.signals.check()  # a signal at the last step (Lightning ends training there) or in the last validation
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
        # the fit's totals now: a test at the best checkpoint restores the callbacks' state from it
        # (the training clock's samples, times and throughput of an earlier epoch)
        fit = fit_record(self.trainer, self.model, self.datamodule, self.clock)
        stopped_early = self._stopped_early()  # before the test, which restores EarlyStopping's count too
        test_metrics: dict = {}
        if run.test_after_fit:
            self._say_test_padding()
            ckpt = "best" if run.test_ckpt == "best" else None
            outputs = trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt, verbose=False)
            test_metrics = dict(outputs[0]) if outputs else {}
            self.signals.check()  # a signal in the test's last batch: Lightning finishes the stage
        pause_at("report")
        if trainer.is_global_zero:
            results = self.collect_results(test_metrics, final_metrics, fit, stopped_early=stopped_early)
            write_results(self.run_dir, results)
            log_results(trainer.loggers, results, self.run_dir)  # the same numbers (and files) into W&B
            if run.log_model:
                log_checkpoints(trainer.loggers, self.run_dir / "checkpoints", results, self.run_dir)
            shown = ", ".join(f"{k} = {v:.4f}" for k, v in sorted(test_metrics.items()))
            print(f"\n{self.experiment}/{run.variant}/seed{self.seed}: {shown or 'no test run'}")
            print(f"results: {self.run_dir / RESULTS_FILE}", flush=True)

    def _say_test_padding(self) -> None:
        """Under DDP, Lightning's distributed sampler pads the test set to a multiple of the processes: say
        how many images it repeats (and so counts twice in the test metrics), if any."""
        world = self.trainer.world_size
        try:
            n = len(self.datamodule.test_dataset)
        except (AttributeError, TypeError):
            return
        if world > 1 and n % world and self.trainer.is_global_zero:
            print(f"test on {n} examples over {world} processes: the distributed sampler repeats "
                  f"{world - n % world} of them (counted twice in the test metrics); a 1-process "
                  "`repro test --ckpt_path ...` counts each once", file=sys.stderr, flush=True)

    def collect_results(self, test_metrics: dict, final_metrics: dict, fit: dict, *,
                        stopped_early: bool | None) -> dict:
        """results.json of a finished fit; ``fit``: ``fit_record`` taken when training ended;
        ``stopped_early``: ``_stopped_early`` then."""
        run = self._run_options()
        return {
            "status": "finished",
            "experiment": self.experiment,
            "variant": run.variant,
            "seed": self.seed,
            "run_dir": str(self.run_dir),
            "test": {k: float(v) for k, v in test_metrics.items()},
            "test_ckpt": run.test_ckpt,
            "final": final_metrics,
            **fit,
            "plateau": self._plateau(fit, stopped_early),
            **self._environment(),
        }

    def _stopped_early(self) -> bool | None:
        """Whether an EarlyStopping callback ended the fit (None without one). Read when training
        ends: a test at the best checkpoint restores the callbacks' state from it, and there the
        count of checks without improvement is 0."""
        stoppers = [c for c in self.trainer.callbacks if isinstance(c, EarlyStopping)]
        return any(c.wait_count >= c.patience for c in stoppers) if stoppers else None

    def _plateau(self, fit: dict, stopped_early: bool | None) -> dict:
        """Whether the monitored validation metric stopped improving (reproductions/run/curve.py)."""
        return plateau(read_curve(self.log_dir / "metrics.csv"), (fit.get("best") or {}).get("monitor"),
                       stopped_early=stopped_early, val_size=(fit.get("data") or {}).get("val_size"))
