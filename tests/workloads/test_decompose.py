"""Op expansion: hand-derived GEMM FLOPs, TP/SP collectives, MoE, serving, properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware_specs.schema import DTYPE_BYTES
from workloads.decompose import (
    LayerOp,
    decode_step_ops,
    layer_backward_ops,
    layer_forward_ops,
    model_step_ops,
    op_groups,
    optimizer_ops,
    params_per_tp_rank,
    prefill_ops,
    total_count,
    tp_shard,
    valid_tp_degrees,
)
from workloads.flops import op_flops, total_flops
from workloads.models import ModelError, get_model, list_models
from workloads.ops import COLLECTIVE_KINDS, Op, OpKind, ops_frame
from workloads.plan import make_plan


def gemm_flops(ops: list[LayerOp]) -> float:
    return sum(o.count * op_flops(o.op) for o in ops if o.op.op == OpKind.gemm)


def by_name(ops: list[LayerOp]) -> dict[str, LayerOp]:
    return {o.name: o for o in ops}


# --- GEMM FLOPs, hand-derived ------------------------------------------------------------------

# Weight-matrix parameters of one layer, written out by hand:
#   llama3-8b: Q 4096x4096, K and V 4096x1024 each, O 4096x4096, gate/up/down 3x 4096x14336
LLAMA3_8B_LAYER_MATRICES = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
#   gpt3-175b: QKV 12288x36864, O 12288x12288, fc1 and fc2 12288x49152 -> 12 h^2
GPT3_LAYER_MATRICES = 12 * 12288**2


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize(
    ("model_id", "matrices"),
    [("llama3-8b", LLAMA3_8B_LAYER_MATRICES), ("gpt3-175b", GPT3_LAYER_MATRICES)],
)
def test_forward_gemm_flops_are_2_tokens_params_over_tp(model_id, matrices, tp):
    assert LLAMA3_8B_LAYER_MATRICES == 218_103_808
    b, s = 2, 2048
    ops = layer_forward_ops(get_model(model_id), b, s, tp=tp)
    assert gemm_flops(ops) == 2 * b * s * matrices / tp


def test_forward_gemm_shapes_llama3_8b_tp8():
    ops = by_name(layer_forward_ops(get_model("llama3-8b"), 1, 4096, tp=8))
    tokens = 4096
    assert ops["qkv_proj"].op.model_dump(include={"m", "k", "n"}) == {
        "m": tokens,
        "k": 4096,
        "n": (4 + 2 * 1) * 128,  # 32/8 query heads, 8/8 kv heads
    }
    assert (ops["o_proj"].op.k, ops["o_proj"].op.n) == (512, 4096)
    assert (ops["mlp_up"].op.k, ops["mlp_up"].op.n) == (4096, 2 * 14336 // 8)
    assert (ops["mlp_down"].op.k, ops["mlp_down"].op.n) == (14336 // 8, 4096)
    attn = ops["attn"].op
    assert (attn.op, attn.batch, attn.seq_q, attn.seq_kv) == (OpKind.attn_fwd, 1, 4096, 4096)
    assert (attn.heads_q, attn.heads_kv, attn.head_dim, attn.causal) == (4, 1, 128, True)


@pytest.mark.parametrize("model_id", ["llama3-8b", "mixtral-8x7b", "gpt3-175b", "qwen2.5-7b"])
@pytest.mark.parametrize("sp", [False, True])
def test_backward_gemm_flops_are_twice_forward(model_id, sp):
    m = get_model(model_id)
    kw = {"tp": 4, "sequence_parallel": sp}
    fwd = layer_forward_ops(m, 2, 1024, **kw)
    bwd = layer_backward_ops(m, 2, 1024, **kw)
    assert gemm_flops(bwd) == 2 * gemm_flops(fwd)
    assert total_flops(bwd) == 2 * total_flops(fwd)  # attention backward is 2x too
    for ph in ("forward", "backward"):
        assert len(model_step_ops(m, 2, 1024, phase=ph, **kw)) > 0
    step_f = model_step_ops(m, 2, 1024, phase="forward", **kw)
    step_b = model_step_ops(m, 2, 1024, phase="backward", **kw)
    assert gemm_flops(step_b) == 2 * gemm_flops(step_f)


def test_backward_gemm_shapes():
    fwd = by_name(layer_forward_ops(get_model("llama3-8b"), 1, 512))
    bwd = by_name(layer_backward_ops(get_model("llama3-8b"), 1, 512))
    up = fwd["mlp_up"].op  # m=512, k=4096, n=28672
    d, w = bwd["mlp_up_dgrad"].op, bwd["mlp_up_wgrad"].op
    assert (d.m, d.k, d.n) == (up.m, up.n, up.k)  # dX[m,k] = dY[m,n] W^T[n,k]
    assert (w.m, w.k, w.n) == (up.k, up.m, up.n)  # dW[k,n] = X^T[k,m] dY[m,n]
    assert bwd["attn_bwd"].op.op == OpKind.attn_bwd
    # elementwise backward: same kind, rows scaled by the traffic ratio
    assert bwd["rmsnorm_1_bwd"].op.op == OpKind.rmsnorm and bwd["rmsnorm_1_bwd"].op.m == 768
    assert bwd["swiglu_bwd"].op.op == OpKind.swiglu and bwd["swiglu_bwd"].op.m == 854


@pytest.mark.parametrize(
    "model_id", ["llama3-8b", "llama2-70b", "mixtral-8x7b", "qwen2.5-7b", "gpt3-175b"]
)
@pytest.mark.parametrize("causal", [True, False])
def test_ops_flops_match_flops_per_token(model_id, causal):
    """All layers' forward + the LM head = flops_per_token(training=False) * tokens."""
    m = get_model(model_id)
    b, s = 2, 1024  # b*s*top_k divisible by num_experts: balanced routing is exact
    tokens = b * s
    layer = total_flops(layer_forward_ops(m, b, s, causal=causal))
    head = total_flops(model_step_ops(m, b, s))
    fwd = m.num_layers * layer + head
    assert fwd == pytest.approx(m.flops_per_token(s, causal, training=False) * tokens)
    layer_b = total_flops(layer_backward_ops(m, b, s, causal=causal))
    head_b = total_flops(model_step_ops(m, b, s, phase="backward"))
    train = fwd + m.num_layers * layer_b + head_b
    assert train == pytest.approx(m.flops_per_token(s, causal, training=True) * tokens)


