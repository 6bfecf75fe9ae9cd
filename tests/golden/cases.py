"""The fixed set of CLI runs whose outputs are held as goldens (tests/test_goldens.py).

Each case is an argv for ``simcli`` ending in ``--format json``. Keys that change from run
to run (wall time, versions) are dropped before comparing. Regenerate only on purpose:
``python -m pytest tests/test_goldens.py --update-goldens``, and say in the commit which
predictions changed and why.
"""

from __future__ import annotations

CASES: dict[str, list[str]] = {
    # training: megatron (fused), plain PyTorch, fp8, CP, MoE, interleaved, recompute
    "train_llama3_70b_interleaved": [
        "train", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "8",
        "--pp", "4", "--vpp", "2", "--pp-schedule", "interleaved", "--global-batch", "64",
        "--seq-len", "8192", "--recompute", "selective",
    ],
    "train_gpt3_175b_a100": [
        "train", "--model", "gpt3-175b", "--gpu", "a100-sxm-80gb", "--gpus", "1024", "--tp", "8",
        "--pp", "16", "--global-batch", "1536", "--seq-len", "2048", "--recompute", "full",
    ],
    "train_llama3_8b_pytorch": [
        "train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3",
        "--global-batch", "16", "--seq-len", "4096", "--framework", "pytorch",
        "--recompute", "full",
    ],
    "train_llama3_8b_fp8_cp": [
        "train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "4",
        "--cp", "4", "--global-batch", "8", "--seq-len", "65536", "--precision", "fp8",
        "--recompute", "full", "--zero", "1",
    ],
    "train_llama3_8b_ulysses_overlap": [
        "train", "--model", "llama3-8b", "--gpu", "h200-sxm", "--gpus", "16", "--tp", "4",
        "--cp", "4", "--cp-kind", "ulysses", "--global-batch", "16", "--seq-len", "32768",
        "--recompute", "selective", "--tp-comm", "overlap",
    ],
    "train_mixtral_ep": [
        "train", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "32", "--tp", "2",
        "--pp", "2", "--ep", "4", "--global-batch", "64", "--seq-len", "4096",
        "--recompute", "full", "--zero", "1",
    ],
    "train_llama3_8b_window": [
        "train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "8",
        "--global-batch", "8", "--seq-len", "32768", "--recompute", "full",
        "--attn-pattern", "window:4096",
    ],
    # plan search
    "plan_llama3_8b": [
        "plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "64", "--top", "3",
    ],
    "plan_gpt3_175b": [
        "plan", "--model", "gpt3-175b", "--gpu", "a100-sxm-80gb", "--gpus", "1024",
        "--seq-len", "2048", "--global-batch", "1536", "--top", "3",
    ],
    # serving steps
    "step_prefill_vllm": [
        "step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--phase", "prefill", "--batch", "4",
        "--prompt-len", "2048",
    ],
    "step_decode_vllm_tp2": [
        "step", "--model", "llama3-70b", "--gpu", "h200-sxm", "--tp", "4", "--phase", "decode",
        "--batch", "64", "--context-len", "4096",
    ],
    "step_prefill_eager": [
        "step", "--model", "llama3-8b", "--gpu", "h100-sxm", "--phase", "prefill", "--batch", "2",
        "--prompt-len", "1024", "--engine", "pytorch-eager",
    ],
    "step_mixed_moe": [
        "step", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--tp", "4", "--phase", "mixed",
        "--batch", "32", "--context-len", "2048", "--chunk", "512", "--past", "512",
        "--prefills", "2",
    ],
    # serving deployments
    "serve_sarathi": [
        "serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--replicas", "2", "--scheduler",
        "sarathi", "--qps", "8", "--num-requests", "300", "--prompt-len", "lognormal:1024:1",
        "--output-len", "lognormal:128:1", "--seed", "0", "--slo-ttft-s", "0.5",
        "--slo-tpot-s", "0.05",
    ],
    "serve_vllm_swap": [
        "serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--replicas", "1", "--scheduler",
        "vllm", "--qps", "30", "--num-requests", "300", "--prompt-len", "fixed:2048",
        "--output-len", "fixed:256", "--seed", "1", "--max-batch-size", "512",
        "--preemption", "swap",
    ],
    "serve_disagg": [
        "serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--replicas", "2", "--qps", "6",
        "--num-requests", "200", "--prompt-len", "lognormal:1024:1", "--output-len",
        "lognormal:128:1", "--seed", "0", "--disaggregate", "--pd-ratio", "1:1",
    ],
    "serve_branches": [
        "serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--replicas", "1", "--qps", "1",
        "--num-requests", "60", "--prompt-len", "fixed:512", "--output-len", "fixed:256",
        "--seed", "0", "--branches", "4", "--branches-stop", "2", "--prune", "sart",
    ],
    "serve_plan_small": [
        "serve", "plan", "--model", "llama3-8b", "--gpu-types", "h100-sxm", "--tp", "1,2",
        "--schedulers", "sarathi", "--chunk-sizes", "512", "--pd-ratios", "none",
        "--qps", "10", "--num-requests", "200", "--slo-ttft-s", "0.5", "--slo-tpot-s", "0.05",
        "--top", "2",
    ],
    # sparsity what-if and per-layer pricing
    "sparsity_compare": [
        "sparsity", "compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-lens",
        "8192,32768", "--patterns", "dense;nsa;window:4096;s2:local=8,stride=8",
    ],
    "predict_layer_70b": [
        "predict", "layer", "--model", "llama3-70b", "--seq-len", "4096", "--tp", "8",
        "--phase", "fwdbwd", "--gpu", "h100-sxm",
    ],
    "varlen_llama3_8b": [
        "varlen", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "8",
        "--lengths", "lognormal:4096:1:32768", "--tokens-per-step", "262144", "--steps", "4",
        "--seed", "0",
    ],
}

# Keys whose values change from run to run; dropped at any depth before comparing.
VOLATILE_KEYS = {
    "search_seconds",
    "configs_per_s",
    "phase_seconds",
    "simulation_wall_s",
    "simulated_requests_per_wall_s",
    "seconds",
    "plan_wall_s_per_step",
    "simcli_version",
}
