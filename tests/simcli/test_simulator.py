"""Training-iteration simulator: schedules, invariants, CLI, and validation bounds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from benchmarks.validate_training import h100_step_rows, megatron_rows
from simcli.cli import app
from simcli.scenario import resolve_hardware
from simcli.training.simulator import Task, _Durations, _run_pipeline, schedule, simulate_iteration
from workloads.models import load_model
from workloads.plan import PlanError, make_plan

runner = CliRunner()


def _simulate(model, plan, gpu, **kw):
    """simulate_iteration on ``plan.num_gpus`` reference GPUs of ``gpu``, resolved here."""
    hw = resolve_hardware(gpu, plan.num_gpus)
    return simulate_iteration(model, plan, system=hw.system, cost_model=hw.cost_model, **kw)


def _plan(pp: int, m: int, vpp: int = 1, sched: str = "1f1b"):
    return make_plan(num_gpus=pp, pp=pp, vpp=vpp, pp_schedule=sched, global_batch=m, seq_len=128)


@pytest.mark.parametrize("sched", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 3), (8, 16)])
def test_even_stages_reproduce_the_bubble_formula(sched, pp, m):
    """(m + p - 1)(f + b): Narayanan et al. 2021 eq. for 1F1B and GPipe, zero p2p."""
    plan = _plan(pp, m, sched=sched)
    dur = _Durations((1.0,) * pp, (2.0,) * pp, (1,) * pp)
    end, _ = _run_pipeline(plan, dur, 0.0, None)
    assert end.max() == pytest.approx((m + pp - 1) * 3.0)


@pytest.mark.parametrize(("pp", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 4, 8)])
def test_interleaving_divides_the_bubble_by_v(pp, v, m):
    plan = _plan(pp, m, vpp=v, sched="interleaved")
    chunks = pp * v
    dur = _Durations((1.0 / v,) * chunks, (2.0 / v,) * chunks, (1,) * chunks)
    end, _ = _run_pipeline(plan, dur, 0.0, None)
    assert end.max() == pytest.approx(3.0 * (m + (pp - 1) / v))


@settings(max_examples=40, deadline=None)
@given(
    pp=st.sampled_from([1, 2, 3, 4]),
    m_mult=st.integers(1, 4),
    v=st.sampled_from([1, 2, 3]),
    p2p=st.floats(0.0, 0.5),
    f=st.lists(st.floats(0.01, 3.0), min_size=12, max_size=12),
)
def test_every_microbatch_completes_once_and_time_is_sane(pp, m_mult, v, p2p, f):
    if pp == 1:
        v = 1
    sched = "interleaved" if v > 1 else "1f1b"
    m = pp * m_mult
    plan = _plan(pp, m, vpp=v, sched=sched)
    chunks = pp * v
    dur = _Durations(tuple(f[:chunks]), tuple(2 * x for x in f[:chunks]), (1,) * chunks)
    spans: list = []
    end, ready = _run_pipeline(plan, dur, p2p, spans)
    compute = [s for s in spans if s.stream == "compute"]
    assert len(compute) == 2 * m * chunks
    assert len({(s.rank, s.name) for s in compute}) == len(compute)
    assert all(s.end_s >= s.start_s >= 0 for s in spans)
    # a rank never runs two tasks at once
    for r in range(pp):
        mine = sorted((s.start_s, s.end_s) for s in compute if s.rank == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:], strict=False))
    work = sum(dur.fwd_s) + sum(dur.bwd_s)
    assert end.max() >= m * work / pp - 1e-9
    assert len(ready) == chunks


def test_schedules_hold_each_task_once():
    for sched, v in [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)]:
        plan = _plan(4, 8, vpp=v, sched=sched)
        tasks = [t for rank in schedule(plan) for t in rank]
        assert len(tasks) == len(set(tasks)) == 2 * 8 * 4 * v
        assert all(isinstance(t, Task) and plan.stage_of_chunk(t.chunk) == t.rank for t in tasks)


def test_uneven_split_shows_up():
    model = load_model("llama3-8b")
    base = dict(num_gpus=4, pp=4, global_batch=16, seq_len=2048)
    even = _simulate(model, make_plan(model, **base), "h100-sxm")
    skew = _simulate(model, make_plan(model, layer_split=(14, 6, 6, 6), **base), "h100-sxm")
    assert skew.iteration_s > even.iteration_s * 1.2
    assert max(s["layers"] for s in skew.stages) == 14


def test_recompute_costs_time_and_dp_comm_is_mostly_hidden():
    model = load_model("llama3-8b")
    base = dict(num_gpus=16, tp=2, global_batch=64, seq_len=4096)
    none = _simulate(model, make_plan(model, **base), "h100-sxm")
    full = _simulate(model, make_plan(model, recompute="full", **base), "h100-sxm")
    sel = _simulate(model, make_plan(model, recompute="selective", **base), "h100-sxm")
    assert none.iteration_s < sel.iteration_s < full.iteration_s
    no_overlap = _simulate(model, make_plan(model, overlap_grad_reduce=False, **base), "h100-sxm")
    assert no_overlap.breakdown_s["dp_comm_exposed_s"] > none.breakdown_s["dp_comm_exposed_s"]
    assert 0 < none.mfu < 1


def test_plan_errors_name_the_valid_choices():
    model = load_model("llama3-8b")
    with pytest.raises(PlanError, match="allowed tp"):
        make_plan(model, num_gpus=8, tp=6, global_batch=8, seq_len=128)
    with pytest.raises(PlanError, match="multiple of"):
        make_plan(model, num_gpus=8, global_batch=12, seq_len=128)
    with pytest.raises(PlanError, match="divide"):
        make_plan(model, num_gpus=8, pp=3, global_batch=8, seq_len=128)


def test_sharded_data_parallel_with_pipelines():
    """ZeRO-2/3 with PP (Llama 3's FSDP + pipeline): accepted; every micro-batch's
    gradients are reduce-scattered (and under ZeRO-3 parameters re-gathered) layer by
    layer, so the step costs more communication than ZeRO-1 and holds less memory."""
    from costmodels.steps.memory import estimate_memory
    from hardware_specs.registry import get_gpu

    model = load_model("llama3-8b")
    base = dict(num_gpus=64, tp=8, pp=2, global_batch=64, seq_len=4096)
    res, mem = {}, {}
    for z in (1, 2, 3):
        plan = make_plan(model, zero=z, **base)
        res[z] = _simulate(model, plan, "h100-sxm")
        mem[z] = estimate_memory(model, plan, get_gpu("h100-sxm")).total_bytes
    assert mem[3] < mem[2] < mem[1]
    assert res[1].iteration_s < res[2].iteration_s < res[3].iteration_s
    # ZeRO-2's per-micro-batch reductions are DP communication, ZeRO-3's gathers its own
    assert res[2].breakdown_s["dp_comm_exposed_s"] > 0
    assert res[2].breakdown_s["zero3_exposed_s"] == 0
    assert res[3].breakdown_s["zero3_exposed_s"] > 0


def test_train_cli_json_and_trace(tmp_path):
    trace = tmp_path / "t.json"
    res = runner.invoke(
        app,
        ["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "2",
         "--pp", "2", "--global-batch", "32", "--seq-len", "4096", "--recompute", "selective",
         "--format", "json", "--trace", str(trace)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("iteration_s", "tokens_per_s", "mfu", "peak_memory_gib", "breakdown_s", "stages"):
        assert key in out
    assert out["iteration_s"] > 0 and len(out["stages"]) == 2
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all({"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys() for e in spans)


def test_train_cli_bad_tp_is_one_line():
    res = runner.invoke(
        app,
        ["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "3",
         "--global-batch", "8", "--seq-len", "128"],
    )  # fmt: skip
    assert res.exit_code == 2
    assert res.output.strip().startswith("error:") and len(res.output.strip().splitlines()) == 1


def test_megatron_published_iteration_times():
    """Korthikanti et al. 2022 Table 4, never fitted on: mean error <= 5%, max <= 8% (the
    A100 profile is fitted on Vidur's public per-operator A100 timings only)."""
    errs = [abs(r["error_pct"]) for r in megatron_rows()]
    assert sum(errs) / len(errs) <= 5.0
    assert max(errs) <= 8.0


def test_single_h100_steps():
    """Measured plain-PyTorch steps (an earlier lease, no step of it fitted on): all 9
    within 10%, the host-bound 1x2048 rows included (the shipped host time per op)."""
    rows = h100_step_rows()
    errs = sorted(abs(r["error_pct"]) for r in rows)
    assert len(rows) == 9
    assert errs[-1] <= 10.0


def test_traced_single_gpu_steps():
    """The traced H100/H200 suites (eager, compiled, fp8, full recompute) at 8k tokens per
    step, with the shipped composition: mean error <= 5% per GPU and mode, and the
    held-out Qwen-shaped model (no factor saw it) within 6% everywhere."""
    from benchmarks.validate_training import traced_step_rows

    rows = [r for r in traced_step_rows() if r["tokens"] >= 8192]
    assert len(rows) == 29
    by: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by.setdefault((r["gpu"], r["mode"]), []).append(abs(r["error_pct"]))
    for key, errs in by.items():
        assert sum(errs) / len(errs) <= 5.0, (key, errs)
    held = [abs(r["error_pct"]) for r in rows if r["model"] == "qwen2.5-1.5b-like"]
    assert len(held) == 10 and max(held) <= 6.0


def test_small_host_bound_steps():
    """Steps of <= 2k tokens, host-bound in eager and compiled PyTorch (the same config
    repeated on one lease differs by up to 43%): no systematic error (signed mean within
    5%) and mean |error| <= 13% per GPU, the held-out models too. Without the host time
    per op these rows were 20-60% too fast."""
    from benchmarks.validate_training import traced_step_rows

    rows = [r for r in traced_step_rows() if r["tokens"] < 8192]
    assert len(rows) == 78
    for gpu in ("h100-sxm", "h200-sxm"):
        errs = [r["error_pct"] for r in rows if r["gpu"] == gpu]
        assert abs(sum(errs) / len(errs)) <= 5.0
        assert sum(abs(e) for e in errs) / len(errs) <= 13.0
        held = [abs(r["error_pct"]) for r in rows if r["gpu"] == gpu and r["held_out"]]
        assert len(held) == (21 if gpu == "h200-sxm" else 17)
        assert sum(held) / len(held) <= 13.0
    assert sum(r["host_bound"] for r in rows) >= 60


def test_traced_steps_peak_memory():
    """Peak memory of every traced step (eager, full recompute, compiled, fp8; 256 to 8k
    tokens; both GPUs) within 2%, the held-out models included; compiled and fp8 were
    13-40% high when estimated with eager's layout."""
    from benchmarks.validate_training import traced_step_rows

    rows = traced_step_rows()
    assert len(rows) == 107
    for mode in ("eager", "eager+rc", "compile", "fp8"):
        errs = [abs(r["memory_error_pct"]) for r in rows if r["mode"] == mode]
        assert errs and max(errs) <= 2.0, (mode, max(errs))


HETERO = """
nodes:
  - id: dgx-h100-roce100
    name: DGX H100 with one 100G RoCE NIC per GPU (test)
    gpu: h100-sxm
    gpus_per_node: 8
    intra_node_link: nvlink4-nvswitch
    intra_node_gb_per_s: 450
    switched: true
    nic: eth-100g
    nics_per_gpu: 1
    host_link: pcie-gen5-x16
    sources: {nics_per_gpu: fixture, intra_node_gb_per_s: fixture, gpus_per_node: fixture}
clusters:
  - name: mixed
    node: dgx-h100
    num_nodes: 4
    node_groups: [{node: dgx-h100, num_nodes: 2}, {node: dgx-h100-roce100, num_nodes: 2}]
"""


def _iteration(system, model, plan):
    cost_model = resolve_hardware("h100-sxm", plan.num_gpus).cost_model
    return simulate_iteration(model, plan, system=system, cost_model=cost_model).iteration_s


def test_heterogeneous_nics_and_measured_links_slow_the_rings(tmp_path):
    """Holmes-style node groups with different NICs and Pipette-style measured per-node
    bandwidths: rings and pipeline links crossing a slow node run at its speed."""
    from hardware_specs.registry import load_catalog

    path = tmp_path / "mixed.yaml"
    path.write_text(HETERO)
    cat = load_catalog(path)
    model = load_model("llama3-8b")
    dp_plan = make_plan(model, num_gpus=32, tp=8, global_batch=32, seq_len=2048,
                        overlap_grad_reduce=False)  # fmt: skip
    homo = cat.system("h100-sxm", 32)
    mixed = cat.system_for_cluster(cat.clusters["mixed"])
    assert mixed.slowdown([0, 3]) == pytest.approx(4.0)  # 400G NDR vs 100G
    assert _iteration(mixed, model, dp_plan) > _iteration(homo, model, dp_plan)
    # pipeline over 4 nodes: only the link into the slow group is slower
    pp_plan = make_plan(model, num_gpus=32, tp=8, pp=4, global_batch=64, seq_len=2048)
    assert _iteration(mixed, model, pp_plan) > _iteration(homo, model, pp_plan)
    measured = cat.clusters["mixed"].model_copy(
        update={"node_groups": [], "measured_nic_gb_per_s": [50.0, 50.0, 50.0, 10.0]}
    )
    slow_one = cat.system_for_cluster(measured)
    assert _iteration(slow_one, model, dp_plan) > _iteration(homo, model, dp_plan)


def test_train_cli_cluster_file(tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(HETERO)
    args = ["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "32", "--tp", "8",
            "--global-batch", "32", "--seq-len", "2048", "--format", "json"]  # fmt: skip
    res = runner.invoke(app, [*args, "--cluster", str(path)])
    assert res.exit_code == 0, res.output
    bad = runner.invoke(app, [*args[:4], "a100-sxm-80gb", *args[5:], "--cluster", str(path)])
    assert bad.exit_code == 2 and "allowed: --gpu h100-sxm" in bad.output


def test_context_parallel_variants_cross_over_with_length():
    """Ulysses' all-to-alls are cheap next to short attention; ring attention hides its KV
    exchange behind long attention (quadratic work vs linear bytes); TokenRing's two
    directions never lose to the one-way ring."""
    model = load_model("llama3-8b")

    def t(kind, seq):
        plan = make_plan(model, num_gpus=64, tp=2, cp=16, cp_kind=kind, global_batch=4,
                         seq_len=seq, recompute="full")  # fmt: skip
        return _simulate(model, plan, "h100-sxm").iteration_s

    assert t("ulysses", 2048) < t("ring", 2048)
    assert t("ring", 131072) < t("ulysses", 131072)
    for seq in (2048, 131072):
        assert t("tokenring", seq) <= t("ring", seq) + 1e-12


def test_allgather_and_hierarchical_context_parallelism():
    """All-gathered K/V (Llama 3) pays a gather forward, a gather and a reduce-scatter
    backward, all exposed; hierarchical CP (Ulysses inside a node x ring across) pays the
    in-node all-to-alls and a ring of r = cp / u steps; Ulysses with fewer KV heads than CP
    ranks replicates K/V (an all-gather, more bytes than the all-to-all)."""
    from costmodels.steps.training import cp_comms, hierarchical_split

    model = load_model("llama3-8b")  # 32 query heads, 8 KV heads

    def plan(kind, cp, tp=2):
        return make_plan(model, num_gpus=tp * cp, tp=tp, cp=cp, cp_kind=kind, global_batch=1,
                         seq_len=262144, recompute="full")  # fmt: skip

    assert hierarchical_split(16, 2, 8) == (4, 4) and hierarchical_split(8, 8, 8) == (1, 8)
    ag = cp_comms(model, plan("allgather", 16), 8)
    ring = cp_comms(model, plan("ring", 16), 8)
    assert ag["ag_kv"].kind == "all_gather" and ag["rs_kv"].kind == "reduce_scatter"
    assert ag["ag_kv"].nbytes == 16 * ring["step_f"].nbytes  # the whole sequence's K/V
    hier = cp_comms(model, plan("hierarchical", 16), 8)
    assert hier["a2a"].ranks == 4 and hier["a2a"].nodes == 1 and "step_f" in hier
    # 4 KV heads per TP rank over 16 Ulysses ranks: replicated, gathered
    uly = cp_comms(model, plan("ulysses", 16), 8)
    assert uly["a2a_kv"].kind == "all_gather"
    assert cp_comms(model, plan("ulysses", 4), 8)["a2a_kv"].kind == "all_to_all"
    times = {k: _simulate(model, plan(k, 16), "h100-sxm") for k in
             ("ring", "ulysses", "allgather", "hierarchical")}  # fmt: skip
    for k, res in times.items():
        assert res.breakdown_s["cp_comm_s"] >= 0.0, k
    assert times["allgather"].breakdown_s["cp_comm_s"] > 0.0
    # the in-node all-to-alls cost something; the ring over 4 node groups hides behind
    # attention at 256k tokens like the 16-step ring does
    assert times["ring"].iteration_s <= times["hierarchical"].iteration_s
    # the gathered K/V and their fp32 gradients sit in memory beside the layer
    from costmodels.steps.memory import estimate_memory
    from hardware_specs.registry import builtin_catalog

    gpu = builtin_catalog().gpu("h100-sxm")
    mem = {k: estimate_memory(model, plan(k, 16), gpu).total_bytes for k in ("ring", "allgather")}
    assert mem["allgather"] > mem["ring"]
    # 8 query heads per TP-8 rank do not split over 16 Ulysses ranks: one line
    with pytest.raises(PlanError, match="Ulysses"):
        make_plan(model, num_gpus=128, tp=8, cp=16, cp_kind="ulysses", global_batch=1,
                  seq_len=262144)  # fmt: skip


def test_train_cli_refuses_a_plan_that_does_not_fit(tmp_path):
    trace = tmp_path / "t.json"
    args = ["train", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "8",
            "--global-batch", "8", "--seq-len", "8192", "--trace", str(trace)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "does not fit" in res.output and not trace.exists()
    ok = runner.invoke(app, [*args, "--ignore-memory", "--format", "json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["fits"] is False


def test_real_data_parallel_steps_on_h200s():
    """DDP (overlapped all-reduce) and FSDP (ZeRO-3) on 2 and 4 H200s: the rows the
    interference constant was not fitted on stay within 10% mean, 15% max."""
    from benchmarks.validate_training import h200_dist_rows

    rows = h200_dist_rows()
    assert len(rows) == 10
    errs = [abs(r["error_pct"]) for r in rows if not r["fitted"]]
    assert sum(errs) / len(errs) <= 10.0 and max(errs) <= 15.0


def test_context_parallel_ranks_join_the_gradient_reduction():
    """Gradients reduce over the data-parallel group with context parallelism, dp * cp
    ranks (Megatron-LM's get_data_parallel_group(with_context_parallel=True)): dp 1 and
    cp 2 all-reduce the gradients (none before), the exposed reduction grows with cp at
    fixed dp, and the distributed optimizer steps on a 1 / (dp * cp) share."""
    model = load_model("llama3-8b")

    def run(dp, cp, **kw):
        plan = make_plan(model, num_gpus=dp * cp, cp=cp, cp_kind="ring", seq_len=8192,
                         global_batch=2 * dp, recompute="full", overlap_grad_reduce=False,
                         **kw)  # fmt: skip
        return _simulate(model, plan, "h100-sxm", keep_spans=True)

    one = run(1, 2)
    assert any(s.stream == "dp-comm" for s in one.spans)
    assert one.breakdown_s["dp_comm_exposed_s"] > 0.0
    assert run(1, 1).breakdown_s["dp_comm_exposed_s"] == 0.0
    for dp in (1, 2):
        comm = [run(dp, cp).breakdown_s["dp_comm_exposed_s"] for cp in (1, 2, 4)]
        assert comm[0] < comm[1] < comm[2], (dp, comm)
    z0, z1 = run(1, 4, zero=0), run(1, 4, zero=1)
    assert z1.breakdown_s["optimizer_s"] < 0.5 * z0.breakdown_s["optimizer_s"]


def test_real_tensor_and_pipeline_parallel_steps_on_h200s():
    """TP 2/4 with sequence parallelism, PP 2/4 (1F1B, 8 micro-batches), TP2 x PP2, CP 2/4
    (PyTorch's ring attention) and one GPU, eager PyTorch on 4 H200s in three device calls
    (calibrate/data/steps-par-h200-x4; 68 rows, 3 models). Every rank's peak memory within
    2.5% (max 2.4%; before the eager TP and pipeline terms up to 17% off), the largest
    peak within 1% without CP (2.4% with). Step time, CP aside (the gradient all-reduce
    over the CP ranks is priced, as Megatron's DP-with-CP group; the Python ring
    attention's host work is not modelled: 12-63% fast, was 16-64%): steps the GPU
    bounds within 6% (max 4.5%); host-paced steps follow the host, whose speed per op
    differs between machines (the same shapes on two calls differ by up to 30%): all
    within 16% mean, none off by 80% or more, pipelines within 30%."""
    from benchmarks.validate_training import h200_par_rows

    rows = h200_par_rows()
    assert len(rows) == 68
    assert max(abs(r["rank_memory_error_pct"]) for r in rows) < 2.5
    timed = [r for r in rows if r["cp"] == 1]
    assert len(timed) == 52
    assert max(abs(r["memory_error_pct"]) for r in timed) < 1.0
    gpu = [abs(r["error_pct"]) for r in timed if r["gpu_bound"]]
    assert len(gpu) >= 5 and max(gpu) < 6.0
    errs = [abs(r["error_pct"]) for r in timed]
    assert sum(errs) / len(errs) < 16.0 and max(errs) < 80.0
    assert max(abs(r["error_pct"]) for r in timed if r["mode"] == "pp") < 30.0
    # the known CP gap, so that a model of it shows up here: every CP step predicted fast
    assert all(r["error_pct"] < -10.0 for r in rows if r["cp"] > 1)


def test_train_cli_attention_pattern():
    """A training plan can name a sparse attention pattern: a window at 32k is faster than
    dense, an unknown pattern is one error line."""
    args = ["train", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "8",
            "--global-batch", "8", "--seq-len", "32768", "--recompute", "full",
            "--format", "json"]  # fmt: skip
    dense = json.loads(runner.invoke(app, args).stdout)["iteration_s"]
    res = runner.invoke(app, [*args, "--attn-pattern", "window:4096"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["iteration_s"] < 0.9 * dense
    bad = runner.invoke(app, [*args, "--attn-pattern", "bogus"])
    assert bad.exit_code == 2 and "unknown sparsity pattern" in bad.output


def test_breakdown_has_no_negative_rounding_residue():
    """pp = 1 has no bubble: the breakdown says 0, never -8.9e-16 (issue 18 item 5)."""
    model = load_model("llama3-8b")
    for tp, gb, seq, rc in ((1, 4, 1024, "full"), (2, 8, 2048, "none"), (8, 16, 4096, "selective")):
        plan = make_plan(model, num_gpus=8, tp=tp, global_batch=gb * 8 // tp, seq_len=seq,
                         recompute=rc)  # fmt: skip
        res = _simulate(model, plan, "h100-sxm")
        assert res.breakdown_s["pp_bubble_s"] == 0.0
        assert all(v >= 0 for v in res.breakdown_s.values()), res.breakdown_s
        assert all(s["bubble_s"] >= 0 for s in res.stages)