# --- tensor-parallel splitting -----------------------------------------------------------------


def test_tp_not_dividing_heads_lists_divisors():
    with pytest.raises(ModelError) as info:
        layer_forward_ops(get_model("llama3-8b"), 1, 128, tp=3)
    msg = str(info.value)
    assert "tp=3" in msg and "num_heads=32" in msg
    assert msg.endswith("valid tp: 1, 2, 4, 8, 16, 32")
    assert "\n" not in msg


def test_tp_kv_heads_rule():
    qwen = get_model("qwen2.5-7b")  # 28 heads, 4 kv heads, ffn 18944
    assert valid_tp_degrees(qwen) == [1, 2, 4]
    with pytest.raises(ModelError, match="num_kv_heads=4") as info:
        tp_shard(qwen, 7)  # divides 28 heads but neither divides nor is a multiple of 4
    assert str(info.value).endswith("valid tp: 1, 2, 4")


def test_kv_heads_replicated_when_tp_exceeds_them():
    m = get_model("llama3-8b")  # 8 kv heads
    sh = tp_shard(m, 16)
    assert (sh.heads, sh.kv_heads, sh.kv_replicas) == (2, 1, 2)
    ops = by_name(layer_forward_ops(m, 1, 256, tp=16))
    assert (ops["attn"].op.heads_q, ops["attn"].op.heads_kv) == (2, 1)
    assert ops["qkv_proj"].op.n == (2 + 2) * 128
    # replicated K/V weights make the per-rank GEMM work exceed an even split
    assert gemm_flops(list(ops.values())) > 2 * 256 * LLAMA3_8B_LAYER_MATRICES / 16
    assert tp_shard(m, 8).kv_replicas == 1


