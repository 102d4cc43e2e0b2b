"""Sharded data parallelism with PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

``FSDP2Strategy`` is Lightning's ``ModelParallelStrategy`` set up for plain sharded data
parallelism: every process is one data-parallel rank (a 1-D mesh of ``devices x num_nodes``;
tensor parallelism off), checkpoints are one ordinary file by default, and the Trainer's
``precision`` flag is replaced by FSDP2's own mixed precision (``MixedPrecisionPolicy``) so that
nothing is cast twice. The strategy does not shard anything itself: as ``ModelParallelStrategy``
requires, the LightningModule does it in ``configure_model`` (``TrainingModule`` calls
``shard_net``, with the strategy's ``sharding_options()``).

``shard_net`` applies ``fully_shard`` in place: one FSDP unit per module of ``net.shard_units()``
(the ViT's blocks; the hybrid's ResNet stages and blocks), then the root (``net`` itself: the
stem, position embeddings, final norm and head). Each parameter becomes a ``DTensor`` holding
this rank's 1/N slice (dim 0) of it; a unit's parameters are all-gathered just before its
forward and backward and freed after them, and gradients are reduce-scattered, so each rank
keeps 1/N of the parameters, gradients and optimiser state. Options:

- mixed precision (``param_dtype``): ``bfloat16`` computes and reduces gradients in bf16
  (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``) while the sharded parameters
  the optimiser updates stay fp32 (the master weights); the root's output (the logits) is cast
  back to fp32 so the loss is fp32. ``float32``: no casts at all.
- ``activation_checkpointing``: each unit's forward runs under ``torch.utils.checkpoint``
  (non-reentrant): its activations are recomputed in the backward pass instead of kept
  (less memory, about one more forward of compute). Parameter names do not change.
- ``compile_mode``: ``torch.compile`` each unit in place (``nn.Module.compile``) before it is
  sharded (per block, as torchtitan does; the root's few layers stay eager).

Nothing here knows the ViT: a net names its units with a ``shard_units()`` method; a net without
one is sharded as a single root unit (each rank still holds 1/N of every parameter, but the whole
net is gathered at once).
"""

from __future__ import annotations

import functools
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from utils.choices import check_choice

#: FSDP2's compute dtype: ``auto`` is bf16 on CUDA devices and fp32 elsewhere (bf16 matmuls on
#: CPUs without bf16 units are 10-20x slower than fp32), unless the Trainer's precision flag is
#: ``bf16-mixed``, which asks for bf16 on any device
MixedPrecisionChoice = Literal["auto", "bf16", "fp32"]
#: the Trainer precision flags the strategy accepts (others cast the whole module or need a
#: gradient scaler, neither of which composes with FSDP2's own mixed precision)
SUPPORTED_PRECISION = ("32-true", "bf16-mixed")


def resolve_param_dtype(mixed_precision: MixedPrecisionChoice, precision_flag: str, device_type: str) -> torch.dtype:
    """FSDP2's compute dtype: ``bf16``/``fp32`` as asked; ``auto``: bf16 if the Trainer's flag is
    ``bf16-mixed`` or the device is CUDA, else fp32. A flag other than ``32-true`` and
    ``bf16-mixed`` is a ValueError (``bf16-true`` would cast the fp32 master weights, ``16-mixed``
    needs a gradient scaler)."""
    check_choice("mixed_precision", mixed_precision, MixedPrecisionChoice)
    if precision_flag not in SUPPORTED_PRECISION:
        raise ValueError(
            f"FSDP2Strategy: trainer.precision={precision_flag!r} is not supported: leave it at '32-true' (mixed "
            "precision is the strategy's: --trainer.strategy.init_args.mixed_precision auto|bf16|fp32, auto = bf16 "
            "on GPUs) or give 'bf16-mixed'"
        )
    if mixed_precision != "auto":
        return torch.bfloat16 if mixed_precision == "bf16" else torch.float32
    return torch.bfloat16 if precision_flag == "bf16-mixed" or device_type == "cuda" else torch.float32


def shard_units(net: nn.Module) -> list[nn.Module]:
    """The submodules ``net`` wants as separate FSDP units (``net.shard_units()``), else none."""
    units = getattr(net, "shard_units", None)
    return list(units()) if callable(units) else []


