"""The schedulers of real engines (vllm-v1, priority, sglang, trtllm): the compiled loop
equals the event loop request for request, the policies do what their engines do, and
the invariants hold on random workloads (hypothesis)."""

from __future__ import annotations

import json
import math
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from simcli.scenario.serving import ServeOptions, resolve_serve
from simcli.serving import fastpath, policy
from simcli.serving.engine import Engine
from simcli.serving.priority import parse_priority_mix
from simcli.serving.requests import RequestChunk, RequestStream, trace_requests
from simcli.serving.schedulers import SCHEDULERS, SchedulerConfig, make_scheduler
from simcli.serving.simulator import ServeConfig, Simulator

NEW = ("vllm-v1", "priority", "sglang", "trtllm", "trtllm-max-util")
# KV room for ~12k tokens per replica: the decode batches run out of blocks often
TIGHT = {
    "model": "llama3-8b",
    "gpu": "h100-sxm",
    "replicas": 3,
    "gpu_memory_utilization": 0.25,
    "max_batch_size": 256,  # the old default: vLLM V1 takes 1024 seats and less KV room
    "qps": 20.0,
    "num_requests": 250,
    "prompt_len": "lognormal:700:0.8:3000",
    "output_len": "lognormal:400:0.8:2000",
    "seed": 3,
    "priority_mix": "0:0.3,1:0.7",
}


@pytest.fixture(autouse=True)
def _compiled_for_any_size(monkeypatch):
    monkeypatch.setattr(fastpath, "COMPILE_FROM_REQUESTS", 0)


@cache
def _scenario(**kw):
    return resolve_serve(ServeOptions(**{**TIGHT, **kw}))


def _row(req):
    return (req.id, req.replica, req.arrival_s, req.prompt_tokens, req.output_tokens,
            req.first_token_s, req.finish_s, req.preemptions, req.priority)  # fmt: skip


def _both(make_sim, stream):
    """(compiled result, event-loop result, their per-request rows) of one run."""
    rows: tuple[list, list] = ([], [])
    out = []
    for i, reqs in enumerate((stream, list(stream))):
        sim = make_sim(sink=lambda r, _i=i: rows[_i].append(_row(r)))
        if i == 1:  # the list has lost the stream's flag: same metrics either way
            sim.metrics.track_priority = sim.metrics.track_priority or stream.priorities
        assert fastpath.eligible(sim, reqs) == (i == 0)
        out.append(sim.run(reqs))
    return out[0], out[1], rows


def _close(x, y) -> bool:
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_close(x[k], y[k]) for k in x)
    if isinstance(x, float) and isinstance(y, float):
        return (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-9, abs=1e-12)
    return x == y


def _same(a, b):
    assert a.summary.keys() == b.summary.keys()
    for k, x in a.summary.items():
        assert _close(x, b.summary[k]), k
    assert a.per_replica == b.per_replica


@pytest.mark.parametrize("kind", NEW)
@pytest.mark.parametrize("router", ["least_outstanding", "kv_aware"])
def test_compiled_loop_equals_event_loop(kind, router):
    sc = _scenario(scheduler=kind, router=router)
    fast, slow, rows = _both(sc.simulator, sc.arrivals.requests())
    _same(fast, slow)
    assert rows[0] == rows[1] and len(rows[0]) == 250
    pre = fast.summary["preemptions"]
    if kind == "trtllm":
        assert pre == 0  # GUARANTEED_NO_EVICT
    else:
        assert pre > 5  # the scenario does exercise preemption / retraction
    assert set(fast.summary["by_priority"]) == {"0", "1"}


@pytest.mark.parametrize("kind", NEW)
def test_compiled_loop_equals_event_loop_with_knobs(kind):
    """Other budgets: V1's long_prefill_token_threshold (several partial prefills at once),
    SGLang's small chunks and prefill budget, a small token budget, few seats."""
    sc = _scenario(scheduler=kind, num_requests=160)
    base = sc.deployment.config
    sched = base.scheduler.model_copy(
        update={"long_prefill_token_threshold": 300, "chunked_prefill_size": 700,
                "max_prefill_tokens": 1500, "max_tokens": 1024, "max_batch_size": 24}
    )  # fmt: skip
    cfg = base.model_copy(update={"scheduler": sched})

    def make(**kw):
        return Simulator(sc.deployment.step, cfg, **kw)

    fast, slow, rows = _both(make, sc.arrivals.requests())
    _same(fast, slow)
    assert rows[0] == rows[1]


