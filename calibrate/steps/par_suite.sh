#!/usr/bin/env bash
# Multi-GPU whole-step truth in one call: tensor-parallel (with sequence parallelism),
# pipeline-parallel (1F1B) and TP x PP training steps on 2 and 4 GPUs of one host, and the
# same models on one GPU of the same machine (calibrate/steps/par_step.py, train_step.py).
#
#   bash calibrate/steps/par_suite.sh OUT DEVICE_KIND [main|host|cp]
#
# main: TP 2/4 (3 models x 2 micro-batch shapes), PP 2/4 (1F1B, 8 micro-batches), TP2xPP2,
#       and the one-GPU reference (about 5 minutes).
# host: where the host bounds eager steps (about 4 minutes): one-GPU steps of 512-1k
#       tokens alone and on all 4 GPUs at once (the host's speed per op on this machine,
#       alone and with 4 processes), TP 2/4 and PP 2/4 at 1k tokens per micro-batch, and
#       a repeat of main's host-bound shapes.
# cp:   context parallelism 2/4 (PyTorch's context_parallel, ring attention with K/V passed
#       around the ring or all-gathered) at 8k and 16k tokens, and the one-GPU steps of 8k
#       tokens of the same models (about 5 minutes).
# Runs on a machine with 4 GPUs (each launch uses the first 2 or 4). Every parallel
# launch first checks loss and gradients against the single-process model on tiny fp32
# models (--check; meta.json records it) and keeps rank 0's trimmed trace of each model's
# first shape. Everything lands in OUT/par-PART.tar.gz (CSV + meta.json + traces,
# topology, log) and OUT/suite.log. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 etc.).
set -uo pipefail
OUT=${1:?OUT}; KIND=${2:?DEVICE_KIND}; PART=${3:-main}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1
W=$(mktemp -d)
LOG="$OUT/suite.log"
MODELS=llama3.2-1b-like,llama2-small-mha,llama3.2-3b-like
run() {
  echo "+ $*" | tee -a "$LOG"
  "$@" 2>&1 | grep -v --line-buffered '^USDT\|FutureWarning\|warnings.warn' | tee -a "$LOG"
}
# par TP PP LIMIT_S ARGS...: one torchrun of TP*PP ranks, killed after LIMIT_S seconds
par() {
  local tp=$1 pp=$2 limit=$3
  shift 3
  run timeout -k 10 "$limit" python3 -m torch.distributed.run --standalone \
    --nproc_per_node $((tp * pp)) \
    -m calibrate.steps.par_step --out "$W/par" --tp "$tp" --pp "$pp" --device cuda \
    --device-kind "$KIND" --check --trace-dir "$W/par/traces" --trace-first-only "$@"
}
# cpar CP ROTATE LIMIT_S ARGS...: one torchrun of CP ranks
cpar() {
  local cp=$1 rotate=$2 limit=$3
  shift 3
  run timeout -k 10 "$limit" python3 -m torch.distributed.run --standalone \
    --nproc_per_node "$cp" \
    -m calibrate.steps.par_step --out "$W/par" --cp "$cp" --cp-rotate "$rotate" \
    --device cuda --device-kind "$KIND" --check --trace-dir "$W/par/traces" \
    --trace-first-only "$@"
}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv >>"$LOG" 2>&1
mkdir -p "$W/par"
nvidia-smi topo -m >"$W/par/topo.txt" 2>&1
t0=$SECONDS
if [[ $PART == main ]]; then
# each launch is cut at its limit (the limits add up to 550 s) and starts no new config
# after its budget; the largest model comes last, so a budget cut drops it first
run timeout -k 10 70 python3 -m calibrate.steps.train_step --out "$W/single" --device cuda \
  --device-kind "$KIND" --models llama3.2-1b-like,llama2-small-mha --shapes 1x4096,2x4096 \
  --time-budget-s 45
par 2 1 95 --models "$MODELS" --shapes 1x4096,2x4096 --time-budget-s 60
par 4 1 95 --models "$MODELS" --shapes 1x4096,2x4096 --time-budget-s 60
par 1 2 110 --models "$MODELS" --shapes 1x4096,1x2048 --microbatches 8 --steps 6 \
  --time-budget-s 70
par 1 4 110 --models "$MODELS" --shapes 1x4096,1x2048 --microbatches 8 --steps 6 \
  --time-budget-s 70
par 2 2 70 --models llama3.2-1b-like,llama2-small-mha --shapes 1x4096 --microbatches 8 \
  --steps 6 --time-budget-s 35
fi
if [[ $PART == host ]]; then
# limits add up to 480 s
SMALL=llama3.2-1b-like,llama2-small-mha
run timeout -k 10 60 python3 -m calibrate.steps.train_step --out "$W/single-alone" \
  --device cuda --device-kind "$KIND" --models "$SMALL" --shapes 1x512,1x1024 --steps 12 \
  --time-budget-s 40
# the same steps in 4 processes at once, one per GPU (rank i writes single-4proc-i)
echo "+ 4 concurrent train_step processes" | tee -a "$LOG"
for i in 0 1 2 3; do
  CUDA_VISIBLE_DEVICES=$i timeout -k 10 60 python3 -m calibrate.steps.train_step \
    --out "$W/single-4proc-$i" --device cuda --device-kind "$KIND" --models "$SMALL" \
    --shapes 1x512,1x1024 --steps 12 --time-budget-s 40 >"$W/single-4proc-$i.log" 2>&1 &
done
wait
grep -h '^\[train_step\]' "$W"/single-4proc-*.log | tee -a "$LOG"
par 2 1 80 --models "$SMALL" --shapes 1x1024,1x4096 --time-budget-s 50
par 4 1 80 --models "$SMALL" --shapes 1x1024,1x4096 --time-budget-s 50
par 1 2 90 --models "$SMALL" --shapes 1x1024,1x2048 --microbatches 8 --steps 6 \
  --time-budget-s 60
par 1 4 90 --models "$SMALL" --shapes 1x1024,1x2048 --microbatches 8 --steps 6 \
  --time-budget-s 60
fi
if [[ $PART == cp ]]; then
# limits add up to 470 s
SMALL=llama3.2-1b-like,llama2-small-mha
run timeout -k 10 70 python3 -m calibrate.steps.train_step --out "$W/single" --device cuda \
  --device-kind "$KIND" --models "$SMALL" --shapes 1x8192 --time-budget-s 45
cpar 2 alltoall 100 --models "$SMALL" --shapes 1x8192,1x16384 --time-budget-s 60
cpar 4 alltoall 100 --models "$SMALL" --shapes 1x8192,1x16384 --time-budget-s 60
cpar 2 allgather 100 --models "$SMALL" --shapes 1x8192,1x16384 --time-budget-s 60
cpar 4 allgather 100 --models "$SMALL" --shapes 1x8192,1x16384 --time-budget-s 60
fi
echo "suite: $((SECONDS - t0)) s" | tee -a "$LOG"
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv >>"$LOG" 2>&1
cp "$LOG" "$W/par/suite.log"
tar -C "$W" -czf "$OUT/par-$PART.tar.gz" .
ls -la "$OUT"
