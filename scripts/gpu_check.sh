#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA GPU, in under 5 minutes, run the GPU paths that a CPU
# cannot measure and write one JSON with the device, the versions and the numbers:
#   1. bench   python -m reproductions bench gpu: ViT-B/16 at 224 px and BST training steps in bf16
#              against timm / nn.TransformerEncoder, images/s and MFU (reproductions/benchmarks/gpu.py)
#   2. fsdp    a short FSDP2 run of ViT-B/16 through the CLI and the fsdp overlay (fully_shard on one
#              device, bf16 MixedPrecisionPolicy, fp32 master weights): 2 epochs x 20 steps of batch 64
#              on the digits upsampled to 224 px (generated data: no download), then test
#   3. compile the same run's training under DDP on 1 device with torch.compile and bf16-mixed (the gpu
#              profiles' setting), no validation or test (their eval graphs would be compiled too)
# Usage (from the repository root):
#   scripts/gpu_check.sh [OUT_DIR]          # default OUT_DIR: runs/gpu_check; the JSON: OUT_DIR/gpu_check.json
# Environment: PYTHON (default: .venv/bin/python if present, else python); GPU_CHECK_STAGES (default
# "bench fsdp compile"); GPU_CHECK_SMOKE=1 runs the same stages on the CPU with tiny shapes, to
# check the script itself (time limits x5, the compiled run in fp32; its numbers mean nothing).
# Without a CUDA GPU (and without GPU_CHECK_SMOKE) it exits 2 with one line saying so.
# Status: not yet run on a GPU (written and smoke-checked on a CPU; docs/scaling.md).
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
OUT_DIR="${1:-runs/gpu_check}"
STAGES="${GPU_CHECK_STAGES:-bench fsdp compile}"
SMOKE="${GPU_CHECK_SMOKE:-0}"

if [[ "$SMOKE" != "1" ]]; then
  if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 2)" 2>/dev/null; then
    echo "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False): nothing run" >&2
    exit 2
  fi
fi
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STATUS="$OUT_DIR/stages.tsv"
: > "$STATUS"

# stage NAME SECONDS COMMAND...: run with a time limit, log to OUT_DIR/NAME.log, record rc and seconds
stage() {
  local name=$1 limit=$2
  shift 2
  if [[ " $STAGES " != *" $name "* ]]; then return; fi
  echo "gpu_check: $name (limit $((limit * LIMIT_SCALE))s): $*" >&2
  local start=$SECONDS
  timeout -k 10 "$((limit * LIMIT_SCALE))" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$STATUS"
  [[ $rc -eq 0 ]] || echo "gpu_check: $name failed (rc $rc), see $OUT_DIR/$name.log" >&2
}

if [[ "$SMOKE" == "1" ]]; then
  LIMIT_SCALE=5  # a CPU, possibly shared: compiling is slow there
  PRECISION=32-true  # bf16 autocast on a CPU without bf16 units would only slow the smoke run
  BENCH=(--device cpu --tiny --rounds 1 --threads 1)
  ACCEL=(--trainer.accelerator cpu)
  VIT=(--data.image_size 16 --model.net.init_args.img_size 16 --model.net.init_args.patch_size 8
       --model.net.init_args.embed_dim 32 --model.net.init_args.depth 1 --model.net.init_args.num_heads 2
       --data.batch_size 16 --trainer.limit_train_batches 2)
else
  LIMIT_SCALE=1
  PRECISION=bf16-mixed
  BENCH=()
  ACCEL=(--trainer.accelerator gpu)
  # ViT-B/16 at 224 px (the digits' one channel, 10 classes)
  VIT=(--data.image_size 224 --model.net.init_args.img_size 224 --model.net.init_args.patch_size 16
       --model.net.init_args.embed_dim 768 --model.net.init_args.depth 12 --model.net.init_args.num_heads 12
       --model.net.init_args.mlp_ratio 4.0 --data.batch_size 64 --trainer.limit_train_batches 20
       --data.num_workers 4)
fi
RUN=(fit --config reproductions/vit/configs/digits.yaml "${ACCEL[@]}" --trainer.devices 1 --trainer.max_epochs 2
     --trainer.limit_val_batches 2 --trainer.limit_test_batches 2 --trainer.enable_progress_bar false
     --trainer.enable_model_summary false "${VIT[@]}" --run.root "$OUT_DIR/runs")

stage bench 110 "$PYTHON" -m reproductions bench gpu "${BENCH[@]}" --out "$OUT_DIR/bench_gpu.json"
stage fsdp 60 "$PYTHON" -m reproductions "${RUN[@]}" --config reproductions/vit/configs/overlays/fsdp.yaml \
  --run.variant fsdp2
# training only: validation and test would compile the eval graphs too (another 20-40 s)
stage compile 130 "$PYTHON" -m reproductions "${RUN[@]}" --trainer.strategy ddp --model.init_args.compile true \
  --trainer.precision "$PRECISION" --trainer.limit_val_batches 0 --run.test_after_fit false --run.variant ddp-compiled

"$PYTHON" - "$OUT_DIR" "$SMOKE" <<'EOF'
import json, subprocess, sys
from pathlib import Path

import lightning, timm, torch

out, smoke = Path(sys.argv[1]), sys.argv[2] == "1"
stages = {}
for line in (out / "stages.tsv").read_text().splitlines():
    name, rc, seconds = line.split("\t")
    stages[name] = {"rc": int(rc), "seconds": int(seconds), "log": str(out / f"{name}.log")}
cuda = torch.cuda.is_available()
try:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=30).stdout.strip() or None
except (OSError, subprocess.SubprocessError):
    driver = None
report = {
    "smoke": smoke,
    "device": torch.cuda.get_device_name(0) if cuda else "cpu",
    "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "lightning": lightning.__version__,
                 "timm": timm.__version__, "driver": driver,
                 "cudnn": torch.backends.cudnn.version() if cuda else None},
    "stages": stages,
}
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
        "bst_geomean_ratio": bench["bst"]["geomean_ratio"], "peak_flops": peak, "peak_source": bench["peak_source"],
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
report["ok"] = all(s["rc"] == 0 for s in stages.values())
path = out / "gpu_check.json"
path.write_text(json.dumps(report, indent=2))
print(json.dumps({k: report[k] for k in ("device", "ok", "stages")}))
print(f"gpu_check: wrote {path}")
sys.exit(0 if report["ok"] else 1)
EOF
