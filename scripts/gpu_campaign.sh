#!/usr/bin/env bash
# The GPU campaign: on a machine with one CUDA GPU, run the ViT ablations' `h200` profiles (CIFAR-10 at 32 px,
# the data held on the GPU) in priority order within a budget, leaving each finished run's directory under
# OUT_DIR/runs/; a later campaign into the same OUT_DIR skips the finished runs and continues, and any campaign
# skips the runs results/ already records at h200 with the same config (brought back from an earlier machine).
#   0. install    the wheels the machine lacks (GPU_CAMPAIGN_WHEELS=DIR, from scripts/gpu_wheels.sh; default
#      preflight  gpu_wheels/ if it holds any) and the preflight, as scripts/gpu_check.sh does (scripts/gpu_common.sh)
#   1. data       the CIFAR-10 training JPEG folder (GPU_CAMPAIGN_DATA: the folder with train/<class>/*.jpg, or the
#                 .tar.gz that holds it, unpacked into a temporary folder), prepared and decoded once
#                 (repro data prepare)
#   2. runs       scripts/gpu_campaign.py: the sweeps' h200 runs in order, until GPU_CAMPAIGN_BUDGET seconds
#                 (default 540) are spent; the run in flight then gets SIGTERM, saves a checkpoint and records
#                 status interrupted (never finished); no run starts with under 45 s left (smoke: 10 s). An
#                 interrupted run whose checkpoint is still in its directory is resumed from it next time.
# Usage (from the repository root):
#   GPU_CAMPAIGN_DATA=DIR scripts/gpu_campaign.sh [OUT_DIR]      # default OUT_DIR: runs/gpu_campaign
# Environment: PYTHON (as for gpu_check.sh); GPU_CAMPAIGN_DATA (required, except in the smoke run);
# GPU_CAMPAIGN_BUDGET (seconds of runs, >= 30; default 540, the smoke run's 150); GPU_CAMPAIGN_SWEEPS (the
# sweeps in priority order; default "vit/patch_size vit/pooling vit/position vit/hybrid vit/data_size vit/attention_data vit/time_to_accuracy_cifar10");
# GPU_CAMPAIGN_KEEP_CHECKPOINTS=1 keeps the finished runs' checkpoints (by default removed, sizes noted);
# GPU_CAMPAIGN_SMOKE=1: on the CPU, a generated 300-image JPEG folder, every run two steps of batch 16 (a
# rehearsal of the script: budget, stop, continue; its numbers mean nothing).
# Output: OUT_DIR/runs/vit/<sweep>-h200/<variant>/seed0/ (results.json status finished: `repro registry add
# PATH`), OUT_DIR/campaign.json (every run's status, the budget, why it stopped), OUT_DIR/<stage>.log, stages.tsv.
# Exit status: 0 every run finished, 3 stopped at the budget with runs left (run it again to continue),
# 1 a stage or a run failed, 2 a usage error (one error: line, before any work).
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh  # PYTHON, the wheels, the CUDA check, stage, install_and_preflight
GPU_TAG=gpu_campaign
gpu_python
OUT_DIR="${1:-runs/gpu_campaign}"
SMOKE="${GPU_CAMPAIGN_SMOKE:-0}"
SWEEPS="${GPU_CAMPAIGN_SWEEPS:-vit/patch_size vit/pooling vit/position vit/hybrid vit/data_size vit/attention_data vit/time_to_accuracy_cifar10}"
gpu_wheels GPU_CAMPAIGN_WHEELS
if [[ "$SMOKE" == "1" ]]; then LIMIT_SCALE=5; TRAIN_DEFAULT=150; MIN_START=10; else LIMIT_SCALE=1; TRAIN_DEFAULT=540; MIN_START=45; fi
TRAIN_BUDGET="${GPU_CAMPAIGN_BUDGET:-$TRAIN_DEFAULT}"
if ! [[ "$TRAIN_BUDGET" =~ ^[0-9]+$ ]] || (( TRAIN_BUDGET < 30 )); then
  echo "error: GPU_CAMPAIGN_BUDGET=$TRAIN_BUDGET is not a number of seconds >= 30; give e.g. GPU_CAMPAIGN_BUDGET=540" >&2
  exit 2