def test_compiled_loop_equals_event_loop_on_a_trace_with_priorities(tmp_path):
    path = tmp_path / "t.csv"
    rng = np.random.default_rng(4)
    lines = ["arrival_s,prompt_tokens,output_tokens,priority"]
    t = 0.0
    for _ in range(220):
        t += float(rng.exponential(0.05))
        lines.append(f"{t},{int(rng.integers(1, 2500))},{int(rng.integers(1, 900))},"
                     f"{int(rng.integers(-1, 3))}")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    stream = trace_requests(path)
    assert stream.priorities
    sc = _scenario(scheduler="priority")
    fast, slow, rows = _both(sc.simulator, stream)
    _same(fast, slow)
    assert rows[0] == rows[1]
    assert sorted(fast.summary["by_priority"]) == ["-1", "0", "1", "2"]
    assert {r[-1] for r in rows[0]} == {-1, 0, 1, 2}


def test_priority_serves_the_urgent_class_first():
    sc = _scenario(scheduler="priority")
    by = sc.simulator().run(sc.arrivals.requests()).summary["by_priority"]
    assert by["0"]["ttft_s_p50"] < 0.2 * by["1"]["ttft_s_p50"]
    fcfs = _scenario(scheduler="vllm-v1")
    run = fcfs.simulator().run(fcfs.arrivals.requests()).summary
    # without the priority policy the classes wait alike (same arrivals, same mix)
    assert run["by_priority"]["0"]["ttft_s_p50"] > 0.5 * run["by_priority"]["1"]["ttft_s_p50"]


def test_trtllm_reserves_whole_sequences_and_never_preempts():
    """GUARANTEED_NO_EVICT: the running requests' whole sequences always fit the cache, so
    the decode reservations never fail; the price is fewer requests running at once."""
    tr = _scenario(scheduler="trtllm")
    orca = _scenario(scheduler="orca")  # the same batching with on-demand blocks
    sim = tr.simulator(check=True)
    engines = [e for r in sim.replicas for e in r.engines]
    seen = []
    orig = Engine.admit

    def admit(self, seq, *a, **kw):
        orig(self, seq, *a, **kw)
        assert self.reserved_blocks <= self.kv.num_blocks
        seen.append(self.reserved_blocks)

    Engine.admit = admit
    try:
        res = sim.run(list(tr.arrivals.requests())).summary
    finally:
        Engine.admit = orig
    assert res["preemptions"] == 0 and seen
    assert all(e.reserved_blocks == 0 for e in engines)  # every reservation returned
    other = orca.simulator().run(orca.arrivals.requests()).summary
    assert other["preemptions"] > 0
    assert res["mean_decode_batch"] < other["mean_decode_batch"]


def test_sglang_retraction_resets_the_ratio_and_decays_it():
    sc = _scenario(scheduler="sglang")
    sim = sc.simulator(check=True)
    sched = sim.replicas[0].scheduler
    assert sched.init_ratio == 0.7 and sched.min_ratio == pytest.approx(0.098)
    assert sched.decay == pytest.approx((0.7 - 0.098) / 600)
    res = sim.run(list(sc.arrivals.requests())).summary
    assert res["preemptions"] > 0
    ratios = list(sched.ratio.values())
    assert ratios and all(sched.min_ratio <= r <= 1.0 for r in ratios)


