"""``TrainingModule``: the training logic every LightningModule here shares.

``ImageClassifier`` (``image_classifier.py``) and ``CTRModule`` (``ctr.py``) subclass it and add
only what is theirs: the loss, the metrics per stage, the batch unpacking, the metric
checkpoints and early stopping watch (``monitor``) and the checks of the net against the data.
The base holds:

- the recipe arguments both take (``lr``, ``weight_decay``, ``betas``, ``warmup_steps``,
  ``min_lr_ratio``, ``lr_scaling``, ``base_batch_size``, ``compile``, ``compile_mode``) and
  their checks; a subclass takes them through ``**kwargs`` and redeclares only those whose
  default differs. The hparams are saved without the net (see ``__init__``);
- the optimiser: AdamW (``optimizer_class`` may choose another) on the weight-decay groups of
  ``parameter_groups`` (default: timm's ``param_groups_weight_decay``, which spares parameters
  with fewer than two dimensions, plus the names in ``net.no_weight_decay()``). The groups are
  made in ``configure_model``, by name, from the parameters the optimiser will update: under
  FSDP2 (``lightning_modules.sharding.FSDP2Strategy``) after ``fully_shard``, which replaces
  every parameter by a new ``DTensor`` Parameter (its ``ndim`` and name are the full
  parameter's, so the rule sees the same matrices); under the other strategies before they wrap
  the module (Lightning's FSDP1 with ``use_orig_params`` turns parameters into flat 1-D views,
  so groups made after it would decay nothing: they are kept by parameter identity). Gradient
  norm clipping is PyTorch's ``clip_grad_norm_``, which computes the global norm over DTensor
  shards; under FSDP1 it goes through FSDP's own ``clip_grad_norm_``;
- sharding (``configure_model``): under a ``ModelParallelStrategy`` (``FSDP2Strategy``) the net
  is ``fully_shard``-ed, one unit per module of ``net.shard_units()`` then the root
  (``lightning_modules.sharding.shard_net``);
- the schedule (``lr_schedule``): linear warm-up, then constant or cosine decay to
  ``lr * min_lr_ratio`` (``warmup_schedule``), stepped per optimiser step;
- the learning rate following the global batch (``lr_scaling``, ``scaled_lr``); the effective
  rate and global batch are logged to the hparams (and by the CLI to ``results.json``);
- ``torch.compile`` of the net in place (``compile_in_place``), in ``configure_model``; under
  FSDP2 each shard unit (block) is compiled in place before it is sharded instead;
- the parameter count (at construction) and forward FLOPs per sample (once, at ``setup``, on
  the example ``inspect_data`` returns), both logged to the hparams at fit start.
Throughput is measured by ``callbacks.TrainingClock``, for every module alike.

Why the optimiser is not injected (LightningCLI's ``--optimizer`` / ``--lr_scheduler``, or an
``optimizer: OptimizerCallable`` argument): the injected class would own ``lr``,
``weight_decay`` and ``betas`` (``model.init_args.optimizer.init_args.lr``), and every config,
sweep grid and README command sets them as ``model.init_args.lr`` etc.; keeping both would
leave two places for one number. The rate the optimiser gets is also not the configured one
(``lr_scaling`` rescales it with the global batch, known only once the trainer is attached),
the decay value is needed earlier than the optimiser (the groups are made in
``configure_model``), and the schedule's length comes from
``trainer.estimated_stepping_batches``. So the arguments stay explicit and
``configure_optimizers`` builds the optimiser and schedule from them.
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any, Literal, Optional

import torch
from lightning import LightningModule
from timm.optim import param_groups_weight_decay
from torch import nn

from lightning_modules.model_stats import count_flops, count_parameters
from lightning_modules.sharding import is_sharded, shard_net
from utils.choices import check_choice, choices
from utils.stop import pause_at

#: the rate after warm-up: held (``constant``) or cosine-decayed to ``lr * min_lr_ratio``
Schedule = Literal["constant", "cosine"]
#: how the configured ``lr`` follows the global batch: not at all (the default: a config's lr is
#: for its own global batch), linearly (Goyal et al. 2017, SGD) or with the square root (the
#: usual rule for Adam-type optimisers)
LRScaling = Literal["none", "linear", "sqrt"]
#: ``torch.compile`` modes (``default`` is torch's own default)
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
SCHEDULES = choices(Schedule)
LR_SCALINGS = choices(LRScaling)
COMPILE_MODES = choices(CompileMode)


# --------------------------------------------------------------------------- schedule


def warmup_schedule(
    step: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0, schedule: Schedule = "cosine"
) -> float:
    """Learning-rate multiplier at optimiser step ``step`` (from 0).

    Linear warm-up from 1/warmup_steps to 1 over ``warmup_steps``, then constant (``schedule=
    'constant'``) or cosine decay to ``min_lr_ratio`` at ``total_steps`` (and flat after).
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --------------------------------------------------------------------------- learning-rate scaling