def test_tp_ffn_and_bad_values():
    m = get_model("llama3-8b").model_copy(update={"ffn_hidden_size": 14336 + 2})
    with pytest.raises(ModelError, match="ffn_hidden_size"):
        tp_shard(m, 4)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ModelError, match="tp must be a positive integer"):
            tp_shard(get_model("llama3-8b"), bad)


def test_vocab_padded_per_rank(tmp_path):
    m = get_model("gpt3-175b").model_copy(update={"vocab_size": 50257})
    head = by_name(model_step_ops(m, 1, 128, tp=2))
    assert head["lm_head"].op.n == 25129 and head["cross_entropy"].op.n == 25129


def test_params_per_tp_rank_split():
    for model_id in ("llama3-8b", "gpt3-175b", "mixtral-8x7b"):
        m = get_model(model_id)
        per = params_per_tp_rank(m, 1)
        rest = per["embedding"] + per["final_norm"] + per["lm_head"]
        assert m.num_layers * per["layer"] + rest == m.num_params
    m = get_model("llama3-8b")  # no biases, no router: everything but norms splits
    per = params_per_tp_rank(m, 4)
    assert (per["layer"] - 2 * m.norm_params) * 4 == m.layer_params - 2 * m.norm_params
    assert per["embedding"] * 4 == m.vocab_size * m.hidden_size


# --- collectives and sequence parallelism ------------------------------------------------------


def collectives(ops: list[LayerOp]) -> list[LayerOp]:
    return [o for o in ops if o.op.op in COLLECTIVE_KINDS]


def test_no_collectives_at_tp1():
    m = get_model("llama3-8b")
    for sp in (False, True):
        assert not collectives(layer_forward_ops(m, 1, 256, sequence_parallel=sp))
        assert not collectives(layer_backward_ops(m, 1, 256, sequence_parallel=sp))
        assert not collectives(model_step_ops(m, 1, 256, sequence_parallel=sp))


def test_tp_allreduce_bytes_and_names():
    m = get_model("llama3-8b")
    b, s, tp = 2, 1024, 8
    fwd = collectives(layer_forward_ops(m, b, s, tp=tp))
    assert [o.name for o in fwd] == ["tp_allreduce_attn", "tp_allreduce_mlp"]
    for o in fwd:
        assert o.op.op == OpKind.all_reduce
        assert o.op.bytes == b * s * 4096 * 2 and o.op.ranks == tp
    bwd = collectives(layer_backward_ops(m, b, s, tp=tp))
    assert [o.name for o in bwd] == ["tp_allreduce_mlp_bwd", "tp_allreduce_attn_bwd"]


