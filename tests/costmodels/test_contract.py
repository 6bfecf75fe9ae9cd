"""The contract every cost model keeps: finite, positive, monotone, scalar == vectorised."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodels import AnalyticalCostModel
from tests.costmodels.strategies import (
    any_op,
    attention_ops,
    blocksparse_ops,
    collective_ops,
    decode_ops,
    elementwise_ops,
    gemm_ops,
)
from workloads.ops import Op, ops_frame

BASE_OPS = [
    Op(op="gemm", m=4096, n=4096, k=4096),
    Op(op="gemm", m=1, n=8192, k=8192, dtype="fp16"),
    Op(op="gemm", m=2048, n=2048, k=2048, dtype="fp32"),
    Op(
        op="attn_fwd",
        batch=2,
        seq_q=4096,
        seq_kv=4096,
        heads_q=32,
        heads_kv=8,
        head_dim=128,
        causal=True,
    ),
    Op(op="attn_fwdbwd", batch=1, seq_q=8192, seq_kv=8192, heads_q=16, heads_kv=16, head_dim=64),
    Op(
        op="attn_bwd",
        batch=1,
        seq_q=2048,
        seq_kv=2048,
        heads_q=8,
        heads_kv=8,
        head_dim=128,
        backend="cudnn",
    ),
    Op(op="attn_decode", batch=32, seq_kv=4096, heads_q=32, heads_kv=8, head_dim=128),
    Op(
        op="attn_blocksparse_fwd",
        batch=1,
        seq_q=16384,
        seq_kv=16384,
        heads_q=16,
        heads_kv=16,
        head_dim=128,
        density=0.2,
        block_size=128,
    ),
    Op(op="all_reduce", bytes=2**26, ranks=8),
    Op(op="all_gather", bytes=2**20, ranks=4),
    Op(op="reduce_scatter", bytes=2**24, ranks=16, nodes=2),
    Op(op="all_to_all", bytes=2**24, ranks=8),
    Op(op="send_recv", bytes=2**22),
    Op(op="copy", bytes=2**28),
    Op(op="rmsnorm", m=8192, n=4096),
    Op(op="swiglu", m=8192, n=14336),
    Op(op="rope", m=8192, n=4096),
    Op(op="softmax", m=4096, n=4096),
    Op(op="cross_entropy", m=8192, n=128256),
    Op(op="adamw", n=10**9, dtype="fp32"),
]


def test_every_gpu_prices_every_base_op(any_gpu_model):
    for op in BASE_OPS:
        t = any_gpu_model.predict(op)
        assert np.isfinite(t) and t > 0, (any_gpu_model.gpu.id, op)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=any_op)
def test_random_ops_finite_and_positive(h100, op):
    t = h100.predict(op)
    assert np.isfinite(t)
    assert t > 0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(any_op, min_size=1, max_size=40))
def test_vectorised_equals_scalar(h100, ops):
    many = h100.predict_many(ops_frame(ops))
    one_by_one = np.array([h100.predict(o) for o in ops])
    np.testing.assert_allclose(many, one_by_one, rtol=1e-12)


def test_predict_many_keeps_row_order(h100):
    frame = ops_frame(BASE_OPS)
    forward = h100.predict_many(frame)
    backward = h100.predict_many(frame.iloc[::-1].reset_index(drop=True))
    np.testing.assert_allclose(forward, backward[::-1])


def _grown(op: Op, field: str, factor: float) -> Op | None:
    value = getattr(op, field)
    if value is None:
        return None
    if field == "density":
        new = min(1.0, value * factor)
    else:
        new = int(np.ceil(value * factor))
        if new == value:
            new += 1
        if op.op.value == "gemm" and field in ("k", "n") and op.dtype.value != "fp32":
            # Growing k or n into a better byte alignment switches cuBLAS to faster kernels
            # (TMA needs 16-byte rows: a real, measured speed-up), so sizes grow within their
            # alignment class.
            elt = {"fp8": 1, "int8": 1, "bf16": 2, "fp16": 2}.get(op.dtype.value, 4)

            def align(v: int) -> int:
                return min((v * elt) & -(v * elt), 16)

            while align(new) != align(value):
                new += 1
    data = op.model_dump()
    data[field] = new
    if field == "heads_kv" and data["heads_q"] % new:
        return None
    if field == "heads_q" and new % data["heads_kv"]:
        return None
    return Op(**data)


SIZE_FIELDS = {
    "gemm": ["m", "n", "k", "batch"],
    "attn": ["batch", "seq_kv", "heads_q", "heads_kv", "head_dim"],
    "decode": ["batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim"],
    "sparse": ["batch", "seq_q", "seq_kv", "heads_q", "head_dim", "density"],
    "collective": ["bytes"],
    "elementwise": ["m", "n", "bytes"],
}


def _check_monotone(model: AnalyticalCostModel, op: Op, fields: list[str], factor: float) -> None:
    base = model.predict(op)
    for field in fields:
        bigger = _grown(op, field, factor)
        if bigger is None:
            continue
        assert model.predict(bigger) >= base * (1 - 1e-12), (field, op, bigger)


factors = st.sampled_from([1.001, 1.1, 1.5, 2.0, 3.0])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=gemm_ops(), factor=factors)
def test_gemm_monotone(h100, op, factor):
    _check_monotone(h100, op, SIZE_FIELDS["gemm"], factor)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=attention_ops(), factor=factors)
def test_attention_monotone(h100, op, factor):
    fields = list(SIZE_FIELDS["attn"])
    if not op.causal:
        fields.append("seq_q")
    _check_monotone(h100, op, fields, factor)
    if op.causal:
        # Bottom-right alignment: one more query shifts the diagonal, so earlier query
        # blocks may see a key block less; growing the sequence grows queries and keys.
        grow = max(1, int(op.seq_q * (factor - 1)))
        longer = op.model_copy(update={"seq_q": op.seq_q + grow, "seq_kv": op.seq_kv + grow})
        assert h100.predict(longer) >= h100.predict(op) * (1 - 1e-12)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=decode_ops(), factor=factors)
def test_decode_monotone(h100, op, factor):
    _check_monotone(h100, op, SIZE_FIELDS["decode"], factor)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=blocksparse_ops(), factor=factors)
def test_blocksparse_monotone(h100, op, factor):
    _check_monotone(h100, op, SIZE_FIELDS["sparse"], factor)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=collective_ops(), factor=factors)
def test_collective_monotone_in_bytes(h100, op, factor):
    _check_monotone(h100, op, SIZE_FIELDS["collective"], factor)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_collective_monotone_in_ranks_within_a_node(h100, kind):
    times = [h100.predict(Op(op=kind, bytes=2**24, ranks=r)) for r in range(2, 9)]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False)), times


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(op=elementwise_ops(), factor=factors)
def test_elementwise_monotone(h100, op, factor):
    _check_monotone(h100, op, SIZE_FIELDS["elementwise"], factor)


def test_predict_many_validates_raw_frames(h100):
    raw = pd.DataFrame({"op": ["gemm"], "m": ["128"], "n": ["256"], "k": ["64"]})
    assert h100.predict_many(raw)[0] > 0
    with pytest.raises(ValueError, match="column 'k'"):
        h100.predict_many(pd.DataFrame({"op": ["gemm"], "m": [1], "n": [1], "k": [0]}))


def test_unsupported_dtype_is_a_clear_error():
    a100 = AnalyticalCostModel.for_gpu("a100-sxm-80gb")
    with pytest.raises(ValueError, match="fp8"):
        a100.predict(Op(op="gemm", m=128, n=128, k=128, dtype="fp8"))