def test_policy_victims_and_queue_order():
    V0, V1, P, SG = policy.VLLM, policy.VLLM_V1, policy.PRIORITY, policy.SGLANG
    # V0: the latest arrival; V1: the latest admitted; priority: the largest
    # (priority, arrival); SGLang: the fewest output tokens, then the longest prompt
    assert policy.victim_key(V0, 0, 2.0, 1, 0, 0) > policy.victim_key(V0, 0, 1.0, 9, 0, 0)
    assert policy.victim_key(V1, 0, 1.0, 9, 0, 0) > policy.victim_key(V1, 0, 2.0, 1, 0, 0)
    assert policy.victim_key(P, 1, 0.5, 0, 0, 0) > policy.victim_key(P, 0, 9.0, 0, 0, 0)
    assert policy.victim_key(SG, 0, 0, 0, 3, 10) > policy.victim_key(SG, 0, 0, 0, 8, 99)
    assert policy.victim_key(SG, 0, 0, 0, 3, 99) > policy.victim_key(SG, 0, 0, 0, 3, 10)
    assert policy.ordered_queue(P) and not policy.ordered_queue(V1)
    assert policy.requeue_front(V1) and not policy.requeue_front(SG)
    # admission: V0 keeps the watermark free, V1 does not; TensorRT-LLM counts promises
    assert not policy.admit_fits(V0, 10, 10, 1, True, 0, 0, 100)
    assert policy.admit_fits(V1, 10, 10, 1, True, 0, 0, 100)
    assert not policy.admit_fits(policy.TRTLLM, 50, 5, 0, True, 90, 11, 100)
    assert policy.admit_fits(policy.TRTLLM, 50, 5, 0, True, 89, 11, 100)
    assert policy.chunk_tokens(V1, 5000, 8192, 1024) == 1024
    assert policy.chunk_tokens(V1, 5000, 700, 0) == 700
    assert policy.sglang_ratio_after_retract(100, 1000, 5) == pytest.approx(0.2)
    assert policy.sglang_ratio_after_retract(900, 1000, 5) == 1.0


def test_registry_builds_every_scheduler():
    for name in SCHEDULERS:
        s = make_scheduler(SchedulerConfig(kind=name))
        assert s.kind_code == policy.kind_code(name)


def test_priority_mix_is_drawn_from_the_seed_and_leaves_the_arrivals():
    a = _scenario(scheduler="priority").arrivals.requests()
    b = _scenario(scheduler="priority", priority_mix=None).arrivals.requests()
    ra, rb = list(a), list(b)
    assert [(r.arrival_s, r.prompt_tokens) for r in ra] == [
        (r.arrival_s, r.prompt_tokens) for r in rb
    ]
    share = np.mean([r.priority == 0 for r in ra])
    assert 0.2 < share < 0.4 and {r.priority for r in rb} == {0}
    assert [r.priority for r in ra] == [r.priority for r in a]  # the same draw again
    assert parse_priority_mix("1:0.8, 0:0.2") == ((0, 0.2), (1, 0.8))
    for bad in ("0:0.5", "a:1", "0:1,0:0", "0:-1,1:2", "1"):
        with pytest.raises(ValueError, match="allowed: CLASS:SHARE"):
            parse_priority_mix(bad)


# --- invariants on random workloads (hypothesis) --------------------------------------
@cache
def _tiny_step():
    return _scenario().deployment.step


def _stream(arr, prompt, out, prio):
    n = len(arr)

    def chunks():
        yield RequestChunk(0, np.array(arr, float), np.array(prompt, np.int64),
                           np.array(out, np.int64), np.full(n, -1, np.int64),
                           np.zeros(n, np.int64), np.array(prio, np.int64))  # fmt: skip

    s = RequestStream(chunks, False, n)
    s.priorities = True
    return s


workloads = st.integers(2, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0, 0.05), min_size=n, max_size=n),
        st.lists(st.integers(1, 600), min_size=n, max_size=n),
        st.lists(st.integers(1, 300), min_size=n, max_size=n),
        st.lists(st.integers(0, 2), min_size=n, max_size=n),
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(SCHEDULERS), w=workloads, blocks=st.integers(57, 140),
       seats=st.integers(2, 16), budget=st.sampled_from([512, 1024, 4096]))  # fmt: skip
