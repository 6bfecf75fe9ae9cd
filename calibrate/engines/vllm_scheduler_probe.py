"""Drive vLLM V1's own scheduler with a fake model executor: batch composition per
iteration on given arrivals, and the scheduler's host (CPU) time per iteration.

    python calibrate/engines/vllm_scheduler_probe.py --out DIR [--what traces,hostcost,fit]
        [--scenarios NAME,...] [--hostcost-reps 15] [--hostcost-rounds 3] [--no-log-stats]
        [--arrivals CSV --name NAME --num-blocks B --max-num-seqs S --max-num-batched-tokens T]

Runs in a virtualenv with vLLM installed (see calibrate/data/vllm-scheduler-cpu/README.md:
``pip install --no-deps vllm`` plus the pure-Python modules its scheduler imports and a CPU
torch); it imports nothing of simcli. No GPU, no weights, no tokenizer: the model config is
a one-layer Llama ``config.json`` written to a temporary folder (the scheduler reads only
``max_model_len`` and whether the model is encoder-decoder / multimodal from it).

What is real: ``vllm.v1.core.sched.scheduler.Scheduler`` (the class ``EngineCore`` builds),
its ``KVCacheManager`` over ``--num-blocks`` blocks of 16 tokens (one full-attention group;
the block pool keeps block 0 as its null block, so ``num_blocks - 1`` are usable), chunked
prefill on (the V1 default), prefix caching off, FCFS, recompute preemption, requests with
``SamplingParams(max_tokens=L, ignore_eos=True)``.

What is fake: the model executor. Each iteration, as ``EngineCore.step`` does without
async scheduling: add the requests that have arrived by the simulated clock,
``schedule()``, advance the clock by the step time, then ``update_from_output()`` with one
sampled token for every scheduled request whose prompt (plus, after a preemption, its
earlier output) is now fully computed, and none for a partial prefill chunk (the GPU model
runner discards those samples: ``discard_request_indices``, seq_lens < num_tokens). The step time is
a synthetic function of the batch, :func:`step_time_s`, the same one
benchmarks/compare_vllm_scheduler.py gives simcli: only composition and host time matter.

Outputs (``--out``): ``iterations.csv`` (one row per iteration per scenario),
``requests.csv`` (arrivals, lengths, first-token and finish times), ``hostcost.csv`` (host
time of one ``schedule()`` + ``update_from_output()`` by running sequences and tokens),
``meta.json`` (versions, CPU, scenarios, the host-cost fit and its held-out error).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BLOCK_SIZE = 16

# Synthetic step time (seconds) of one iteration: a fixed part plus per scheduled token and
# per scheduled sequence. Not a measurement of any GPU: it only sets the simulated clock so
# that arrivals interleave with iterations as they would; both sides use these constants.
STEP_BASE_S = 0.005
STEP_PER_TOKEN_S = 25e-6
STEP_PER_SEQ_S = 20e-6


def step_time_s(scheduled_tokens: int, scheduled_seqs: int) -> float:
    return STEP_BASE_S + STEP_PER_TOKEN_S * scheduled_tokens + STEP_PER_SEQ_S * scheduled_seqs


# Scenario families: (arrivals, lengths, engine limits). Lengths and arrivals are drawn here
# from a seeded generator and written to requests.csv, which the comparison reads back.
SCENARIOS: dict[str, dict] = {
    # moderate Poisson load, a 2048-token budget: chunking and mixed batches
    "poisson_chunked": dict(n=300, qps=6.0, prompt=(64, 3000), output=(16, 400), num_blocks=4096,
                            max_num_seqs=256, max_num_batched_tokens=2048, seed=1),
    # heavier load with the V1 default budget of the OpenAI server on a big GPU (8192)
    "poisson_8k": dict(n=400, qps=12.0, prompt=(32, 4000), output=(8, 512), num_blocks=8192,
                       max_num_seqs=256, max_num_batched_tokens=8192, seed=2),
    # KV pressure: few blocks, so running requests are preempted (recompute)
    "kv_pressure": dict(n=200, qps=8.0, prompt=(128, 1500), output=(64, 600), num_blocks=700,
                        max_num_seqs=128, max_num_batched_tokens=1024, seed=3),
    # offline: everything at t=0, the seat limit binds
    "offline_seats": dict(n=300, qps=None, prompt=(16, 1024), output=(16, 300), num_blocks=6000,
                          max_num_seqs=64, max_num_batched_tokens=4096, seed=4),
    # long prompts over a small budget: multi-iteration chunked prefills beside decodes
    "long_prompts": dict(n=80, qps=1.5, prompt=(2000, 12000), output=(32, 256), num_blocks=12000,
                         max_num_seqs=128, max_num_batched_tokens=1024, seed=5),
}


def draw_requests(spec: dict) -> list[tuple[float, int, int]]:
    """A scenario's (arrival_s, prompt, output) per request: read from its arrivals file
    (``--arrivals``) or drawn from its seeded distributions."""
    if "arrivals_file" in spec:
        return read_arrivals(Path(spec["arrivals_file"]))
    rng = np.random.default_rng(spec["seed"])
    n = spec["n"]
    qps = spec["qps"]
    arr = np.zeros(n) if qps is None else np.cumsum(rng.exponential(1.0 / qps, n))
    p = rng.integers(spec["prompt"][0], spec["prompt"][1] + 1, n)
    o = rng.integers(spec["output"][0], spec["output"][1] + 1, n)
    return [(float(round(a, 6)), int(pi), int(oi)) for a, pi, oi in zip(arr, p, o, strict=True)]


def read_arrivals(path: Path) -> list[tuple[float, int, int]]:
    """A CSV with columns arrival_s, prompt_tokens, output_tokens (sorted by arrival)."""
    with open(path, newline="") as f:
        rows = [(float(r["arrival_s"]), int(r["prompt_tokens"]), int(r["output_tokens"]))
                for r in csv.DictReader(f)]  # fmt: skip
    if not rows:
        raise ValueError(f"{path}: no requests; allowed: a CSV of arrival_s,prompt_tokens,"
                         "output_tokens rows")  # fmt: skip
    for i, (a, p, o) in enumerate(rows):
        if p < 1 or o < 1 or (i and a < rows[i - 1][0]):
            raise ValueError(f"{path} row {i + 2}: arrival {a}, prompt {p}, output {o}; allowed: "
                             "arrivals sorted, prompt and output >= 1")  # fmt: skip
    return rows


# --- vLLM objects ----------------------------------------------------------------------------
def _model_dir() -> str:
    d = tempfile.mkdtemp(prefix="vllm-probe-model-")
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "vocab_size": 32000, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "dtype": "float16",
    }  # fmt: skip
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


_MODEL_DIR: str | None = None


def make_scheduler(num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int,
                   max_model_len: int = 32768, log_stats: bool = True):  # fmt: skip
    """vLLM V1's Scheduler as EngineCore builds it, over a KV pool of ``num_blocks``."""
    global _MODEL_DIR
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if _MODEL_DIR is None:
        _MODEL_DIR = _model_dir()
    mc = ModelConfig(model=_MODEL_DIR, skip_tokenizer_init=True, dtype="float16",
                     max_model_len=max_model_len, seed=0)  # fmt: skip
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=max_model_len, enable_chunked_prefill=True)  # fmt: skip
    cc = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, swap_space=0,
                     cache_dtype="auto", enable_prefix_caching=False)  # fmt: skip
    cc.num_gpu_blocks = num_blocks
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                    device_config=DeviceConfig(device="cpu"))  # fmt: skip
    assert vc.scheduler_config.chunked_prefill_enabled
    assert not vc.cache_config.enable_prefix_caching
    assert vc.scheduler_config.max_num_batched_tokens == max_num_batched_tokens
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float16))],
    )  # fmt: skip
    return Scheduler(vllm_config=vc, kv_cache_config=kv,
                     structured_output_manager=StructuredOutputManager(vc),
                     log_stats=log_stats)  # fmt: skip


