#!/usr/bin/env bash
# Sets up this repository on a fresh Debian/Ubuntu machine (idempotent):
#   - Fashion-MNIST from the Debian package dataset-fashion-mnist (offline CPU-scale data),
#   - a virtual environment in .venv with the pinned requirements (and the test tools), and this
#     repository installed into it in editable mode (the `repro` command).
# Run as root or with sudo available for apt-get; skips apt when the data is already there.
set -euo pipefail
cd "$(dirname "$0")"

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq dataset-fashion-mnist
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements-dev.txt
# the repository itself, editable: `repro ...` on the PATH of the venv, imports from any directory
.venv/bin/python -m pip install -q --no-deps -e .
.venv/bin/python -c "import torch, torchvision, timm, lightning; print(f'torch {torch.__version__}, torchvision {torchvision.__version__}, timm {timm.__version__}, lightning {lightning.__version__}')"
