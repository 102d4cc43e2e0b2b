"""Reusing finished runs (``sweep ... --reuse``): a planned run whose resolved config and seed
equal those of a run already finished elsewhere under the same root is copied from it instead of
trained again.

Sweeps share configurations: the ViT baseline (learned 1-D, class token, the recipe's learning
rate, patch 4) is a variant of ``vit/position``, ``vit/pooling``, ``vit/patch_size``,
``vit/attention`` and ``vit/relative`` at the same profile, and a CPU run is deterministic on
the same hardware and software, so training it again there gives the same numbers for the same
compute.

What "equal" means. The planned run's config is resolved exactly as ``fit`` resolves it (the same
parser, the same ``--config`` files and overrides) and dumped as ``config.yaml`` is; it is
compared, as data, with each finished run's ``config.yaml``, leaving out only what names a run
rather than what it computes: the ``run`` section (experiment, variant, group, tags, W&B) and
``config`` (the paths of the config files, whose content is already resolved). The seed is part
of the config (``seed_everything``). The code is not compared: the copied ``results.json`` keeps
the source's ``git`` commit, and the copy says where it came from (``reused_from``); after a
change to the code that alters results, train again (leave out ``--reuse``).

The hardware is compared. Another CPU type (another instruction set: AVX2 against AVX-512) or
another GPU picks other kernels, whose float reductions round differently: the same config and
seed then give another, equally valid draw (on Fashion-MNIST at 196 tokens, 84.44 on one 2-core
VM type and 84.36 on another, seed 0). A finished twin is copied only when its ``results.json``
names the hardware the planned run would use on this machine (``hardware`` in
reproductions/run/results.py: the CPU and its instruction set, or the GPU model); a twin from other
hardware, or from before ``results.json`` recorded it, is named in the output and the run trains.

What is copied. Everything in the source run directory but its lock, its W&B files and its
``stdout.log`` (the copy's log starts with one line naming the source, then the source's log);
``config.yaml`` is the planned run's own dump (its ``run`` section names the new experiment);
``results.json`` is the source's with the new run's names, command and paths, plus
``reused_from``, written last and atomically: until it is there the run counts as not finished,
so an interrupted copy is trained (or copied) again on the next sweep. A run directory that
holds checkpoints of an earlier attempt is not copied into: that run resumes instead. A copy is
not logged to W&B: the source's W&B run, in the source's group, is the record there.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from reproductions.run.results import RESULTS_FILE, hardware, hardware_label, read_results, same_hardware, write_results
from reproductions.sweeping.plan import LOG_FILE, Run
from utils.atomic import atomic_write_text

CONFIG_FILE = "config.yaml"
#: top-level config keys that name a run rather than what it computes
NAMING_KEYS = ("run", "config")
#: what is not copied from the source run directory
NOT_COPIED = ("run.lock*", "wandb", LOG_FILE, RESULTS_FILE, CONFIG_FILE)


def config_key(config: dict[str, Any]) -> str:
    """The comparable part of a resolved config, as one canonical string."""
    return json.dumps({k: v for k, v in config.items() if k not in NAMING_KEYS}, sort_keys=True, default=str)


#: resolve_config's parsers, one per subcommand, built at the first resolution in this process
_PARSERS: dict[str | None, tuple[Any, dict, dict]] = {}


def resolve_config(args: Sequence[str]) -> str:
    """The ``config.yaml`` text ``python -m reproductions <args>`` would write, without running it.

    The repository's CLI parses ``args`` (``fit --config ... overrides``) and stops before any
    class is built, so nothing is instantiated, created or locked."""
    from reproductions.run.cli import ReproductionCLI

    class Resolved(Exception):
        pass

    class ResolveOnly(ReproductionCLI):
        def _set_seed(self) -> None:  # the config's seed is what is compared; nothing is seeded
            pass

        def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
            """The parser is built once per subcommand in a process and reused: it depends only on the
            classes, not on the arguments, and a quarter of a resolution is building it."""
            key = self.cli_args[0] if self.cli_args else None
            if key not in _PARSERS:
                super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
                _PARSERS[key] = (self.parser, getattr(self, "_subcommand_method_arguments", {}),
                                 getattr(self, "_subcommand_parsers", {}))  # fmt: skip
            self.parser, self._subcommand_method_arguments, self._subcommand_parsers = _PARSERS[key]

        def before_instantiate_classes(self) -> None:
            raise Resolved(self._parser(self.subcommand).dump(self.config[self.subcommand], skip_none=False))

    try:
        with warnings.catch_warnings():  # args given while sys.argv holds this command's own: intended here
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            ResolveOnly(args=list(args))
    except Resolved as done:
        return str(done.args[0])
    raise RuntimeError(f"the CLI did not stop before instantiating for {list(args)}")  # pragma: no cover


def load_config(text: str) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def run_config(run_dir: Path) -> dict[str, Any] | None:
    """A run directory's resolved ``config.yaml`` (None if missing or unparsable), as the run
    computed it: a run resumed from a checkpoint in its own directory (``--ckpt_path
    <run dir>/checkpoints/last.ckpt`` after an interruption) resumes exactly, so it has computed
    what the uninterrupted run computes and its ``ckpt_path`` is read as unset; so does a run moved
    since, whose ``ckpt_path`` lies in the directory where it ran (results.json's ``run_dir``). A
    ``ckpt_path`` elsewhere (weights from another run) is kept: that run computed something else."""
    from reproductions.run.ckpt_paths import in_run_dir

    try:
        config = load_config((Path(run_dir) / CONFIG_FILE).read_text())
    except OSError:
        return None
    ckpt = config.get("ckpt_path") if config else None
    ran_in = (read_results(run_dir) or {}).get("run_dir") if ckpt else None
    if ckpt and (in_run_dir(ckpt, run_dir) or (isinstance(ran_in, str) and _inside(ckpt, ran_in))):
        return {**config, "ckpt_path": None}
    return config


def computes_the_same(run: Run) -> bool:
    """Whether the finished run in ``run.run_dir`` computed what ``run``'s command computes now: its
    ``config.yaml`` equals, as data, the config the command resolves to (``config_key``; a command
    changed only in its words, e.g. a value now given explicitly that equals the default, computes the
    same). False when the run directory has no readable ``config.yaml``."""
    have = run_config(run.run_dir)
    if have is None:
        return False
    want = load_config(resolve_config(run.args))
    return want is not None and config_key(have) == config_key(want)


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` names a file under ``folder``, as written (both as the run saw them, maybe elsewhere now)."""
    import os

    path, folder = os.path.normpath(str(path)), os.path.normpath(folder)
    return os.path.isabs(path) == os.path.isabs(folder) and path.startswith(folder + os.sep)


def finished_runs(root: Path, exclude: Sequence[Path] = ()) -> dict[str, list[Path]]:
    """config key -> run directories, for every finished run under ``root`` with a
    ``config.yaml`` (``<...>/seed<k>/``; a ``validate``/``test`` subdirectory is not a run; runs
    that were themselves copied count too), in path order."""
    skip = {p.resolve() for p in exclude}
    index: dict[str, list[Path]] = {}
    for results in sorted(Path(root).rglob(RESULTS_FILE)):
        run_dir = results.parent
        if not run_dir.name.startswith("seed") or run_dir.resolve() in skip or not (run_dir / CONFIG_FILE).is_file() or read_results(run_dir) is None:
            continue
        config = run_config(run_dir)
        if config is not None:
            index.setdefault(config_key(config), []).append(run_dir)
    return index


def planned_device(config: dict[str, Any]) -> str:
    """The device a run with this resolved config would train on here (``trainer.accelerator``:
    ``auto`` and ``gpu`` mean CUDA where there is one)."""
    import torch

    accelerator = str((config.get("trainer") or {}).get("accelerator") or "auto").lower()
    if accelerator in ("auto", "gpu", "cuda"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return accelerator


def _rebase(value: Any, src: Path, dst: Path) -> Any:
    """Paths inside the source run directory (e.g. ``best.path``) moved to the copy."""
    if isinstance(value, dict):
        return {k: _rebase(v, src, dst) for k, v in value.items()}
    if isinstance(value, list):
        return [_rebase(v, src, dst) for v in value]
    if isinstance(value, str):
        for base, new in ((str(src.resolve()), str(dst.resolve())), (str(src), str(dst))):
            if value == base or value.startswith(base + "/"):
                return new + value[len(base):]
    return value


def copy_run(src: Path, run: Run, config_text: str) -> dict:
    """Copy the finished run ``src`` into ``run``'s directory (see the module docstring); returns
    the source's results."""
    dst = run.run_dir
    dst.mkdir(parents=True, exist_ok=True)
    results = read_results(src)
    if results is None:
        raise RuntimeError(f"{src} is no longer a finished run")
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*NOT_COPIED), dirs_exist_ok=True)
    source_log = src / LOG_FILE
    log = source_log.read_text(errors="replace") if source_log.is_file() else ""
    atomic_write_text(dst / LOG_FILE, f"sweep --reuse: copied from {src} (the same resolved config and seed)\n" + log)
    atomic_write_text(dst / CONFIG_FILE, config_text)
    copied = _rebase(results, src, dst)
    copied.update(
        experiment=run.args[run.args.index("--run.experiment") + 1],
        variant=run.variant.name,
        run_dir=str(dst),
        command="python -m reproductions " + " ".join(run.args),
        reused_from={"run_dir": str(src), "command": results.get("command")},
    )
    write_results(dst, copied)
    return results