def make_request(rid: str, prompt: int, output: int, arrival_s: float):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(max_tokens=output, ignore_eos=True)
    return Request(request_id=rid, prompt_token_ids=[1] * prompt, sampling_params=sp,
                   pooling_params=None, eos_token_id=2, arrival_time=arrival_s)  # fmt: skip


def fake_output(sched, out):
    """What the GPU model runner returns: one token per request whose known tokens are all
    computed after this step, none for a partial prefill chunk."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    reqs = sched.requests
    sampled = [[7] if reqs[r].num_computed_tokens >= reqs[r].num_tokens else [] for r in ids]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                             pooler_output=[])  # fmt: skip


# --- traces ----------------------------------------------------------------------------------
ITER_COLUMNS = [
    "scenario", "iter", "t_start_s", "step_s", "num_decodes", "num_prefills", "prefill_tokens",
    "prefill_chunks", "scheduled_tokens", "preempted", "preempted_ids", "running", "waiting",
    "kv_free_blocks",
    "schedule_wall_s", "schedule_cpu_s", "update_wall_s", "update_cpu_s",
]  # fmt: skip
REQ_COLUMNS = ["scenario", "rid", "arrival_s", "prompt_tokens", "output_tokens",
               "first_token_s", "finish_s", "preemptions"]  # fmt: skip


def _decoding(state: tuple[int, int, int]) -> bool:
    """(computed, known tokens, output tokens): only the last sampled token left to run."""
    return state[2] > 0 and state[0] == state[1] - 1


def run_scenario(name: str, spec: dict, log_stats: bool) -> tuple[list[list], list[list]]:
    reqs = draw_requests(spec)
    sched = make_scheduler(spec["num_blocks"], spec["max_num_seqs"], spec["max_num_batched_tokens"],
                           log_stats=log_stats)  # fmt: skip
    pool = sched.kv_cache_manager.block_pool
    first: dict[str, float] = {}
    finish: dict[str, float] = {}
    preempts: dict[str, int] = {}
    rows: list[list] = []
    clock, nxt, it = 0.0, 0, 0
    n = len(reqs)
    gc.collect()
    gc.freeze()
    while len(finish) < n:
        while nxt < n and reqs[nxt][0] <= clock:
            a, p, o = reqs[nxt]
            sched.add_request(make_request(str(nxt), p, o, a))
            nxt += 1
        if not sched.has_unfinished_requests():
            clock = reqs[nxt][0]  # idle until the next arrival
            continue
        # the state each scheduled request had before this step (to tell decodes)
        before = {r.request_id: (r.num_computed_tokens, r.num_tokens, r.num_output_tokens)
                  for r in sched.running}  # fmt: skip
        w0, c0 = time.perf_counter(), time.process_time()
        out = sched.schedule()
        w1, c1 = time.perf_counter(), time.process_time()
        dec, chunks = 0, []
        for rid, k in out.num_scheduled_tokens.items():
            st = before.get(rid)
            if st is not None and k == 1 and _decoding(st):
                dec += 1
            else:
                chunks.append(f"{rid}:{k}")
        npre = len(chunks)
        ptok = out.total_num_scheduled_tokens - dec
        # running before this schedule() and sent back to the waiting queue by it
        gone = [rid for rid in before if sched.requests[rid].status.name == "PREEMPTED"]
        preempted = len(gone)
        # victim kind: d = decoding, p = partial prefill (its known tokens not all computed)
        gone_ids = ";".join(f"{rid}:{'d' if _decoding(before[rid]) else 'p'}" for rid in gone)
        for rid in gone:
            preempts[rid] = preempts.get(rid, 0) + 1
        step = step_time_s(out.total_num_scheduled_tokens, len(out.num_scheduled_tokens))
        t0 = clock
        clock += step
        mro = fake_output(sched, out)
        w2, c2 = time.perf_counter(), time.process_time()
        eco = sched.update_from_output(out, mro)
        w3, c3 = time.perf_counter(), time.process_time()
        for outs in eco.values():
            for o in outs.outputs:
                if o.new_token_ids and o.request_id not in first:
                    first[o.request_id] = clock
                if o.finish_reason is not None:
                    finish[o.request_id] = clock
        rows.append([name, it, round(t0, 9), round(step, 9), dec, npre, ptok, ";".join(chunks),
                     out.total_num_scheduled_tokens, preempted, gone_ids, len(sched.running),
                     len(sched.waiting), pool.get_num_free_blocks(), w1 - w0, c1 - c0,
                     w3 - w2, c3 - c2])  # fmt: skip
        it += 1
        if it > 2_000_000:
            raise RuntimeError(f"{name}: no progress after {it} iterations")
    gc.unfreeze()
    req_rows = []
    for i, (a, p, o) in enumerate(reqs):
        rid = str(i)
        req_rows.append([name, i, a, p, o, round(first[rid], 9), round(finish[rid], 9),
                         preempts.get(rid, 0)])  # fmt: skip
    return rows, req_rows


def count_preemptions(rows: list[list]) -> int:
    return sum(r[ITER_COLUMNS.index("preempted")] for r in rows)


# --- host cost -------------------------------------------------------------------------------
HOST_COLUMNS = ["family", "seqs", "decodes", "prefill_tokens", "tokens", "reps", "rounds",
                "schedule_cpu_s", "update_cpu_s", "total_cpu_s", "total_wall_s",
                "total_cpu_s_min_round", "total_cpu_s_max_round"]  # fmt: skip


def _timed_steps(sched, reps: int) -> tuple[float, float, float, float, int, int, int]:
    """Median CPU/wall time of ``reps`` schedule()+update_from_output() iterations."""
    sc, uc, tw = [], [], []
    seqs = toks = decs = 0
    for _ in range(reps):
        before = {r.request_id: (r.num_computed_tokens, r.num_tokens, r.num_output_tokens)
                  for r in sched.running}  # fmt: skip
        w0, c0 = time.perf_counter(), time.process_time()
        out = sched.schedule()
        c1 = time.process_time()
        mro = fake_output(sched, out)
        c2 = time.process_time()
        sched.update_from_output(out, mro)
        w3, c3 = time.perf_counter(), time.process_time()
        sc.append(c1 - c0)
        uc.append(c3 - c2)
        tw.append(w3 - w0 - (c2 - c1))
        seqs = len(out.num_scheduled_tokens)
        toks = out.total_num_scheduled_tokens
        decs = sum(1 for rid, k in out.num_scheduled_tokens.items()
                   if k == 1 and rid in before and before[rid][2] > 0)  # fmt: skip
    return (statistics.median(sc), statistics.median(uc),
            statistics.median([a + b for a, b in zip(sc, uc, strict=True)]),
            statistics.median(tw), seqs, toks, decs)  # fmt: skip


def host_point(family: str, decodes: int, prefills: int, prefill_len: int, reps: int,
               log_stats: bool) -> list:  # fmt: skip
    """Steady state with ``decodes`` decoding sequences plus ``prefills`` new prompts of
    ``prefill_len`` tokens scheduled in the timed iteration (a fresh batch of prompts
    before each timed step)."""
    budget = decodes + prefills * prefill_len + 16
    blocks = decodes * 8 + prefills * (prefill_len // 16 + 4) * 2 + 64
    sched = make_scheduler(num_blocks=blocks, max_num_seqs=max(decodes + prefills, 1) + 1,
                           max_num_batched_tokens=max(budget, 2048), log_stats=log_stats)
    for i in range(decodes):  # short prompts, long outputs: they decode for the whole run
        sched.add_request(make_request(f"d{i}", 32, 100000, 0.0))
    while any(r.num_output_tokens == 0 for r in sched.running) or sched.waiting:
        out = sched.schedule()
        sched.update_from_output(out, fake_output(sched, out))
    gc.collect()  # EngineCore freezes its startup heap the same way (gc.collect; gc.freeze)
    gc.freeze()
    if prefills == 0:
        sc, uc, tot, wall, seqs, toks, decs = _timed_steps(sched, reps)
    else:
        vals = []
        for rep in range(reps):  # each timed step admits a fresh set of prompts (output 1)
            for j in range(prefills):
                sched.add_request(make_request(f"p{rep}_{j}", prefill_len, 1, 0.0))
            vals.append(_timed_steps(sched, 1))
        sc = statistics.median(v[0] for v in vals)
        uc = statistics.median(v[1] for v in vals)
        tot = statistics.median(v[2] for v in vals)
        wall = statistics.median(v[3] for v in vals)
        seqs, toks, decs = vals[-1][4], vals[-1][5], vals[-1][6]
    gc.unfreeze()
    return [family, seqs, decs, toks - decs, toks, reps, sc, uc, tot, wall]


def host_rows(reps: int, rounds: int, log_stats: bool) -> list[list]:
    """Every grid point ``rounds`` times, each round in its own shuffled order (so that a
    burst of load from other processes on a shared machine hits different points); a row
    is the median over the rounds, with the smallest and largest round."""
    grid = host_grid()
    got: dict[int, list[list]] = {i: [] for i in range(len(grid))}
    rng = np.random.default_rng(0)
    for rd in range(rounds):
        for i in rng.permutation(len(grid)):
            fam, d, k, plen = grid[i]
            got[int(i)].append(host_point(fam, d, k, plen, reps, log_stats))
        print(f"host cost: round {rd + 1}/{rounds} done", file=sys.stderr)
    rows = []
    for i in range(len(grid)):
        rs = got[i]
        med = [statistics.median(r[j] for r in rs) for j in range(6, 10)]
        tot = [r[8] for r in rs]
        rows.append(rs[0][:6] + [rounds] + med + [min(tot), max(tot)])
    return rows


def host_grid() -> list[tuple[str, int, int, int]]:
    """(family, decodes, prefills, prefill_len): three families for the held-out split."""
    grid = []
    for n in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 640, 768, 896, 1024):
        grid.append(("decode", n, 0, 0))
    for n in (1, 8, 32, 64, 128, 256, 512, 1024):
        for c in (256, 2048, 8192):
            grid.append(("decode+chunk", n, 1, c))
    for k in (1, 2, 4, 8, 16, 32, 64, 128):
        for plen in (64, 512):
            grid.append(("prefills", 0, k, plen))
    return grid


def fit_host(rows: list[list], column: str = "total_cpu_s") -> dict:
    """Least squares ``cpu_s = a + b * seqs + c * tokens`` on all but one family, MAPE on
    the held-out family; then the fit on every row (the one to use)."""
    fam = np.array([r[0] for r in rows])
    x = np.array([[1.0, float(r[1]), float(r[4])] for r in rows])
    y = np.array([float(r[HOST_COLUMNS.index(column)]) for r in rows])
    # weights 1 / y: least squares on the relative error, the error that MAPE reports
    x, y0 = x / y[:, None], y
    y = np.ones_like(y0)
    res: dict = {"model": "schedule_plus_update_cpu_s = a + b * seqs + c * tokens",
                 "column": column, "held_out": {}}  # fmt: skip
    for f in sorted(set(fam)):
        tr, te = fam != f, fam == f
        coef, *_ = np.linalg.lstsq(x[tr], y[tr], rcond=None)
        pred = x[te] @ coef  # predicted / measured
        res["held_out"][f] = {"a_s": coef[0], "b_s_per_seq": coef[1], "c_s_per_token": coef[2],
                              "mape": float(np.mean(np.abs(pred - 1.0))),
                              "rows": int(te.sum())}  # fmt: skip
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    pred = x @ coef
    res["all"] = {"a_s": coef[0], "b_s_per_seq": coef[1], "c_s_per_token": coef[2],
                  "mape_in_sample": float(np.mean(np.abs(pred - 1.0))), "rows": len(rows)}
    return json.loads(json.dumps(res, default=float))


# --- main ------------------------------------------------------------------------------------
def cpu_details() -> dict:
    """/proc/cpuinfo's family, model, stepping and MHz of the first CPU (a VM may hide
    the model name, not these)."""
    out: dict = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "cpu family", "model", "stepping", "cpu MHz", "cache size"):
                out.setdefault(key.replace(" ", "_"), val.strip())
            if not line.strip() and out:
                break
    except OSError:
        pass
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_csv(path: Path, cols: list[str], rows: list[list]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in rows:
            w.writerow([f"{v:.9g}" if isinstance(v, float) else v for v in r])
    tmp.replace(path)


def environment(log_stats: bool) -> dict:
    """What meta.json records of the software and machine a measurement ran on."""
    import torch
    import vllm

    return {
        "vllm_version": vllm.__version__, "torch_version": torch.__version__,
        "python": platform.python_version(), "cpu_model": cpu_model(), "cpu": cpu_details(),
        "cpus": os.cpu_count(), "platform": platform.platform(),
        "date_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "scheduler": "vllm.v1.core.sched.scheduler.Scheduler (FCFS, chunked prefill, "
                     "no prefix caching, recompute preemption, sync scheduling)",
        "block_size": BLOCK_SIZE, "log_stats": log_stats,
        "step_time": {"formula": "base_s + per_token_s * scheduled_tokens + per_seq_s * "
                                 "scheduled_seqs", "base_s": STEP_BASE_S,
                      "per_token_s": STEP_PER_TOKEN_S, "per_seq_s": STEP_PER_SEQ_S},
        "usable_blocks_note": "the block pool keeps one null block: num_blocks - 1 usable",
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--what", default="traces,hostcost")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--hostcost-reps", type=int, default=15)
    ap.add_argument("--hostcost-rounds", type=int, default=3)
    ap.add_argument("--arrivals", type=Path, default=None,
                    help="trace one scenario of your own: CSV of arrival_s,prompt_tokens,"
                         "output_tokens (with --name and the three limits below)")
    ap.add_argument("--name", default="custom")
    ap.add_argument("--num-blocks", type=int, default=4096)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--no-log-stats", action="store_true",
                    help="Scheduler(log_stats=False), as the offline LLM class runs it")
    args = ap.parse_args(argv)
    what = set(args.what.split(","))
    if not what <= {"traces", "hostcost", "fit"}:
        print(f"--what {args.what}; allowed: traces, hostcost, fit", file=sys.stderr)
        return 2
    scenarios = dict(SCENARIOS)
    names = args.scenarios.split(",")
    if args.arrivals is not None:
        try:
            n = len(read_arrivals(args.arrivals))
        except (OSError, KeyError, ValueError) as exc:
            print(f"--arrivals: {exc}", file=sys.stderr)
            return 2
        if min(args.num_blocks, args.max_num_seqs, args.max_num_batched_tokens) < 1:
            print("--num-blocks, --max-num-seqs, --max-num-batched-tokens; allowed: >= 1",
                  file=sys.stderr)  # fmt: skip
            return 2
        scenarios = {args.name: dict(n=n, arrivals_file=str(args.arrivals),
                                     num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs,
                                     max_num_batched_tokens=args.max_num_batched_tokens)}
        names = [args.name]
    bad = [s for s in names if s not in scenarios]
    if bad:
        print(f"unknown scenario {bad[0]}; allowed: {', '.join(scenarios)}", file=sys.stderr)
        return 2
    log_stats = not args.no_log_stats
    args.out.mkdir(parents=True, exist_ok=True)
    meta_path = args.out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if what != {"fit"}:
        meta.update(environment(log_stats))
    if "traces" in what:
        it_rows, rq_rows = [], []
        for s in names:
            t = time.perf_counter()
            a, b = run_scenario(s, scenarios[s], log_stats)
            it_rows += a
            rq_rows += b
            print(f"{s}: {len(a)} iterations, {count_preemptions(a)} preemptions, "
                  f"{time.perf_counter() - t:.1f} s", file=sys.stderr)  # fmt: skip
        write_csv(args.out / "iterations.csv", ITER_COLUMNS, it_rows)
        write_csv(args.out / "requests.csv", REQ_COLUMNS, rq_rows)
        meta["scenarios"] = {s: scenarios[s] for s in names}
    if "hostcost" in what:
        rows = host_rows(args.hostcost_reps, args.hostcost_rounds, log_stats)
        write_csv(args.out / "hostcost.csv", HOST_COLUMNS, rows)
    if "hostcost" in what or "fit" in what:  # fit: refit the hostcost.csv already there
        with open(args.out / "hostcost.csv", newline="") as f:
            rows = [list(r.values()) for r in csv.DictReader(f)]
        meta["hostcost_fit"] = fit_host(rows)
        # the least disturbed round of each point (a shared machine's load only adds)
        meta["hostcost_fit_min_round"] = fit_host(rows, "total_cpu_s_min_round")
        meta["hostcost_note"] = (
            "CPU time of Scheduler.schedule() + update_from_output() only (median of reps); "
            "excludes the model runner's input preparation, sampling, detokenisation and the "
            "API server; measured on this CPU (server CPUs differ)")
    tmp = meta_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1, default=float) + "\n")
    tmp.replace(meta_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
