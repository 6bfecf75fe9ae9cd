"""simcli's scheduler against vLLM V1's own scheduler on the same arrivals.

Run: python benchmarks/compare_vllm_scheduler.py [--scheduler sarathi] [--watermark 0]
         [--data calibrate/data/vllm-scheduler-cpu] [--scenarios a,b] [--show-diffs 8]
         [--json OUT.json]

The reference is calibrate/data/vllm-scheduler-cpu: vLLM 0.11's
``vllm.v1.core.sched.scheduler.Scheduler`` driven by a fake model executor
(calibrate/engines/vllm_scheduler_probe.py). Each scenario's requests (arrival, prompt,
output) are simulated here by simcli's event loop on one replica with the same limits
(``max_num_seqs`` -> ``max_batch_size``, ``max_num_batched_tokens`` -> ``max_tokens`` and
``chunk_size``, recompute preemption, no prefix caching, block size 16, ``num_blocks - 1``
usable blocks: vLLM's pool keeps a null block) and the same synthetic step time, a
function of the batch alone (the probe's ``step_time_s``, read from meta.json), given to
the simulator as its step model (the ``StepModelLike`` contract of
``simcli.serving.batch``). Per-iteration batches are read through the simulator's
``recorder`` hook. So the iterations differ only where the scheduling policy (or the
event loop's handling of arrivals) differs.

Reported per scenario: iterations on each side; the share of aligned iterations (by
index, up to the shorter run) with the same (decodes, prefill tokens); the first
iteration that differs; mean absolute difference of scheduled tokens per aligned
iteration; preemptions on each side; per-request TTFT and finish-time differences
(simcli - vLLM); how many of V1's preemption victims were partial prefills.
``--show-diffs N`` prints the first N differing iterations side by side
(what V1 does differently). vLLM is not needed: the reference data is committed.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

# the simulator of the checkout this script is in, not an installed copy
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from simcli.serving.requests import Request  # noqa: E402
from simcli.serving.schedulers import SCHEDULERS, SchedulerConfig  # noqa: E402
from simcli.serving.simulator import ServeConfig, Simulator  # noqa: E402
from simcli.serving.timeline import StepRecorder  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "calibrate" / "data" / "vllm-scheduler-cpu"
DEFAULT_SCHEDULER = "vllm-v1" if "vllm-v1" in SCHEDULERS else "sarathi"


class SyntheticStep:
    """A step model whose iteration time is the probe's function of the batch:
    ``base_s + per_token_s * tokens + per_seq_s * sequences`` (a decode is one token)."""

    kv_bytes_per_token = 1.0

    def __init__(self, base_s: float, per_token_s: float, per_seq_s: float) -> None:
        self.base_s, self.per_token_s, self.per_seq_s = base_s, per_token_s, per_seq_s

    def step_s(self, prefill_new: np.ndarray, prefill_past: np.ndarray, decode_ctx: np.ndarray):
        tokens = int(prefill_new.sum()) + len(decode_ctx)
        seqs = len(prefill_new) + len(decode_ctx)
        return self.base_s + self.per_token_s * tokens + self.per_seq_s * seqs

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int:
        raise ValueError("the comparison passes kv_capacity_tokens explicitly")


class BatchLog(StepRecorder):
    """Every iteration's composition (the recorder hook sees each batch as it starts)."""

    def __init__(self) -> None:
        super().__init__(max_samples=1)
        self.rows: list[dict] = []
        self._pre = 0

    def step(self, engine, batch, dt_s: float) -> None:  # noqa: ANN001 - simulator types
        chunks = [f"{s.request.id}:{n}" for s, n in zip(batch.prefills, batch.prefill_new,
                                                          strict=True)]  # fmt: skip
        self.rows.append({
            "t_start_s": engine.batch_start_s, "step_s": dt_s, "num_decodes": batch.n_decode,
            "num_prefills": len(batch.prefills), "prefill_tokens": sum(batch.prefill_new),
            "prefill_chunks": ";".join(chunks),
            "scheduled_tokens": sum(batch.prefill_new) + batch.n_decode,
            "preempted": engine.preemptions - self._pre, "running": engine.num_running,
            "waiting": len(engine.waiting),
        })  # fmt: skip
        self._pre = engine.preemptions

    def request(self, req: Request) -> None:
        pass


