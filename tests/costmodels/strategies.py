"""Hypothesis strategies for valid ops of every kind (shared by the cost-model tests)."""

from hypothesis import strategies as st

from workloads.ops import Op

sizes = st.integers(min_value=1, max_value=65536)
seqs = st.integers(min_value=1, max_value=32768)
dims = st.sampled_from([32, 64, 96, 128, 192, 256])
half = st.sampled_from(["bf16", "fp16"])


@st.composite
def heads(draw):
    hkv = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    return hkv * group, hkv


@st.composite
def gemm_ops(draw):
    return Op(
        op="gemm",
        m=draw(sizes),
        n=draw(sizes),
        k=draw(sizes),
        batch=draw(st.integers(1, 64)),
        dtype=draw(st.sampled_from(["bf16", "fp16", "fp32", "tf32", "fp8"])),
    )


@st.composite
def attention_ops(draw):
    hq, hkv = draw(heads())
    kind = draw(st.sampled_from(["attn_fwd", "attn_bwd", "attn_fwdbwd"]))
    return Op(
        op=kind,
        batch=draw(st.integers(1, 16)),
        seq_q=draw(seqs),
        seq_kv=draw(seqs),
        heads_q=hq,
        heads_kv=hkv,
        head_dim=draw(dims),
        causal=draw(st.booleans()),
        backend=draw(st.sampled_from([None, "flash", "cudnn", "flex", "efficient"])),
        dtype=draw(half),
    )


@st.composite
def decode_ops(draw):
    hq, hkv = draw(heads())
    return Op(
        op="attn_decode",
        batch=draw(st.integers(1, 512)),
        seq_q=draw(st.integers(1, 8)),
        seq_kv=draw(st.integers(1, 262144)),
        heads_q=hq,
        heads_kv=hkv,
        head_dim=draw(dims),
        dtype=draw(half),
    )


@st.composite
def blocksparse_ops(draw):
    hq, hkv = draw(heads())
    return Op(
        op=draw(st.sampled_from(["attn_blocksparse_fwd", "attn_blocksparse_bwd"])),
        batch=draw(st.integers(1, 8)),
        seq_q=draw(seqs),
        seq_kv=draw(seqs),
        heads_q=hq,
        heads_kv=hkv,
        head_dim=draw(dims),
        density=draw(st.floats(0.001, 1.0)),
        block_size=draw(st.sampled_from([64, 128])),
        dtype=draw(half),
    )


@st.composite
def collective_ops(draw):
    kind = draw(
        st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"])
    )
    nodes = draw(st.sampled_from([1, 1, 2, 4, 16]))
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    ranks = 2 if kind == "send_recv" and nodes == 1 else nodes * per_node
    if kind == "send_recv":
        nodes = min(nodes, 2)
        ranks = 2
    return Op(op=kind, bytes=draw(st.integers(1, 2**33)), ranks=max(ranks, 2), nodes=nodes)


@st.composite
def elementwise_ops(draw):
    kind = draw(
        st.sampled_from(
            [
                "copy",
                "rmsnorm",
                "layernorm",
                "swiglu",
                "gelu",
                "rope",
                "softmax",
                "cross_entropy",
                "embedding",
                "residual_add",
                "adamw",
            ]
        )
    )
    if kind == "copy":
        return Op(op=kind, bytes=draw(st.integers(1, 2**34)))
    if kind == "adamw":
        return Op(
            op=kind, n=draw(st.integers(1, 2**34)), dtype=draw(st.sampled_from(["fp32", "bf16"]))
        )
    return Op(op=kind, m=draw(sizes), n=draw(st.integers(1, 262144)), dtype=draw(half))


any_op = st.one_of(
    gemm_ops(),
    attention_ops(),
    decode_ops(),
    blocksparse_ops(),
    collective_ops(),
    elementwise_ops(),
)
