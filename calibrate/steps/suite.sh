#!/usr/bin/env bash
# Whole-step truth on one GPU, with a trimmed profiler trace of every config, in one call.
#
#   bash calibrate/steps/suite.sh OUT DEVICE_KIND [eager|compiled|all]
#
# eager:    training steps in eager PyTorch (3 models x 3 shapes, full recompute on two),
#           eager prefill and CUDA-graph / eager decode of two 7-8B models.
# compiled: training steps with per-block torch.compile (bf16) and torchao float8 (+compile).
# host:     small (host-bound) training steps of four models, eager twice (start and end of
#           the lease: the host's drift) and compiled / float8, to fit the host time per op.
# big:      a Llama-2-7B-shaped model (141 GB GPUs only): eager 1-4k tokens, compiled, and
#           full recompute at 2x4096 - a held-out model 4x larger than the fitted ones.
# Everything lands in OUT/steps.tar.gz (CSV + meta.json + traces per part) and OUT/suite.log.
# fp8 needs torchao: carry its wheel (.whl/) and put it on PYTHONPATH before calling this.
set -uo pipefail
OUT=${1:?OUT}; KIND=${2:?DEVICE_KIND}; PART=${3:-all}  # eager | compiled | all | host | big
W=$(mktemp -d)
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1
LOG="$OUT/suite.log"
TRAIN_MODELS=llama3.2-1b-like,llama2-small-mha,qwen2.5-1.5b-like
run() { echo "+ $*" | tee -a "$LOG"; "$@" 2>&1 | grep -v '^USDT' | tee -a "$LOG"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit,temperature.gpu --format=csv >>"$LOG" 2>&1
if [[ $PART == eager || $PART == all ]]; then
  run python3 -m calibrate.steps.train_step --out "$W/train-eager" --device cuda \
    --device-kind "$KIND" --models "$TRAIN_MODELS" --shapes 1x2048,2x4096,1x8192 \
    --trace-dir "$W/train-eager/traces" --time-budget-s 120
  run python3 -m calibrate.steps.train_step --out "$W/train-recompute" --device cuda \
    --device-kind "$KIND" --models llama3.2-1b-like,qwen2.5-1.5b-like --shapes 2x4096 \
    --recompute full --trace-dir "$W/train-recompute/traces" --time-budget-s 60
  for M in llama3-8b qwen2.5-7b-like; do
    run python3 -m calibrate.steps.serve_step --out "$W/serve-$M" --model "$M" --device cuda \
      --device-kind "$KIND" --prefill-batches 1,4 --prompt-lens 512,2048 \
      --decode-batches 1,32 --context-lens 1024,4096 --warmup 1 \
      --trace-dir "$W/serve-$M/traces" --time-budget-s 60
  done
  run python3 -m calibrate.steps.serve_step --out "$W/serve-eager-decode" --phases decode \
    --decode-mode eager --device cuda --device-kind "$KIND" --decode-batches 1,32 \
    --context-lens 1024 --warmup 1 --trace-dir "$W/serve-eager-decode/traces" --time-budget-s 30
fi
if [[ $PART == compiled || $PART == all ]]; then
  run python3 -m calibrate.steps.train_step --out "$W/train-compiled" --device cuda \
    --device-kind "$KIND" --models "$TRAIN_MODELS" --shapes 1x2048,2x4096 \
    --modes compile,fp8 --trace-dir "$W/train-compiled/traces" --time-budget-s 420
fi
if [[ $PART == host ]]; then
  HOST_MODELS=llama3.2-1b-like,llama2-small-mha,qwen2.5-1.5b-like,llama3.2-3b-like
  run python3 -m calibrate.steps.train_step --out "$W/train-host-eager" --device cuda \
    --device-kind "$KIND" --models "$HOST_MODELS" --shapes 1x256,1x512,1x1024,1x2048 \
    --steps 12 --trace-dir "$W/train-host-eager/traces" --time-budget-s 150
  run python3 -m calibrate.steps.train_step --out "$W/train-host-compiled" --device cuda \
    --device-kind "$KIND" --models "$HOST_MODELS" --shapes 1x512 --modes compile,fp8 \
    --steps 12 --trace-dir "$W/train-host-compiled/traces" --time-budget-s 240
  run python3 -m calibrate.steps.train_step --out "$W/train-host-eager-again" --device cuda \
    --device-kind "$KIND" --models "$HOST_MODELS" --shapes 1x512 \
    --steps 12 --trace-dir "$W/train-host-eager-again/traces" --time-budget-s 60
fi
if [[ $PART == big ]]; then
  run python3 -m calibrate.steps.train_step --out "$W/train-big-eager" --device cuda \
    --device-kind "$KIND" --models llama2-7b-like --shapes 1x1024,1x2048,1x4096 \
    --trace-dir "$W/train-big-eager/traces" --time-budget-s 120
  run python3 -m calibrate.steps.train_step --out "$W/train-big-recompute" --device cuda \
    --device-kind "$KIND" --models llama2-7b-like --shapes 2x4096 --recompute full \
    --trace-dir "$W/train-big-recompute/traces" --time-budget-s 90
  run python3 -m calibrate.steps.train_step --out "$W/train-big-compiled" --device cuda \
    --device-kind "$KIND" --models llama2-7b-like --shapes 1x2048 --modes compile \
    --trace-dir "$W/train-big-compiled/traces" --time-budget-s 150
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.limit,temperature.gpu --format=csv >>"$LOG" 2>&1
tar -C "$W" -czf "$OUT/steps-$PART.tar.gz" .
ls -la "$OUT"