def _check_lr_scaling(lr_scaling: LRScaling, base_batch_size: int | None) -> None:
    """Raise ValueError for an unknown rule, or a scaling rule without a positive base batch."""
    check_choice("lr_scaling", lr_scaling, LRScaling)
    if base_batch_size is not None and (isinstance(base_batch_size, bool) or base_batch_size < 1):
        raise ValueError(f"base_batch_size={base_batch_size!r} must be a positive integer")
    if lr_scaling != "none" and base_batch_size is None:
        raise ValueError(
            f"lr_scaling={lr_scaling!r} needs base_batch_size: the global batch the configured lr was tuned for"
        )


def scaled_lr(lr: float, *, lr_scaling: LRScaling, global_batch: int | None, base_batch_size: int | None) -> float:
    """The learning rate a run uses: ``lr`` for ``none``; ``lr * k`` for ``linear`` and
    ``lr * sqrt(k)`` for ``sqrt``, where ``k = global_batch / base_batch_size``."""
    _check_lr_scaling(lr_scaling, base_batch_size)
    if lr_scaling == "none":
        return float(lr)
    if global_batch is None or global_batch < 1:
        raise ValueError(
            f"lr_scaling={lr_scaling!r} needs the global batch size, got {global_batch!r}: train with a "
            "DataModule that has a batch_size (the global batch, as the DataModules here define it)"
        )
    ratio = global_batch / base_batch_size
    return float(lr) * (ratio if lr_scaling == "linear" else math.sqrt(ratio))


def global_batch_size(trainer) -> int | None:
    """Samples per optimiser step: the DataModule's ``batch_size`` (the global batch, which it
    splits over devices x nodes) times ``accumulate_grad_batches``; None without a DataModule
    batch size."""
    batch = getattr(getattr(trainer, "datamodule", None), "batch_size", None)
    if not isinstance(batch, int) or isinstance(batch, bool):
        return None
    return batch * int(getattr(trainer, "accumulate_grad_batches", 1) or 1)


# --------------------------------------------------------------------------- torch.compile


def is_compiled(net: nn.Module) -> bool:
    """Whether ``net`` was compiled in place (``nn.Module.compile``)."""
    return getattr(net, "_compiled_call_impl", None) is not None


def compile_in_place(net: nn.Module, mode: CompileMode = "default") -> None:
    """``torch.compile`` ``net``'s forward in place (``nn.Module.compile``), once.

    In place, not ``net = torch.compile(net)``: the module stays the same object with the same
    parameters, so state_dict keys keep their plain names (no ``_orig_mod.`` prefix) and a
    checkpoint moves freely between compiled and uncompiled modules; attribute access, hooks
    and ``explicit_attention`` work on the module as before. Compilation itself happens at the
    first call.
    """
    check_choice("compile_mode", mode, CompileMode)
    if not is_compiled(net):
        net.compile(mode=None if mode == "default" else mode)


def _uses_fsdp(module: LightningModule) -> bool:
    trainer = module._trainer
    if trainer is None:
        return False
    from lightning.pytorch.strategies import FSDPStrategy

    return isinstance(getattr(trainer, "strategy", None), FSDPStrategy)


# --------------------------------------------------------------------------- the module