def is_sharded(module: nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def checkpoint_activations(module: nn.Module) -> None:
    """Recompute ``module``'s activations in the backward pass (``torch.utils.checkpoint``,
    non-reentrant, RNG state preserved), in place: its ``forward`` is wrapped, its parameters and
    their names stay as they are. Applied before ``fully_shard``, so FSDP's all-gather for the
    backward happens before the recomputation needs the parameters."""
    if getattr(module, "_checkpointed_forward", False):
        return
    forward = module.forward

    @functools.wraps(forward)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed
    module._checkpointed_forward = True


def shard_net(
    net: nn.Module,
    mesh,
    *,
    param_dtype: torch.dtype = torch.float32,
    activation_checkpointing: bool = False,
    reshard_after_forward: bool = True,
    compile_mode: Optional[str] = None,
) -> None:
    """``fully_shard`` ``net`` over the 1-D device mesh ``mesh``, in place, once: each of
    ``shard_units(net)`` (optionally activation-checkpointed and compiled first), then the root.

    ``param_dtype``: the compute and gradient-reduction dtype (bf16 or fp32); the sharded
    parameters keep their own dtype (fp32). ``reshard_after_forward``: free each unit's gathered
    parameters after its forward (ZeRO-3; False keeps them until the backward, ZeRO-2-like, more
    memory and one all-gather less per unit). ``compile_mode``: None for no ``torch.compile``,
    else its mode (``default`` for torch's default).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if is_sharded(net):
        return
    if mesh.ndim != 1:
        raise ValueError(f"shard_net needs a 1-D data-parallel mesh, got {mesh.ndim} dimensions ({mesh})")
    if param_dtype == torch.float32:
        unit_policy = root_policy = MixedPrecisionPolicy()  # no casts at all
    else:
        unit_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=param_dtype)
        root_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=param_dtype,
                                           output_dtype=torch.float32)  # the loss sees fp32 logits
    for unit in shard_units(net):
        if activation_checkpointing:
            checkpoint_activations(unit)
        if compile_mode is not None and getattr(unit, "_compiled_call_impl", None) is None:
            unit.compile(mode=None if compile_mode == "default" else compile_mode)
        fully_shard(unit, mesh=mesh, mp_policy=unit_policy, reshard_after_forward=reshard_after_forward)
    fully_shard(net, mesh=mesh, mp_policy=root_policy, reshard_after_forward=reshard_after_forward)


def optimizer_state_by_name(state: dict, optimizer: torch.optim.Optimizer, module: nn.Module) -> dict:
    """An optimiser state dict keyed by parameter index (``torch.optim``'s own format, and what
    Lightning writes for a full checkpoint) re-keyed by the parameter names of ``module``.

    The k-th index listed in the saved group g belongs to the k-th parameter of ``optimizer``'s
    group g: the rule ``Optimizer.load_state_dict`` applies. Lightning's FSDP2 loader instead
    reads index i as the i-th parameter of ``module.parameters()``, which is right only for
    checkpoints that FSDP2 itself wrote; with more than one parameter group (the weight-decay
    groups) a DDP or single-device checkpoint would get its moments on the wrong parameters.
    A state already keyed by name is returned as it is."""
    if not state.get("state") or not all(isinstance(k, int) for k in state["state"]):
        return state
    saved, current = state["param_groups"], optimizer.param_groups
    sizes = ([len(g["params"]) for g in saved], [len(g["params"]) for g in current])
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"the checkpoint's optimiser has parameter groups of sizes {sizes[0]}, this run's {sizes[1]}: "
            "not the same model and weight-decay groups"
        )
    names = {id(p): n for n, p in module.named_parameters()}
    by_index = {i: names[id(p)] for g, h in zip(saved, current) for i, p in zip(g["params"], h["params"])}
    return {
        "state": {by_index[i]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [by_index[i] for i in g["params"]]} for g in saved],
    }


class ShardedPrecision(Precision):
    """The Trainer's precision plugin under ``FSDP2Strategy``: no autocast, no module cast, no
    gradient scaler; the mixed precision is FSDP2's ``MixedPrecisionPolicy`` (see ``shard_net``).
    ``precision`` names what runs (``bf16-mixed`` or ``32-true``), so ``trainer.precision`` and
    results.json report the truth."""

    def __init__(self, precision: str) -> None:
        self.precision = precision


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as pure FSDP2 data parallelism.

    Args:
        mixed_precision: ``auto`` (default: bf16 on CUDA devices, fp32 on CPUs; bf16 anywhere if
            the Trainer's precision flag is ``bf16-mixed``), ``bf16`` or ``fp32``. bf16 computes
            and reduce-scatters gradients in bf16; the sharded master weights and the optimiser
            state stay fp32. Leave the Trainer's ``precision`` at ``32-true`` (or ``bf16-mixed``,
            read as a request for bf16): the strategy replaces Lightning's precision plugin by
            ``ShardedPrecision`` so autocast does not run on top of the policy; other flags
            (``bf16-true`` would cast the master weights, ``16-mixed`` needs a gradient scaler)
            are refused.
        activation_checkpointing: recompute each unit's activations in the backward pass.
        reshard_after_forward: free gathered parameters after each unit's forward (default).
        save_distributed_checkpoint: False (default): the full model and optimiser state are
            gathered to rank 0 and saved as one ordinary checkpoint file, which resumes on any
            number of processes (sharded or not) and loads into the plain model
            (``load_from_checkpoint``, ``analyze --ckpt``). True: a folder with one shard per
            rank (torch.distributed.checkpoint, also resumable on another world size), for models
            whose full state does not fit one host's memory; only this strategy reads it.
        process_group_backend, timeout: as ``ModelParallelStrategy`` (nccl on GPUs, gloo on CPUs).

    Every process is one data-parallel rank: the mesh is ``devices x num_nodes`` wide and the
    data are split over all of it (``data.batch_size`` stays the global batch).
    """

    def __init__(
        self,
        mixed_precision: MixedPrecisionChoice = "auto",
        activation_checkpointing: bool = False,
        reshard_after_forward: bool = True,
        save_distributed_checkpoint: bool = False,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = default_pg_timeout,
    ) -> None:
        check_choice("mixed_precision", mixed_precision, MixedPrecisionChoice)
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        self.mixed_precision = mixed_precision
        self.activation_checkpointing = bool(activation_checkpointing)
        self.reshard_after_forward = bool(reshard_after_forward)
        self._precision_flag: Optional[str] = None

    @property
    def param_dtype(self) -> torch.dtype:
        """The compute dtype FSDP2 casts the gathered parameters to (bf16 or fp32)."""
        flag = self._precision_flag or str(getattr(self.precision_plugin, "precision", "32-true"))
        return resolve_param_dtype(self.mixed_precision, flag, self.root_device.type)

    def setup_environment(self) -> None:
        # one data-parallel dimension over every process (the parent's "auto" would make it the
        # node count and the rest tensor parallel)
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        if self._precision_flag is None:  # the flag the Trainer was given, before it is replaced
            self._precision_flag = str(getattr(self.precision_plugin, "precision", "32-true"))
        dtype = self.param_dtype  # refuses an unsupported flag before any process group exists
        # no autocast on top of FSDP2's policy: the plugin names what runs, for trainer.precision
        self.precision_plugin = ShardedPrecision("bf16-mixed" if dtype == torch.bfloat16 else "32-true")
        super().setup_environment()

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict[str, Any]:
        """A one-file checkpoint (this strategy's default, or one written by DDP or a single
        device) is loaded here, its optimiser state re-keyed by ``optimizer_state_by_name``; a
        sharded folder goes to Lightning's loader."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, set_model_state_dict, set_optimizer_state_dict,
        )

        path = Path(self.broadcast(str(checkpoint_path)))
        if not path.is_file():
            return super().load_checkpoint(path, weights_only=weights_only)
        strict = self.lightning_module.strict_loading
        checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        # every rank reads the (memory-mapped) file and keeps its own slice of each tensor
        options = StateDictOptions(full_state_dict=True, strict=strict)
        set_model_state_dict(self.model, checkpoint.pop("state_dict"), options=options)
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states", [])):
            state = optimizer_state_by_name(state, optimizer, self.model)
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=state, options=options)
        return checkpoint

    def sharding_options(self) -> dict[str, Any]:
        """Keywords of ``shard_net`` for this run (the module adds ``compile_mode``)."""
        return dict(param_dtype=self.param_dtype, activation_checkpointing=self.activation_checkpointing,
                    reshard_after_forward=self.reshard_after_forward)
