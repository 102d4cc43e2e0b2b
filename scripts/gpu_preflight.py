"""The GPU check's first step (scripts/gpu_check.sh): does this Python hold what the check's stages use?

    python scripts/gpu_preflight.py OUT.json

Three checks, each in this process, in seconds rather than after a stage's minutes:

- ``bench``: the modules of ``python -m reproductions bench gpu``;
- ``fit``: the modules of the fit runs (the CLI, the ViT, the image DataModule, the FSDP2 strategy), then
  the runs' command line parsed to the end (``fit --config digits.yaml --config overlays/fsdp.yaml
  --print_config``: LightningCLI with ``jsonargparse[signatures]``, every class path resolved);
- ``torch``: the PyTorch APIs the stages call, present in this version (FSDP2, its mixed precision and
  state-dict helpers, SDPA's kernel choice, the FLOP counter, ``torch.compile``, the process-group timeout).

OUT.json holds each check's result (``ok``, or the error and the missing module), the version and location
of each package that scripts/gpu_wheels.sh carries, and the requirements of those packages that the
installed ones do not meet (``pip install --no-deps`` does not check them). Exit 0 when all pass, else 1
after one line per failed check on stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import sys
import traceback
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS_SCRIPT = REPO / "scripts" / "gpu_wheels.sh"
FIT_ARGS = ["fit", "--config", str(REPO / "reproductions/vit/configs/digits.yaml"),
            "--config", str(REPO / "reproductions/vit/configs/overlays/fsdp.yaml"), "--print_config"]
BENCH_MODULES = ["reproductions.commands.bench", "reproductions.benchmarks.gpu"]
FIT_MODULES = ["reproductions.run.cli", "models.vit", "lightning_modules.image_classifier", "lightning_modules.sharding",
               "datamodules.images"]
#: (module, attribute path) of every PyTorch API the stages call that older or newer versions may lack
TORCH_APIS = [
    ("torch", "compile"),
    ("torch.nn", "Module.compile"),
    ("torch.distributed.fsdp", "fully_shard"),
    ("torch.distributed.fsdp", "MixedPrecisionPolicy"),
    ("torch.distributed.fsdp", "FSDPModule"),
    ("torch.distributed.checkpoint.state_dict", "StateDictOptions"),
    ("torch.distributed.checkpoint.state_dict", "set_model_state_dict"),
    ("torch.distributed.checkpoint.state_dict", "set_optimizer_state_dict"),
    ("torch.distributed.device_mesh", "init_device_mesh"),
    ("torch.nn.attention", "sdpa_kernel"),
    ("torch.nn.attention", "SDPBackend.FLASH_ATTENTION"),
    ("torch.nn.attention", "SDPBackend.EFFICIENT_ATTENTION"),
    ("torch.nn.attention", "SDPBackend.CUDNN_ATTENTION"),
    ("torch.nn.functional", "scaled_dot_product_attention"),
    ("torch.utils.flop_counter", "FlopCounterMode"),
    ("torch.utils.checkpoint", "checkpoint"),
]
#: one of these sets the default process group's timeout (reproductions/run/rendezvous.py takes the first present)
TORCH_TIMEOUT_APIS = [("torch.distributed", "set_timeout"), ("torch.distributed.distributed_c10d", "_set_pg_timeout")]


def bundle_specs(script: Path = WHEELS_SCRIPT) -> dict[str, str]:
    """``{name: version}`` of the packages in scripts/gpu_wheels.sh's ``WHEELS=( ... )``."""
    body = re.search(r"^WHEELS=\(\n(.*?)^\)", script.read_text(), re.S | re.M)
    if body is None:
        raise ValueError(f"no WHEELS=( ... ) list in {script}")
    return dict(line.strip().split("==") for line in body.group(1).splitlines() if line.strip())


def _failure(err: BaseException) -> dict:
    missing = err.name if isinstance(err, ModuleNotFoundError) else None
    text = f"{type(err).__name__}: {err}".strip()
    return {"ok": False, "error": text.splitlines()[0][:300] if text else type(err).__name__, "missing": missing,
            "traceback": traceback.format_exc(limit=-6)[-3000:]}


def _imports(modules: list[str]) -> dict:
    try:
        for name in modules:
            importlib.import_module(name)
    except BaseException as err:  # noqa: BLE001 - an import may fail any way; it is what we report
        return _failure(err)
    return {"ok": True}


def check_bench() -> dict:
    return _imports(BENCH_MODULES)


def check_fit() -> dict:
    result = _imports(FIT_MODULES)
    if not result["ok"]:
        return result
    from reproductions.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(FIT_ARGS))
    except SystemExit as exit_:
        code = exit_.code
    except BaseException as error:  # noqa: BLE001
        return _failure(error)
    if code not in (0, None):
        lines = (err.getvalue() or out.getvalue()).strip().splitlines()
        return {"ok": False, "error": f"`{' '.join(FIT_ARGS)}` exited {code}: {lines[-1] if lines else ''}"[:400],
                "missing": None}
    return {"ok": True}


def _lookup(module: str, path: str):
    obj = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def check_torch() -> dict:
    missing = []
    for module, path in TORCH_APIS:
        try:
            _lookup(module, path)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{path}")
    timeouts = []
    for module, path in TORCH_TIMEOUT_APIS:
        with contextlib.suppress(ImportError, AttributeError):
            _lookup(module, path)
            timeouts.append(f"{module}.{path}")
    if not timeouts:
        missing.append(" or ".join(f"{m}.{p}" for m, p in TORCH_TIMEOUT_APIS))
    import torch

    result = {"ok": not missing, "version": torch.__version__, "timeout_api": timeouts[0] if timeouts else None}
    if missing:
        result.update(error=f"torch {torch.__version__} lacks {', '.join(missing)}", missing=None)
    return result


def bundle_state(specs: dict[str, str]) -> tuple[dict, list[str]]:
    """Each carried package's installed version and location, and the requirements (markers evaluated,
    extras skipped) of those packages that the installed distributions do not meet."""
    from packaging.requirements import Requirement

    state, unmet = {}, []
    for name, wanted in specs.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            state[name] = {"wanted": wanted, "version": None, "location": None}
            continue
        state[name] = {"wanted": wanted, "version": dist.version, "location": str(dist.locate_file(""))}
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                unmet.append(f"{name} needs {req}: not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{name} needs {req}: {req.name} {have} is installed")
    return state, unmet


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("error: usage: python scripts/gpu_preflight.py OUT.json", file=sys.stderr)
        return 2
    out = Path(argv[0])
    checks = {"torch": check_torch(), "bench": check_bench(), "fit": check_fit()}
    specs = bundle_specs()
    state, unmet = bundle_state(specs)
    report = {"ok": all(c["ok"] for c in checks.values()), "checks": checks, "bundle": state, "unmet": unmet,
              "python": sys.version.split()[0]}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(out)
    for line in unmet:
        print(f"preflight: warning: {line}", file=sys.stderr)
    for name, check in checks.items():
        if check["ok"]:
            print(f"preflight: {name}: ok", file=sys.stderr)
            continue
        hint = ""
        if check.get("missing"):
            top = check["missing"].split(".")[0]
            hint = (f" (module {top!r} is missing: carry it as a wheel, scripts/gpu_wheels.sh DIR here, then "
                    f"GPU_CHECK_WHEELS=DIR there)")
        print(f"preflight: {name} FAILED: {check['error']}{hint}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
