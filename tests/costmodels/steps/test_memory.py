"""The training memory estimator: hand-derived numbers, the H100 steps, properties."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodels.steps.memory import (
    DRIVER_RESERVED_BYTES,
    estimate_memory,
    in_flight,
    layer_activation_bytes,
    memory_bytes_many,
    memory_bytes_of_plans,
)
from hardware_specs.registry import get_gpu
from hardware_specs.schema import GIB
from workloads.decompose import params_per_tp_rank, valid_tp_degrees
from workloads.models import get_model, model_from_dict
from workloads.plan import PlanError, make_plan

ROOT = Path(__file__).resolve().parents[3]
STEPS_CSV = ROOT / "calibrate" / "data" / "steps-h100" / "train_step.csv"
H100 = get_gpu("h100-sxm")
TORCH_VISIBLE_H100_GIB = 79.18  # "total capacity of 79.18 GiB" in the oom rows

# A small model that exercises what the built-ins do not: tied embeddings, learned
# positions, LayerNorm, GELU, biases, 13 layers (uneven pipeline splits), GQA.
ODD = model_from_dict(
    {
        "id": "odd",
        "name": "odd",
        "family": "gpt",
        "num_layers": 13,
        "hidden_size": 512,
        "num_heads": 8,
        "num_kv_heads": 2,
        "ffn_hidden_size": 1536,
        "vocab_size": 1001,
        "max_seq_len": 4096,
        "activation": "gelu",
        "norm": "layernorm",
        "position": "learned",
        "tie_embeddings": True,
        "qkv_bias": True,
        "out_proj_bias": True,
        "mlp_bias": True,
        "source": "test",
    }
)


def plan_for(model, **kw):
    kw.setdefault("num_gpus", kw.get("tp", 1) * kw.get("pp", 1) * kw.get("cp", 1))
    kw.setdefault("global_batch", kw.get("micro_batch", 1) * kw["num_gpus"])
    kw.setdefault("seq_len", 2048)
    return make_plan(model, **kw)


def many_args(plan):
    return dict(
        tp=plan.tp,
        pp=plan.pp,
        cp=plan.cp,
        dp=plan.data_parallel,
        vpp=plan.vpp,
        ep=plan.ep,
        zero=plan.zero,
        micro_batch=plan.micro_batch,
        num_microbatches=plan.num_microbatches,
        seq_len=plan.seq_len,
        recompute=plan.recompute,
        sp=plan.sp,
        precision=plan.precision,
        pp_schedule=plan.pp_schedule,
    )


# --------------------------------------------------------------------------- hand-derived


def test_bytes_per_param_zero0():
    """Megatron-LM distrib_optimizer.md: bf16 params + fp32 grads + fp32 master/m/v = 18 B,
    fp16 = 20 B; eager PyTorch with fp32 params: 4 + 4 + 8 = 16 B (ZeRO's mixed precision
    16 bytes/param); pure bf16 = 2 + 2 + 4."""
    m = get_model("llama3-8b")
    n = m.num_params
    plan = plan_for(m, seq_len=128)
    est = estimate_memory(m, plan, H100)
    assert (est.weights_bytes, est.grads_bytes, est.optimizer_bytes) == (2 * n, 4 * n, 12 * n)
    fp16 = estimate_memory(m, plan.model_copy(update={"precision": "fp16-mixed"}), H100)
    assert fp16.weights_bytes + fp16.grads_bytes + fp16.optimizer_bytes == 20 * n
    bf16 = estimate_memory(m, plan.model_copy(update={"precision": "bf16"}), H100)
    assert bf16.weights_bytes + bf16.grads_bytes + bf16.optimizer_bytes == 8 * n
    # eager: 128 tokens of activations are far below the 4 B/param of gradients, so the
    # peak is the end of the backward: exactly 16 bytes per parameter
    eager = estimate_memory(m, plan, H100, framework="pytorch")
    assert (eager.weights_bytes, eager.grads_bytes, eager.optimizer_bytes) == (4 * n, 4 * n, 8 * n)
    assert eager.activations_bytes == 0


@pytest.mark.parametrize("dp", [2, 8])
def test_zero_stages_divide_the_right_parts(dp):
    m = get_model("llama3-8b")
    n = m.num_params
    base = dict(num_gpus=dp, dp=dp, seq_len=256, global_batch=dp)
    ests = [estimate_memory(m, plan_for(m, zero=z, **base), H100) for z in range(4)]
    z0, z1, z2, z3 = ests
    assert (z0.weights_bytes, z0.grads_bytes, z0.optimizer_bytes) == (2 * n, 4 * n, 12 * n)
    # ZeRO-1 = Megatron's distributed optimizer: 6 + 12/d bytes per parameter
    assert z1.weights_bytes + z1.grads_bytes == 6 * n
    assert z1.optimizer_bytes == pytest.approx(12 * n / dp)
    assert z2.grads_bytes == pytest.approx(4 * n / dp)
    assert z2.weights_bytes == 2 * n
    assert z3.weights_bytes == pytest.approx(2 * n / dp)
    # the buckets being reduced (2 x 160 MB) and two gathered layers are buffers
    assert z1.comm_buffer_bytes == 0
    assert z2.comm_buffer_bytes == pytest.approx(2 * 160e6)
    layer = params_per_tp_rank(m, 1)["embedding"]  # the largest FSDP unit here
    assert z3.comm_buffer_bytes == pytest.approx(2 * 160e6 + 2 * 2 * layer)
    assert [e.total_bytes for e in ests] == sorted((e.total_bytes for e in ests), reverse=True)


def test_korthikanti_equations():
    """Korthikanti et al. 2022 for GPT-3 175B (a=96, s=2048, h=12288, so 5as/h = 80, the
    paper's example): eq. 1 sbh(34 + 5as/h), eq. 2 with t=8, eq. 4 with SP, eq. 6 selective
    + SP, and 2sbh per layer with full recompute. Our count adds the LayerNorms' fp32
    mean and rstd (8 bytes per token each), which the paper leaves out."""
    m = get_model("gpt3-175b")
    s, b, h, a = 2048, 1, 12288, 96
    assert 5 * a * s / h == 80
    sbh = s * b * h
    stats = 2 * 8 * s * b

    def ours(t, sp, recompute):
        return layer_activation_bytes(
            m,
            micro_batch=b,
            seq_len=s,
            tp=t,
            sp=sp,
            recompute=recompute,
            framework="megatron-unfused",
        )

    assert ours(1, False, "none") == sbh * (34 + 80) + stats
    assert ours(8, False, "none") == sbh * (10 + 24 / 8 + 80 / 8) + stats
    assert ours(8, True, "none") == sbh * (34 / 8 + 80 / 8) + stats / 8
    assert ours(8, True, "selective") == sbh * 34 / 8 + stats / 8
    assert ours(1, False, "full") == 2 * sbh
    # with flash attention (our default) the 5as^2b terms and the dropout masks are gone:
    # only the fp32 log-sum-exp per head and token is kept
    flash = layer_activation_bytes(m, micro_batch=b, seq_len=s)
    assert flash == sbh * 32 + stats + 4 * a * s * b


def test_gqa_and_swiglu_from_the_architecture():
    m = get_model("llama3-8b")  # 32 heads, 8 KV heads, head_dim 128, SwiGLU
    mha = m.model_copy(update={"num_kv_heads": 32})
    gelu = m.model_copy(update={"activation": "gelu"})
    args = dict(micro_batch=1, seq_len=1024)
    per_tok = 1024
    # K and V (2 bytes each, per KV head x head_dim) are the only attention terms GQA cuts
    diff = layer_activation_bytes(mha, **args) - layer_activation_bytes(m, **args)
    assert diff == per_tok * 2 * 2 * (32 - 8) * 128
    # SwiGLU keeps gate and up (2 x 2f) and the FC2 input (2f); GELU 2f + 2f
    diff = layer_activation_bytes(m, **args) - layer_activation_bytes(gelu, **args)
    assert diff == per_tok * 2 * m.ffn_hidden_size


def test_eager_pytorch_layer_matches_the_measured_formula():
    """Per token and layer on H100 (torch 2.11, forward hooks between the blocks of the
    calibration model): 26h + 4q + 4kv + 8f + 4 heads + 8 bytes."""
    m = get_model("llama3-8b")
    h, q, kv, f, heads = 4096, 4096, 1024, 14336, 32
    got = layer_activation_bytes(m, micro_batch=2, seq_len=512, framework="pytorch")
    assert got == 1024 * (26 * h + 4 * q + 4 * kv + 8 * f + 4 * heads + 8)


def test_in_flight_matches_the_pipeline_schedules():
    """1F1B: rank i holds min(p - i, m); GPipe: m; interleaved: Megatron's warm-up + 1,
    and the schedules the simulator runs agree."""
    from simcli.training.simulator import schedule

    def peak_in_flight(tasks):
        live = best = 0
        for t in tasks:
            live += 1 if t.phase == "F" else -1
            best = max(best, live)
        return best

    m = get_model("llama3-8b")
    for sched, p, v, mb in [
        ("1f1b", 4, 1, 8),
        ("1f1b", 8, 1, 3),
        ("gpipe", 4, 1, 6),
        ("interleaved", 4, 2, 8),
        ("interleaved", 4, 4, 4),
        ("interleaved", 2, 3, 6),
    ]:
        plan = plan_for(m, pp=p, vpp=v, pp_schedule=sched, global_batch=mb)
        tasks = schedule(plan)
        for r in range(p):
            expect = in_flight(
                np.array({"1f1b": 0, "gpipe": 1, "interleaved": 2}[sched]), p, v, mb, r
            )
            assert peak_in_flight(tasks[r]) == expect, (sched, p, v, mb, r)
    assert in_flight(np.array(0), 8, 1, 16, np.arange(8)).tolist() == [8, 7, 6, 5, 4, 3, 2, 1]
    # interleaved, rank 0, m large: L (1 + (p - 1)/(p v)) layers (Korthikanti sec. 4)
    p, v, layers = 4, 2, 32
    stored = in_flight(np.array(2), p, v, 64, 0) * layers / (p * v)
    assert stored == layers * (1 + (p - 1) / (p * v))


def test_logits_context_parallel_and_experts():
    m = get_model("llama3-8b")
    # fp32 logits (and the bf16 ones while the loss runs) of one micro-batch, vocab / tp
    est = estimate_memory(m, plan_for(m, tp=2, seq_len=4096, micro_batch=2), H100)
    assert est.logits_bytes == 6 * 2 * 4096 * (-(-m.vocab_size // 2))
    # GPipe keeps the fp32 logits of every micro-batch until the backward
    gpipe = plan_for(m, tp=2, seq_len=4096, micro_batch=2, pp_schedule="gpipe", global_batch=6)
    est = estimate_memory(m, gpipe, H100)
    assert est.logits_bytes == (6 + 2 * 4) * 2 * 4096 * (-(-m.vocab_size // 2))
    # context parallelism divides every per-token term by cp
    one = layer_activation_bytes(m, micro_batch=1, seq_len=8192)
    two = layer_activation_bytes(m, micro_batch=1, seq_len=8192, cp=2)
    assert two == one / 2
    # MoE: expert weights divided by ep, the rest not
    mx = get_model("mixtral-8x7b")
    kw = dict(num_gpus=8, dp=8, global_batch=8, seq_len=1024)
    e1 = estimate_memory(mx, plan_for(mx, **kw), H100)
    e8 = estimate_memory(mx, plan_for(mx, ep=8, **kw), H100)
    expert = mx.num_layers * mx.num_experts * mx.expert_params
    assert e1.weights_bytes - e8.weights_bytes == pytest.approx(2 * expert * (1 - 1 / 8))


def test_peak_is_the_largest_stage_and_breakdown_sums():
    m = get_model("llama3-70b")
    plan = plan_for(m, tp=8, pp=4, vpp=2, pp_schedule="interleaved", global_batch=16)
    est = estimate_memory(m, plan, H100)
    assert est.total_bytes == max(est.per_stage_total_bytes)
    assert est.peak_stage == est.per_stage_total_bytes.index(est.total_bytes)
    gib = est.breakdown_gib()
    parts = [k for k in gib if k not in ("total", "capacity")]
    assert sum(gib[k] for k in parts) == pytest.approx(gib["total"])
    assert est.capacity_bytes == H100.memory_bytes - DRIVER_RESERVED_BYTES


def test_bad_inputs_are_one_line():
    m = get_model("llama3-8b")
    with pytest.raises(PlanError, match="allowed: megatron"):
        estimate_memory(m, plan_for(m), H100, framework="jax")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="unknown recompute"):
        memory_bytes_many(m, H100, **{**many_args(plan_for(m)), "recompute": ["some"]})


# --------------------------------------------------------------------------- H100 steps


def _steps():
    rows = list(csv.DictReader(STEPS_CSV.open()))
    out = []
    for r in rows:
        model = model_from_dict(
            {
                "id": r["model"],
                "name": r["model"],
                "family": "llama",
                "num_layers": int(r["layers"]),
                "hidden_size": int(r["hidden"]),
                "num_heads": int(r["heads"]),
                "num_kv_heads": int(r["kv_heads"]),
                "head_dim": int(r["head_dim"]),
                "ffn_hidden_size": int(r["ffn"]),
                "vocab_size": int(r["vocab"]),
                "max_seq_len": 8192,
                "activation": "swiglu",
                "norm": "rmsnorm",
                "position": "rope",
                "source": "calibrate/steps/train_step.py",
            }
        )
        assert model.num_params == int(r["params"])
        b, s = int(r["batch"]), int(r["seq_len"])
        plan = make_plan(model, num_gpus=1, micro_batch=b, global_batch=b, seq_len=s)
        out.append((r, estimate_memory(model, plan, H100, framework="pytorch")))
    return out


def test_h100_training_steps():
    """Every ok row within 12% (what max_memory_allocated measures: the tensors and the
    cuBLAS workspaces), every oom row over the 79.18 GiB torch sees."""
    assert H100.model_copy(update={"memory_gib": TORCH_VISIBLE_H100_GIB}).memory_bytes > 0
    cap = TORCH_VISIBLE_H100_GIB * GIB
    steps = _steps()
    assert sum(r["status"] == "ok" for r, _ in steps) == 9
    assert sum(r["status"] == "oom" for r, _ in steps) == 3
    for r, est in steps:
        assert est.capacity_bytes == pytest.approx(cap, rel=1e-3)
        if r["status"] == "ok":
            measured = float(r["peak_allocated_bytes"])
            assert est.allocated_bytes == pytest.approx(measured, rel=0.12), r["model"]
            assert est.total_bytes >= float(r["peak_reserved_bytes"])
            assert est.fits
        else:
            assert not est.fits and est.total_bytes > cap, r["model"]


# --------------------------------------------------------------------------- vectorised


def _random_plans(rng, model, n):
    plans = []
    tps = [t for t in valid_tp_degrees(model) if t <= 8]
    while len(plans) < n:
        tp, pp = int(rng.choice(tps)), int(rng.choice([1, 2, 3, 4, 8]))
        sched = str(rng.choice(["1f1b", "gpipe", "interleaved"]))
        vpp = int(rng.choice([2, 3])) if sched == "interleaved" else 1
        dp, cp = int(rng.choice([1, 2, 4, 6])), int(rng.choice([1, 1, 2, 4]))
        mb, m = int(rng.choice([1, 2])), int(rng.integers(1, 13))
        ep = int(
            rng.choice([d for d in (1, 2, 4, 8) if dp % d == 0 and model.num_experts % d == 0])
        )
        fields = dict(
            num_gpus=tp * pp * cp * dp,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            vpp=vpp,
            zero=int(rng.integers(0, 4)),
            micro_batch=mb,
            global_batch=mb * dp * (m * pp if sched == "interleaved" else m),
            seq_len=int(rng.choice([256, 1024, 4096])),
            pp_schedule=sched,
            recompute=str(rng.choice(["none", "selective", "full"])),
            sequence_parallel=bool(rng.integers(0, 2)) and tp > 1,
            precision=str(rng.choice(["bf16-mixed", "fp16-mixed", "bf16", "fp8"])),
        )
        try:
            plans.append(make_plan(model, **fields))
        except PlanError:
            continue
    return plans


@pytest.mark.parametrize("framework", ["megatron", "megatron-unfused", "pytorch"])
@pytest.mark.parametrize("model_id", ["llama3-8b", "mixtral-8x7b", "odd"])
def test_vectorised_agrees_with_estimate_memory(framework, model_id):
    model = ODD if model_id == "odd" else get_model(model_id)
    plans = _random_plans(np.random.default_rng(len(model_id)), model, 40)
    cols = {k: np.array([many_args(p)[k] for p in plans]) for k in many_args(plans[0])}
    got = memory_bytes_many(model, H100, framework=framework, **cols)
    want = np.array([estimate_memory(model, p, H100, framework).total_bytes for p in plans])
    np.testing.assert_allclose(got, want, rtol=1e-9)
    # integer codes give the same as the names
    codes = dict(
        recompute=("none", "selective", "full"), pp_schedule=("1f1b", "gpipe", "interleaved")
    )
    coded = {k: np.array([v.index(x) for x in cols[k]]) for k, v in codes.items()}
    np.testing.assert_array_equal(
        memory_bytes_many(model, H100, framework=framework, **{**cols, **coded}), got
    )


# --------------------------------------------------------------------------- properties

PLAN_FIELDS = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["llama3-8b", "mixtral-8x7b", "odd", "gpt3-175b"]),
        "framework": st.sampled_from(["megatron", "megatron-unfused", "pytorch"]),
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.sampled_from([1, 2, 4]),
        "cp": st.sampled_from([1, 2]),
        "dp": st.sampled_from([1, 2, 3, 4]),
        "zero": st.integers(0, 3),
        "micro_batch": st.sampled_from([1, 2, 4]),
        "m": st.integers(1, 8),
        "seq_len": st.sampled_from([512, 2048, 8192]),
        "schedule": st.sampled_from(["1f1b", "gpipe", "interleaved"]),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "sp": st.booleans(),
        "precision": st.sampled_from(["bf16-mixed", "fp16-mixed", "bf16", "fp8"]),
    }
)


def _args(f):
    """memory_bytes_many arguments from drawn fields (made valid rather than filtered)."""
    model = ODD if f["model"] == "odd" else get_model(f["model"])
    tp = max(t for t in valid_tp_degrees(model) if t <= f["tp"])
    pp = f["pp"]
    interleaved = f["schedule"] == "interleaved" and pp > 1
    sched = f["schedule"] if f["schedule"] != "interleaved" or interleaved else "1f1b"
    args = dict(
        tp=tp,
        pp=pp,
        cp=f["cp"],
        dp=f["dp"],
        vpp=2 if interleaved else 1,
        ep=1,
        zero=f["zero"],
        micro_batch=f["micro_batch"],
        num_microbatches=f["m"] * (pp if interleaved else 1),
        seq_len=f["seq_len"],
        recompute=f["recompute"],
        sp=f["sp"] and tp > 1,
        precision=f["precision"],
        pp_schedule=sched,
    )
    return model, f["framework"], args


def _mem(model, framework, args):
    return float(memory_bytes_many(model, H100, framework=framework, **args))


def _non_increasing(values):
    """Each value <= the one before, up to float rounding (sums of the same parts)."""
    return all(b <= a * (1 + 1e-12) for a, b in zip(values, values[1:], strict=False))


@settings(max_examples=150, deadline=None)
@given(PLAN_FIELDS)
def test_properties(f):
    model, fw, args = _args(f)
    base = _mem(model, fw, args)
    assert np.isfinite(base) and base > 0
    # more data-parallel GPUs: the same micro-batches each, or the same global batch.
    # Eager ZeRO-0 going from 1 GPU to DDP allocates DDP's gradient buckets (measured,
    # calibrate/data/steps-h200-x4), so its data-parallel comparison starts at dp = 2.
    if fw == "pytorch" and args["zero"] == 0 and args["dp"] * args["cp"] == 1:
        args = {**args, "dp": 2}
        base = _mem(model, fw, args)
    assert _non_increasing([base, _mem(model, fw, {**args, "dp": 2 * args["dp"]})])
    step = 2 * args["pp"] if args["vpp"] > 1 else 2  # interleaved needs m % pp == 0
    if args["num_microbatches"] % step == 0:
        fewer = {**args, "dp": 2 * args["dp"], "num_microbatches": args["num_microbatches"] // 2}
        assert _non_increasing([base, _mem(model, fw, fewer)])
    # recompute: none >= selective >= full
    rcs = ("none", "selective", "full")
    assert _non_increasing([_mem(model, fw, {**args, "recompute": r}) for r in rcs])
    # sequence parallelism never increases memory
    if args["tp"] > 1:
        sp = [_mem(model, fw, {**args, "sp": x}) for x in (False, True)]
        assert _non_increasing(sp)
    # a higher ZeRO stage never increases memory
    stages = (0, 1, 2, 3) if args["pp"] == 1 else (0, 1)
    assert _non_increasing([_mem(model, fw, {**args, "zero": z}) for z in stages])


def test_param_shards_match_workloads():
    """The vectorised per-rank parameter counts are those of workloads.decompose."""
    from costmodels.steps.memory import _shard

    for model in (get_model("llama3-8b"), get_model("mixtral-8x7b"), ODD, get_model("gpt3-175b")):
        for tp in valid_tp_degrees(model):
            if tp > 16:
                continue
            ref = params_per_tp_rank(model, tp)
            sh = _shard(model, np.asarray(tp))
            layer = sh["attn"] + model.num_experts * sh["expert"] + model.router_params
            assert layer + 2 * model.norm_params == ref["layer"]
            assert sh["embedding"] == ref["embedding"]
            assert sh["head"] == (ref["lm_head"] or sh["vocab"] * model.hidden_size)


if __name__ == "__main__":  # the validation table: python tests/simcli/test_memory.py
    print("| model | batch x seq | measured GiB | estimated GiB | error % | fits 79.18 GiB |")
    print("|---|---|---|---|---|---|")
    for row, est in _steps():
        ok = row["status"] == "ok"
        measured = float(row["peak_allocated_bytes"]) / GIB if ok else float("nan")
        got = est.allocated_bytes / GIB
        err = f"{100 * (got / measured - 1):+.2f}" if ok else "oom"
        size = f"{row['batch']} x {row['seq_len']}"
        print(f"| {row['model']} | {size} | {measured:.2f} | {got:.2f} | {err} | {est.fits} |")


# --------------------------------------------------------------------------- memory options


def test_memory_options_what_real_frameworks_do():
    """fp8 primary weights, bf16 gradient buffers, optimizer and activation offload:
    each removes what it should from the right component, and the vectorised path
    agrees with estimate_memory."""
    model = get_model("llama3-8b")
    base = dict(num_gpus=8, cp=2, global_batch=16, seq_len=8192, precision="fp8", zero=1)
    ref = estimate_memory(model, make_plan(model, **base), H100)
    n = model.num_params
    per_layer = params_per_tp_rank(model, 1)["layer"] - 2 * model.norm_params
    linear = model.num_layers * per_layer
    fp8p = estimate_memory(model, make_plan(model, fp8_params=True, **base), H100)
    # 1 B less weight and 1 B less cached copy per layer GEMM weight
    saved = ref.weights_bytes - fp8p.weights_bytes
    assert saved == pytest.approx(2 * linear, rel=0.01)
    bf16 = estimate_memory(model, make_plan(model, grad_reduce_dtype="bf16", **base), H100)
    assert ref.grads_bytes - bf16.grads_bytes == pytest.approx(2 * n, rel=1e-6)
    off = estimate_memory(model, make_plan(model, optimizer_offload=1.0, **base), H100)
    assert off.optimizer_bytes == 0 and ref.optimizer_bytes > 0
    half = estimate_memory(model, make_plan(model, optimizer_offload=0.5, **base), H100)
    assert half.optimizer_bytes == pytest.approx(ref.optimizer_bytes / 2)
    acts = estimate_memory(model, make_plan(model, activation_offload=1.0, **base), H100)
    assert acts.activations_bytes < 0.2 * ref.activations_bytes
    plans = [
        make_plan(model, **base, **extra)
        for extra in (
            {}, {"fp8_params": True}, {"grad_reduce_dtype": "bf16"},
            {"optimizer_offload": 0.5}, {"activation_offload": 0.25},
        )
    ]  # fmt: skip
    want = [estimate_memory(model, p, H100).total_bytes for p in plans]
    np.testing.assert_allclose(memory_bytes_of_plans(model, H100, plans), want, rtol=1e-9)


def test_memory_options_are_checked():
    model = get_model("llama3-8b")
    with pytest.raises(PlanError, match="fp8_params needs precision fp8"):
        make_plan(model, num_gpus=1, global_batch=1, seq_len=128, fp8_params=True)
    with pytest.raises(PlanError, match="optimizer_offload"):
        make_plan(model, num_gpus=1, global_batch=1, seq_len=128, optimizer_offload=1.5)