class TrainingModule(LightningModule):
    """Optimiser, schedule, lr scaling, compile and model statistics for an injected ``net``.

    Args:
        net: the network (``self.net``).
        lr: peak learning rate (after warm-up), for the global batch as configured.
        weight_decay: decoupled weight decay (AdamW) on the decayed group of
            ``parameter_groups``; must be >= 0.
        betas: Adam(W) betas.
        warmup_steps: linear warm-up length in optimiser steps; None: none, unless the
            subclass derives one (``ImageClassifier``: from ``warmup_fraction``).
        min_lr_ratio: the cosine schedule ends at ``lr * min_lr_ratio``; in [0, 1].
        lr_scaling: ``none`` (default: ``lr`` as given, for the config's global batch),
            ``linear`` or ``sqrt``: the optimiser gets ``lr * k`` or ``lr * sqrt(k)`` with
            ``k = global batch / base_batch_size``; the global batch is the DataModule's
            ``batch_size`` (already the global batch, split over devices x nodes) times
            ``accumulate_grad_batches``.
        base_batch_size: the global batch ``lr`` was tuned for (needed by ``linear``/``sqrt``).
        compile: ``torch.compile`` the net (in place, in ``configure_model``). Costs compile
            time at the first steps (about a minute on a CPU); pays off on GPUs.
        compile_mode: torch.compile's ``mode``.

    Subclasses set ``monitor`` and may override ``parameter_groups``, ``optimizer_class``,
    ``lr_schedule`` and ``inspect_data``.
    """

    #: the metric ModelCheckpoint and early stopping watch, and in which direction
    monitor: tuple[str, str]

    def __init__(
        self,
        net: nn.Module,
        *,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: Optional[int] = None,
        min_lr_ratio: float = 0.0,
        lr_scaling: LRScaling = "none",
        base_batch_size: Optional[int] = None,
        compile: bool = False,
        compile_mode: CompileMode = "default",
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"lr={lr!r} must be positive")
        if weight_decay < 0:
            raise ValueError(f"weight_decay={weight_decay!r} must be >= 0")
        if warmup_steps is not None and warmup_steps < 0:
            raise ValueError(f"warmup_steps={warmup_steps!r} must be >= 0")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={min_lr_ratio!r} must be in [0, 1]")
        _check_lr_scaling(lr_scaling, base_batch_size)
        check_choice("compile_mode", compile_mode, CompileMode)
        self._save_hparams_without_net(inspect.currentframe())
        self.net = net
        self.num_params: int = count_parameters(net)
        self.flops_per_sample: int | None = None
        self.effective_lr: float | None = None  # set by configure_optimizers
        self.global_batch_size: int | None = None
        self._param_groups: list[dict] | None = None  # weight-decay groups, made before any wrapping

    def _save_hparams_without_net(self, frame) -> None:
        """``save_hyperparameters`` with every constructor's arguments, this one's and the
        subclass's (Lightning walks the ``__init__`` frames outward from ``frame``).

        Under LightningCLI the hparams hold the net's *config*, so ``load_from_checkpoint`` can
        rebuild it; called directly they would hold the module itself, which the checkpoint's
        state_dict already stores: drop it then.
        """
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`.*")
            self.save_hyperparameters(frame=frame)
        if isinstance(self.hparams.get("net"), nn.Module):
            del self.hparams["net"]

    def forward(self, x: Any) -> Any:
        return self.net(x)

    # ---------------------------------------------------------------- setup
    def inspect_data(self, datamodule) -> Any:
        """Check the net against ``datamodule`` (None when fitting on bare loaders), raising
        ValueError on a mismatch; return one sample as a batch of one for the FLOP count, or
        None to skip it. The default checks nothing and counts nothing."""
        return None

    def setup(self, stage: str) -> None:
        """Check the net against the data before any step runs, and count FLOPs once."""
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        example = self.inspect_data(datamodule)
        if self.flops_per_sample is None and example is not None:
            try:
                pause_at("flops")  # the test hook (utils/stop.py): a signal here must stop the run, not the count
                self.flops_per_sample = count_flops(self.net, example)
            except Exception as err:  # FLOPs are a report nicety, never a reason to stop a run (a signal is not
                # an Exception: it stops the run)
                warnings.warn(f"could not count FLOPs: {err}", stacklevel=2)

    def configure_model(self) -> None:
        """Runs after ``setup`` (FLOPs are counted on the plain net) and before the strategy
        wraps the module (DDP, FSDP); called again by every later fit/validate/test, so
        idempotent: shards once (under ``ModelParallelStrategy``), makes the weight-decay groups
        once from the parameters the optimiser will see, compiles once."""
        compile_mode = self.hparams.get("compile_mode", "default") if self.hparams.get("compile") else None
        mesh = self._data_parallel_mesh()
        if mesh is not None:
            if not is_sharded(self.net):
                shard_net(self.net, mesh, compile_mode=compile_mode, **self._sharding_options())
                self._param_groups = None  # fully_shard replaced every parameter: group the new ones
        elif compile_mode is not None:
            compile_in_place(self.net, compile_mode)
        if self._param_groups is None:
            self._param_groups = self.parameter_groups()

    def _data_parallel_mesh(self):
        """The 1-D data-parallel device mesh to shard over under a ``ModelParallelStrategy``
        (``FSDP2Strategy``), else None. Tensor parallelism is not supported."""
        mesh = self.device_mesh if self._trainer is not None else None
        if mesh is None:
            return None
        names = mesh.mesh_dim_names or ()
        if "tensor_parallel" in names and mesh["tensor_parallel"].size() > 1:
            raise ValueError(
                f"{type(self).__name__} shards over data parallelism only, but the device mesh has "
                f"tensor_parallel size {mesh['tensor_parallel'].size()}: use "
                "lightning_modules.sharding.FSDP2Strategy (reproductions/vit/configs/overlays/fsdp.yaml), or "
                "ModelParallelStrategy with tensor_parallel_size=1"
            )
        return mesh["data_parallel"] if "data_parallel" in names else mesh

    def _sharding_options(self) -> dict[str, Any]:
        """``shard_net``'s options: the ``FSDP2Strategy``'s, else bf16 on CUDA and fp32 elsewhere."""
        strategy = self.trainer.strategy
        if hasattr(strategy, "sharding_options"):
            return strategy.sharding_options()
        on_cuda = strategy.root_device.type == "cuda"
        return dict(param_dtype=torch.bfloat16 if on_cuda else torch.float32)

    def on_fit_start(self) -> None:
        """Parameter count, FLOPs and the effective learning rate into every logger's hparams
        (hparams.yaml, the W&B config), next to the configured values."""
        stats: dict[str, Any] = {"model/params": self.num_params}
        if self.flops_per_sample is not None:
            stats["model/flops_per_sample"] = self.flops_per_sample
        if self.effective_lr is not None:
            stats["optim/effective_lr"] = self.effective_lr
            stats["optim/lr_scaling"] = self.hparams.get("lr_scaling", "none")
            if self.global_batch_size is not None:
                stats["optim/global_batch_size"] = self.global_batch_size
        for logger in self.loggers:
            logger.log_hyperparams(stats)

    def log_lr(self) -> None:
        """Log the current learning rate (``train/lr``) at this step."""
        if self._trainer is not None and self.trainer.optimizers:
            self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], on_step=True, on_epoch=False)

    # ---------------------------------------------------------------- optimiser
    def parameter_groups(self) -> list[dict]:
        """The optimiser's parameter groups, each with its ``weight_decay``: by default timm's
        (parameters with fewer than two dimensions, i.e. norms and biases, and the names in
        ``net.no_weight_decay()``, e.g. position embeddings and the class token, are not
        decayed; the rest are). Made once, in ``configure_model``."""
        no_decay = set(self.net.no_weight_decay()) if hasattr(self.net, "no_weight_decay") else set()
        return param_groups_weight_decay(self.net, self.hparams.weight_decay, no_weight_decay_list=no_decay)

    def optimizer_class(self) -> type[torch.optim.Optimizer]:
        """The optimiser, called as ``cls(groups, lr=..., betas=...)``: AdamW."""
        return torch.optim.AdamW

    def lr_schedule(self) -> dict[str, Any] | None:
        """``warmup_schedule``'s keywords for this run, or None for a constant rate without a
        scheduler. Default: warm-up over ``warmup_steps`` (None: 0), then cosine decay to
        ``lr * min_lr_ratio`` at the last optimiser step."""
        total = int(self.trainer.estimated_stepping_batches)
        return dict(warmup_steps=self.hparams.warmup_steps or 0, total_steps=total, schedule="cosine",
                    min_lr_ratio=self.hparams.min_lr_ratio)

    def resolve_lr(self) -> tuple[float, int | None]:
        """``(lr the optimiser gets, global batch)``: the configured ``lr`` scaled by
        ``lr_scaling`` with the attached trainer's global batch."""
        h = self.hparams
        batch = global_batch_size(self._trainer) if self._trainer is not None else None
        rule = h.get("lr_scaling", "none")
        return scaled_lr(h.lr, lr_scaling=rule, global_batch=batch, base_batch_size=h.get("base_batch_size")), batch

    def configure_optimizers(self):
        groups = self._param_groups
        if groups is None or {id(p) for g in groups for p in g["params"]} != {
            id(p) for p in self.net.parameters() if p.requires_grad
        }:  # not made yet, or the net's parameters were replaced since
            groups = self._param_groups = self.parameter_groups()
        groups = [dict(g) for g in groups if g["params"]]  # the optimiser adds its keys to the dicts it gets
        self.effective_lr, self.global_batch_size = self.resolve_lr()
        for group in groups:  # a group with its own rate follows the batch as lr does
            if "lr" in group:
                group["lr"] *= self.effective_lr / self.hparams.lr
        optimizer = self.optimizer_class()(groups, lr=self.effective_lr, betas=tuple(self.hparams.betas))
        schedule = self.lr_schedule()
        if schedule is None:
            return optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_schedule(step, **schedule))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping (``torch.nn.utils.clip_grad_norm_``; under FSDP2 the gradients
        are DTensors and it computes the global norm over all shards), except norm clipping under
        Lightning's FSDP1 strategy, which Lightning refuses (there the function would see only
        this rank's flat shards): FSDP1's own ``clip_grad_norm_`` on the root module."""
        if _uses_fsdp(self) and gradient_clip_algorithm in (None, "norm"):  # also GradClipAlgorithmType.NORM
            if gradient_clip_val:  # Lightning hands the hook the trainer's gradient_clip_val
                self.trainer.model.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
