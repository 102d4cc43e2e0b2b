#!/usr/bin/env bash
# Rehearses the GPU check on this CPU as the GPU machine will run it: a clean virtual environment that
# holds only what that machine's image holds for the check (its versions where known, PyPI's Linux wheel of
# torch 2.11.0, a CUDA build that also runs on a CPU), the wheels of scripts/gpu_wheels.sh installed by the
# check itself from a folder without network (pip --no-index), then GPU_CHECK_SMOKE=1 scripts/gpu_check.sh.
# It fails if the environment holds a package the image lacks, if it already holds a carried one, or if the
# check fails.
#
# Usage (from anywhere; needs PyPI and about 8 GB of disk in WORK_DIR):
#   scripts/gpu_rehearsal.sh [WORK_DIR]     # default: $TMPDIR/gpu-rehearsal (outside the repository)
# WORK_DIR keeps the downloaded wheels (image-wheels/: a second run downloads nothing), the environment
# (venv/, rebuilt every run), the bundle (bundle/) and the check's output (out/). Environment:
#   REHEARSAL_PYTHON   the interpreter for the environment (default: python3.12 if present, else python3);
#                      the bundle is downloaded for its version (the image's is 3.12)
#   GPU_CHECK_STAGES   passed on (default: all stages)
# Prints how long each step took (download, install, bundle, check) and the check's JSON path.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=${1:-${TMPDIR:-/tmp}/gpu-rehearsal}
case "$(realpath -m "$WORK")/" in "$REPO"/*)
  echo "error: WORK_DIR $WORK is inside the repository; give a folder outside it (default \$TMPDIR/gpu-rehearsal)" >&2
  exit 2;;
esac
if [[ -z "${REHEARSAL_PYTHON:-}" ]]; then  # the image's 3.12 where one runs (also pyenv's), else python3
  REHEARSAL_PYTHON=python3
  for candidate in python3.12 $(command -v pyenv >/dev/null && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null); do
    if "$candidate" -c pass 2>/dev/null; then REHEARSAL_PYTHON=$candidate; break; fi
  done
fi
PY=$("$REHEARSAL_PYTHON" -c 'import sys; print(sys.executable)')  # the interpreter itself, not a shim
PYVER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# What the image holds that the check uses, at the image's versions where they were read there
# (scripts/gpu_image_packages.txt); numpy: the image's 2.5.2 is not on PyPI, requirements.txt's 2.4.6
# stands in; the others at requirements.txt's pins. pip adds their dependencies, all of which the image holds
# (checked below; what it lacks is removed again).
IMAGE=(
  torch==2.11.0 torchvision==0.26.0 lightning==2.6.6 pytorch-lightning==2.6.6 torchmetrics==1.9.0
  huggingface-hub==1.33.0 safetensors==0.8.0 timm==1.0.31 numpy==2.4.6 pandas==3.1.1 pyarrow==26.0.1
  pyyaml==6.0.4 matplotlib==3.11.2 scikit-learn==1.9.1 pillow==13.0.0 xxhash fsspec tqdm filelock packaging
)
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
VENV=$WORK/venv

say() { echo "rehearsal: $*" >&2; }
t0=$SECONDS
say "downloading the image's packages for Python $PYVER into $WORK/image-wheels"
"$PY" -m pip download -q -d "$WORK/image-wheels" "${IMAGE[@]}" 2> >(grep -v "is ignored: it is neither" >&2)
t_download=$((SECONDS - t0))
size_download=$(du -sh "$WORK/image-wheels" | cut -f1)

t0=$SECONDS
say "installing them into a fresh $VENV (no index)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$WORK/image-wheels" "${IMAGE[@]}"
t_install=$((SECONDS - t0))

# the environment must look like the image: what pip added that the image lacks (a newer dependency's own
# dependency) is removed again; then nothing it lacks may be left, and none of the carried packages
IMAGE_CHECK='
import re, sys
from importlib import metadata

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(l.split("==")[0].strip()) for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")}
installed = {norm(d.metadata["Name"]) for d in metadata.distributions()}
print(" ".join(sorted(installed - image - {"pip"})))
'
extra=$(cd "$WORK" && "$VENV/bin/python" -c "$IMAGE_CHECK" "$REPO/scripts/gpu_image_packages.txt")
if [[ -n "$extra" ]]; then
  say "removing what the image lacks: $extra"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip uninstall -q -y $extra
  extra=$(cd "$WORK" && "$VENV/bin/python" -c "$IMAGE_CHECK" "$REPO/scripts/gpu_image_packages.txt")
  [[ -z "$extra" ]] || { say "error: the environment still holds packages the image lacks: $extra"; exit 1; }
fi
for module in jsonargparse datasets wandb dill multiprocess docstring_parser typeshed_client; do
  if (cd "$WORK" && "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)"); then
    say "error: $module is importable before the bundle is installed; the rehearsal would prove nothing"
    exit 1
  fi
done

t0=$SECONDS
GPU_WHEELS_PYTHON_VERSION=$PYVER PYTHON=$PY scripts/gpu_wheels.sh "$WORK/bundle"
t_bundle=$((SECONDS - t0))

t0=$SECONDS
rm -rf "$WORK/out"
rc=0
env -u PYTHONPATH PYTHON="$VENV/bin/python" GPU_CHECK_WHEELS="$WORK/bundle" GPU_CHECK_SMOKE=1 \
  scripts/gpu_check.sh "$WORK/out" || rc=$?
t_check=$((SECONDS - t0))
t_stage_install=$(awk -F'\t' '$1 == "install" { print $3 }' "$WORK/out/stages.tsv" 2>/dev/null || true)

say "Python $PYVER; download ${t_download} s ($size_download), install ${t_install} s, bundle ${t_bundle} s," \
    "check ${t_check} s (its wheel install ${t_stage_install:-?} s); rc $rc; $WORK/out/gpu_check.json"
exit $rc
