"""Variable-length simulation: costs, strategies' invariants, the FlexSP program, the CLI."""

from __future__ import annotations

import json
import math
from collections import Counter
from functools import cache

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from costmodels.ops.select import get_cost_model
from simcli.commands import varlen as varlen_cmd
from simcli.errors import set_debug
from simcli.training import varlen as V
from workloads.lengths import parse_dist
from workloads.models import get_model

MODEL = "llama3-8b"
GPU = "h100-sxm"
DYNAMIC = ("hydraulis", "bytescale", "flexsp")


@cache
def simulate(
    dist: str = "longtail-128k",
    gpus: int = 32,
    tp: int = 4,
    tokens: int = 1 << 19,
    steps: int = 6,
    seed: int = 0,
    **extra,
) -> V.VarlenResult:
    cfg = V.make_varlen_config(
        lengths=parse_dist(dist),
        num_gpus=gpus,
        tp=tp,
        tokens_per_step=tokens,
        steps=steps,
        seed=seed,
        **extra,
    )
    return V.simulate_varlen(get_model(MODEL), get_cost_model(GPU, num_gpus=gpus), cfg)


@cache
def coster(gpus: int = 32, tps: tuple[int, ...] = (4,), max_len: int = 131072) -> V.VarlenCoster:
    return V.VarlenCoster(get_model(MODEL), get_cost_model(GPU, num_gpus=gpus), gpus, tps, max_len)


def without_wall_clock(result: V.VarlenResult) -> dict:
    out = result.to_dict()
    for summary in out["strategies"].values():
        summary.pop("plan_wall_s_per_step")
    return out


# --------------------------------------------------------------------------- costs


def test_one_long_document_costs_far_more_than_many_short_ones():
    c = coster()
    lengths = np.array([32768] + [1024] * 32)
    long = V.Lane(4, 1)
    long.add(0, 1)
    short = V.Lane(4, 1)
    for d in range(1, 33):
        short.add(d, 1)
    t_long = V.lane_cost(c, long, lengths).busy_s
    t_short = V.lane_cost(c, short, lengths).busy_s
    assert t_long > 1.5 * t_short  # same tokens; attention is per document (varlen)
    f32, b32 = c.attention_s(4, np.array([32768.0]))
    f1, b1 = c.attention_s(4, np.array([1024.0]))
    assert (f32 + b32)[0] > 10 * 32 * (f1 + b1)[0]  # causal attention ~ L^2


def test_costs_are_positive_and_monotone():
    c = coster()
    tokens = np.array([64.0, 1000, 4096, 20000, 60000])
    lin = c.linear_s(4, tokens)
    assert np.all(lin > 0) and np.all(np.diff(lin) > 0)
    lengths = np.array([16.0, 100, 1000, 10_000, 100_000])
    f, b = c.attention_s(4, lengths)
    assert np.all(np.diff(f) > 0) and np.all(np.diff(b) > 0)
    # splitting a long document over more ranks cuts each rank's share
    per_rank = [float(c.doc_cost_s(4, np.array([131072.0]), k)[0]) for k in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(per_rank, per_rank[1:], strict=False))
    assert c.optimizer_s > 0


def test_memory_limit_follows_tp_and_recompute():
    c = coster()
    assert c.limit(4) > 0
    assert c.tokens_limit(8) > c.tokens_limit(4) > c.tokens_limit(2)
    full = V.VarlenCoster(
        get_model(MODEL), get_cost_model(GPU, num_gpus=32), 32, (), 0, recompute="full"
    )
    assert full.tokens_limit(4) > 5 * c.tokens_limit(4)


# --------------------------------------------------------------------------- packing


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 100), min_size=1, max_size=60), cap=st.integers(100, 300))
def test_ffd_places_every_item_once_within_capacity(sizes, cap):
    bins = V.ffd(np.array(sizes), cap)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in b) <= cap for b in bins)


@settings(max_examples=30, deadline=None)
@given(
    costs=st.lists(st.floats(0.01, 10.0), min_size=1, max_size=40),
    lanes=st.integers(1, 6),
)
def test_eft_assigns_once_and_is_within_lpt_bound(costs, lanes):
    arr = np.array(costs)
    out, makespan = V.eft([arr], [lanes])
    flat = sorted(d for lane in out[0] for d in lane)
    assert flat == list(range(len(costs)))
    loads = [arr[lane].sum() for lane in out[0]]
    assert math.isclose(max(loads), makespan, rel_tol=1e-9)
    # Graham's list-scheduling bound (LPT is a list schedule): mean load + largest item
    assert makespan <= arr.sum() / lanes + arr.max() + 1e-9


