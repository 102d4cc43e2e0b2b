#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA GPU, in under 8 minutes in all, run the GPU paths that a CPU
# cannot measure and write one JSON with the device, the versions and the numbers:
#   0. install  the wheels the machine lacks (GPU_CHECK_WHEELS=DIR, from scripts/gpu_wheels.sh), with pip
#               --no-index into a temporary folder put on PYTHONPATH; nothing else on the machine changes
#      preflight the stages' imports and PyTorch APIs, in seconds (scripts/gpu_preflight.py); if it fails,
#               the stages are skipped and the JSON says what is missing
#   1. bench    python -m reproductions bench gpu: ViT-B/16 at 224 px and BST training steps in bf16
#               against timm / nn.TransformerEncoder, images/s and MFU (reproductions/benchmarks/gpu.py)
#   2. fsdp     a short FSDP2 run of ViT-B/16 through the CLI and the fsdp overlay (fully_shard on one
#               device, bf16 MixedPrecisionPolicy, fp32 master weights): 2 epochs x 20 steps of batch 64
#               on the digits upsampled to 224 px (generated data: no download), then test
#   3. compile  the same run's training under DDP on 1 device with torch.compile and bf16-mixed (the gpu
#               profiles' setting), no validation, test or attention analysis (their graphs would be
#               compiled too)
# Every stage has a time limit, and all of them together GPU_CHECK_BUDGET seconds (default 450): a stage
# that would run past the budget gets what is left, or is skipped. The benchmark and the runs stop
# themselves a little before their limit (bench --budget, --trainer.max_time) and write what they measured;
# the JSON is written in every case, also after SIGTERM or SIGINT (the running stage is stopped first).
# Usage (from the repository root):
#   scripts/gpu_check.sh [OUT_DIR]          # default OUT_DIR: runs/gpu_check; the JSON: OUT_DIR/gpu_check.json
# Environment: PYTHON (default: .venv/bin/python if present, else python3: on the GPU machine, the image's);
# GPU_CHECK_WHEELS (a folder of wheels to install first; default gpu_wheels/ if it holds any);
# GPU_CHECK_STAGES (default "bench fsdp compile"; install and preflight always run); GPU_CHECK_BUDGET
# (seconds for all stages); GPU_CHECK_KEEP_CHECKPOINTS=1 keeps the runs' checkpoints (by default their sizes
# go into the JSON and the files are removed: about 1 GB each); GPU_CHECK_SMOKE=1 runs the same stages on the CPU with tiny shapes, to check
# the script itself (time limits and budget x5, the FSDP2 run with its bf16 policy, the compiled run in
# fp32; its numbers mean nothing). scripts/gpu_rehearsal.sh runs it so in an environment like the GPU
# machine's. Without a CUDA GPU (and without GPU_CHECK_SMOKE) it exits 2 with one line saying so.
# Exit status: 0 all stages passed, 1 one failed, timed out or was skipped, 2 a usage error.
# Status: passed on one H200 in 160 s (docs/benchmarks.md#on-one-h200-the-gpu-check); rehearsed on a CPU with that
# machine's package versions (docs/scaling.md).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh  # PYTHON, the wheels, the CUDA check, stage, install_and_preflight
GPU_TAG=gpu_check
gpu_python
OUT_DIR="${1:-runs/gpu_check}"
STAGES="${GPU_CHECK_STAGES:-bench fsdp compile}"
SMOKE="${GPU_CHECK_SMOKE:-0}"
gpu_wheels GPU_CHECK_WHEELS
if [[ "$SMOKE" == "1" ]]; then LIMIT_SCALE=5; else LIMIT_SCALE=1; fi  # a CPU, possibly shared: compiling is slow there
BUDGET="${GPU_CHECK_BUDGET:-$((450 * LIMIT_SCALE))}"
if ! [[ "$BUDGET" =~ ^[0-9]+$ ]] || (( BUDGET < 60 )); then
  echo "error: GPU_CHECK_BUDGET=$BUDGET is not a number of seconds >= 60; give e.g. GPU_CHECK_BUDGET=450" >&2
  exit 2
