"""Whole-iteration validation of `simcli train` against real runs (not its own formulas).

Run: python benchmarks/validate_training.py
1. Published Megatron-LM iteration times on DGX A100 (Korthikanti et al. 2022, Table 4),
   simulated with Megatron's pre-FlashAttention core attention (framework megatron-unfused).
2. Real single-H100 training steps of plain PyTorch Llama-style models measured by
   calibrate/steps/train_step.py (calibrate/data/steps-h100/train_step.csv), simulated with
   framework pytorch (eager kernels under autocast) and the cuDNN attention PyTorch picked.
3. Real 1/2/4-GPU DDP and FSDP steps of the same model on H200s
   (calibrate/data/steps-h200-x4, calibrate/steps/dist_step.py).
"""

from __future__ import annotations

from simcli.training.validation import h100_step_rows, h200_dist_rows, megatron_rows


def main() -> None:
    rows = megatron_rows()
    print("Megatron-LM, Korthikanti et al. 2022 Table 4 (DGX A100 80GB)")
    print(f"{'model':14s} {'mode':7s} {'published_s':>11s} {'simulated_s':>11s} {'error':>7s}")
    for r in rows:
        print(f"{r['model']:14s} {r['mode']:7s} {r['published_s']:11.2f} "
              f"{r['simulated_s']:11.2f} {r['error_pct']:6.1f}%")  # fmt: skip
    errs = [abs(r["error_pct"]) for r in rows]
    print(f"mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%\n")
    print("Single H100, plain PyTorch (calibrate/data/steps-h100/train_step.csv)")
    head = ("model", "batch x seq", "measured_ms", "simulated_ms", "error")
    print(f"{head[0]:20s} {head[1]:>12s} {head[2]:>11s} {head[3]:>12s} {head[4]:>7s}")
    steps = h100_step_rows()
    for r in steps:
        print(f"{r['model']:20s} {r['shape']:>12s} {r['measured_ms']:11.1f} "
              f"{r['simulated_ms']:12.1f} {r['error_pct']:6.1f}%")  # fmt: skip
    errs = [abs(r["error_pct"]) for r in steps]
    print(f"mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%\n")
    print("1/2/4 H200s, plain PyTorch DDP / FSDP (calibrate/data/steps-h200-x4)")
    dist = h200_dist_rows()
    for r in dist:
        tag = " (fitted)" if r["fitted"] else ""
        print(f"{r['mode']:6s} x{r['gpus']} {r['shape']:>8s} {r['measured_ms']:8.1f} "
              f"{r['simulated_ms']:8.1f} {r['error_pct']:6.1f}%{tag}")  # fmt: skip
    errs = [abs(r["error_pct"]) for r in dist if not r["fitted"]]
    print(f"not fitted: mean |error| {sum(errs) / len(errs):.1f}%  max {max(errs):.1f}%")


if __name__ == "__main__":
    main()