# --------------------------------------------------------------------------- simulation


def coverage(lanes: list[V.Lane], n_docs: int) -> np.ndarray:
    """How much of each document the lanes hold (1 = exactly once)."""
    held = np.zeros(n_docs)
    for lane in lanes:
        for d, k in zip(lane.docs, lane.shards, strict=True):
            held[d] += lane.cp / k
    return held


def test_every_document_assigned_exactly_once_and_memory_respected():
    res = simulate()
    for name, strat in res.results.items():
        for step, outcome in zip(res.steps, strat.outcomes, strict=True):
            np.testing.assert_allclose(coverage(outcome.lanes, len(step)), 1.0, err_msg=name)
            assert outcome.fill_max <= 1.0 + 1e-9, name
            # ByteScale shards: a document split over k ranks sits on k distinct lanes
            where = Counter(d for lane in outcome.lanes for d in set(lane.docs))
            for lane in outcome.lanes:
                for d, k in zip(lane.docs, lane.shards, strict=True):
                    if k > lane.cp:
                        assert where[d] == k
    c = V.VarlenCoster(
        get_model(MODEL), get_cost_model(GPU, num_gpus=32), 32, (4,), res.static_plan.seq_len
    )
    for strat in res.results.values():
        for step, outcome in zip(res.steps, strat.outcomes, strict=True):
            for lane in outcome.lanes:
                per_rank = step[lane.docs] / np.array(lane.shards)
                if lane.tp == 4:
                    assert per_rank.max() <= c.limit(4)


def test_dynamic_strategies_never_slower_than_static_on_the_same_steps():
    res = simulate()
    static = [o.step_s for o in res.results["static"].outcomes]
    for name in DYNAMIC:
        steps = [o.step_s for o in res.results[name].outcomes]
        assert all(d <= s * (1 + 1e-9) for d, s in zip(steps, static, strict=True)), name
    summary = res.to_dict()["strategies"]
    assert summary["static"]["padding_fraction"] > 0.05
    for name in ("hydraulis", "flexsp"):
        assert summary[name]["speedup_vs_static"] > 1.1, summary[name]
        assert summary[name]["fallback_steps"] < res.config.steps
        assert summary[name]["padding_fraction"] == 0.0
        assert summary[name]["imbalance"] < summary["static"]["imbalance"]


@settings(max_examples=6, deadline=None)
@given(
    dist=st.sampled_from(["longtail-128k", "uniform:64:16384", "zipf:1.3:32:65536", "chat-8k"]),
    layout=st.sampled_from([(8, 2), (16, 4), (32, 8), (16, 8)]),
    tokens=st.sampled_from([1 << 16, 1 << 18]),
    seed=st.integers(0, 1000),
)
def test_invariants_hold_across_scenarios(dist, layout, tokens, seed):
    gpus, tp = layout
    args = dict(dist=dist, gpus=gpus, tp=tp, tokens=tokens, steps=2, seed=seed)
    res = simulate(**args, seq_len=32768)  # longer documents are cut (fits 8 x H100)
    assert max(s.max() for s in res.steps) <= 32768
    static = res.results["static"].outcomes
    for name, strat in res.results.items():
        for step, outcome, base in zip(res.steps, strat.outcomes, static, strict=True):
            np.testing.assert_allclose(coverage(outcome.lanes, len(step)), 1.0, err_msg=name)
            assert outcome.fill_max <= 1.0 + 1e-9, name
            assert outcome.step_s <= base.step_s * (1 + 1e-9), name
            assert sum(lane.gpus for lane in outcome.lanes) <= gpus, name


def test_same_seed_same_result_other_seed_other_documents():
    a = without_wall_clock(simulate(steps=3, seed=5))
    b = V.simulate_varlen(
        get_model(MODEL),
        get_cost_model(GPU, num_gpus=32),
        simulate(steps=3, seed=5).config,
    )
    assert a == without_wall_clock(b)
    c = simulate(steps=3, seed=6)
    assert not all(
        np.array_equal(x, y) for x, y in zip(simulate(steps=3, seed=5).steps, c.steps, strict=True)
    )


