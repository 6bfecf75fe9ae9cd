"""Serving-simulator speed: requests simulated per second of wall time, and peak memory.

Run: python benchmarks/serve_speed.py [--requests 100000 --replicas 8 --model llama3-8b
     --gpu h100-sxm --tp 1 --qps 200 --schedulers vllm,sarathi,orca --sizes 10000,100000
     --features plain,spec,sart,disagg]

Each (scheduler, size) runs in a fresh process so its peak RSS (``resource.getrusage``,
``ru_maxrss``) is its own; the sizes show that memory stays flat as the trace grows
(arrivals are drawn in fixed-size chunks, metrics are bounded sketches, nothing per token
is kept). Reported per run: wall time of the simulation (the StepModel built beforehand),
simulated requests per wall second, engine iterations per second, peak RSS, and the
simulated figures (TTFT/TPOT p50/p99, throughput) so the load can be checked. For
reference, Vidur (Agrawal et al., MLSys 2024) simulates on the order of hundreds of
requests per second; the target here is >= 10,000.

Plain runs take the simulator's fast path (:mod:`simcli.serving.fastpath`: arrivals as
arrays, the loop compiled with numba over flat arrays, :mod:`simcli.serving.fastkernel`);
their wall time is with the compiled kernel loaded from numba's cache. ``--features`` adds
runs of the vLLM scheduler at each size: ``compile`` (the plain run with an empty numba
cache, so the kernel compiles first: the one-time cost after an install), ``event-loop``
(the same plain run through the general event loop, which the optional features need: the
fast path's speed-up), ``spec``
(speculative decoding with a Llama-3.2-1B-shaped draft, k = 4, acceptance 0.7: two step
prices per iteration and a per-sequence context array instead of the lockstep batch),
``sart`` (4 branches per request, stop at 2, SART pruning, at a quarter of the qps: four
times the sequences per request) and ``disagg`` (half the replicas prefill, half decode,
KV transfers priced by the cost model). ``plain`` is the runs above, one per scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Llama-3.2-1B's config.json (the keys simcli reads): the draft of `spec`
LLAMA_1B = Path(__file__).parents[1] / "examples/models/llama-3.2-1b.config.json"


def _options(args: argparse.Namespace, draft: str | None = None):
    """The ``simcli serve`` options of one run (the deployment is built as the CLI builds
    it: :func:`simcli.scenario.serving.resolve_serve`)."""
    from simcli.scenario.serving import ServeOptions

    kw: dict = {}
    feature = args.feature
    if feature == "spec":
        kw = {"draft_model": draft, "spec_k": 4, "spec_acceptance": 0.7}
    elif feature == "sart":  # four times the sequences per request: a quarter of the qps
        kw = {"branches": 4, "branches_stop": 2, "prune": "sart", "qps": args.qps / 4}
    elif feature == "disagg":
        half = max(1, args.replicas // 2)
        rest = max(1, args.replicas - half)
        kw = {"disaggregate": True, "prefill_replicas": half, "decode_replicas": rest}
        kw["replicas"] = half + rest
    base = {
        "model": args.model,
        "gpu": args.gpu,
        "tp": args.tp,
        "replicas": args.replicas,
        "scheduler": args.schedulers,
        "chunk_size": 512,
        "qps": args.qps,
        "num_requests": args.requests,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "seed": args.seed,
    }
    return ServeOptions(**{**base, **kw})


def _child(args: argparse.Namespace) -> None:
    from simcli.scenario.serving import resolve_serve

    feature = args.feature
    scenario = resolve_serve(_options(args, str(LLAMA_1B)))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    sim = scenario.simulator(energy=True)  # as the CLI
    requests = scenario.arrivals.requests()
    if feature == "compile":
        feature = "plain"
    if feature == "event-loop":  # a plain iterator of Requests: the general loop
        requests = iter(requests)
    t0 = time.perf_counter()
    res = sim.run(requests, compiled=True if feature == "plain" else None)
    wall = time.perf_counter() - t0
    s = res.summary
    print(
        json.dumps(
            {
                "scheduler": args.schedulers,
                "feature": feature,
                "requests": s["requests_completed"],
                "wall_s": wall,
                "requests_per_s": s["requests_completed"] / wall,
                "iterations_per_s": s["iterations"] / wall,
                "iterations": s["iterations"],
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_before_sim_mib": rss0 / 1024,
                "simulated_s": s["duration_s"],
                "ttft_s_p50": s["ttft_s_p50"],
                "ttft_s_p99": s["ttft_s_p99"],
                "tpot_s_p50": s["tpot_s_p50"],
                "tpot_s_p99": s["tpot_s_p99"],
                "throughput_tokens_per_s": s["throughput_tokens_per_s"],
                "mean_decode_batch": s["mean_decode_batch"],
                "kv_util_mean": s["kv_util_mean"],
                "preemptions": s["preemptions"],
                "extra": {
                    "spec": f"{s['spec_tokens_per_step'] or 0:.2f} tokens/step",
                    "sart": f"pruned {s['branches_pruned']}, e2e p50 {s['e2e_s_p50']:.1f} s",
                    "disagg": f"KV transfer {(s['kv_transfer_s_mean'] or 0) * 1e3:.1f} ms",
                }.get(feature, ""),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--qps", type=float, default=200.0)
    ap.add_argument("--prompt-len", default="lognormal:512:1:4096")
    ap.add_argument("--output-len", default="lognormal:128:1:2048")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--schedulers", default="vllm,sarathi,orca")
    ap.add_argument("--sizes", default="10000,100000", help="request counts, one run each")
    ap.add_argument(
        "--features",
        default="plain,compile,event-loop,spec,sart,disagg",
        help="plain, compile, event-loop, spec, sart, disagg",
    )
    ap.add_argument("--feature", default="plain", help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    print(
        f"{args.model} on {args.replicas} x {args.gpu} tp={args.tp}, qps {args.qps:g}, "
        f"prompt {args.prompt_len}, output {args.output_len}"
    )
    features = args.features.split(",")
    runs = [(sched, "plain") for sched in args.schedulers.split(",") if "plain" in features]
    runs += [("vllm", f) for f in features if f != "plain"]
    for sched, feature in runs:
        for n in (int(x) for x in args.sizes.split(",")):
            argv = [
                sys.executable, __file__, "--child", "--requests", str(n),
                "--schedulers", sched, "--model", args.model, "--gpu", args.gpu,
                "--tp", str(args.tp), "--replicas", str(args.replicas), "--qps", str(args.qps),
                "--prompt-len", args.prompt_len, "--output-len", args.output_len,
                "--seed", str(args.seed), "--feature", feature,
            ]  # fmt: skip
            env = dict(os.environ)
            if feature == "compile":  # an empty cache: numba compiles the kernel first
                env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="simcli-numba-")
            else:  # warm the cache (a run of the plain path) before the timed run
                subprocess.run([*argv[:4], "100", *argv[5:-2], "--feature", "plain"],
                               capture_output=True, check=False)  # fmt: skip
            out = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
            if out.returncode:
                print(out.stderr.strip().splitlines()[-1] if out.stderr else "failed")
                continue
            r = json.loads(out.stdout)
            label = sched if feature == "plain" else f"{sched}+{feature}"
            print(
                f"{label:12s} {r['requests']:>7d} requests in {r['wall_s']:6.2f} s: "
                f"{r['requests_per_s']:>8.0f} requests/s, {r['iterations_per_s']:>7.0f} "
                f"iterations/s, peak RSS {r['peak_rss_mib']:.0f} MiB "
                f"(before the run {r['rss_before_sim_mib']:.0f})  | simulated "
                f"{r['simulated_s']:.0f} s, TTFT p50/p99 {r['ttft_s_p50']:.3f}/"
                f"{r['ttft_s_p99']:.3f} s, TPOT p50/p99 {r['tpot_s_p50'] * 1e3:.1f}/"
                f"{r['tpot_s_p99'] * 1e3:.1f} ms, {r['throughput_tokens_per_s']:.0f} tok/s, "
                f"batch {r['mean_decode_batch']:.0f}, KV {r['kv_util_mean']:.2f}, "
                f"preemptions {r['preemptions']}  {r['extra']}"
            )


if __name__ == "__main__":
    main()