@dataclass
class Reused:
    run: Run
    source: Path


def reuse_finished(
    runs: Sequence[Run],
    root: Path,
    *,
    own: Sequence[Path] = (),
    out: TextIO,
    copy: bool = True,
    resolve: Callable[[Sequence[str]], str] = resolve_config,
) -> list[Reused]:
    """Copy every run of ``runs`` that has a finished twin under ``root`` (not among ``own``, the
    plan's own run directories); returns those copied (with ``copy=False``, those that would be:
    the dry run). A run whose config cannot be resolved is left to train, where its own error
    message names the problem."""
    index = finished_runs(root, exclude=own)
    if not index:
        return []
    reused: list[Reused] = []
    here: dict[str, dict] = {}  # device -> this machine's hardware record
    for run in runs:
        if (run.run_dir / "checkpoints").is_dir() and any((run.run_dir / "checkpoints").iterdir()):
            continue  # an earlier attempt: it resumes
        try:
            text = resolve(run.args)
        except Exception as e:  # noqa: BLE001 - reported, and the run trains
            print(f"    reuse: could not resolve the config of {run.label} ({type(e).__name__}: {e}); it will train",
                  file=out)
            continue
        config = load_config(text)
        twins = index.get(config_key(config), []) if config is not None else []
        if not twins:
            continue
        device = planned_device(config)
        mine = here.setdefault(device, hardware(device))
        recorded = {twin: ((read_results(twin) or {}).get("hardware")) for twin in twins}
        source = next((twin for twin in twins if same_hardware(recorded[twin], mine)), None)
        if source is None:
            print(f"    reuse: {run.label} has a finished twin, {twins[0]}, trained on "
                  f"{hardware_label({'hardware': recorded[twins[0]]})}, not on this machine's "
                  f"{hardware_label({'hardware': mine})}; "
                  f"the numbers would differ, so it trains", file=out)
            continue
        results = copy_run(source, run, text) if copy else read_results(source)
        commit = ((results or {}).get("git") or {}).get("commit") or "unknown"
        reused.append(Reused(run, source))
        print(f"    {'reused' if copy else 'would reuse'} {run.label}: {'copied ' if copy else ''}from {source} "
              f"(code {str(commit)[:10]})", file=out)
    return reused