fi
DEADLINE=$((SECONDS + BUDGET))  # the budget counts from here

[[ "$SMOKE" == "1" ]] || gpu_require_cuda
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD"
# no network is needed: the digits come with scikit-learn, their cache goes to a temporary folder
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export HF_DATASETS_CACHE="${HF_DATASETS_CACHE:-$WORK/hf-cache}"
STATUS="$OUT_DIR/stages.tsv"
: > "$STATUS"
RESERVE=$((30 * LIMIT_SCALE))  # seconds kept for writing the JSON (it imports torch, reads the driver version)
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

if [[ "$SMOKE" == "1" ]]; then
  PRECISION=32-true  # bf16 autocast on a CPU without bf16 units would only slow the smoke run
  BENCH=(--device cpu --tiny --rounds 1 --threads 1)
  ACCEL=(--trainer.accelerator cpu)
  VIT=(--data.image_size 16 --model.net.init_args.img_size 16 --model.net.init_args.patch_size 8
       --model.net.init_args.embed_dim 32 --model.net.init_args.depth 1 --model.net.init_args.num_heads 2
       --data.batch_size 16 --trainer.limit_train_batches 2)
  FSDP_POLICY=(--trainer.strategy.init_args.mixed_precision bf16)  # the GPU's policy, on tiny shapes
else
  PRECISION=bf16-mixed
  BENCH=()
  ACCEL=(--trainer.accelerator gpu)
  # ViT-B/16 at 224 px (the digits' one channel, 10 classes)
  VIT=(--data.image_size 224 --model.net.init_args.img_size 224 --model.net.init_args.patch_size 16
       --model.net.init_args.embed_dim 768 --model.net.init_args.depth 12 --model.net.init_args.num_heads 12
       --model.net.init_args.mlp_ratio 4.0 --data.batch_size 64 --trainer.limit_train_batches 20
       --data.num_workers 4)
  FSDP_POLICY=()  # mixed_precision auto: bf16 on a GPU
fi
RUN=(fit --config reproductions/vit/configs/digits.yaml "${ACCEL[@]}" --trainer.devices 1 --trainer.max_epochs 2
     --trainer.limit_val_batches 2 --trainer.limit_test_batches 2 --trainer.enable_progress_bar false
     --trainer.enable_model_summary false "${VIT[@]}" --run.root "$OUT_DIR/runs")
# The runs stop training at max_time, some seconds before their limit, to test and write results.json
# (start-up, test and the checkpoint take the rest); bench gpu stops measuring at its --budget.

install_and_preflight
stage bench 110 "$PYTHON" -m reproductions bench gpu "${BENCH[@]}" --budget "@LIMIT-25@" --out "$OUT_DIR/bench_gpu.json"
stage fsdp 80 "$PYTHON" -m reproductions "${RUN[@]}" --config reproductions/vit/configs/overlays/fsdp.yaml \
  "${FSDP_POLICY[@]}" --trainer.max_time '{"seconds": @LIMIT-35@}' --run.variant fsdp2
# training only: validation, test and the attention analysis at the end of the fit would compile their
# graphs too (another 20-60 s for ViT-B/16)
stage compile 140 "$PYTHON" -m reproductions "${RUN[@]}" --trainer.strategy ddp --model.init_args.compile true \
  --trainer.precision "$PRECISION" --trainer.limit_val_batches 0 --run.test_after_fit false '--trainer.callbacks=[]' \
  --trainer.max_time '{"seconds": @LIMIT-30@}' --run.variant ddp-compiled
trap - TERM INT

timeout -k 5 "$RESERVE" "$PYTHON" - "$OUT_DIR" "$SMOKE" "$BUDGET" "$SECONDS" "$WHEELS" <<'EOF'
import json, os, subprocess, sys
from pathlib import Path

import torch

out, smoke, budget, elapsed, wheels = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
stages = {}
for line in (out / "stages.tsv").read_text().splitlines():
    name, rc, seconds, limit, why = (line.split("\t") + [""] * 5)[:5]
    status = "skipped" if rc == "skipped" else "ok" if rc == "0" else "timed out" if rc in ("124", "137") else "failed"
    stages[name] = {"status": status, "rc": None if rc == "skipped" else int(rc), "seconds": int(seconds),
                    "limit": int(limit), "why": why or None, "log": str(out / f"{name}.log")}