def test_fixed_lengths_at_the_context_leave_nothing_to_gain():
    res = simulate(dist="fixed:4096", gpus=16, tp=8, tokens=16 * 4096, steps=2)
    summary = res.to_dict()["strategies"]
    for name in DYNAMIC:
        assert math.isclose(summary[name]["speedup_vs_static"], 1.0, rel_tol=0.02), summary
    assert summary["static"]["padding_fraction"] == 0.0


def test_sampler_cuts_long_documents_and_fills_the_budget():
    dist = parse_dist("uniform:1000:20000")
    steps = V.sample_steps(dist, 50_000, 4, 3, 8192)
    for docs in steps:
        assert docs.max() <= 8192 and docs.min() >= 1
        assert 50_000 <= docs.sum() < 50_000 + 20_000
    again = V.sample_steps(dist, 50_000, 4, 3, 8192)
    assert all(np.array_equal(x, y) for x, y in zip(steps, again, strict=True))


def test_static_plan_defaults_and_errors():
    res = simulate()
    plan = res.static_plan
    assert plan.tp * plan.cp * plan.dp == 32 and plan.seq_len >= 131072
    assert plan.seq_len // plan.cp <= res.tokens_limit
    with pytest.raises(V.VarlenError) as exc:
        simulate(cp=1)
    line = str(exc.value)
    assert "\n" not in line and "--cp in {" in line
    with pytest.raises(V.VarlenError, match="has no maximum length"):
        simulate(dist="lognormal:1000:1")
    with pytest.raises(V.VarlenError, match="tp=3 does not divide num_gpus=32"):
        simulate(tp=3)
    with pytest.raises(V.VarlenError, match="strategies"):
        V.make_varlen_config(
            lengths=parse_dist("100"),
            num_gpus=8,
            tokens_per_step=100,
            strategies=("static", "static"),
        )


def test_too_long_for_the_cluster_is_one_line():
    with pytest.raises(V.VarlenError) as exc:
        simulate(dist="fixed:1000000", gpus=8, tp=8, tokens=1 << 20, steps=1)
    assert "\n" not in str(exc.value) and "does not fit" in str(exc.value)


# --------------------------------------------------------------------------- FlexSP program


def step_inputs(gpus: int = 32, tp: int = 4):
    res = simulate(gpus=gpus, tp=tp)
    c = V.VarlenCoster(
        get_model(MODEL), get_cost_model(GPU, num_gpus=gpus), gpus, (tp,), res.static_plan.seq_len
    )
    lengths = max(res.steps, key=lambda s: s.max())  # the step with the longest document
    units = gpus // tp
    sizes = [1 << i for i in range(int(math.log2(units)) + 1)]
    fits = {k: lengths <= c.limit(tp) * k for k in sizes}
    cost = {k: np.where(fits[k], c.doc_cost_s(tp, lengths, k), np.inf) for k in sizes}
    return c, lengths, units, sizes, fits, cost