def load(data: Path) -> tuple[dict, dict[str, list[dict]], dict[str, list[dict]]]:
    meta = json.loads((data / "meta.json").read_text())
    its: dict[str, list[dict]] = defaultdict(list)
    reqs: dict[str, list[dict]] = defaultdict(list)
    with open(data / "iterations.csv", newline="") as f:
        for r in csv.DictReader(f):
            its[r["scenario"]].append(r)
    with open(data / "requests.csv", newline="") as f:
        for r in csv.DictReader(f):
            reqs[r["scenario"]].append(r)
    return meta, its, reqs


def simulate_scenario(spec: dict, reqs: list[dict], step: SyntheticStep, scheduler: str,
                      watermark: float) -> tuple[list[dict], list[Request]]:  # fmt: skip
    mnbt = int(spec["max_num_batched_tokens"])
    cfg = ServeConfig(
        replicas=1,
        scheduler=SchedulerConfig(kind=scheduler, max_batch_size=int(spec["max_num_seqs"]),
                                  max_tokens=mnbt, chunk_size=mnbt, preemption="recompute",
                                  watermark=watermark),  # fmt: skip
        block_size=16,
        prefix_caching=False,
    )
    requests = [Request(int(r["rid"]), float(r["arrival_s"]), int(r["prompt_tokens"]),
                        int(r["output_tokens"])) for r in reqs]  # fmt: skip
    log = BatchLog()
    sim = Simulator(step, cfg, kv_capacity_tokens=(int(spec["num_blocks"]) - 1) * 16,
                    recorder=log)  # fmt: skip
    sim.run(requests)
    return log.rows, requests


def compare(v_it: list[dict], s_it: list[dict], v_rq: list[dict], s_rq: list[Request]) -> dict:
    n = min(len(v_it), len(s_it))
    same = 0
    first_diff = None
    tok_diff = []
    for i in range(n):
        a, b = v_it[i], s_it[i]
        key_a = (int(a["num_decodes"]), int(a["prefill_tokens"]))
        key_b = (int(b["num_decodes"]), int(b["prefill_tokens"]))
        if key_a == key_b:
            same += 1
        elif first_diff is None:
            first_diff = i
        tok_diff.append(abs(int(a["scheduled_tokens"]) - int(b["scheduled_tokens"])))
    by_id = {r.id: r for r in s_rq}
    ttft, fin, rel = [], [], []
    for r in v_rq:
        s = by_id[int(r["rid"])]
        arr = float(r["arrival_s"])
        v_fin = float(r["finish_s"])
        ttft.append((s.first_token_s - arr) - (float(r["first_token_s"]) - arr))
        fin.append(s.finish_s - v_fin)
        rel.append((s.finish_s - v_fin) / (v_fin - arr))
    ttft_a, fin_a, rel_a = np.array(ttft), np.array(fin), np.array(rel)
    return {
        "iterations_vllm": len(v_it),
        "iterations_simcli": len(s_it),
        "aligned": n,
        "same_composition_share": same / n if n else float("nan"),
        "first_diff_iteration": first_diff,
        "scheduled_tokens_mad": float(np.mean(tok_diff)) if tok_diff else float("nan"),
        "preemptions_vllm": sum(int(r["preempted"]) for r in v_it),
        "preemptions_simcli": sum(int(r["preempted"]) for r in s_it),
        # V1's victim is the tail of its running list, which may be a partial prefill (often
        # the request it admitted one iteration before); simcli's is always a decode
        "preempted_partial_prefills_vllm": sum(
            v.endswith(":p") for r in v_it for v in r.get("preempted_ids", "").split(";") if v
        ),
        "mean_decodes_vllm": float(np.mean([int(r["num_decodes"]) for r in v_it])),
        "mean_decodes_simcli": float(np.mean([int(r["num_decodes"]) for r in s_it])),
        "mean_tokens_vllm": float(np.mean([int(r["scheduled_tokens"]) for r in v_it])),
        "mean_tokens_simcli": float(np.mean([int(r["scheduled_tokens"]) for r in s_it])),
        "ttft_diff_s_mean": float(ttft_a.mean()),
        "ttft_diff_s_mean_abs": float(np.abs(ttft_a).mean()),
        "finish_diff_s_mean": float(fin_a.mean()),
        "finish_diff_s_mean_abs": float(np.abs(fin_a).mean()),
        "finish_diff_s_p90_abs": float(np.quantile(np.abs(fin_a), 0.9)),
        "e2e_rel_diff_mean_abs": float(np.abs(rel_a).mean()),
        "makespan_vllm_s": max(float(r["finish_s"]) for r in v_rq),
        "makespan_simcli_s": max(r.finish_s for r in s_rq),
    }


