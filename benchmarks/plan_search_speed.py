"""Plan-search speed: configs evaluated per second (issue: >= 25,000/s on 2 cores for
GPT-3 175B on 1,024 GPUs; Calculon evaluates about 240/s on the same machine).

Run: python benchmarks/plan_search_speed.py [--model gpt3-175b --gpu a100-sxm-80gb
     --gpus 1024 --seq-len 2048 --global-batch 1536 --top 5 --repeat 3]

The script re-executes itself under ``taskset -c 0,1`` (two cores) when taskset exists;
``--no-pin`` runs it as it is. "Configs evaluated" is every plan the search enumerates
after the pruning rules, each priced for memory; those that fit get the closed-form
iteration time, and the best few are re-run with the discrete-event simulator. Reported:
the first search in the process (cold: step costs, cost model and catalogue caches
empty) and the median of ``--repeat`` more, each with its phases. Resolving the scenario
(model, hardware and cost model of every GPU count searched, ``simcli.scenario``) happens
before the search and is reported on its own, not in the configs/s figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time


def _pin(argv: list[str]) -> None:
    """Re-run under ``taskset -c 0,1`` so the figure is for two cores."""
    taskset = shutil.which("taskset")
    if taskset is None or len(os.sched_getaffinity(0)) < 2:
        print("taskset not available: running unpinned", file=sys.stderr)
        return
    os.execv(taskset, [taskset, "-c", "0,1", sys.executable, __file__, *argv, "--no-pin"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--gpu", default="a100-sxm-80gb")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=1536)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--objective", default="time", choices=("time", "cost"))
    ap.add_argument("--balance", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-pin", action="store_true", help="do not re-run under taskset")
    args = ap.parse_args()
    if not args.no_pin:
        _pin(sys.argv[1:])

    t_import = time.perf_counter()
    from simcli.scenario import PlanConfig, resolve_plan, run_plan

    config = PlanConfig(
        model=args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        seq_len=args.seq_len,
        global_batch=args.global_batch,
        top=args.top,
        objective=args.objective,
        balance=args.balance,
    )
    t_import = time.perf_counter() - t_import
    cores = sorted(os.sched_getaffinity(0))
    print(f"{args.model} on {args.gpus} x {args.gpu}, seq {args.seq_len}, global batch "
          f"{args.global_batch}, top {args.top}, objective {args.objective}; "
          f"cores {cores}; imports {t_import:.2f} s")  # fmt: skip

    resolve_s = [0.0]

    def run():
        t = time.perf_counter()
        scenario = resolve_plan(config)
        resolve_s[0] = time.perf_counter() - t
        return run_plan(scenario)

    def line(label: str, r) -> None:
        s = r.summary()
        fast = sum(v for k, v in r.phase_seconds.items() if k != "simulate")
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r.phase_seconds.items())
        print(
            f"{label}: {s['configs_evaluated']} configs ({s['configs_fit']} fit) in "
            f"{s['search_seconds']:.2f} s = {s['configs_per_s']:,.0f} configs/s "
            f"[phases s: {phases}; {r.simulated} simulated; without the simulator re-run: "
            f"{s['configs_evaluated'] / fast:,.0f} configs/s; scenario resolved in "
            f"{resolve_s[0]:.2f} s]"
        )

    first = run()
    line("cold  ", first)
    rates = []
    for i in range(args.repeat):
        r = run()
        line(f"run {i + 1} ", r)
        rates.append(r.summary()["configs_per_s"])
    if rates:
        print(f"median of {len(rates)} warm runs: {statistics.median(rates):,.0f} configs/s")
    best = first.plans[0]
    rec = best.record()
    print(
        f"best plan: tp={rec['tp']} pp={rec['pp']} vpp={rec['vpp']} dp={rec['dp']} "
        f"cp={rec['cp']} zero={rec['zero']} micro_batch={rec['micro_batch']} "
        f"recompute={rec['recompute']} sp={rec['sequence_parallel']}: "
        f"{rec['iteration_s']:.3f} s/iteration, MFU {rec['mfu']:.3f}, "
        f"{rec['peak_memory_gib']:.1f} GiB; closed form vs simulator max error "
        f"{first.estimate_max_rel_error:.2e}"
    )


if __name__ == "__main__":
    main()