def wire_units(ops: list[LayerOp]) -> int:
    """Per-rank ring traffic in units of bytes * (p-1)/p: all-reduce 2, AG / RS 1 each."""
    weight = {OpKind.all_reduce: 2, OpKind.all_gather: 1, OpKind.reduce_scatter: 1}
    return sum(weight[o.op.op] * o.op.bytes * o.count for o in collectives(ops))


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from(list_models()),
    b=st.integers(1, 4),
    s_blocks=st.integers(1, 8),
    data=st.data(),
)
def test_sequence_parallel_moves_what_allreduce_moves(model, b, s_blocks, data):
    tp = data.draw(st.sampled_from([t for t in valid_tp_degrees(model) if 1 < t <= 64]))
    s = s_blocks * tp
    for fn in (layer_forward_ops, layer_backward_ops):
        plain = fn(model, b, s, tp=tp)
        sp = fn(model, b, s, tp=tp, sequence_parallel=True)
        # Megatron's extra backward all-gather of the sharded input for weight gradients
        sp_core = [o for o in sp if not o.name.endswith("_input")]
        assert {o.op.op for o in collectives(plain)} == {OpKind.all_reduce}
        assert {o.op.op for o in collectives(sp_core)} == {
            OpKind.all_gather,
            OpKind.reduce_scatter,
        }
        assert wire_units(sp_core) == wire_units(plain)  # RS + AG = AR
    for phase in ("forward", "backward"):
        plain = model_step_ops(model, b, s, tp=tp, phase=phase)
        sp = model_step_ops(model, b, s, tp=tp, phase=phase, sequence_parallel=True)
        sp_core = [o for o in sp if not o.name.endswith("_input")]
        assert wire_units(sp_core) == wire_units(plain)


def test_sequence_parallel_shards_norms_and_regathers():
    m = get_model("llama3-8b")
    b, s, tp = 1, 4096, 4
    fwd = by_name(layer_forward_ops(m, b, s, tp=tp, sequence_parallel=True))
    assert fwd["rmsnorm_1"].op.m == b * s // tp and fwd["residual_2"].op.m == b * s // tp
    assert fwd["qkv_proj"].op.m == b * s  # GEMMs still see all tokens
    assert fwd["tp_allgather_attn"].op.bytes == b * s * 4096 * 2
    bwd = [o.name for o in layer_backward_ops(m, b, s, tp=tp, sequence_parallel=True)]
    i = bwd.index("tp_allgather_qkv_proj_input")
    assert bwd[i - 1] == "qkv_proj_dgrad" and bwd[i + 1] == "qkv_proj_wgrad"
    with pytest.raises(ModelError, match="seq_len divisible by tp"):
        layer_forward_ops(m, 1, 4095, tp=4, sequence_parallel=True)


def test_cross_entropy_allreduce():
    ops = by_name(model_step_ops(get_model("llama3-8b"), 2, 512, tp=2))
    ce = ops["tp_allreduce_cross_entropy"]
    assert ce.count == 3 and ce.op.bytes == 2 * 512 * 4 and ce.op.dtype == "fp32"


def test_model_step_stages():
    m = get_model("gpt3-175b")
    first = {o.name for o in model_step_ops(m, 1, 2048, tp=8, stage="first")}
    last = {o.name for o in model_step_ops(m, 1, 2048, tp=8, stage="last")}
    assert first == {"embedding", "pos_embedding", "tp_allreduce_embedding"}
    assert {"final_layernorm", "lm_head", "cross_entropy"} <= last
    assert not first & last


# --- MoE -------------------------------------------------------------------------------------


