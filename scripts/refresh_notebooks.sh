#!/usr/bin/env bash
# Re-execute notebooks in place, so that the outputs saved in them (tables, figures) are those of a
# fresh run of their defaults. Commit the result (each must stay under 1 MB: tests/test_notebooks.py).
#
# Usage (from anywhere):
#   scripts/refresh_notebooks.sh attention   # notebooks/vit_attention_analysis.ipynb
#   scripts/refresh_notebooks.sh bst         # notebooks/bst_results.ipynb (its runs first, below)
#   scripts/refresh_notebooks.sh             # both
#
# attention: needs nothing else: the shipped checkpoint reproductions/vit/demo/fmnist_vit_p4.ckpt on
#   128 Fashion-MNIST validation images (offline); figures and numbers also go to runs/analysis/fmnist_vit_p4/.
# bst: reports the runs under BST_RUNS_ROOT (default runs), made by
#   repro sweep bst/table    --profile cpu-movielens --root "$BST_RUNS_ROOT" -- --data.data_dir DIR
#   repro sweep bst/position --profile cpu-movielens --root "$BST_RUNS_ROOT" --reuse -- --data.data_dir DIR
#   (DIR: MovieLens ml-latest-small unzipped; reproductions/bst/README.md); with none there, the
#   results registry's records (what the committed notebook shows: refresh it where runs/bst has none).
#
# Environment: anything the notebooks read (ANALYSIS_*, BST_*: their parameters cells) changes what is
# saved; leave them unset to save the defaults, which the notebooks' text describes. PYTHON: the
# interpreter whose jupyter runs them (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
declare -A NOTEBOOKS=([attention]=notebooks/vit_attention_analysis.ipynb [bst]=notebooks/bst_results.ipynb)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(attention bst)
for name in "${names[@]}"; do
  notebook=${NOTEBOOKS[$name]:-}
  if [ -z "$notebook" ]; then
    echo "error: unknown notebook '$name' (one of: ${!NOTEBOOKS[*]})" >&2
    exit 2
  fi
  "$PYTHON" -m jupyter execute --inplace --timeout 1800 "$notebook"
  ls -l "$notebook"
done
