#!/bin/bash
# One device call of calibrate/bench/engine_kernels.py (and engine_step.py): install
# FlashInfer (the slimmed package of engine_kernels_pack.py + the apache-tvm-ffi wheel,
# carried in .kern/), build its kernels (or unpack .kern/aot.tar.xz from an earlier call),
# time, and leave the CSVs, meta.json, build logs and the built modules (aot.tar.xz) in
# $OUT. Run from the repo root with the scripts copied to .kern/ (see
# calibrate/data/engine-kernels-h100-sxm/README.md).
# usage: bash .kern/run.sh TIME_BUDGET_S COMPILE_BUDGET_S [extra args]
export PYTHONUNBUFFERED=1
OLDPWD_REPO=$(pwd)
B=${1:-500}; CB=${2:-240}; shift 2
mkdir -p /tmp/site /tmp/res
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .kern/whl/*.whl || exit 1
tar xJf .kern/flashinfer_slim.tar.xz -C /tmp/site || exit 1
if [ -f .kern/aot.tar.xz ]; then mkdir -p /tmp/site/flashinfer/data/aot && tar xJf .kern/aot.tar.xz -C /tmp/site/flashinfer/data/aot && ls -R /tmp/site/flashinfer/data/aot | head; fi
export PYTHONPATH=/tmp/site FLASHINFER_WORKSPACE_BASE=/tmp/fiws XDG_CACHE_HOME=/tmp/xdg
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
nvcc --version | tail -2; nproc; free -g | head -2
python3 -c "import flashinfer, tvm_ffi, torch; print('flashinfer', flashinfer.__version__, 'tvm_ffi', tvm_ffi.__version__, 'torch', torch.__version__)"
python3 .kern/engine_kernels.py --out /tmp/res --time-budget-s $B --compile-budget-s $CB "$@" 2>&1 | tee /tmp/res/log.txt
cp /tmp/res/decode.csv /tmp/res/attention.csv /tmp/res/meta.json /tmp/res/log.txt $OUT/ 2>/dev/null
tar czf $OUT/jit_logs.tgz -C /tmp/res jit_logs
# compiled modules, laid out as FlashInfer's AOT folder (<name>/<name>.so), for the next call
cd /tmp && mkdir -p aot && for so in $(find /tmp/fiws -name '*.so' -path '*cached_ops*') $(find /tmp/site/flashinfer/data/aot -name '*.so' 2>/dev/null); do n=$(basename $so .so); mkdir -p aot/$n && cp $so aot/$n/; done
du -sh aot/* 2>/dev/null; tar cf - -C /tmp/aot . | xz -T16 -6 > /tmp/aot.tar.xz; ls -la /tmp/aot.tar.xz
[ $(stat -c %s /tmp/aot.tar.xz) -lt 15000000 ] && cp /tmp/aot.tar.xz $OUT/
# a whole decode step of a Llama-3-8B-shaped model with FlashInfer attention
if [ -n "$STEP_BUDGET" ]; then
  mkdir -p /tmp/step; cd $OLDPWD_REPO && python3 .kern/engine_step.py --out /tmp/step --time-budget-s $STEP_BUDGET --traces 2>&1 | tee /tmp/step/log.txt
  tar czf $OUT/engine_step.tgz -C /tmp step
fi
ls -la $OUT