def test_moe_balanced_experts():
    m = get_model("mixtral-8x7b")
    b, s, tp = 1, 4096, 2
    ops = by_name(layer_forward_ops(m, b, s, tp=tp))
    up = ops["expert_up"]  # one grouped launch over all 8 experts, 1024 rows each
    assert up.count == 1 and up.op.batch == 8 and up.op.m == b * s * 2 // 8
    assert (up.op.k, up.op.n) == (4096, 2 * 14336 // tp)
    assert ops["router"].op.n == 8 and ops["router"].op.m == b * s
    assert "mlp_up" not in ops
    expert_flops = sum(
        o.count * op_flops(o.op) for o in ops.values() if o.name.startswith("expert_")
    )
    assert expert_flops == 2 * b * s * 2 * 3 * 4096 * 14336 / tp  # tokens * top-2 experts


def test_moe_decode_touches_only_routed_experts():
    ops = by_name(decode_step_ops(get_model("mixtral-8x7b"), 1, 100))
    up = ops["expert_up"]  # one grouped launch per layer, the token's 2 experts' weights
    assert up.count == 32 and up.op.batch == 2 and up.op.m == 16  # padded to BLOCK_M 16
    ops = by_name(decode_step_ops(get_model("mixtral-8x7b"), 3, 100))
    # 6 picks touch 8 (1 - (3/4)^3) = 4.6 distinct experts on average, not 6
    assert ops["expert_up"].count == 32 and ops["expert_up"].op.batch == 5


# --- serving ---------------------------------------------------------------------------------


def test_decode_step():
    m = get_model("llama3-70b")
    ops = by_name(decode_step_ops(m, 16, 3000, tp=4))
    attn = ops["attn"]
    assert attn.op.op == OpKind.attn_decode and attn.count == 80
    assert (attn.op.batch, attn.op.seq_q, attn.op.seq_kv) == (16, 1, 3000)
    assert (attn.op.heads_q, attn.op.heads_kv) == (16, 2)
    assert ops["qkv_proj"].op.m == 16 and ops["qkv_proj"].count == 80
    assert ops["lm_head"].op.m == 16 and ops["lm_head"].count == 1
    assert ops["tp_allreduce_mlp"].op.bytes == 16 * 8192 * 2
    assert "cross_entropy" not in ops


def test_prefill():
    m = get_model("llama3-8b")
    ops = prefill_ops(m, 4, 1000, tp=2)
    named = by_name(ops)
    assert named["qkv_proj"].op.m == 4000 and named["qkv_proj"].count == 32
    assert named["attn"].op.seq_q == 1000 and named["attn"].op.causal
    assert named["lm_head"].op.m == 4  # logits only for each prompt's last token
    layer = total_flops(layer_forward_ops(m, 4, 1000, tp=2))
    assert total_count(ops, "attn") == 32
    assert total_flops(ops) == pytest.approx(32 * layer + op_flops(named["lm_head"].op))


# --- misc ------------------------------------------------------------------------------------


def test_optimizer_ops():
    (op,) = optimizer_ops(get_model("llama3-8b"), 1_000_000)
    assert op.op.op == OpKind.adamw and op.op.n == 1_000_000 and op.op.dtype == "fp32"
    with pytest.raises(ModelError, match="num_params_per_rank"):
        optimizer_ops(get_model("llama3-8b"), 0)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"batch": 0}, "batch must be a positive integer"),
        ({"seq_len": -5}, "seq_len must be a positive integer"),
        ({"dtype": "bf17"}, "unknown dtype 'bf17'; allowed: fp64"),
    ],
)
def test_bad_arguments(kwargs, needle):
    args = {"batch": 1, "seq_len": 128} | kwargs
    with pytest.raises(ModelError, match=needle):
        layer_forward_ops(get_model("llama3-8b"), **args)


def test_bad_phase_and_stage():
    m = get_model("llama3-8b")
    with pytest.raises(ModelError, match="allowed: forward, backward"):
        model_step_ops(m, 1, 128, phase="sideways")  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="allowed: all, first, last"):
        model_step_ops(m, 1, 128, stage="middle")  # type: ignore[arg-type]


def test_dtype_and_backend_propagate():
    ops = layer_forward_ops(
        get_model("llama3-8b"), 1, 256, tp=2, dtype="fp16", attn_backend="cudnn"
    )
    assert all(o.op.dtype == "fp16" for o in ops)
    assert by_name(ops)["attn"].op.backend == "cudnn"
    assert by_name(ops)["tp_allreduce_attn"].op.bytes == 256 * 4096 * DTYPE_BYTES["fp16"]