def show_diffs(name: str, v_it: list[dict], s_it: list[dict], k: int) -> None:
    shown = 0
    for i in range(min(len(v_it), len(s_it))):
        a, b = v_it[i], s_it[i]
        if (int(a["num_decodes"]), int(a["prefill_tokens"])) == (
            int(b["num_decodes"]), int(b["prefill_tokens"])
        ):  # fmt: skip
            continue
        print(f"  {name} iter {i}: t vllm {float(a['t_start_s']):.4f} simcli "
              f"{float(b['t_start_s']):.4f}")  # fmt: skip
        for side, r in (("vllm  ", a), ("simcli", b)):
            print(f"    {side} decodes {int(r['num_decodes']):4d} prefill [{r['prefill_chunks']}]"
                  f" preempted {r['preempted']} running {r['running']} waiting {r['waiting']}")
        shown += 1
        if shown >= k:
            return


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--scheduler", default=DEFAULT_SCHEDULER)
    ap.add_argument("--watermark", type=float, default=0.0,
                    help="simcli's KV watermark on admission (V1 keeps none)")
    ap.add_argument("--scenarios", default="")
    ap.add_argument("--show-diffs", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.scheduler not in SCHEDULERS:
        print(f"--scheduler {args.scheduler}; allowed: {', '.join(SCHEDULERS)}", file=sys.stderr)
        return 2
    if not 0 <= args.watermark < 1:
        print(f"--watermark {args.watermark}; allowed: 0 <= w < 1", file=sys.stderr)
        return 2
    try:
        meta, its, reqs = load(args.data)
    except (OSError, KeyError, ValueError) as exc:
        print(f"cannot read {args.data}: {exc}; allowed: a folder written by "
              "calibrate/engines/vllm_scheduler_probe.py", file=sys.stderr)  # fmt: skip
        return 2
    names = [s for s in args.scenarios.split(",") if s] or list(meta["scenarios"])
    bad = [s for s in names if s not in meta["scenarios"] or s not in its]
    if bad:
        print(f"unknown scenario {bad[0]}; allowed: {', '.join(meta['scenarios'])}",
              file=sys.stderr)  # fmt: skip
        return 2
    st = meta["step_time"]
    step = SyntheticStep(st["base_s"], st["per_token_s"], st["per_seq_s"])
    print(f"vLLM {meta['vllm_version']} V1 scheduler (reference) vs simcli --scheduler "
          f"{args.scheduler} (watermark {args.watermark}); same arrivals and step-time function")
    head = (f"{'scenario':16s} {'iters v/s':>11s} {'same%':>6s} {'1st diff':>8s} "
            f"{'|dtok|':>7s} {'preempt v/s':>11s} {'ttft d ms':>9s} {'fin d ms':>9s} "
            f"{'|fin d| ms':>10s} {'|e2e| %':>7s}")  # fmt: skip
    print(head)
    out = {"scheduler": args.scheduler, "watermark": args.watermark,
           "vllm_version": meta["vllm_version"], "scenarios": {}}  # fmt: skip
    for name in names:
        s_it, s_rq = simulate_scenario(meta["scenarios"][name], reqs[name], step,
                                       args.scheduler, args.watermark)  # fmt: skip
        c = compare(its[name], s_it, reqs[name], s_rq)
        out["scenarios"][name] = c
        fd = "-" if c["first_diff_iteration"] is None else str(c["first_diff_iteration"])
        print(f"{name:16s} {c['iterations_vllm']:5d}/{c['iterations_simcli']:<5d} "
              f"{100 * c['same_composition_share']:6.1f} {fd:>8s} {c['scheduled_tokens_mad']:7.1f} "
              f"{c['preemptions_vllm']:5d}/{c['preemptions_simcli']:<5d} "
              f"{1e3 * c['ttft_diff_s_mean']:9.1f} {1e3 * c['finish_diff_s_mean']:9.1f} "
              f"{1e3 * c['finish_diff_s_mean_abs']:10.1f} {100 * c['e2e_rel_diff_mean_abs']:7.1f}")
        if args.show_diffs:
            show_diffs(name, its[name], s_it, args.show_diffs)
    if args.json is not None:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps(out, indent=1) + "\n")
        tmp.replace(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
