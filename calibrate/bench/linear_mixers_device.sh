#!/bin/bash
# One device call of calibrate/bench/linear_mixers.py: install the carried fla-core wheel
# and unpack the carried mamba_ssm sdist (its Triton modules only; no CUDA build) into
# /tmp, time the linear-attention / SSM kernels, and leave in $OUT (6 files) the CSVs,
# meta.json, the log, the profiler traces and Triton's autotune results (autotune_cache.tgz: carry it
# back as .whl/autotune_cache.tgz so a second call skips autotuning).
# Run from the repo root with .whl/ holding fla_core-*.whl and mamba_ssm-*.tar.gz
# (see calibrate/data/linear-mixers-h200-sxm/README.md):
#   bash calibrate/bench/linear_mixers_device.sh TIME_BUDGET_S [extra runner args]
export PYTHONUNBUFFERED=1
B=${1:-400}
shift
mkdir -p /tmp/site /tmp/src /tmp/traces /tmp/triton_cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/fla_core-*.whl || exit 1
tar xzf .whl/mamba_ssm-*.tar.gz -C /tmp/src || exit 1
MSRC=$(ls -d /tmp/src/mamba_ssm-*/ | head -1)
export PYTHONPATH=/tmp/site TRITON_CACHE_DIR=/tmp/triton_cache TRITON_CACHE_AUTOTUNING=1
[ -f .whl/autotune_cache.tgz ] && tar xzf .whl/autotune_cache.tgz -C /tmp/triton_cache
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
# rows, meta.json and the log go straight to $OUT (they come back even if the call is cut).
# A kernel that breaks the CUDA context makes the runner exit 42: start a fresh process on
# the time left, skipping every case already tried in this call.
END=$(( $(date +%s) + B ))
for try in 1 2 3 4 5; do
  LEFT=$(( END - $(date +%s) ))
  [ "$LEFT" -lt 30 ] && break
  python3 -m calibrate.bench.linear_mixers --out "$OUT" --trace-dir /tmp/traces \
    --time-budget-s "$LEFT" --mamba-src "$MSRC" --skip-attempted "$OUT"/linear_mixers.csv \
    "$@" 2>&1 | tee -a "$OUT"/log.txt
  [ "${PIPESTATUS[0]}" -eq 42 ] || break
  echo "restart $try after a broken CUDA context" | tee -a "$OUT"/log.txt
done
tar czf "$OUT"/traces.tgz -C /tmp traces
(cd /tmp/triton_cache && find . -name '*.autotune.json' | tar czf "$OUT"/autotune_cache.tgz -T -)
ls -la "$OUT"