def test_fp8_runs_only_the_layer_gemms_in_fp8():
    """Transformer Engine and torchao float8 quantise the Linear GEMMs only: attention,
    norms, activations, the loss, the LM head (fwd and bwd) and TP collectives stay bf16."""
    model = get_model("llama3-8b")
    for ops in (
        layer_forward_ops(model, 1, 256, tp=2, dtype="fp8"),
        layer_backward_ops(model, 1, 256, tp=2, dtype="fp8"),
    ):
        for o in ops:
            assert o.op.dtype == ("fp8" if o.op.op == OpKind.gemm else "bf16"), o.name
    fwd = layer_forward_ops(model, 1, 256, tp=2, dtype="fp8")
    assert by_name(fwd)["tp_allreduce_attn"].op.bytes == 256 * 4096 * DTYPE_BYTES["bf16"]
    for phase in ("forward", "backward"):
        head = model_step_ops(model, 1, 256, phase=phase, dtype="fp8", stage="last")
        gemms = [o for o in head if o.op.op == OpKind.gemm]
        assert gemms and all(o.op.dtype == "bf16" for o in gemms)


def test_fp8_weight_casts_amortise_over_microbatches():
    model = get_model("llama3-8b")

    def weight_cast_bytes(global_batch: int) -> int:
        plan = make_plan(
            model,
            num_gpus=1,
            global_batch=global_batch,
            micro_batch=1,
            seq_len=2048,
            precision="fp8",
        )
        fwd = op_groups(model, plan)[0]
        return by_name(fwd)["fp8_weight_cast"].op.bytes

    # 6 bytes per layer parameter per iteration, a copy op moving 2x its bytes
    assert weight_cast_bytes(1) == pytest.approx(
        6 * params_per_tp_rank(model, 1)["layer"] / 2, 1e-6
    )
    assert weight_cast_bytes(4) == pytest.approx(weight_cast_bytes(1) / 4, rel=1e-6)


# --- property: any valid configuration expands into valid ops ----------------------------------


@settings(max_examples=150, deadline=None)
@given(
    model=st.sampled_from(list_models()),
    b=st.integers(1, 16),
    s=st.integers(1, 4096),
    sp=st.booleans(),
    causal=st.booleans(),
    data=st.data(),
)
def test_any_valid_config_yields_valid_ops(model, b, s, sp, causal, data):
    tp = data.draw(st.sampled_from(valid_tp_degrees(model)))
    if sp and tp > 1:
        s = max(tp, s - s % tp)
    lists = [
        layer_forward_ops(model, b, s, tp, sp, causal=causal),
        layer_backward_ops(model, b, s, tp, sp, causal=causal),
        model_step_ops(model, b, s, tp, "forward", sp),
        model_step_ops(model, b, s, tp, "backward", sp),
        prefill_ops(model, b, s, tp),
        decode_step_ops(model, b, s, tp),
    ]
    for ops in lists:
        assert ops
        for lo in ops:
            assert isinstance(lo.op, Op) and lo.count > 0 and lo.name
            assert Op.model_validate(lo.op.model_dump()) == lo.op
            for field in ("m", "n", "k", "bytes", "ranks", "batch", "seq_kv"):
                value = getattr(lo.op, field)
                assert value is None or (isinstance(value, int) and value > 0)
    every = [lo.op for ops in lists for lo in ops]
    assert len(ops_frame(every)) == len(every)  # the vectorised contract check agrees
    # exact for whole counts; the mean layer of a dense/MoE mix has fractional ones
    assert gemm_flops(lists[1]) == pytest.approx(2 * gemm_flops(lists[0]), rel=1e-12)


def test_bad_backend_and_serving_argument_names():
    m = get_model("llama3-8b")
    with pytest.raises(ModelError, match="allowed: flash, cudnn, flex, efficient"):
        layer_forward_ops(m, 1, 128, attn_backend="xformers")
    with pytest.raises(ModelError, match="for attn_decode; allowed: flash, cudnn, flex, efficient"):
        decode_step_ops(m, 1, 128, attn_backend="triton")
    with pytest.raises(ModelError, match="context_len must be a positive integer"):
        decode_step_ops(m, 1, 0)
    with pytest.raises(ModelError, match="prompt_len must be a positive integer"):
        prefill_ops(m, 1, 0)


