"""Serving capacity-planning speed: search time and simulations run for the default search.

Run: python benchmarks/serve_plan_speed.py [--model llama3-8b --qps 100 --slo-ttft-s 0.5
     --slo-tpot-s 0.03 --attainment 0.9 --num-requests 1000 --top 5 --repeat 2]

The default search is ``simcli serve plan``'s default space (GPUs h100-sxm, h200-sxm,
a100-sxm-80gb; tp 1, 2, 4; schedulers vllm and sarathi; Sarathi chunks 512 and 2048;
colocated and disaggregated 1:1 and 1:2: 81 configs). The script re-executes itself under
``taskset -c 0,1`` (two cores) when taskset exists; ``--no-pin`` runs it as it is. Each
search runs in a fresh process, so every one is cold (step-model grids, cost models and
catalogue built inside the timed search).
Reported: search seconds, simulations run (and how many stopped early), configs simulated,
skipped, pruned and infeasible, and the cheapest deployment. ``--exhaustive`` adds a search
with an unbounded ``--top``, which prunes nothing by cost: the price of searching every
config.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def _pin(argv: list[str]) -> None:
    """Re-run under ``taskset -c 0,1`` so the figure is for two cores."""
    taskset = shutil.which("taskset")
    if taskset is None or len(os.sched_getaffinity(0)) < 2:
        print("taskset not available: running unpinned", file=sys.stderr)
        return
    os.execv(taskset, [taskset, "-c", "0,1", sys.executable, __file__, *argv, "--no-pin"])


def _child(args: argparse.Namespace, top: int) -> None:
    t0 = time.perf_counter()
    from simcli.scenario.serving import plan_deployments
    from simcli.serving.plan_inputs import SLO, PlanSpace, Workload

    t_import = time.perf_counter() - t0
    result = plan_deployments(
        args.model,
        Workload(qps=args.qps, num_requests=args.num_requests, seed=args.seed),
        SLO(ttft_s=args.slo_ttft_s, tpot_s=args.slo_tpot_s, attainment=args.attainment),
        PlanSpace(),
        top=top,
    )
    out = result.summary()
    out["import_s"] = t_import
    out["best"] = result.records()[0]
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--qps", type=float, default=100.0)
    ap.add_argument("--slo-ttft-s", type=float, default=0.5)
    ap.add_argument("--slo-tpot-s", type=float, default=0.03)
    ap.add_argument("--attainment", type=float, default=0.9)
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--exhaustive", action="store_true", help="also search with no pruning")
    ap.add_argument("--no-pin", action="store_true", help="do not re-run under taskset")
    ap.add_argument("--child-top", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_top is not None:
        _child(args, args.child_top)
        return
    if not args.no_pin:
        _pin(sys.argv[1:])

    cores = sorted(os.sched_getaffinity(0))
    print(
        f"{args.model} at {args.qps:g} qps, SLO TTFT <= {args.slo_ttft_s:g} s, TPOT <= "
        f"{args.slo_tpot_s:g} s for {args.attainment:.0%} of {args.num_requests} requests; "
        f"default space (81 configs); cores {cores}"
    )
    runs = [(f"top {args.top}", args.top)] * args.repeat
    if args.exhaustive:
        runs.append(("exhaustive", 1_000_000))
    base = [sys.executable, __file__, *sys.argv[1:]]
    base = [a for a in base if a != "--exhaustive"]
    for label, top in runs:
        wall = time.perf_counter()
        proc = subprocess.run(
            [*base, "--child-top", str(top)], capture_output=True, text=True, check=True
        )
        wall = time.perf_counter() - wall
        s = json.loads(proc.stdout.strip().splitlines()[-1])
        b = s["best"]
        chunk = f" chunk {b['chunk_size']}" if b["chunk_size"] else ""
        print(
            f"{label:>10}: search {s['search_seconds']:6.2f} s (process {wall:5.2f} s, "
            f"imports {s['import_s']:.2f} s), {s['simulations_run']} simulations "
            f"({s['simulations_stopped_early']} stopped early), configs: "
            f"{s['configs_simulated']} simulated, {s['configs_pruned']} pruned, "
            f"{s['configs_skipped']} skipped, {s['configs_infeasible']} infeasible; "
            f"cheapest {b['replicas']} x tp{b['tp']} {b['gpu']} {b['scheduler']}{chunk} "
            f"${b['usd_per_hour']:.2f}/h, attainment {b['slo_attainment']:.3f}, "
            f"TTFT p99 {b['ttft_s_p99']:.3f} s, TPOT p99 {b['tpot_s_p99'] * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