fi
for sweep in $SWEEPS; do
  file="reproductions/${sweep%%/*}/sweeps/${sweep#*/}.yaml"
  if [[ "$sweep" != */* || ! -f "$file" ]] || ! grep -q "^  h200:" "$file"; then
    echo "error: GPU_CAMPAIGN_SWEEPS names $sweep, which is not a sweep with an h200 profile; give some of: vit/patch_size vit/pooling vit/position vit/hybrid vit/data_size vit/attention_data vit/time_to_accuracy_cifar10" >&2
    exit 2
  fi
done
DATA="${GPU_CAMPAIGN_DATA:-}"
if [[ -z "$DATA" && "$SMOKE" != "1" ]]; then
  echo "error: GPU_CAMPAIGN_DATA is not set; give the CIFAR-10 training JPEG folder (train/<class>/*.jpg) or its .tar.gz" >&2
  exit 2
elif [[ -n "$DATA" && ! -d "$DATA" && ! ( -f "$DATA" && "$DATA" == *.tar.gz ) ]]; then
  echo "error: GPU_CAMPAIGN_DATA=$DATA is neither a folder nor a .tar.gz file; give the CIFAR-10 training JPEG folder (train/<class>/*.jpg) or its .tar.gz" >&2
  exit 2
fi
[[ "$SMOKE" == "1" ]] || gpu_require_cuda

STAGES="data runs"
GRACE=$((90 * LIMIT_SCALE))       # seconds a stopped run gets to save its checkpoint and exit
RESERVE=5
SETUP=$(((45 + 60 + 240) * LIMIT_SCALE))
BUDGET=$((SETUP + TRAIN_BUDGET + GRACE + 30))  # the hard limit of all stages; the runs stop at TRAIN_BUDGET
DEADLINE=$((SECONDS + BUDGET))
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_campaign.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export HF_DATASETS_CACHE="${HF_DATASETS_CACHE:-$WORK/hf-cache}"
STATUS="$OUT_DIR/stages.tsv"
: > "$STATUS"
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

install_and_preflight
# the data, ready before the budget of the runs starts: unpacked if given as a .tar.gz, prepared and decoded once
if [[ -z "$DATA" ]]; then  # the smoke run: 10 classes x 30 generated 32x32 JPEGs
  DATA="$WORK/cifar10"
  PREP=("$PYTHON" -c '
import sys
from pathlib import Path
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for c in range(10):
    folder = Path(sys.argv[1]) / "train" / f"class{c}"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(30):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.jpg", quality=90)
' "$DATA")
elif [[ -f "$DATA" ]]; then
  mkdir -p "$WORK/cifar10"
  PREP=(tar -xzf "$DATA" -C "$WORK/cifar10")
  DATA="$WORK/cifar10"
else
  PREP=(true)
fi
if ! stage data 240 bash -c '"${@:3}" && "$1" -m reproductions data prepare --source folder --data.data_dir "$2"' \
    _ "$PYTHON" "$DATA" "${PREP[@]}"; then
  SKIP_REASON=${SKIP_REASON:-"the data stage failed (OUT_DIR/data.log)"}
fi
SETUP_OK=1
[[ -z "$SKIP_REASON" ]] || SETUP_OK=0
KEEP=()
[[ "${GPU_CAMPAIGN_KEEP_CHECKPOINTS:-0}" == "1" ]] && KEEP=(--keep-checkpoints)
SMOKE_ARG=()
[[ "$SMOKE" == "1" ]] && SMOKE_ARG=(--smoke)
# shellcheck disable=SC2086
stage runs $((TRAIN_BUDGET + GRACE + 20)) "$PYTHON" scripts/gpu_campaign.py --out "$OUT_DIR" --budget "$TRAIN_BUDGET" \
  --data-dir "$DATA" --grace "$GRACE" --min-start "$MIN_START" "${KEEP[@]}" "${SMOKE_ARG[@]}" $SWEEPS
rc=$?
trap - TERM INT
tail -n 1 "$OUT_DIR/runs.log" 2>/dev/null
if (( SETUP_OK == 0 )) || [[ $rc -ne 0 && $rc -ne 3 ]]; then
  exit 1
fi
exit $rc