def test_pytorch_compile_keeps_only_stage_extras_and_weight_casts():
    """Compiled blocks are the fused layer plus autocast's weight casts; the embedding,
    LM head and loss stay eager (the eager extras of the first and last stage)."""
    model = get_model("llama3-8b")
    plan = make_plan(model, num_gpus=1, global_batch=1, micro_batch=1, seq_len=2048)
    eager = op_groups(model, plan, framework="pytorch")
    comp = op_groups(model, plan, framework="pytorch-compile")
    fused = op_groups(model, plan, framework="megatron")
    extra = {o.name for o in comp[0]} - {o.name for o in fused[0]}
    assert extra == {"eager_weight_cast"}
    assert {o.name for o in comp[1]} - {o.name for o in fused[1]} == {"eager_wgrad_cast"}
    for g in (2, 3, 4, 5):  # stage extras as in eager
        assert {o.name for o in comp[g]} == {o.name for o in eager[g]}


def test_fp8_scaling_follows_the_engine():
    """Transformer Engine (megatron): fused cast-transpose, 4 B/element, weights cached
    across micro-batches; torchao (pytorch engines): an amax pass first, 5 B/element
    forward, 8 B per gradient element + 3 B per input element backward, 14 B/parameter."""
    model = get_model("llama3-8b")
    plan = make_plan(model, num_gpus=1, global_batch=2, micro_batch=1, seq_len=2048,
                     precision="fp8")  # fmt: skip
    t, h, f = 2048, 4096, 14336
    q, kv = 32 * 128, 8 * 128
    fwd_el = t * (h + q + h + f)
    grad_el = t * ((q + 2 * kv) + h + 2 * f + h)
    layer = params_per_tp_rank(model, 1)["layer"]

    def bytes_of(framework: str, group: int, name: str) -> float:
        op = by_name(op_groups(model, plan, framework=framework)[group])[name]
        return 2.0 * op.op.bytes * op.count  # a copy op moves 2x its bytes

    assert bytes_of("megatron", 0, "fp8_cast_fwd") == pytest.approx(4 * fwd_el, rel=1e-4)
    assert bytes_of("megatron", 0, "fp8_weight_cast") == pytest.approx(6 * layer / 2, rel=1e-4)
    assert bytes_of("pytorch-compile", 0, "fp8_cast_fwd") == pytest.approx(5 * fwd_el, rel=1e-4)
    assert bytes_of("pytorch-compile", 0, "fp8_weight_cast") == pytest.approx(14 * layer, rel=1e-4)
    assert bytes_of("pytorch-compile", 1, "fp8_cast_bwd") == pytest.approx(
        8 * grad_el + 3 * fwd_el, rel=1e-4
    )
    # torchao's float8 weight casts replace autocast's bf16 ones
    names = {o.name for o in op_groups(model, plan, framework="pytorch")[0]}
    assert "eager_weight_cast" not in names and "fp8_weight_cast" in names


def test_eager_moe_training_runs_transformers_expert_loop():
    """Under --framework pytorch an MoE layer's expert GEMMs are transformers' loop: two
    fp32 GEMMs forward and four backward per hit expert, of T k / E_touched rows; the
    fused frameworks keep one grouped GEMM per projection."""
    model = get_model("mixtral-8x7b")
    plan = make_plan(model, num_gpus=8, tp=8, global_batch=8, micro_batch=1, seq_len=2048)
    fwd, bwd = op_groups(model, plan, framework="pytorch")[:2]
    names = {o.name for o in fwd} | {o.name for o in bwd}
    assert not names & {"expert_up", "expert_down", "expert_up_dgrad", "expert_down_wgrad"}
    up = by_name(fwd)["hf_expert_up"]
    assert up.op.dtype.value == "fp32" and up.count == 8  # 2048 tokens hit all 8 experts
    assert up.op.m == 2048 * 2 // 8 and up.op.n == 2 * 14336 // 8
    assert {o.name for o in bwd if o.name.startswith("hf_expert")} == {
        "hf_expert_up_dgrad", "hf_expert_up_wgrad", "hf_expert_down_dgrad",
        "hf_expert_down_wgrad",
    }  # fmt: skip
    fused = {o.name for o in op_groups(model, plan, framework="megatron")[0]}
    assert "expert_up" in fused and "hf_expert_up" not in fused


