#!/usr/bin/env bash
# A separate virtual environment for the benchmarks' third-party peers, which are never dependencies of
# this repository: FuxiCTR (`repro bench bst` measures our BST against a BST built from FuxiCTR's layers).
# It holds the same pinned torch as requirements.txt, fuxictr (and what it pulls in: ray[data], polars,
# h5py, ...), and this repository installed editable with its requirements and test tools
# (requirements-dev.txt). No system site-packages.
#
# Usage (from anywhere):
#   scripts/bench_env.sh                 # create or update .venv-bench (idempotent)
#   .venv-bench/bin/repro bench bst --peers fuxictr --blocks 1 --batch-size 1024 --threads 1 --skip-eval
#   .venv-bench/bin/python -m pytest -n 0 -q tests/test_bench.py -k fuxictr   # the peer's own test
#
# Environment:
#   BENCH_ENV            where the environment goes (default .venv-bench in the repository root)
#   PYTHON               the interpreter that creates it (default python3)
#   TORCH_INDEX_URL      an index for torch alone, e.g. https://download.pytorch.org/whl/cpu for the
#                        CPU-only build, far smaller than PyPI's CUDA build with its nvidia-* wheels
#                        (.venv-bench is 6.6 GB with those); unset: PyPI's, which also runs on a CPU
#   FUXICTR_VERSION      default 2.3.10 (the version the peer was written and measured against)
# Without this environment (plain .venv) `repro bench bst` skips the FuxiCTR peer with one line that
# says to run this script.
set -euo pipefail
cd "$(dirname "$0")/.."

ENV_DIR=${BENCH_ENV:-.venv-bench}
PYTHON=${PYTHON:-python3}
FUXICTR_VERSION=${FUXICTR_VERSION:-2.3.10}
TORCH_PIN=$(grep -E '^torch==' requirements.txt | sed 's/[[:space:]].*//')

if [ ! -x "$ENV_DIR/bin/python" ]; then
  "$PYTHON" -m venv "$ENV_DIR"  # --system-site-packages off: only what is installed below
fi
PIP=("$ENV_DIR/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "${PIP[@]}" install -q "$TORCH_PIN" --index-url "$TORCH_INDEX_URL"
fi
# the repository's pinned requirements first, then fuxictr on top of them (its own needs are unpinned)
"${PIP[@]}" install -q -r requirements-dev.txt  # the pinned requirements and the test tools
"${PIP[@]}" install -q "fuxictr==$FUXICTR_VERSION" -r requirements-dev.txt
"${PIP[@]}" install -q --no-deps -e .
"$ENV_DIR/bin/python" - <<'EOF'
import sys

import fuxictr
import torch

from reproductions.benchmarks import fuxictr_peer

problem = fuxictr_peer.available()
print(f"{sys.prefix}: torch {torch.__version__}, fuxictr {fuxictr.__version__}; FuxiCTR peer: "
      f"{'ready' if problem is None else problem}")
sys.exit(problem is not None)
EOF
