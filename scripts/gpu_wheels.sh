#!/usr/bin/env bash
# The wheels that the GPU machine's image lacks for scripts/gpu_check.sh, downloaded here (where PyPI is
# reachable) for that machine's Python (3.12, manylinux x86-64), to be copied there with the repository.
# The image already holds PyTorch, Lightning, timm, torchmetrics, numpy, pandas, pyarrow, pyyaml, fsspec,
# xxhash, tqdm, huggingface-hub, ... (scripts/gpu_image_packages.txt); it lacks these, which the check's
# code path imports (tests/test_gpu_bundle.py checks that this list is exactly that set):
#
#   package           version   size     why the check needs it
#   jsonargparse      4.53.0    174 KiB  LightningCLI parses every `fit` command with it (reproductions/run/cli.py)
#   docstring-parser  0.18.0     22 KiB  jsonargparse[signatures], which Lightning checks before the CLI starts
#   typeshed-client   2.15.0    789 KiB  jsonargparse[signatures], as above
#   datasets          5.2.0     594 KiB  datamodules.images holds every image source, digits included, as a
#                                        datasets.Dataset (imported by the fit runs' DataModule)
#   dill              0.4.1     117 KiB  imported by datasets
#   multiprocess      0.70.19   147 KiB  imported by datasets (one wheel per Python version: py312)
#                                        total about 1.8 MiB
# Not carried: wandb (imported only with --run.wandb true, which the check does not set); datasets' other
# needs (pyarrow, fsspec, xxhash, pandas, huggingface-hub, ...) and typeshed-client's typing-extensions are
# in the image. Versions: requirements.txt's pins, and this repository's tested versions for the others.
#
# Usage (from anywhere):
#   scripts/gpu_wheels.sh DIR      # download into DIR (its old *.whl are replaced), print sizes and total
#   scripts/gpu_wheels.sh --list   # the pinned packages, one `name==version` a line
# Environment: GPU_WHEELS_PYTHON_VERSION (default 3.12, the image's; the CPU rehearsal passes its own),
# PYTHON (whose pip downloads: default .venv/bin/python if present, else python3).
# It fails (exit 1) if the download fails or the wheels add up to more than 48 MiB (the machine takes at
# most 64 MiB besides the repository). scripts/gpu_check.sh installs them (GPU_CHECK_WHEELS=DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  jsonargparse==4.53.0
  docstring-parser==0.18.0
  typeshed-client==2.15.0
  datasets==5.2.0
  dill==0.4.1
  multiprocess==0.70.19
)
MAX_MIB=48

if [[ "${1:-}" == "--list" ]]; then
  printf '%s\n' "${WHEELS[@]}"
  exit 0
fi
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "error: usage: scripts/gpu_wheels.sh DIR (or --list); give the folder to download the wheels into" >&2
  exit 2
fi
DIR=$1
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
PYVER="${GPU_WHEELS_PYTHON_VERSION:-3.12}"

# Download into a fresh folder beside DIR, then replace DIR's wheels: never a half-filled DIR.
mkdir -p "$DIR"
TMP=$(mktemp -d "${DIR%/}.tmp.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
if ! "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$TMP" "${WHEELS[@]}" 2> "$TMP/pip.err"; then
  grep -v "is ignored: it is neither a file nor a directory" "$TMP/pip.err" >&2 || true
  echo "error: pip download failed for Python $PYVER (above); check the network and the versions in scripts/gpu_wheels.sh" >&2
  exit 1
fi
rm -f "$TMP/pip.err"
total=$(du -cb "$TMP"/*.whl | tail -1 | cut -f1)
if (( total > MAX_MIB * 1024 * 1024 )); then
  echo "error: the wheels add up to $((total / 1024 / 1024)) MiB, over $MAX_MIB MiB; carry fewer packages" >&2
  exit 1
fi
rm -f "$DIR"/*.whl
mv "$TMP"/*.whl "$DIR"/
for whl in "$DIR"/*.whl; do
  stat -c '%s %n' "$whl" | awk '{ n = split($2, p, "/"); printf "%8.1f KiB  %s\n", $1 / 1024, p[n] }'
done
awk -v t="$total" -v n="${#WHEELS[@]}" -v v="$PYVER" -v d="$DIR" -v m="$MAX_MIB" \
  'BEGIN { printf "%8.2f MiB  total, %d wheels for CPython %s in %s (limit %d MiB)\n", t / 1048576, n, v, d, m }'
