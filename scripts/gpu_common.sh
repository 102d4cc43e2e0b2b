# Shared pieces of the scripts that run on a lent GPU machine (scripts/gpu_check.sh, scripts/gpu_campaign.sh),
# sourced from the repository root: the Python to use, the wheel bundle (scripts/gpu_wheels.sh) and its install,
# the preflight (scripts/gpu_preflight.py), and stages that each run under a time limit inside one budget.
#
# The sourcing script sets, before calling these: GPU_TAG (the name its messages start with), OUT_DIR,
# STATUS (the stages' TSV: name, rc or "skipped", seconds, limit, why), STAGES (the optional stages to run;
# install and preflight always run), LIMIT_SCALE (1, or 5 for a CPU smoke run), DEADLINE (in $SECONDS),
# RESERVE (seconds kept after the stages), BUDGET, WORK (a temporary folder). SKIP_REASON and CHILD are kept here.

# PYTHON: as given, else .venv/bin/python if present, else python3 (on the GPU machine: the image's)
gpu_python() {
  if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
  fi
}

# gpu_wheels VAR: WHEELS from the environment variable named VAR, else gpu_wheels/ if it holds wheels; a
# folder without wheels is a usage error (one line, exit 2)
gpu_wheels() {
  local var=$1
  WHEELS="${!var:-}"
  if [[ -z "$WHEELS" ]] && compgen -G "gpu_wheels/*.whl" > /dev/null; then WHEELS=gpu_wheels; fi
  if [[ -n "$WHEELS" ]] && ! compgen -G "$WHEELS/*.whl" > /dev/null; then
    echo "error: $var=$WHEELS holds no .whl file; fill it with scripts/gpu_wheels.sh $WHEELS (where PyPI is reachable)" >&2
    exit 2
  fi
}

# gpu_require_cuda: exit 2 with one line unless torch sees a CUDA GPU
gpu_require_cuda() {
  if ! "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 2)" 2>/dev/null; then
    echo "$GPU_TAG: no CUDA GPU visible (torch.cuda.is_available() is False): nothing run" >&2
    exit 2
  fi
}

SKIP_REASON=""      # set when the stages that remain cannot run
CHILD=""
on_signal() {
  SKIP_REASON="stopped by SIG$1"
  [[ -n "$CHILD" ]] && kill -TERM "$CHILD" 2>/dev/null
}

# stage NAME SECONDS COMMAND...: run with a time limit (capped by what is left of the budget), log to
# OUT_DIR/NAME.log, record name, rc (or "skipped"), seconds, limit and why in STATUS. In the command,
# @LIMIT-N@ stands for the stage's limit less N seconds (N x LIMIT_SCALE), at least 1
stage() {
  local name=$1 limit=$(($2 * LIMIT_SCALE))
  shift 2
  if [[ " install preflight $STAGES " != *" $name "* ]]; then return 0; fi
  local left=$((DEADLINE - RESERVE - SECONDS))
  if [[ -n "$SKIP_REASON" ]] || (( left < 10 )); then
    local why=${SKIP_REASON:-"budget of ${BUDGET}s spent"}
    printf '%s\tskipped\t0\t0\t%s\n' "$name" "$why" >> "$STATUS"
    echo "$GPU_TAG: $name skipped: $why" >&2
    return 1
  fi
  (( limit > left )) && limit=$left
  local argv=() a value
  for a in "$@"; do
    while [[ $a =~ @LIMIT-([0-9]+)@ ]]; do
      value=$((limit - BASH_REMATCH[1] * LIMIT_SCALE))
      a=${a//"${BASH_REMATCH[0]}"/$((value > 1 ? value : 1))}
    done
    argv+=("$a")
  done
  echo "$GPU_TAG: $name (limit ${limit}s): ${argv[*]}" >&2
  local start=$SECONDS rc
  timeout -k 5 "$limit" "${argv[@]}" > "$OUT_DIR/$name.log" 2>&1 &
  CHILD=$!
  wait "$CHILD"; rc=$?
  while kill -0 "$CHILD" 2>/dev/null; do wait "$CHILD"; rc=$?; done  # a trapped signal interrupts wait
  CHILD=""
  local why=""
  (( rc == 124 || rc == 137 )) && why="timed out after ${limit}s"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$limit" "$why" >> "$STATUS"
  [[ $rc -eq 0 ]] || echo "$GPU_TAG: $name failed (rc $rc${why:+, $why}), see $OUT_DIR/$name.log" >&2
  return $rc
}

# install_and_preflight: the wheels of WHEELS (if any) into WORK/site, put on PYTHONPATH with the repository;
# then the preflight (OUT_DIR/preflight.json). If it fails, SKIP_REASON makes the later stages skip.
install_and_preflight() {
  export PYTHONPATH="$PWD"
  if [[ -n "$WHEELS" ]]; then
    stage install 45 "$PYTHON" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" \
      --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$WHEELS"/*.whl
    export PYTHONPATH="$PWD:$WORK/site"
  fi
  if ! stage preflight 60 "$PYTHON" scripts/gpu_preflight.py "$OUT_DIR/preflight.json"; then
    grep -h "FAILED\|warning" "$OUT_DIR/preflight.log" >&2
    SKIP_REASON=${SKIP_REASON:-"preflight failed (OUT_DIR/preflight.json)"}
  fi
}
