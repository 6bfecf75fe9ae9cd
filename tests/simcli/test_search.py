"""Plan search: enumeration, the closed form against the simulator, ranking, balance, CLI."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pandas as pd
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from costmodels.steps.memory import estimate_memory
from costmodels.steps.training import step_costs
from costmodels.steps.training_many import step_costs_many
from hardware_specs.registry import builtin_catalog
from simcli.commands import plan as plan_cmd
from simcli.errors import set_debug
from simcli.scenario import resolve_hardware
from simcli.training.search import gpu_counts, pareto_mask, search_plans
from simcli.training.search_estimate import (
    EstimateContext,
    _pipeline_exact,
    balance_split,
    estimate_iteration_s,
    memory_capacity_bytes,
    pipeline_times,
    plan_memory_bytes,
)
from simcli.training.search_space import TRIMS, SearchSpace, enumerate_plans, plan_from_row
from simcli.training.simulator import _Durations, _run_pipeline, simulate_iteration
from workloads.models import load_model
from workloads.plan import PlanError, check_plan, make_plan

GPU = "h100-sxm"
LLAMA = load_model("llama3-8b")  # 128k vocabulary: a heavy last pipeline stage


def _context(model, num_gpus: int, seq_len: int, global_batch: int) -> EstimateContext:
    hw = resolve_hardware(GPU, num_gpus)
    return EstimateContext(
        model, hw.system, hw.cost_model, num_gpus, seq_len, global_batch, "bf16-mixed"
    )


def _simulate(model, plan, gpu=GPU):
    hw = resolve_hardware(gpu, plan.num_gpus)
    return simulate_iteration(model, plan, system=hw.system, cost_model=hw.cost_model)


def _search(model, gpu, num_gpus, *, objective="time", price_usd_per_gpu_hour=None, **kwargs):
    """search_plans over the GPU counts ``simcli plan`` would try, resolved here."""
    hardware = [
        resolve_hardware(gpu, n, price_usd_per_gpu_hour=price_usd_per_gpu_hour)
        for n in gpu_counts(num_gpus, objective)
    ]
    return search_plans(model, hardware, objective=objective, **kwargs)


# --------------------------------------------------------------------------- pieces


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    else:
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15), path


@pytest.mark.parametrize("model_id", ["llama3-8b", "mixtral-8x7b"])
def test_step_costs_many_is_step_costs(model_id):
    """The batched pricing the search relies on equals step_costs field by field."""
    model = load_model(model_id)
    n = 64
    ctx = _context(model, n, 4096, 128)

    def ep(tp, pp, cp):
        return 2 if model.is_moe and (n // (tp * pp * cp)) % 2 == 0 else 1

    plans = [
        make_plan(model, num_gpus=n, tp=tp, pp=pp, cp=cp, ep=ep(tp, pp, cp), cp_kind=kind,
                  recompute=rec,
                  micro_batch=mb, global_batch=128, seq_len=4096, sequence_parallel=sp)
        for tp, pp, cp, kind, rec, mb, sp in [
            (1, 1, 1, "ring", "none", 1, False),
            (2, 4, 1, "ring", "selective", 2, True),
            (8, 2, 2, "ring", "full", 1, True),
            (4, 1, 4, "ulysses", "selective", 1, False),
            (2, 2, 8, "tokenring", "none", 1, True),
            (8, 8, 1, "ring", "full", 1, False),
        ]
    ]  # fmt: skip
    many = step_costs_many(model, plans, ctx.cost_model, ctx.system)
    for plan, got in zip(plans, many, strict=True):
        want = step_costs(model, plan, ctx.cost_model, ctx.system)
        _close(dataclasses.asdict(got), dataclasses.asdict(want))


def test_pipeline_closed_form_matches_the_simulator_schedule():
    """Exact for even stages (1F1B and interleaved, with p2p); within 2.5 % with heavy
    first/last-stage extras (up to 3 stages' work on the last one)."""
    rng = random.Random(7)
    worst_even = worst_extra = 0.0
    for _ in range(120):
        p = rng.choice([1, 2, 3, 4, 8])
        v = rng.choice([1, 1, 2, 3]) if p > 1 else 1
        m = p * rng.randint(1, 6) if v > 1 else rng.randint(1, 40)
        f = rng.uniform(0.1, 2.0)
        b = f * rng.uniform(1.5, 3.0)
        c = rng.choice([0.0, f * rng.uniform(0.0, 0.5)])
        extra = rng.choice([0.0, 0.0, 0.2, 1.0, 3.0])
        ef, eb = 0.05 * extra * f, 0.05 * extra * b
        lf, lb = extra * v * f * rng.uniform(0.3, 1), extra * v * b * rng.uniform(0.3, 1)
        n = p * v
        fw, bw = [f] * n, [b] * n
        fw[0] += ef
        bw[0] += eb
        fw[-1] += lf
        bw[-1] += lb
        sched = "interleaved" if v > 1 else "1f1b"
        plan = make_plan(num_gpus=p, pp=p, vpp=v, pp_schedule=sched, global_batch=m,
                         seq_len=128)  # fmt: skip
        end, _ = _run_pipeline(plan, _Durations(tuple(fw), tuple(bw), (1,) * n), c, None)
        a = [np.array([x], dtype=float) for x in (p, v, m, f, b)]
        t0, t1, tl = pipeline_times(
            *a[:3], a[3], a[4], (np.array([ef]), np.array([eb])),
            (np.array([lf]), np.array([lb])), np.array([c]),
        )  # fmt: skip
        err = abs(t0[0] / end.max() - 1)
        if extra == 0:
            worst_even = max(worst_even, err)
            if p > 1:
                assert t1[0] == pytest.approx(end[1], rel=1e-9)
            assert tl[0] == pytest.approx(end[-1], rel=1e-9)
        else:
            worst_extra = max(worst_extra, err)
    assert worst_even < 1e-9
    assert worst_extra < 0.025


def test_exact_pipeline_is_the_simulator_schedule_and_bounds_the_closed_form():
    """Interleaved plans with transfers above EXACT_P2P_RATIO of a chunk: the closed form
    is a lower bound there (used to prune), the list scheduling is exact."""
    rng = random.Random(11)
    for _ in range(30):
        p, v = rng.choice([2, 4, 8]), rng.choice([2, 3, 5])
        m = p * rng.randint(1, 4)
        f = rng.uniform(0.5, 1.5)
        b = f * rng.uniform(1.5, 2.5)
        c = (f + b) * rng.uniform(0.25, 1.5)
        ef, eb, lf, lb = 0.05 * f, 0.05 * b, rng.uniform(0, 2) * f, rng.uniform(0, 2) * b
        n = p * v
        fw, bw = [f] * n, [b] * n
        fw[0] += ef
        bw[0] += eb
        fw[-1] += lf
        bw[-1] += lb
        plan = make_plan(num_gpus=p, pp=p, vpp=v, pp_schedule="interleaved", global_batch=m,
                         seq_len=128)  # fmt: skip
        end, _ = _run_pipeline(plan, _Durations(tuple(fw), tuple(bw), (1,) * n), c, None)
        args = (
            *(np.array([x]) for x in (p, v, m)), np.array([f]), np.array([b]),
            (np.array([ef]), np.array([eb])), (np.array([lf]), np.array([lb])), np.array([c]),
        )  # fmt: skip
        t0, t1, tl = _pipeline_exact(*args)
        assert t0[0] == pytest.approx(end.max(), rel=1e-12)
        assert t1[0] == pytest.approx(end[1], rel=1e-12)
        assert tl[0] == pytest.approx(end[-1], rel=1e-12)
        assert pipeline_times(*args)[0][0] <= end.max() * 1.005


def test_fast_estimate_within_one_percent_of_the_simulator():
    """The guarantee the ranking rests on: on a random sample of fitting plans (even
    stages, every schedule / ZeRO / CP kind), the closed form is the simulator's time."""
    ctx = _context(LLAMA, 16, 4096, 64)
    table = enumerate_plans(LLAMA, 16, 4096, 64, 8)
    fits = np.flatnonzero(plan_memory_bytes(ctx, table) <= memory_capacity_bytes(ctx.system))
    rng = np.random.default_rng(3)
    # stratify so the sample has interleaved, ZeRO-3 and CP plans
    groups = [
        fits[table["vpp"][fits] > 1],
        fits[table["zero"][fits] == 3],
        fits[table["cp"][fits] > 1],
        fits[table["pp"][fits] > 1],
        fits,
    ]
    idx = np.unique(np.concatenate([rng.choice(g, 3, replace=False) for g in groups]))
    sub = {k: v[idx] for k, v in table.items()}
    est = estimate_iteration_s(ctx, sub, exact=True)["iteration_s"]
    errors = []
    for i in range(len(idx)):
        plan = plan_from_row(sub, i, num_gpus=16, seq_len=4096, global_batch=64,
                             precision="bf16-mixed", num_layers=LLAMA.num_layers)  # fmt: skip
        sim = simulate_iteration(LLAMA, plan, system=ctx.system, cost_model=ctx.cost_model)
        errors.append(abs(est[i] / sim.iteration_s - 1))
    assert max(errors) < 0.01


def test_enumeration_applies_the_pruning_rules():
    model = load_model("gpt3-175b")
    t = enumerate_plans(model, 1024, 2048, 1536, 8)
    assert len(t["tp"]) > 50_000
    assert (t["tp"] <= 8).all()
    assert (2048 // t["cp"] >= 512).all()
    assert (t["tp"] * t["pp"] * t["cp"] * t["dp"] == 1024).all()
    trims = np.array(TRIMS)[t["trim"]].sum(axis=1)
    assert ((model.num_layers + trims) % (t["pp"] * t["vpp"]) == 0).all()
    assert (t["trim"][model.num_layers % (t["pp"] * t["vpp"]) == 0] == 0).all()
    assert (t["mb"] * t["dp"] * t["m"] == 1536).all()
    inter = t["vpp"] > 1
    assert (t["m"][inter] % t["pp"][inter] == 0).all()
    assert (t["dp"][t["zero"] > 0] * t["cp"][t["zero"] > 0] > 1).all()  # dp * cp shards
    assert (t["pp"][t["zero"] >= 2] > 1).any()  # ZeRO-2/3 with pipelines (Llama 3)
    assert (t["sp"][t["tp"] == 1] == 0).all()
    # TP communication exposed or overlapped, for TP > 1 only
    assert set(np.unique(t["tpc"][t["tp"] > 1]).tolist()) == {0, 1}
    assert (t["tpc"][t["tp"] == 1] == 0).all()
    for i in np.random.default_rng(0).choice(len(t["tp"]), 200, replace=False):
        plan = plan_from_row(t, int(i), num_gpus=1024, seq_len=2048, global_batch=1536,
                             precision="bf16-mixed", num_layers=96)  # fmt: skip
        check_plan(plan, model)
    for i in np.flatnonzero(t["trim"] > 0)[:50]:
        plan = plan_from_row(t, int(i), num_gpus=1024, seq_len=2048, global_batch=1536,
                             precision="bf16-mixed", num_layers=96)  # fmt: skip
        split = check_plan(plan, model).layers_per_chunk(96)
        assert sum(split) == 96 and len(set(split[1:-1])) == 1 and min(split) >= 0


def test_balance_split_binary_search():
    # 12 layers, 4 stages, the last stage carries 2.5 layers' worth of LM head
    assert balance_split(12, [0.0, 0.0, 0.0, 2.5], 1.0) == (4, 4, 3, 1)
    # memory allows the first stage only 2 layers
    split = balance_split(12, [0.0, 0.0, 0.0, 2.5], 1.0, max_layers=[2, 12, 12, 12])
    assert split is not None and split[0] <= 2 and sum(split) == 12
    assert max(w + n for w, n in zip([0, 0, 0, 2.5], split, strict=True)) == 4.5
    assert balance_split(12, [0.0] * 4, 1.0, max_layers=[2, 2, 2, 2]) is None


# --------------------------------------------------------------------------- search


@pytest.fixture(scope="module")
def small_search():
    return _search(LLAMA, GPU, 8, seq_len=4096, global_batch=32, top=5)


def test_search_returns_valid_fitting_plans_ranked_by_the_simulator(small_search):
    r = small_search
    assert 1 <= len(r.plans) <= 5
    assert r.configs_evaluated >= r.configs_fit >= len(r.plans)
    assert r.search_seconds > 0
    times = [p.iteration_s for p in r.plans]
    assert times == sorted(times)
    gpu = builtin_catalog().gpu(GPU)
    for p in r.plans:
        check_plan(p.plan, LLAMA)
        assert estimate_memory(LLAMA, p.plan, gpu).fits
        assert p.peak_memory_bytes <= p.capacity_bytes
        assert p.estimate_s == pytest.approx(p.iteration_s, rel=0.02)
    best = r.plans[0]
    again = _simulate(LLAMA, best.plan)
    assert again.iteration_s == pytest.approx(best.iteration_s, rel=1e-9)


def test_top_plan_beats_a_hand_picked_one(small_search):
    hand = make_plan(LLAMA, num_gpus=8, tp=2, dp=4, zero=1, micro_batch=1, global_batch=32,
                     seq_len=4096, recompute="selective")  # fmt: skip
    assert estimate_memory(LLAMA, hand, builtin_catalog().gpu(GPU)).fits
    assert small_search.plans[0].iteration_s <= _simulate(LLAMA, hand).iteration_s


def test_balance_moves_layers_off_the_lm_head_stage():
    """Galvatron-BMW balancing on a 128k-vocabulary model at pp=8: the last stage holds
    the LM head (about two layers' work), so even stages leave the others idle."""
    space = SearchSpace(tp=(1,), pp=(8,), schedules=("1f1b",), recompute=("selective",),
                        zero=(0,))  # fmt: skip
    kwargs = dict(seq_len=4096, global_batch=64, top=1, space=space)
    even = _search(LLAMA, GPU, 8, **kwargs).plans[0]
    bal = _search(LLAMA, GPU, 8, balance=True, **kwargs).plans[0]
    split = bal.plan.layer_split
    assert split is not None and sum(split) == LLAMA.num_layers
    assert split[-1] < LLAMA.num_layers // 8  # the LM-head stage got fewer layers
    assert bal.iteration_s < 0.95 * even.iteration_s
    assert estimate_memory(LLAMA, bal.plan, builtin_catalog().gpu(GPU)).fits


def test_cost_objective_ranks_by_dollars_and_tries_fewer_gpus():
    r = _search(LLAMA, GPU, 16, seq_len=2048, global_batch=64, top=3, objective="cost",
                price_usd_per_gpu_hour=2.0)  # fmt: skip
    assert r.price_usd_per_gpu_hour == 2.0
    costs = [p.cost_usd_per_iteration for p in r.plans]
    assert costs == sorted(costs)
    for p in r.plans:
        assert p.cost_usd_per_iteration == pytest.approx(
            p.iteration_s * p.plan.num_gpus * 2.0 / 3600
        )
    assert r.configs_evaluated > len(enumerate_plans(LLAMA, 16, 2048, 64, 8)["tp"])


def test_no_fitting_plan_is_one_clear_error():
    with pytest.raises(PlanError, match="no plan of llama3.1-405b fits"):
        _search(load_model("llama3.1-405b"), "l40s", 8, seq_len=4096, global_batch=8)


# --------------------------------------------------------------------------- CLI


def _cli():
    app = typer.Typer()
    app.add_typer(plan_cmd.app, name="plan")

    @app.callback()
    def _root() -> None:
        set_debug(False)

    return app


def test_cli_json_has_the_contract_keys():
    res = CliRunner().invoke(
        _cli(),
        ["plan", "--model", "llama3-8b", "--gpu", GPU, "--gpus", "8", "--seq-len", "4096",
         "--global-batch", "32", "--top", "3", "--format", "json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("configs_evaluated", "search_seconds", "plans"):
        assert key in out
    assert 1 <= len(out["plans"]) <= 3
    first = out["plans"][0]
    for key in ("tp", "pp", "dp", "micro_batch", "iteration_s", "tokens_per_s", "mfu",
                "peak_memory_gib", "cost_usd_per_iteration"):  # fmt: skip
        assert key in first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model", "--gpu", GPU], "unknown model"),
        (["--model", "llama3-8b", "--gpu", "no-such-gpu"], "unknown GPU"),
        (["--model", "llama3-8b", "--gpu", GPU, "--objective", "speed"], "objective"),
    ],
)
def test_cli_errors_are_one_line(args, message):
    res = CliRunner().invoke(
        _cli(), ["plan", *args, "--gpus", "8", "--seq-len", "4096", "--global-batch", "32"]
    )
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_gpu_counts_with_odd_factors_search_instead_of_crashing():
    """96 GPUs (12 nodes of 8): TP 3 groups would straddle nodes and GPT-3's 2,048 tokens
    do not split over TP 3, so those plans are skipped, not fatal; DP groups split 2 + 1
    over nodes (TP 4 x DP 3) are priced as spanning 3 nodes; the best plan is simulated."""
    gpt3 = load_model("gpt3-175b")
    t = enumerate_plans(gpt3, 96, 2048, 192, 8)
    assert len(t["tp"]) and set(np.unique(t["tp"])) <= {1, 2, 4, 8}
    sp = t["sp"] == 1
    assert ((2048 // t["cp"][sp]) % t["tp"][sp] == 0).all()
    for model, seq, gbs in ((load_model("llama3-8b"), 4096, 96), (gpt3, 2048, 192)):
        res = _search(model, GPU, 96, seq_len=seq, global_batch=gbs, top=1)
        best = res.plans[0]
        assert best.plan.num_gpus == 96
        assert _simulate(model, best.plan).iteration_s == pytest.approx(best.iteration_s)


def test_uneven_groups_are_priced_over_a_node_count_that_divides_them():
    from costmodels.steps.training import group_nodes
    from simcli.training.search_estimate import _group_nodes_many

    assert group_nodes(3, 4, 8) == 3  # ranks 0, 4, 8: two nodes, unevenly
    assert group_nodes(3, 8, 8) == 3 and group_nodes(4, 2, 8) == 1 and group_nodes(8, 2, 8) == 2
    sizes, strides = np.array([3, 3, 4, 8, 6]), np.array([4, 8, 2, 2, 2])
    many = _group_nodes_many(sizes, strides, 8)
    pairs = zip(sizes, strides, strict=True)
    assert many.tolist() == [group_nodes(int(s), int(k), 8) for s, k in pairs]


def test_trimmed_stage_layouts_match_the_simulator_and_memory():
    """pp * vpp not dividing the layers: the search adds layouts with a lighter first
    and/or last chunk (search_space.TRIMS); their closed-form time and vectorised memory
    are the simulator's and estimate_memory's for the equivalent layer_split."""
    from costmodels.steps.memory import estimate_memory

    ctx = _context(LLAMA, 24, 4096, 48)
    table = enumerate_plans(LLAMA, 24, 4096, 48, 8)
    trimmed = np.flatnonzero(table["trim"] > 0)
    assert set(np.unique(table["pp"][trimmed]).tolist()) >= {3}  # 32 layers on 3 stages
    mem = plan_memory_bytes(ctx, table)
    idx = np.random.default_rng(0).choice(trimmed, 12, replace=False)
    sub = {k: v[idx] for k, v in table.items()}
    est = estimate_iteration_s(ctx, sub, exact=True)["iteration_s"]
    for j, i in enumerate(idx):
        plan = plan_from_row(table, int(i), num_gpus=24, seq_len=4096, global_batch=48,
                             precision="bf16-mixed", num_layers=32)  # fmt: skip
        split = plan.layers_per_chunk(32)
        assert sum(split) == 32 and plan.layer_split is not None
        want = estimate_memory(LLAMA, plan, ctx.system.gpu).total_bytes
        assert mem[i] == pytest.approx(want, rel=1e-9)
        sim = simulate_iteration(LLAMA, plan, system=ctx.system, cost_model=ctx.cost_model)
        assert est[j] == pytest.approx(sim.iteration_s, rel=0.01)


def test_optimizer_offload_rows_match_the_simulator_and_memory():
    """The search's offload dimension (ZeRO-Offload): closed form and vectorised memory
    equal the simulator and estimate_memory; offloading frees memory and costs time."""
    from costmodels.steps.memory import estimate_memory

    ctx = _context(LLAMA, 8, 4096, 16)
    space = SearchSpace(optimizer_offload=(0.0, 0.5, 1.0), zero=(0, 1))
    table = enumerate_plans(LLAMA, 8, 4096, 16, 8, space)
    assert set(np.unique(table["off"]).tolist()) == {0, 50, 100}
    mem = plan_memory_bytes(ctx, table)
    idx = np.random.default_rng(1).choice(np.flatnonzero(table["off"] > 0), 8, replace=False)
    est = estimate_iteration_s(ctx, {k: v[idx] for k, v in table.items()}, exact=True)
    for j, i in enumerate(idx):
        plan = plan_from_row(table, int(i), num_gpus=8, seq_len=4096, global_batch=16,
                             precision="bf16-mixed", num_layers=32)  # fmt: skip
        assert plan.optimizer_offload == table["off"][i] / 100
        assert mem[i] == pytest.approx(estimate_memory(LLAMA, plan, ctx.system.gpu).total_bytes)
        sim = simulate_iteration(LLAMA, plan, system=ctx.system, cost_model=ctx.cost_model)
        assert est["iteration_s"][j] == pytest.approx(sim.iteration_s, rel=0.01)
        twin = plan.model_copy(update={"optimizer_offload": 0.0})
        assert estimate_memory(LLAMA, twin, ctx.system.gpu).total_bytes > mem[i]
        base = simulate_iteration(LLAMA, twin, system=ctx.system, cost_model=ctx.cost_model)
        assert base.iteration_s < sim.iteration_s


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.integers(1, 16_384),
    model_id=st.sampled_from(["llama3-8b", "llama3-70b", "gpt3-175b", "mixtral-8x7b"]),
    seq_len=st.sampled_from([2048, 4096, 8192]),
    batch_per_gpu=st.sampled_from([0.25, 1, 2]),
)
def test_search_never_crashes_and_returns_only_plans_that_fit(
    gpus, model_id, seq_len, batch_per_gpu
):
    """Any GPU count from 1 to 16,384 (odd factors, primes): the search answers with
    plans that fit (inside the memory margin) or refuses with one PlanError line."""
    model = load_model(model_id)
    global_batch = max(1, int(gpus * batch_per_gpu))
    hw = resolve_hardware(GPU, gpus)
    margin = 0.02 * memory_capacity_bytes(hw.system)
    try:
        res = search_plans(
            model, [hw], seq_len=seq_len, global_batch=global_batch,
            top=2, memory_margin_bytes=margin,
        )  # fmt: skip
    except PlanError as exc:
        assert "\n" not in str(exc) and "allowed" in str(exc)
        return
    assert res.plans
    for p in res.plans:
        assert p.peak_memory_bytes + margin <= p.capacity_bytes
        assert p.plan.num_gpus == gpus
        check_plan(p.plan, model)


def test_rank_order_on_pods_closed_form_and_simulator_agree():
    """Llama 3's layout (DP outermost) on a cluster with 1:7 between pods: the closed form
    prices the DP group and the pipeline hop with the pod factors the simulator uses, and
    keeping pipelines inside pods beats Megatron's layout there."""
    from pathlib import Path

    cluster = Path(__file__).resolve().parents[2] / "examples/clusters/llama3-24k-h100-roce.yaml"
    model = load_model("llama3-70b")
    hw = resolve_hardware(GPU, 6144, cluster_file=cluster)
    ctx = EstimateContext(model, hw.system, hw.cost_model, 6144, 4096, 1536, "bf16-mixed")
    space = SearchSpace(tp=(8,), pp=(8,), rank_orders=("tp-cp-dp-pp", "tp-cp-pp-dp"),
                        schedules=("1f1b",), recompute=("full",), cp_kinds=("ring",))  # fmt: skip
    table = enumerate_plans(model, 6144, 4096, 1536, 8, space)
    assert set(np.unique(table["ord"]).tolist()) == {0, 1}
    idx = np.flatnonzero((table["cp"] == 1) & (table["zero"] == 1) & (table["mb"] == 1))
    idx = idx[(table["tpc"][idx] == 0) & (table["sp"][idx] == 1)]
    sub = {k: v[idx] for k, v in table.items()}
    est = estimate_iteration_s(ctx, sub, exact=True)["iteration_s"]
    sims = {}
    for j in range(len(idx)):
        plan = plan_from_row(sub, j, num_gpus=6144, seq_len=4096, global_batch=1536,
                             precision="bf16-mixed", num_layers=80)  # fmt: skip
        sim = simulate_iteration(model, plan, system=hw.system, cost_model=hw.cost_model)
        assert est[j] == pytest.approx(sim.iteration_s, rel=0.01)
        sims[plan.rank_order] = sim.iteration_s
    assert sims["tp-cp-pp-dp"] < sims["tp-cp-dp-pp"]


def test_pareto_mask_matches_brute_force():
    rng = np.random.default_rng(5)
    for dims in (2, 3):
        pts = rng.integers(0, 12, size=(300, dims)).astype(float)
        got = pareto_mask(*pts.T)
        want = np.array([
            not any((q <= p).all() and (q < p).any() for q in pts) for p in pts
        ])  # fmt: skip
        np.testing.assert_array_equal(got, want)


def test_plan_reports_the_time_memory_cost_front(tmp_path):
    """Issue 18 item 17: the front is in the JSON (`pareto`) and pareto.csv, and no
    fitting plan the search estimated beats a front member in time and memory at once."""
    res = CliRunner().invoke(
        _cli(),
        ["plan", "--model", "llama3-8b", "--gpu", GPU, "--gpus", "8", "--seq-len", "4096",
         "--global-batch", "64", "--format", "json", "--output", str(tmp_path / "out")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    front = json.loads(res.stdout)["pareto"]
    assert len(front) >= 3
    times = [p["estimate_s"] for p in front]
    mems = [p["peak_memory_gib"] for p in front]
    assert times == sorted(times) and mems == sorted(mems, reverse=True)
    ev = pd.read_csv(tmp_path / "out" / "evaluated.csv")
    ev = ev[ev.fits.astype(bool)]
    for t, m in zip(times, mems, strict=True):
        # (evaluated.csv holds 6 significant digits)
        assert not ((ev.estimate_s < t * (1 - 1e-5)) & (ev.peak_memory_gib < m * (1 - 1e-5))).any()
    csv = pd.read_csv(tmp_path / "out" / "pareto.csv")
    assert len(csv) == len(front)


def test_cp_plans_reduce_over_dp_times_cp_in_the_closed_form_and_the_simulator():
    """Context parallelism: gradients (and ZeRO / distributed-optimizer shards) reduce
    over the dp * cp group (Megatron-LM's data-parallel group with context parallelism);
    the closed form prices it as the simulator does, for cp 2 / 4, dp 1 / 2, every ZeRO
    stage and both rank orders (Llama 3's with pipelines, where the group is not one
    uniform stride, and CP blocks spanning nodes)."""
    ctx = _context(LLAMA, 64, 8192, 64)
    space = SearchSpace(rank_orders=("tp-cp-dp-pp", "tp-cp-pp-dp"), schedules=("1f1b",),
                        recompute=("full",), cp_kinds=("ring",), tp_comms=("plain",))  # fmt: skip
    table = enumerate_plans(LLAMA, 64, 8192, 64, 8, space)
    rng = np.random.default_rng(7)
    picked = []
    for cp in (2, 4):
        for dp in (1, 2):
            for zero in (0, 1, 2, 3):
                for order in (0, 1) if dp > 1 else (0,):  # dp 1: the orders coincide
                    rows = np.flatnonzero(
                        (table["cp"] == cp) & (table["dp"] == dp) & (table["zero"] == zero)
                        & (table["ord"] == order) & (table["pp"] > 1) & (table["vpp"] == 1)
                    )  # fmt: skip
                    assert len(rows), (cp, dp, zero, order)
                    picked.append(int(rng.choice(rows)))
    # Llama 3's order with a CP block over two nodes (tp 4 x cp 4 on 8-GPU nodes)
    wide = np.flatnonzero(
        (table["ord"] == 1) & (table["tp"] * table["cp"] > 8) & (table["pp"] > 1)
        & np.isin(table["cp"], (2, 4))
    )  # fmt: skip
    assert len(wide)
    idx = np.array(picked + [int(x) for x in rng.choice(wide, 2, replace=False)])
    sub = {k: v[idx] for k, v in table.items()}
    est = estimate_iteration_s(ctx, sub, exact=True)["iteration_s"]
    for j in range(len(idx)):
        plan = plan_from_row(sub, j, num_gpus=64, seq_len=8192, global_batch=64,
                             precision="bf16-mixed", num_layers=LLAMA.num_layers)  # fmt: skip
        sim = simulate_iteration(LLAMA, plan, system=ctx.system, cost_model=ctx.cost_model)
        assert est[j] == pytest.approx(sim.iteration_s, rel=0.01), plan