cuda = torch.cuda.is_available()
try:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=5).stdout.strip() or None
except (OSError, subprocess.SubprocessError):
    driver = None
versions = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "driver": driver, "cudnn": torch.backends.cudnn.version() if cuda else None}
for name in ("lightning", "timm", "torchmetrics", "jsonargparse", "datasets"):
    try:
        versions[name] = __import__(name).__version__
    except Exception:  # noqa: BLE001 - a missing package is what the preflight reports
        versions[name] = None
report = {"smoke": smoke, "device": torch.cuda.get_device_name(0) if cuda else "cpu", "versions": versions,
          "budget_s": budget, "elapsed_s": elapsed, "wheels": sorted(p.name for p in Path(wheels).glob("*.whl")) if wheels else [],
          "stages": stages}
preflight = out / "preflight.json"
if preflight.is_file():
    pre = json.loads(preflight.read_text())
    report["preflight"] = {"ok": pre["ok"], "unmet": pre["unmet"],
                           "checks": {k: {f: v for f, v in c.items() if f != "traceback"} for k, c in pre["checks"].items()}}
peak = None
bench_file = out / "bench_gpu.json"
if bench_file.is_file():
    bench = json.loads(bench_file.read_text())
    peak = bench.get("peak_flops")
    vit = bench["vit"]["comparison"]["items"]
    report["bench"] = {
        "vit": {name: {"images_per_sec": m.get("median"), "tflops": (m.get("flops_per_sec") or 0) / 1e12}
                for name, m in vit.items()},
        "vit_mfu": bench["vit"]["mfu"], "vit_ratio_to_timm": bench["vit"]["ratio_to_timm"],
        "bst_geomean_ratio": bench["bst"]["geomean_ratio"], "bst_skipped_seq_lens": bench["bst"].get("skipped_seq_lens"),
        "peak_flops": peak, "peak_source": bench["peak_source"],
        "measured_bf16_matmul_tflops": bench["measured_bf16_matmul_flops_per_sec"] / 1e12,
        "attention": bench["attention"], "elapsed_seconds": bench["elapsed_seconds"], "file": str(bench_file),
    }
for name, variant in (("fsdp", "fsdp2"), ("compile", "ddp-compiled")):
    results = out / "runs" / "vit" / "digits" / variant / "seed0" / "results.json"
    if not results.is_file():
        continue
    r = json.loads(results.read_text())
    t, flops = r["training"], r["model"]["flops_per_sample"]
    rate = t.get("samples_per_sec")
    report[name] = {
        "images_per_sec": rate, "precision": t["precision"], "steps": t["steps"], "fit_time_s": t["fit_time_s"],
        "params": r["model"]["params"], "flops_per_sample": flops,
        "mfu": 3 * flops * rate / peak if peak and flops and rate else None,
        "test": r["test"], "final": r["final"], "results": str(results),
    }
# the runs' checkpoints (about 1 GB each for ViT-B/16 with its optimiser state) are measured, then removed
keep = os.environ.get("GPU_CHECK_KEEP_CHECKPOINTS") == "1"
for ckpt in sorted((out / "runs").rglob("*.ckpt")):
    report.setdefault("checkpoints", {})[str(ckpt.relative_to(out))] = round(ckpt.stat().st_size / 2**20, 1)
    if not keep:
        ckpt.unlink()
report["ok"] = all(s["status"] == "ok" for s in stages.values())
path = out / "gpu_check.json"
tmp = path.with_name(path.name + ".tmp")
tmp.write_text(json.dumps(report, indent=2))
tmp.replace(path)
print(json.dumps({"device": report["device"], "ok": report["ok"], "elapsed_s": elapsed,
                  "stages": {k: v["status"] for k, v in stages.items()}}))
print(f"gpu_check: wrote {path}")
sys.exit(0 if report["ok"] else 1)
EOF
