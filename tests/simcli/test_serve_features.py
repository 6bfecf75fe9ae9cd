"""Serving features: prefill/decode disaggregation, speculative decoding, multi-branch
reasoning (invariants, closed forms, the effects each exists for, CLI)."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from simcli.commands import serve as serve_cmd
from simcli.errors import set_debug
from simcli.scenario import serving as serve_scenario
from simcli.serving.branches import BranchConfig
from simcli.serving.disagg import DisaggConfig, KVTransferModel
from simcli.serving.requests import CANCELLED, FINISHED, Request, SyntheticSpec, synthetic_requests
from simcli.serving.schedulers import SchedulerConfig
from simcli.serving.simulator import ServeConfig, SimulationError, Simulator, simulate
from simcli.serving.spec import SpecConfig, SpecDecodeBatch, SpecStats
from workloads.lengths import parse_dist

HAVE_STEP = importlib.util.find_spec("costmodels.steps.serving") is not None
E = np.zeros(0, np.int64)


class Step:
    """Test double of ``StepModel``: ``base + prefill x new tokens + decode x query tokens
    of decodes and verifications + ctx x context``. Verifying k + 1 tokens per sequence
    costs the base once, so speculation pays off at small batch and not at large."""

    kv_bytes_per_token = 131072.0
    weight_bytes = 16e9

    def __init__(self, capacity=1_000_000, base=0.004, prefill=5e-5, decode=1e-4, ctx=0.0):
        self.capacity = capacity
        self.base, self.prefill, self.decode, self.ctx = base, prefill, decode, ctx
        self.calls = 0

    def step_s(self, new, past, ctx) -> float:
        assert len(new) == len(past) and (len(new) or len(ctx))
        assert (np.asarray(new) >= 1).all() and (np.asarray(ctx) >= 1).all()
        self.calls += 1
        return (
            self.base
            + self.prefill * float(np.sum(new))
            + self.decode * len(ctx)
            + self.ctx * float(np.sum(ctx))
        )

    def verify_step_s(self, ctx, k: int) -> float:
        self.calls += 1
        return self.base + self.decode * len(ctx) * (k + 1) + self.ctx * float(np.sum(ctx))

    def kv_capacity_tokens(self, block_size: int, gpu_memory_utilization: float) -> int:
        return self.capacity


class Draft(Step):
    """A draft ~10x cheaper than :class:`Step`."""

    kv_bytes_per_token = 16384.0
    weight_bytes = 2e9

    def __init__(self, **kw):
        super().__init__(**{"base": 0.0005, "prefill": 5e-6, "decode": 1e-5, **kw})


LINK = KVTransferModel.alpha_beta(20e-6, 50e9, Step.kv_bytes_per_token)


def cfg(kind="vllm", **kw) -> ServeConfig:
    sched = {k: kw.pop(k) for k in list(kw) if k in SchedulerConfig.model_fields}
    return ServeConfig(scheduler=SchedulerConfig(kind=kind, **sched), **kw)


def workload(n, qps, prompt, output, seed=0, **kw) -> list[Request]:
    spec = SyntheticSpec(
        qps=qps,
        num_requests=n,
        prompt_len=parse_dist(prompt),
        output_len=parse_dist(output),
        seed=seed,
        **kw,
    )
    return list(synthetic_requests(spec))


def single(prompt: int, out: int, t: float = 0.0) -> list[Request]:
    return [Request(0, t, prompt, out)]


# --------------------------------------------------------------------------- invariants

rows_st = st.lists(
    st.tuples(
        st.floats(0, 0.05, allow_nan=False),
        st.integers(1, 300),
        st.integers(1, 80),
        st.sampled_from([None, 0, 1]),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    rows=rows_st,
    feature=st.sampled_from(["disagg", "spec", "branches", "spec+branches"]),
    kind=st.sampled_from(["vllm", "orca", "sarathi"]),
    preemption=st.sampled_from(["recompute", "swap"]),
    pools=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pp=st.integers(1, 2),
    capacity=st.integers(64, 1500),
    block=st.sampled_from([1, 4, 16]),
    chunk=st.integers(1, 300),
    max_seqs=st.integers(1, 16),
    k=st.integers(1, 5),
    acc=st.floats(0, 1),
    drafts=st.integers(1, 3),
    branches=st.tuples(st.integers(2, 6), st.integers(1, 6)),
    prune=st.sampled_from(["none", "sart"]),
    interval=st.integers(1, 20),
    overlap=st.booleans(),
    seed=st.integers(0, 3),
)
def test_invariants_with_features(
    rows,
    feature,
    kind,
    preemption,
    pools,
    pp,
    capacity,
    block,
    chunk,
    max_seqs,
    k,
    acc,
    drafts,
    branches,
    prune,
    interval,
    overlap,
    seed,
):
    t = 0.0
    requests = []
    for i, (gap, prompt, out, group) in enumerate(rows):
        t += gap
        ptoks = {0: 48, 1: 100}.get(group, 0)  # type: ignore[arg-type]
        requests.append(Request(i, t, prompt + ptoks, out, group, ptoks))
    kw: dict = {}
    extra: dict = {"kv_transfer": LINK}
    lookahead = 1
    n_branches = 1
    if "spec" in feature:
        pp = 1
        spec = SpecConfig(k=k, acceptance=(acc,), drafts=drafts)
        kw["speculative"] = spec
        extra = {"draft_step_model": Draft()}
        lookahead = spec.lookahead
    if "branches" in feature:
        n_branches, m = branches[0], min(branches)
        kw["branching"] = BranchConfig(
            branches=n_branches,
            stop_after=m,
            prune=prune,
            prune_interval=interval,
            output_len=parse_dist("uniform:1:80"),
        )
    replicas = 1 + (1 if kind == "orca" else 0)
    if feature == "disagg":
        kw["disaggregation"] = DisaggConfig(
            prefill_replicas=pools[0], decode_replicas=pools[1], kv_transfer_overlap=overlap
        )
        replicas = sum(pools)
    longest = max(r.prompt_tokens for r in requests) + 80 + lookahead + n_branches
    capacity = max(capacity, pp * (longest + 2 * block))  # every request fits alone
    finished: list[int] = []
    sim = Simulator(
        Step(capacity=capacity, ctx=1e-7),
        cfg(
            kind,
            replicas=replicas,
            pp=pp,
            block_size=block,
            chunk_size=chunk,
            max_batch_size=max_seqs,
            preemption=preemption,
            seed=seed,
            **kw,
        ),
        kv_capacity_tokens=capacity,
        sink=lambda r: finished.append(r.id),
        check=True,  # KV within capacity and equal to what sequences hold, after every event
        **extra,
    )
    res = sim.run(requests).summary
    assert sorted(finished) == list(range(len(requests)))  # each finishes exactly once
    done_tokens = 0
    for r in requests:
        assert r.arrival_s <= r.first_token_s <= r.finish_s
        assert all(s.state in (FINISHED, CANCELLED) for s in r.seqs)
        fin = [s for s in r.seqs if s.state == FINISHED]
        for s in r.seqs:  # never more tokens than asked for; finished ones get all of them
            assert s.generated <= s.output_tokens
            assert s.generated == s.output_tokens or s.state == CANCELLED
        if r.branch is None:
            assert r.generated_tokens == r.output_tokens and len(fin) == 1
        else:
            assert len(fin) == r.branch.config.m and len(r.seqs) == n_branches
            assert r.branch.config.prune == "sart" or r.branch.pruned == 0
        done_tokens += sum(s.generated for s in fin)
    for rep in sim.replicas:
        for e in rep.engines:
            assert e.kv.peak_used_blocks <= e.kv.num_blocks
            assert e.kv.active_blocks == 0
            assert not (e.waiting or e.prefilling or e.swapped or e.incoming or e.sending)
            assert e.decode.n == 0 and e.incoming_blocks == 0 and e.in_transit == 0
    assert res["requests_completed"] == len(requests)
    assert res["output_tokens"] == done_tokens
    if "branches" in feature:
        cancelled = sum(r.cancelled_tokens for r in requests)
        assert res["branch_tokens_cancelled"] == cancelled
        assert res["branches_finished"] == sum(r.branch.config.m for r in requests)
    if feature == "disagg":
        assert res["kv_transfers"] == sum(r.output_tokens > 1 for r in requests)


# --------------------------------------------------------------------------- disaggregation


def _pools(p=1, d=1, **kw) -> DisaggConfig:
    return DisaggConfig(prefill_replicas=p, decode_replicas=d, **kw)


def test_disaggregated_ttft_is_prefill_plus_transfer():
    step = Step()
    prompt, out = 1000, 10
    r = single(prompt, out)
    res = simulate(step, r, cfg(replicas=2, disaggregation=_pools()), kv_transfer=LINK).summary
    prefill = step.step_s(np.array([prompt]), np.array([0]), E)
    transfer = 20e-6 + prompt * Step.kv_bytes_per_token / 50e9
    assert LINK.seconds(prompt) == pytest.approx(transfer, rel=1e-12)
    assert res["ttft_s_p50"] == pytest.approx(prefill + transfer, rel=1e-12)
    assert res["kv_transfer_s_mean"] == pytest.approx(transfer, rel=1e-12)
    assert res["kv_transfer_wait_s_mean"] == 0.0
    decodes = sum(step.step_s(E, E, np.array([prompt + i])) for i in range(out - 1))
    assert r[0].finish_s == pytest.approx(prefill + transfer + decodes, rel=1e-12)
    assert res["kv_transfers"] == 1 and res["gpus"] == 2


def test_layer_by_layer_transfer_hides_behind_the_prefill():
    step = Step()
    prompt, layers = 2000, 32
    prefill = step.step_s(np.array([prompt]), np.array([0]), E)
    for bw in (50e9, 1e9):  # transfer shorter / longer than the prefill
        link = KVTransferModel.alpha_beta(
            20e-6, bw, Step.kv_bytes_per_token, layers=layers, overlap=True
        )
        t = link.seconds(prompt)
        res = simulate(
            step, single(prompt, 5), cfg(replicas=2, disaggregation=_pools()), kv_transfer=link
        ).summary
        exposed = max(t / layers, t - prefill * (layers - 1) / layers)
        assert res["ttft_s_p50"] == pytest.approx(prefill + exposed, rel=1e-9)
        assert res["kv_transfer_exposed_s_mean"] < t


def test_kv_transfer_lanes_split_the_bytes():
    one = KVTransferModel.alpha_beta(1e-5, 25e9, 1000.0)
    four = KVTransferModel.alpha_beta(1e-5, 25e9, 1000.0, lanes=4)
    for tokens in (1, 777, 123456):
        assert one.seconds(tokens) == pytest.approx(1e-5 + tokens * 1000 / 25e9, rel=1e-9)
        assert four.seconds(tokens) == pytest.approx(1e-5 + tokens * 250 / 25e9, rel=1e-9)


def test_kv_transfer_time_appears_in_ttft():
    load = dict(n=60, qps=0.5, prompt="uniform:1000:4000", output="uniform:5:20", seed=3)
    out = {}
    for name, bw in (("fast", 100e9), ("slow", 5e9)):
        link = KVTransferModel.alpha_beta(20e-6, bw, Step.kv_bytes_per_token)
        out[name] = simulate(
            Step(), workload(**load), cfg(replicas=2, disaggregation=_pools()), kv_transfer=link
        ).summary
    fast, slow = out["fast"], out["slow"]
    extra = slow["kv_transfer_s_mean"] - fast["kv_transfer_s_mean"]
    assert extra > 0.01  # ~ 330 MB at 5 vs 100 GB/s
    assert slow["ttft_s_mean"] - fast["ttft_s_mean"] == pytest.approx(extra, rel=1e-6)


def test_disaggregation_beats_colocated_tpot_tail_at_equal_gpus():
    """Prefill-heavy load, tight TPOT SLO: vLLM's prefill-first iterations stall every decode
    of a colocated replica behind long prompts; a decode pool never runs a prefill."""
    load = dict(n=300, qps=8, prompt="uniform:2000:4000", output="uniform:50:150", seed=1)
    slo = dict(slo_tpot_s=0.005, slo_ttft_s=2.0)
    co = simulate(Step(), workload(**load), cfg(replicas=4, **slo)).summary
    dis = simulate(
        Step(),
        workload(**load),
        cfg(replicas=4, disaggregation=_pools(2, 2), **slo),
        kv_transfer=LINK,
        check=True,
    ).summary
    assert co["gpus"] == dis["gpus"] == 4
    assert dis["tpot_s_p99"] < 0.6 * co["tpot_s_p99"]
    assert dis["slo_attainment"] == 1.0 and co["slo_attainment"] < 0.5
    assert dis["kv_transfer_s_mean"] > 0 and co["kv_transfer_s_mean"] is None


def test_decode_pool_back_pressure_keeps_kv_on_prefill_replicas():
    """A decode pool too small for the load: transfers wait for its KV room (pull), so the
    prefill replica's KV holds finished prompts; still every request completes."""
    load = dict(n=120, qps=50, prompt="uniform:300:600", output="uniform:100:200", seed=2)
    sim = Simulator(
        Step(capacity=20_000),
        cfg(replicas=2, disaggregation=_pools(1, 1, kv_transfer="intra")),
        kv_capacity_tokens=20_000,
        kv_transfer=LINK,
        check=True,
    )
    res = sim.run(workload(**load)).summary
    assert res["requests_completed"] == 120
    assert res["kv_transfer_wait_s_mean"] > 0.01
    pre = sim.replicas[0].engines[0].kv
    assert pre.peak_used_blocks > 0.5 * pre.num_blocks