def test_experts_impl_picks_loop_or_grouped():
    """``auto`` is the loop under fp32 master weights and grouped under pure bf16 (where
    transformers' grouped_mm runs); an explicit choice wins."""
    model = get_model("mixtral-8x7b")
    kw = dict(num_gpus=8, tp=8, global_batch=8, micro_batch=1, seq_len=2048)

    def names(**extra):
        return {o.name for o in op_groups(model, make_plan(model, **kw, **extra),
                                          framework="pytorch")[0]}  # fmt: skip

    assert "hf_expert_up" in names() and "expert_up" not in names()
    assert "expert_up" in names(precision="bf16") and "hf_expert_up" not in names(precision="bf16")
    assert "expert_up" in names(experts_impl="grouped")
    assert "hf_expert_up" in names(precision="bf16", experts_impl="loop")


def test_eager_attention_with_sinks_materialises_the_scores():
    """gpt-oss under --framework pytorch: transformers' eager attention (no SDPA with
    sinks), every layer over the whole s x s square; the fused engines keep flash."""
    from pathlib import Path

    from workloads.decompose.training import scores_kind
    from workloads.models import load_model

    cfg = Path(__file__).resolve().parents[2] / "examples" / "models" / "gpt-oss-20b.config.json"
    model = load_model(cfg)
    plan = make_plan(model, num_gpus=1, tp=1, global_batch=1, micro_batch=1, seq_len=2048)
    fwd, bwd = op_groups(model, plan, framework="pytorch")[:2]
    ops = by_name(fwd)
    assert not any(o.op.op.value.startswith("attn") for o in fwd + bwd)
    scores = ops["hf_attn_scores"].op
    assert (scores.batch, scores.m, scores.n, scores.k) == (64, 2048, 2048, 64)
    assert ops["hf_attn_context"].op.k == 2049  # the sliced probabilities' row stride
    fused = op_groups(model, plan, framework="megatron")[0]
    assert any(o.op.op.value == "attn_fwd" for o in fused)
    assert scores_kind(model, "pytorch") == 2 and scores_kind(model, "megatron") == 0


def test_gemma2_final_softcap_is_priced_eagerly():
    """Gemma 2's final logit soft-capping (config final_logit_softcapping) runs as three
    eager kernels over the logits and their backward under --framework pytorch."""
    from pathlib import Path

    from workloads.models import load_model

    root = Path(__file__).resolve().parents[2] / "examples" / "models"
    g2, g3 = (load_model(root / f"{n}.config.json") for n in ("gemma-2-9b", "gemma-3-27b"))
    assert g2.final_logit_softcap == 30.0 and g3.final_logit_softcap is None
    plan = make_plan(g2, num_gpus=1, tp=1, global_batch=1, micro_batch=1, seq_len=2048)
    last_f, last_b = op_groups(g2, plan, framework="pytorch")[4:6]
    cap = by_name(last_f)["eager_logit_softcap"]
    assert cap.count == 3 and cap.op.bytes == 2 * 2048 * g2.vocab_size  # 6 passes / 3 / 2
    assert "eager_logit_softcap_bwd" in by_name(last_b)
    plan3 = make_plan(g3, num_gpus=1, tp=1, global_batch=1, micro_batch=1, seq_len=2048)
    assert "eager_logit_softcap" not in by_name(op_groups(g3, plan3, framework="pytorch")[4])