def test_flexsp_milp_solution_is_feasible():
    c, lengths, units, sizes, fits, cost = step_inputs()
    buckets = V.flexsp_buckets(lengths)
    assert sorted(np.concatenate(buckets)) == list(range(len(lengths)))
    best_single = float(np.min(np.vstack(list(cost.values())), axis=0).max())
    # a bound some plan meets: every document on the smallest group size that holds all
    k_all = next(k for k in sizes if np.all(fits[k]))
    _, greedy = V.eft([cost[k_all]], [units // k_all])
    bound = greedy * 1.0001
    sol = V.solve_flexsp_milp(cost, fits, buckets, units, bound)
    assert sol is not None
    assert sum(k * n for k, n in sol.groups.items()) <= units
    for b, docs in enumerate(buckets):
        assert sum(sol.assign[b].values()) == len(docs)
        for k, n in sol.assign[b].items():
            if n:
                assert np.all(fits[k][docs])  # memory per GPU respected
                assert float(cost[k][docs].max()) <= bound  # no document alone exceeds it
    for k in sizes:
        work = sum(sol.load_s[b].get(k, 0.0) * sol.assign[b].get(k, 0) for b in range(len(buckets)))
        assert work <= bound * sol.groups[k] * (1 + 1e-6) + 1e-9
    lanes, makespan = V.flexsp_realise(sol, cost, lengths, 4)
    np.testing.assert_allclose(coverage(lanes, len(lengths)), 1.0)
    assert Counter(lane.cp for lane in lanes) == {k: n for k, n in sol.groups.items() if n}
    assert makespan >= best_single * (1 - 1e-9)


def test_flexsp_milp_is_infeasible_below_the_longest_document():
    c, lengths, units, sizes, fits, cost = step_inputs()
    best_single = float(np.min(np.vstack(list(cost.values())), axis=0).max())
    buckets = V.flexsp_buckets(lengths)
    assert V.solve_flexsp_milp(cost, fits, buckets, units, 0.5 * best_single) is None


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def run():
    app = typer.Typer(pretty_exceptions_enable=False)
    app.add_typer(varlen_cmd.app, name="varlen")

    @app.callback()
    def _root() -> None:
        pass

    runner = CliRunner()

    def invoke(*args: str):
        set_debug(False)
        return runner.invoke(app, ["varlen", *args])

    return invoke


BASE = ("--model", MODEL, "--gpu", GPU, "--gpus", "32", "--tp", "4", "--tokens-per-step", "524288")


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_cli_json_has_one_object_per_strategy(run):
    result = run(*BASE, "--lengths", "longtail-128k", "--steps", "3", "--format", "json")
    assert result.exit_code == 0, result.output
    obj = json.loads(result.stdout)
    assert set(obj["strategies"]) == {"static", "hydraulis", "bytescale", "flexsp"}
    for summary in obj["strategies"].values():
        keys = ("mean_step_s", "tokens_per_s", "imbalance", "padding_fraction")
        for key in (*keys, "speedup_vs_static", "idle_fraction", "fallback_steps"):
            assert key in summary
    assert obj["strategies"]["static"]["speedup_vs_static"] == 1.0
    assert obj["lengths"] == "longtail-128k" and obj["steps"] == 3
    assert obj["static_plan"]["dp"] * obj["static_plan"]["cp"] * 4 == 32


def test_cli_table_csv_and_histogram(run, tmp_path):
    hist = tmp_path / "lengths.csv"
    hist.write_text("length_lo,length_hi,count\n64,2048,90\n2049,32768,10\n")
    opts = ("--steps", "2", "--strategies", "static,flexsp", "--format", "csv")
    result = run(*BASE, "--lengths-csv", str(hist), *opts)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("strategy,mean_step_s,tokens_per_s,speedup_vs_static")
    assert [ln.split(",")[0] for ln in lines[1:]] == ["static", "flexsp"]
    table = run(*BASE, "--lengths", "uniform:100:8192", "--steps", "2")
    assert table.exit_code == 0, table.output
    assert "hydraulis" in table.stdout and "speedup_vs_static" in table.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--steps", "1"), "exactly one of --lengths"),
        (("--lengths", "100", "--lengths-csv", "x.csv"), "exactly one of --lengths"),
        (("--lengths", "gamma:2"), "unknown length distribution"),
        (("--lengths-csv", "/no/such.csv"), "does not exist"),
        (("--lengths", "100", "--strategies", "static,magic"), "unknown --strategies"),
        (("--lengths", "100", "--recompute", "some"), "unknown --recompute"),
        (("--lengths", "100", "--steps", "0"), "steps: Input should be greater than 0"),
        (("--lengths", "fixed:2000000"), "does not fit"),
    ],
)
def test_cli_errors_are_one_line(run, args, needle):
    line = one_error_line(run(*BASE, *args))
    assert needle in line, line


def test_cli_model_that_does_not_fit_is_one_line(run):
    args = ("--model", "llama3-70b", "--gpu", GPU, "--gpus", "8", "--lengths", "1024")
    line = one_error_line(run(*args, "--tokens-per-step", "65536"))
    assert "leaving no memory for activations" in line


def test_hybrid_attention_runs_in_its_attention_layers_only():
    """Nemotron-H-8B's 4 attention layers of 52: a document's attention costs 4/52 of what
    every-layer attention would, its mixers are token-linear."""
    from pathlib import Path

    from workloads.models import load_model

    cfg = Path(__file__).resolve().parents[2] / "examples" / "models" / "nemotron-h-8b.config.json"
    model = load_model(cfg)
    cm = get_cost_model(GPU, num_gpus=8)
    hybrid = V.VarlenCoster(model, cm, 8, (1,), 32768)
    assert hybrid._attn_share == pytest.approx(4 / 52)
    dense = model.model_copy(update={"mixer": None, "mixer_layers": 0, "attention_free_layers": 0,
                                     "mlp_free_layers": 0, "id": "nemotron-dense"})  # fmt: skip
    every = V.VarlenCoster(dense, cm, 8, (1,), 32768)
    ratio = hybrid.grids[1].attn_f / every.grids[1].attn_f
    assert np.allclose(ratio, 4 / 52, rtol=1e-6)