def test_disaggregated_pools_use_their_own_step_models():
    pre, dec = Step(prefill=2e-5), Step(decode=5e-5)
    sim = Simulator(
        Step(),
        cfg(replicas=3, disaggregation=_pools(1, 2)),
        prefill_step_model=pre,
        decode_step_model=dec,
        kv_transfer=LINK,
    )
    sim.run(workload(50, 5, "fixed:500", "fixed:20"))
    assert pre.calls > 0 and dec.calls > 0
    assert [r.role for r in sim.replicas] == ["prefill", "decode", "decode"]


# --------------------------------------------------------------------------- speculative


def _spec(k=4, acc=(0.8,), **kw) -> ServeConfig:
    return cfg(speculative=SpecConfig(k=k, acceptance=acc, **kw))


def test_spec_all_accepted_closed_form():
    """Acceptance 1: every step yields k + 1 tokens; the last one only what is left."""
    step, draft = Step(), Draft()
    k, prompt, out = 3, 200, 11  # 1 (prefill) + 4 + 4 + 2
    r = single(prompt, out)
    res = simulate(step, r, _spec(k, (1.0,)), draft_step_model=draft).summary
    pre = step.step_s(np.array([prompt]), np.array([0]), E) + draft.step_s(
        np.array([prompt]), np.array([0]), E
    )
    t = pre
    for ctx in (prompt, prompt + 4, prompt + 8):
        c = np.array([ctx])
        t += k * draft.step_s(E, E, c + k // 2) + step.verify_step_s(c, k)
    assert r[0].finish_s == pytest.approx(t, rel=1e-12)
    assert r[0].seqs[0].generated == out and res["output_tokens"] == out
    assert res["spec_accepted_tokens_per_step"] == 3.0  # drafts accepted, before the cut
    assert res["spec_tokens_per_step"] == pytest.approx(10 / 3)


def test_spec_none_accepted_gives_one_token_per_step():
    r = single(100, 30)
    res = simulate(Step(), r, _spec(4, (0.0,)), draft_step_model=Draft()).summary
    assert res["spec_accepted_tokens_per_step"] == 0 and res["spec_tokens_per_step"] == 1
    assert res["spec_steps"] == 29 and r[0].seqs[0].generated == 30


def test_spec_acceptance_process_matches_prefix_products():
    rates = (0.9, 0.7, 0.5, 0.3)
    cfg1 = SpecConfig(k=4, acceptance=rates)
    assert cfg1.expected_accepted == pytest.approx(0.9 + 0.63 + 0.315 + 0.0945)
    # SpecTr's independent-draft bound (the K-SEQ default: tests/simcli/serving/test_spec.py)
    best3 = SpecConfig(k=4, acceptance=rates, drafts=3, spectr="independent-bound")
    assert best3.per_position == pytest.approx([1 - (1 - a) ** 3 for a in rates])
    assert best3.verify_k == 14 and best3.lookahead == 13
    for c in (cfg1, best3):
        stats = SpecStats()
        batch = SpecDecodeBatch(16, c, np.random.default_rng(0), stats)
        for i in range(500):
            s = Request(i, 0.0, 10, 10**6).seqs[0]
            s.ctx_tokens, s.generated = 10, 1
            batch.add(s)
        for _ in range(40):
            batch.advance()
        assert stats.accepted / stats.seq_steps == pytest.approx(c.expected_accepted, rel=0.02)


def test_spec_same_seed_same_run_other_seed_differs():
    load = dict(n=50, qps=20, prompt="fixed:100", output="uniform:20:80", seed=0)
    runs = [
        simulate(
            Step(),
            workload(**load),
            _spec().model_copy(update={"seed": s}),
            draft_step_model=Draft(),
        ).summary
        for s in (1, 1, 2)
    ]
    assert runs[0] == runs[1]
    assert runs[0]["e2e_s_mean"] != runs[2]["e2e_s_mean"]


def test_spec_speedup_shrinks_with_batch():
    """Verifying k + 1 tokens costs about one decode step only while the step is dominated
    by its fixed cost (batch 1); at batch 64 it costs ~k + 1 decode steps' worth of work."""
    speedup = {}
    for batch, qps in ((1, 0.05), (64, 1e6)):
        load = dict(n=max(batch, 10), qps=qps, prompt="fixed:512", output="fixed:200")
        plain = simulate(Step(), workload(**load), cfg()).summary
        spec = simulate(Step(), workload(**load), _spec(), draft_step_model=Draft()).summary
        assert spec["output_tokens"] == plain["output_tokens"]
        speedup[batch] = plain["tpot_s_p50"] / spec["tpot_s_p50"]
    assert speedup[1] > 1.5 and speedup[64] < 0.8 * speedup[1]


def test_spec_hierarchy_cheapens_an_expensive_draft():
    """TriForce: when the draft itself is slow, a tiny model drafting for it helps."""
    mid = Draft(base=0.003)
    load = dict(n=10, qps=0.05, prompt="fixed:512", output="fixed:200")
    flat = simulate(Step(), workload(**load), _spec(6, (0.8,)), draft_step_model=mid).summary
    tri = simulate(
        Step(),
        workload(**load),
        cfg(speculative=SpecConfig(k=6, acceptance=(0.8,), tiny_k=3, tiny_acceptance=0.7)),
        draft_step_model=mid,
        tiny_step_model=Draft(base=0.0002),
    ).summary
    assert tri["tpot_s_p50"] < flat["tpot_s_p50"]
    assert SpecConfig(k=6, tiny_k=3, tiny_acceptance=0.7).tiny_rounds == 3


def test_spec_kv_capacity_counts_the_draft():
    big = Draft()
    sim = Simulator(Step(capacity=100_000), _spec(), draft_step_model=big)
    room = 100_000 * Step.kv_bytes_per_token - Draft.weight_bytes
    want = int(room // (Step.kv_bytes_per_token + Draft.kv_bytes_per_token)) // 16 * 16
    assert sim.kv_capacity_tokens == want
    big.weight_bytes = 1e12
    with pytest.raises(SimulationError, match="does not fit beside the target"):
        Simulator(Step(capacity=100_000), _spec(), draft_step_model=big)
    with pytest.raises(SimulationError, match="draft_step_model"):
        Simulator(Step(), _spec())
    with pytest.raises(ValueError, match="one per position"):
        SpecConfig(k=3, acceptance=(0.5, 0.5))


# --------------------------------------------------------------------------- branches


def _branches(n, m=None, prune="none", **kw) -> ServeConfig:
    extra = {k: kw.pop(k) for k in list(kw) if k not in BranchConfig.model_fields}
    return cfg(branching=BranchConfig(branches=n, stop_after=m, prune=prune, **kw), **extra)


def test_branches_share_the_prompt_blocks():
    prompt = 100  # 6 full blocks of 16 and a partial one
    sim = Simulator(Step(), _branches(4, output_len=parse_dist("fixed:3")), check=True)
    r = single(prompt, 3)
    res = sim.run(r).summary
    kv = sim.replicas[0].engines[0].kv
    assert kv.peak_used_blocks == 6 + 4  # shared full blocks + one partial copy per branch
    assert res["output_tokens"] == 12 and res["branches_finished"] == 4
    assert len(r[0].seqs) == 4 and r[0].finished_tokens == 12


def test_early_stopping_waits_for_the_m_th_branch():
    step = Step(decode=0.0)  # every decode iteration costs `base`
    sim = Simulator(
        step, _branches(6, 2, output_len=parse_dist("uniform:10:200"), seed=4), check=True
    )
    r = single(64, 50)
    res = sim.run(r).summary
    lengths = np.sort(r[0].branch.lengths)
    prefill = step.step_s(np.array([64]), np.array([0]), E)
    assert r[0].finish_s == pytest.approx(prefill + (lengths[1] - 1) * step.base, rel=1e-9)
    assert res["ttft_s_p50"] == pytest.approx(prefill, rel=1e-12)
    assert res["branches_cancelled"] == 4 and res["branches_finished"] == 2
    assert res["output_tokens"] == lengths[0] + lengths[1]
    assert res["branch_tokens_cancelled"] == r[0].cancelled_tokens == 4 * lengths[1]
    assert res["tpot_s_p50"] == pytest.approx(step.base, rel=1e-9)


def test_one_token_branches_finish_at_the_fork():
    sim = Simulator(Step(), _branches(4, 1, output_len=parse_dist("fixed:1")), check=True)
    r = [Request(0, 0.0, 40, 1), Request(1, 0.0, 40, 3)]
    res = sim.run(r).summary
    assert res["branches_finished"] == 2 and res["branches_cancelled"] == 6
    assert res["output_tokens"] == 2 and res["branch_tokens_cancelled"] == 6
    assert r[0].finish_s == r[0].first_token_s  # the prefill's first token completes it


def test_sart_pruning_phases():
    """Phase 1 prunes below alpha (at most beta); phase 2 below the first finisher's score,
    never leaving fewer live branches than still needed."""
    sim = Simulator(
        Step(),
        _branches(
            8, 3, "sart", output_len=parse_dist("uniform:100:400"), prune_interval=10,
            prune_threshold=0.5, prune_max=2, seed=1,
        ),
        check=True,
    )  # fmt: skip
    r = [Request(i, 0.0, 50, 300) for i in range(20)]
    res = sim.run(r).summary
    assert res["branches_finished"] == 60
    for req in r:
        st = req.branch
        gone = [s for s in req.seqs if s.state == CANCELLED]
        assert len(gone) + 3 == 8 and st.pruned <= 5
        early = [s for s in gone if s.generated <= 10 + 1]  # phase 1: the first check
        assert len(early) <= 2 and all(s.score < 0.5 for s in early)
    assert res["branches_pruned"] > 20


def test_sart_beats_self_consistency_latency_and_kv():
    """N = 8 branches: self-consistency waits for all of them (the longest); SART stops at
    M = 2 and prunes low-score branches, so requests finish sooner and hold less KV."""
    load = dict(n=150, qps=3, prompt="uniform:200:800", output="lognormal:300:0.8:2000", seed=2)
    dist = parse_dist("lognormal:300:0.8:2000")
    sc = simulate(Step(), workload(**load), _branches(8, 8, output_len=dist)).summary
    sart = simulate(Step(), workload(**load), _branches(8, 2, "sart", output_len=dist)).summary
    assert sart["e2e_s_p50"] < 0.5 * sc["e2e_s_p50"]
    assert sart["e2e_s_p99"] < 0.5 * sc["e2e_s_p99"]
    assert sart["kv_util_mean"] < 0.5 * sc["kv_util_mean"]
    assert sart["branches_pruned"] > 0 and sc["branches_pruned"] == 0
    assert sc["branches_finished"] == 8 * 150 and sart["branches_finished"] == 2 * 150


def test_branch_lengths_do_not_depend_on_the_policy():
    load = dict(n=20, qps=5, prompt="fixed:64", output="fixed:50", seed=0)
    dist = parse_dist("uniform:1:300")
    a, b = workload(**load), workload(**load)
    simulate(Step(), a, _branches(4, 4, output_len=dist, seed=9))
    simulate(Step(), b, _branches(4, 1, "sart", output_len=dist, seed=9))
    for x, y in zip(a, b, strict=True):
        assert list(x.branch.lengths) == list(y.branch.lengths)
        assert x.branch.lengths[0] == 50


def test_branches_with_trace_lengths_and_bad_config():
    pool = np.array([7, 9, 11])
    r = single(40, 5)
    simulate(Step(), r, _branches(5), branch_output_lengths=pool)
    assert set(r[0].branch.lengths[1:]) <= {7, 9, 11} and r[0].branch.lengths[0] == 5
    with pytest.raises(ValueError, match="allowed: 1 <= M <= N"):
        BranchConfig(branches=2, stop_after=3)
    with pytest.raises(SimulationError, match="branches need"):
        simulate(Step(capacity=64), single(40, 5), _branches(40, block_size=16))


# --------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def h100_cost_model():
    from costmodels.ops.select import get_cost_model

    return get_cost_model("h100-sxm", num_gpus=1)


@pytest.fixture
def cli(monkeypatch, h100_cost_model):
    root = typer.Typer()

    @root.callback()
    def _root() -> None:
        pass

    root.add_typer(serve_cmd.app, name="serve")
    made: list = []

    def fake_step(model_cfg, gpu, *, tp, **kw):
        step = Step() if model_cfg.id == "llama3-8b" else Draft()
        step.cost_model = h100_cost_model  # prices the KV transfers
        step.tp = tp
        made.append((model_cfg.id, tp, step))
        return step

    monkeypatch.setattr(serve_scenario, "build_step_model", fake_step)
    runner = CliRunner()

    def invoke(*args: str):
        set_debug(False)
        return runner.invoke(root, ["serve", *args])

    invoke.made = made  # type: ignore[attr-defined]
    return invoke


BASE = ("--model", "llama3-8b", "--gpu", "h100-sxm", "--qps", "5", "--num-requests", "60")
NEW_KEYS = (
    "disaggregated",
    "prefill_replicas",
    "decode_replicas",
    "kv_transfer_s_mean",
    "kv_transfer_wait_s_mean",
    "spec_k",
    "spec_accepted_tokens_per_step",
    "spec_tokens_per_step",
    "branches",
    "branches_pruned",
    "branch_tokens_cancelled",
)


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cli_plain_run_has_the_new_keys_empty(cli):
    out = _json(cli(*BASE, "--format", "json"))
    for key in NEW_KEYS:
        assert key in out, key
    assert out["disaggregated"] is False and out["kv_transfer_s_mean"] is None
    assert out["spec_k"] is None and out["branches"] == 1 and out["branches_pruned"] is None


def test_cli_disaggregated(cli):
    out = _json(
        cli(
            *BASE, "--disaggregate", "--prefill-replicas", "1", "--decode-replicas", "2",
            "--prefill-tp", "2", "--kv-transfer", "intra", "--kv-transfer-overlap",
            "--format", "json",
        )
    )  # fmt: skip
    assert out["disaggregated"] is True and out["replicas"] == 3
    assert (out["prefill_replicas"], out["decode_replicas"]) == (1, 2)
    assert out["gpus"] == 1 * 2 + 2 * 1 and out["prefill_tp"] == 2 and out["decode_tp"] == 1
    assert out["kv_transfer"] == "intra" and out["kv_transfer_s_mean"] > 0
    assert sorted(tp for _, tp, _ in cli.made) == [1, 2]
    assert [r["role"] for r in out["per_replica"]] == ["prefill", "decode", "decode"]
    ratio = _json(cli(*BASE, "--disaggregate", "--replicas", "4", "--pd-ratio", "1:3",
                      "--format", "json"))  # fmt: skip
    assert (ratio["prefill_replicas"], ratio["decode_replicas"]) == (1, 3)


def test_cli_speculative_and_branches(cli, tmp_path):
    out = _json(
        cli(
            *BASE, "--output-len", "fixed:40", "--draft-model", "llama3.1-8b",
            "--spec-acceptance-per-position", "0.9,0.8,0.7", "--spec-drafts", "2",
            "--format", "json",
        )
    )  # fmt: skip
    assert out["spec_k"] == 3 and out["spec_drafts"] == 2 and out["draft_model"] == "llama3.1-8b"
    assert out["output_tokens"] == 60 * 40 and 1.5 < out["spec_accepted_tokens_per_step"] < 3
    rows = tmp_path / "rows.csv"
    out = _json(
        cli(
            *BASE, "--branches", "6", "--branches-stop", "2", "--prune", "sart",
            "--output", str(rows), "--format", "json",
        )
    )  # fmt: skip
    assert out["branches"] == 6 and out["branches_stop"] == 2 and out["prune"] == "sart"
    assert out["branches_finished"] == 120 and out["branches_pruned"] >= 0
    assert len(list(csv.DictReader(rows.read_text().splitlines()))) == 60
    hier = _json(
        cli(*BASE, "--draft-model", "llama3.1-8b", "--spec-hierarchy", "llama3-8b",
            "--format", "json")
    )  # fmt: skip
    assert hier["spec_hierarchy"] == "llama3-8b"


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (("--spec-k", "4"), "--spec-k needs --draft-model"),
        (("--spec-acceptance", "0.5"), "--spec-acceptance needs --draft-model"),
        (("--draft-model", "llama2-7b"), "has a vocabulary of 32000 tokens"),
        (
            (
                "--draft-model",
                "llama3.1-8b",
                "--spec-k",
                "3",
                "--spec-acceptance-per-position",
                "0.5,0.5",
            ),
            "2 values for --spec-k 3",
        ),  # fmt: skip
        (("--draft-model", "llama3.1-8b", "--spec-acceptance", "1.5"), "--spec-acceptance 1.5"),
        (("--draft-model", "llama3.1-8b", "--pp", "2"), "--pp 1"),
        (("--draft-model", "llama3.1-8b", "--spec-tiny-k", "2"), "needs --spec-hierarchy"),
        (("--branches", "4", "--branches-stop", "5"), "--branches-stop 5 > --branches 4"),
        (("--branches-stop", "2"), "--branches-stop 2 > --branches 1"),
        (("--prune", "sart"), "--prune needs --branches"),
        (("--branches", "3", "--prune", "greedy"), "unknown --prune 'greedy'"),
        (("--branches", "3", "--prune-interval", "5"), "needs --prune sart"),
        (("--prefill-tp", "2"), "--prefill-tp needs --disaggregate"),
        (("--disaggregate",), "--disaggregate needs --prefill-replicas"),
        (("--disaggregate", "--prefill-replicas", "1"), "give both"),
        (("--disaggregate", "--pd-ratio", "1:1"), "--replicas >= 2"),
        (
            (
                "--disaggregate",
                "--replicas",
                "3",
                "--prefill-replicas",
                "1",
                "--decode-replicas",
                "1",
            ),
            "--replicas 3 !=",
        ),  # fmt: skip
        (
            (
                "--disaggregate",
                "--prefill-replicas",
                "1",
                "--decode-replicas",
                "1",
                "--prefill-tp",
                "8",
                "--kv-transfer",
                "intra",
            ),
            "in one node",
        ),  # fmt: skip
        (
            (
                "--disaggregate",
                "--prefill-replicas",
                "1",
                "--decode-replicas",
                "1",
                "--kv-transfer",
                "ib",
            ),
            "unknown --kv-transfer 'ib'",
        ),  # fmt: skip
        (
            (
                "--disaggregate",
                "--prefill-replicas",
                "1",
                "--decode-replicas",
                "1",
                "--branches",
                "2",
            ),
            "--branches with --disaggregate",
        ),  # fmt: skip
        (
            (
                "--disaggregate",
                "--prefill-replicas",
                "1",
                "--decode-replicas",
                "1",
                "--draft-model",
                "llama3.1-8b",
            ),
            "--draft-model with --disaggregate",
        ),  # fmt: skip
    ],
)
def test_cli_bad_combinations_are_one_line(cli, args, msg):
    result = cli(*BASE, *args)
    assert result.exit_code == 2, result.output
    assert msg in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_cli_draft_that_does_not_fit_beside_the_target(cli, monkeypatch):
    monkeypatch.setattr(Draft, "weight_bytes", 1e15)
    result = cli(*BASE, "--draft-model", "llama3.1-8b")
    assert result.exit_code == 2
    assert "does not fit beside the target" in result.stderr
    assert result.stderr.count("\n") == 1