def test_invariants_and_loops_agree(kind, w, blocks, seats, budget):
    """Every request finishes once; KV never exceeds capacity (Engine.check after every
    event); trtllm never preempts; the priority scheduler admits the head of a queue kept
    in (priority, arrival) order; the compiled loop agrees request for request."""
    gaps, prompt, out, prio = w
    arr = np.cumsum(gaps).tolist()
    sched = SchedulerConfig(kind=kind, max_batch_size=seats, max_tokens=budget,
                            chunk_size=max(budget // 2, seats), chunked_prefill_size=budget,
                            max_prefill_tokens=2 * budget)  # fmt: skip
    cfg = ServeConfig(replicas=2, scheduler=sched, block_size=16, prefix_caching=False)
    cap = blocks * 16
    if max(p + o for p, o in zip(prompt, out, strict=True)) > cap:
        event("skipped: a request longer than the cache")
        return
    stream = _stream(arr, prompt, out, prio)
    rows: tuple[list, list] = ([], [])
    checked = []
    orig = Engine.admit

    def admit(self, seq, *a, **kw):
        if self.kind == policy.PRIORITY:
            key = (seq.request.priority, seq.request.arrival_s)
            assert all((w.request.priority, w.request.arrival_s) >= key for w in self.waiting)
            checked.append(key)
        orig(self, seq, *a, **kw)

    Engine.admit = admit
    try:
        slow = Simulator(_tiny_step(), cfg, kv_capacity_tokens=cap, check=True,
                         sink=lambda r: rows[1].append(_row(r))).run(list(stream))  # fmt: skip
    finally:
        Engine.admit = orig
    fast = Simulator(_tiny_step(), cfg, kv_capacity_tokens=cap,
                     sink=lambda r: rows[0].append(_row(r))).run(stream)  # fmt: skip
    event(f"preempted: {slow.summary['preemptions'] > 0}")
    ids = [r[0] for r in rows[1]]
    assert sorted(ids) == list(range(len(arr)))  # each request finished exactly once
    assert slow.summary["kv_util_max"] <= 1.0
    if kind == "trtllm":
        assert slow.summary["preemptions"] == 0
    if kind == "priority":
        assert checked
    assert rows[0] == rows[1]
    for k in ("preemptions", "iterations", "requests_completed"):
        assert fast.summary[k] == slow.summary[k], k


# --- the command line --------------------------------------------------------------------
CLI = ["serve", "--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "20", "--num-requests",
       "200", "--gpu-memory-utilization", "0.25", "--max-batch-size", "256", "--quiet", "--format",
       "json"]  # fmt: skip


def test_cli_priority_end_to_end(run):
    res = run(*CLI, "--scheduler", "priority", "--priority-mix", "0:0.2,1:0.8")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    by = out["by_priority"]
    assert set(by) == {"0", "1"}
    assert by["0"]["requests_completed"] + by["1"]["requests_completed"] == 200
    for key in ("ttft_s_p50", "ttft_s_p99", "tpot_s_p50", "tpot_s_p99", "e2e_s_p50", "e2e_s_p99"):
        assert key in by["0"]
    assert "by_priority" not in json.loads(run(*CLI).stdout)  # unchanged output otherwise


@pytest.mark.parametrize("kind", NEW)
def test_cli_accepts_every_scheduler(run, kind):
    res = run(*CLI, "--scheduler", kind)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["requests_completed"] == 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scheduler", "fifo"], "vllm-v1"),
        (["--priority-mix", "0:0.5"], "allowed: CLASS:SHARE"),
        (["--scheduler", "sglang", "--preemption", "swap"], "not modelled"),
        (["--scheduler", "trtllm", "--branches", "2"], "not modelled"),
    ],
)
def test_cli_refuses_bad_scheduler_input(run, args, message):
    res = run(*CLI, *args)
    assert res.exit_code != 0
    assert message in res.output
    assert "Traceback" not in res.output


def test_cli_trace_priority_column(run, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,priority\n0,100,20,1\n0.01,100,20,0\n")
    res = run(*CLI[:5], "--trace", str(path), "--scheduler", "priority", "--quiet",
              "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert set(json.loads(res.stdout)["by_priority"]) == {"0", "1"}
    path.write_text("arrival_s,prompt_tokens,output_tokens,priority\n0,100,20,high\n")
    res = run(*CLI[:5], "--trace", str(path), "--quiet", "--format", "json")
    assert res.exit_code != 0 and "priority 'high' is invalid" in res.output


def test_cli_serve_plan_takes_the_new_schedulers(run):
    res = run("serve", "plan", "--model", "llama3-8b", "--qps", "2", "--gpus-types", "h100-sxm",
              "--tp", "1", "--schedulers", "vllm-v1,trtllm,sglang,priority", "--pd-ratios",
              "none", "--num-requests", "150", "--slo-ttft-s", "2", "--quiet", "--format",
              "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    plans = json.loads(res.stdout)["deployments"]
    assert plans and {p["scheduler"] for p in plans} <= set(NEW)
    bad = run("serve", "plan", "--model", "llama3-8b", "--qps", "2", "--schedulers", "fifo",
              "--slo-ttft-s", "2", "--quiet")  # fmt: skip
    assert bad.exit_code != 0 and "allowed: vllm, orca, sarathi, vllm-v1" in bad.output