# --------------------------------------------------------------------------- real step models

needs_step = pytest.mark.skipif(not HAVE_STEP, reason="costmodels.steps.serving not available")

# the draft of the real models: Llama-3.2-1B's config.json
LLAMA_1B = str(Path(__file__).parents[2] / "examples/models/llama-3.2-1b.config.json")


@pytest.fixture(scope="module")
def real_models(tmp_path_factory):
    from costmodels.steps.serving import StepModel

    return StepModel("llama3-8b", "h100-sxm"), StepModel(LLAMA_1B, "h100-sxm")


@needs_step
def test_real_disaggregation_tpot_tail_and_transfer(real_models):
    target, _ = real_models
    load = dict(n=300, qps=8, prompt="uniform:4000:8000", output="uniform:100:300", seed=1)
    slo = dict(slo_tpot_s=0.01, slo_ttft_s=1.0)
    co = simulate(target, workload(**load), cfg(replicas=4, **slo)).summary
    dis = simulate(target, workload(**load), cfg(replicas=4, disaggregation=_pools(2, 2), **slo))
    d = dis.summary
    assert d["tpot_s_p99"] < 0.8 * co["tpot_s_p99"]
    assert d["slo_attainment"] > co["slo_attainment"] + 0.3
    # 128 KiB per token over one 50 GB/s NDR NIC: ~2.6 ms per 1000 tokens
    per_token = d["kv_transfer_s_mean"] / 6000
    assert per_token == pytest.approx(target.kv_bytes_per_token / 50e9, rel=0.25)
    assert d["ttft_s_p50"] > d["kv_transfer_s_mean"]


@needs_step
def test_real_spec_decoding_speedup_shrinks_with_batch(real_models):
    target, draft = real_models
    speedup = {}
    for batch, qps in ((1, 0.05), (64, 1e6)):
        load = dict(n=max(batch, 8), qps=qps, prompt="fixed:1000", output="fixed:128")
        plain = simulate(target, workload(**load), cfg()).summary
        spec = simulate(target, workload(**load), _spec(4, (0.8,)), draft_step_model=draft)
        speedup[batch] = plain["tpot_s_p50"] / spec.summary["tpot_s_p50"]
    assert speedup[1] > 1.4
    assert speedup[64] < 0.8 * speedup[1]
