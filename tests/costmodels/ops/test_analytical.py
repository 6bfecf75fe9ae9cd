"""Analytical models against hand-derived and published numbers."""

import numpy as np
import pytest

from costmodels import AnalyticalCostModel, arch_params
from costmodels.ops.attention import causal_tiles_per_head
from costmodels.ops.common import floor_sum
from costmodels.ops.gemm import gemm_work
from costmodels.ops.select import get_cost_model
from hardware_specs.registry import builtin_catalog
from workloads.ops import Op


def tflops(model, op):
    w = model.work(op)
    return w.flops[0] / w.time_s[0] / 1e12


# --- GEMM -------------------------------------------------------------------------------
def test_big_bf16_gemm_near_measured_h100_ceiling(h100):
    # cuBLAS on H100 SXM reaches ~790-800 TFLOP/s at 8192^3 bf16, not the 989 datasheet.
    rate = tflops(h100, Op(op="gemm", m=8192, n=8192, k=8192))
    assert 760 <= rate <= 830


def test_a100_bf16_gemm_near_published_ceiling():
    a100 = AnalyticalCostModel.for_gpu("a100-sxm-80gb")
    rate = tflops(a100, Op(op="gemm", m=8192, n=8192, k=8192))
    assert 240 <= rate <= 285  # ~80-88% of 312 dense


def test_gemv_is_memory_bound(h100):
    # 1 x 8192 x 8192 fp16: 128 MiB of weights at ~0.85 x 3.35 TB/s.
    op = Op(op="gemm", m=1, n=8192, k=8192, dtype="fp16")
    weight_bytes = 8192 * 8192 * 2
    expected = weight_bytes / (3.35e12 * 0.85)
    assert h100.predict(op) == pytest.approx(expected + 4e-6, rel=0.02)


def test_wave_quantisation_with_one_tile_shape():
    gpu = builtin_catalog().gpu("h100-sxm")
    p = arch_params("hopper").gemm.model_copy(update={"tiles": [(128, 256)], "max_split_k": 1})
    k = np.array([4096.0])

    def t(m, n):
        return gemm_work(
            np.array([m]), np.array([n]), k, np.array([1.0]), np.array(["bf16"]), gpu, p
        ).time_s[0]

    one_wave = t(128 * 12, 256 * 11)  # 132 tiles = one wave on 132 SMs
    two_waves = t(128 * 12 + 1, 256 * 11)  # 11 more tiles need a second wave
    assert two_waves == pytest.approx(p.launch_s + 2 * (one_wave - p.launch_s), rel=1e-9)


def test_precision_ordering(h100):
    shape = dict(m=8192, n=8192, k=8192)
    fp8 = h100.predict(Op(op="gemm", dtype="fp8", **shape))
    bf16 = h100.predict(Op(op="gemm", dtype="bf16", **shape))
    tf32 = h100.predict(Op(op="gemm", dtype="tf32", **shape))
    fp32 = h100.predict(Op(op="gemm", dtype="fp32", **shape))
    assert fp8 < bf16 < tf32 < fp32


def test_small_tiles_feed_bound(h100):
    # A 64-row GEMM cannot use 128-row tiles efficiently: far below the big-GEMM rate.
    assert tflops(h100, Op(op="gemm", m=64, n=8192, k=8192)) < 0.5 * tflops(
        h100, Op(op="gemm", m=8192, n=8192, k=8192)
    )


# --- attention --------------------------------------------------------------------------
def test_floor_sum_matches_brute_force():
    rng = np.random.default_rng(0)
    n, m, a, b = (rng.integers(lo, hi, 500) for lo, hi in ((0, 200), (1, 100), (0, 300), (0, 300)))
    brute = [sum((a[j] * i + b[j]) // m[j] for i in range(n[j])) for j in range(500)]
    np.testing.assert_array_equal(floor_sum(n, m, a, b), brute)


def _brute_causal_tiles(sq, skv, bm, bn):
    off, nk = skv - sq, -(-skv // bn)
    total = 0
    for i in range(-(-sq // bm)):
        last = min((i + 1) * bm, sq) - 1
        total += min(nk, max(0, (last + off) // bn + 1))
    return total


def test_causal_tiles_exact_against_brute_force():
    rng = np.random.default_rng(1)
    sq = rng.integers(1, 5000, 400)
    skv = np.maximum(sq + rng.integers(-300, 3000, 400), 1)
    bm = rng.choice([64, 128], 400)
    bn = rng.choice([32, 64, 128], 400)
    fast = causal_tiles_per_head(sq, skv, bm, bn)
    brute = [_brute_causal_tiles(*map(int, x)) for x in zip(sq, skv, bm, bn, strict=True)]
    np.testing.assert_array_equal(fast, brute)


def test_causal_is_not_a_flat_half():
    # square tiles, n blocks: n(n+1)/2 visited of n^2 -> (n+1)/2n, not 1/2
    tiles = causal_tiles_per_head(
        np.array([1024.0]), np.array([1024.0]), np.array([128.0]), np.array([128.0])
    )
    assert tiles[0] == 8 * 9 / 2


def test_attention_fwd_flops_and_backward_ratio(h100):
    common = dict(batch=2, seq_q=4096, seq_kv=4096, heads_q=16, heads_kv=16, head_dim=128)
    fwd = h100.work(Op(op="attn_fwd", **common))
    bwd = h100.work(Op(op="attn_bwd", **common))
    assert fwd.flops[0] == 4 * 2 * 16 * 4096 * 4096 * 128
    assert bwd.flops[0] == pytest.approx(2.5 * fwd.flops[0])
    both = h100.predict(Op(op="attn_fwdbwd", **common))
    assert both == pytest.approx(fwd.time_s[0] + bwd.time_s[0])


def test_attention_h100_rates_plausible(h100):
    # FlashAttention-2 on H100: ~300-370 TFLOP/s fwd at head_dim 128, long sequences;
    # cuDNN's Hopper kernels ~500-650 (Shah et al. 2024, FlashAttention-3, Fig. 5).
    common = dict(batch=4, seq_q=8192, seq_kv=8192, heads_q=16, heads_kv=16, head_dim=128)
    assert 290 <= tflops(h100, Op(op="attn_fwd", **common)) <= 380
    assert 480 <= tflops(h100, Op(op="attn_fwd", backend="cudnn", **common)) <= 680


def test_causal_close_to_half_of_full_for_long_sequences(h100):
    common = dict(batch=1, seq_q=32768, seq_kv=32768, heads_q=32, heads_kv=8, head_dim=128)
    full = h100.predict(Op(op="attn_fwd", **common))
    causal = h100.predict(Op(op="attn_fwd", causal=True, **common))
    assert 0.48 < causal / full < 0.56


def test_gqa_same_compute_less_traffic(h100):
    common = dict(batch=2, seq_q=4096, seq_kv=4096, heads_q=32, head_dim=128)
    mha = h100.work(Op(op="attn_fwd", heads_kv=32, **common))
    gqa = h100.work(Op(op="attn_fwd", heads_kv=4, **common))
    assert gqa.flops[0] == mha.flops[0]
    assert gqa.bytes[0] < mha.bytes[0]


def test_decode_is_memory_bound_at_large_batch(h100):
    op = Op(op="attn_decode", batch=128, seq_kv=8192, heads_q=32, heads_kv=8, head_dim=128)
    kv_bytes = 128 * 8192 * 8 * 128 * 2 * 2
    bw = 3.35e12 * arch_params("hopper").attention.decode_memory_efficiency
    assert h100.predict(op) == pytest.approx(kv_bytes / bw, rel=0.05)


def test_decode_read_rate_falls_with_more_cache_streams_than_sms():
    # measured on H100 and H200: batch x KV heads = 128 streams read at 3.0 / 4.4 TB/s,
    # 256 streams at ~2.7 TB/s on both: the faster HBM stops helping
    h200 = AnalyticalCostModel.for_gpu("h200-sxm")
    att = arch_params("hopper").attention
    common = dict(seq_kv=32768, heads_q=32, heads_kv=8, head_dim=128, backend="flash")

    def rate(batch: int) -> float:
        op = Op(op="attn_decode", batch=batch, **common)
        return batch * 32768 * 8 * 128 * 2 * 2 / h200.predict(op)

    assert rate(16) > 1.3 * att.decode_crowded_bytes_per_s  # 128 streams: HBM-bound
    assert rate(32) == pytest.approx(att.decode_crowded_bytes_per_s, rel=0.05)
    assert rate(64) == pytest.approx(att.decode_crowded_bytes_per_s, rel=0.05)


def test_decode_gqa_reads_less(h100):
    common = dict(batch=64, seq_kv=8192, heads_q=32, head_dim=128)
    assert h100.predict(Op(op="attn_decode", heads_kv=8, **common)) < 0.5 * h100.predict(
        Op(op="attn_decode", heads_kv=32, **common)
    )


def test_blocksparse_density_one_equals_dense_tiles(h100):
    common = dict(batch=1, seq_q=16384, seq_kv=16384, heads_q=16, heads_kv=16, head_dim=128)
    sparse = h100.work(
        Op(op="attn_blocksparse_fwd", density=1.0, block_size=128, backend="flex", **common)
    )
    dense = h100.work(Op(op="attn_fwd", backend="flex", **common))
    assert sparse.flops[0] == dense.flops[0]
    assert sparse.time_s[0] == pytest.approx(dense.time_s[0])
    tenth = h100.predict(Op(op="attn_blocksparse_fwd", density=0.1, block_size=128, **common))
    assert tenth < 0.2 * dense.time_s[0]


# --- memory-bound -----------------------------------------------------------------------
def test_copy_at_measured_bandwidth(h100):
    gib = 2**30
    t = h100.predict(Op(op="copy", bytes=gib))
    assert 2 * gib / t / 1e12 == pytest.approx(3.0, rel=0.03)  # ~3.0 TB/s read + write


def test_tiny_elementwise_is_launch_bound(h100):
    assert h100.predict(Op(op="rmsnorm", m=1, n=128)) == pytest.approx(
        3e-6 + 4e6 / (3.35e12 * 0.75), rel=0.01
    )


# --- collectives ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "factor"),
    [
        ("all_reduce", 2 * 7 / 8),
        ("all_gather", 7 / 8),
        ("reduce_scatter", 7 / 8),
        ("all_to_all", 7 / 8),
        ("send_recv", 1.0),
    ],
)
def test_bus_bandwidth_factors(h100, kind, factor):
    ranks = 2 if kind == "send_recv" else 8
    w = h100.work(Op(op=kind, bytes=2**30, ranks=ranks))
    assert w.bytes[0] == pytest.approx(factor * 2**30 if kind != "send_recv" else 2**30)


def test_h100_nvswitch_all_reduce_busbw(h100):
    # nccl-tests on 8x H100 NVLink4 without NVLS: ~360 GB/s bus bandwidth at 1 GiB.
    w = h100.work(Op(op="all_reduce", bytes=2**30, ranks=8))
    assert 330 <= w.bytes[0] / w.time_s[0] / 1e9 <= 380


def test_small_all_reduce_is_latency_bound(h100):
    t = h100.predict(Op(op="all_reduce", bytes=1024, ranks=8))
    assert 5e-6 < t < 20e-6


def test_inter_node_all_reduce_is_nic_bound():
    # DGX A100: 8 HDR NICs of 25 GB/s per node -> rail rings give ~8 x 25 x 0.9 GB/s busbw.
    a100 = AnalyticalCostModel.for_gpu("a100-sxm-80gb")
    w = a100.work(Op(op="all_reduce", bytes=2**30, ranks=64, nodes=8))
    assert w.bytes[0] / w.time_s[0] / 1e9 == pytest.approx(180, rel=0.05)
    intra = a100.work(Op(op="all_reduce", bytes=2**30, ranks=8))
    assert intra.time_s[0] < w.time_s[0]


def test_inter_node_send_recv_uses_one_nic():
    h100 = AnalyticalCostModel.for_gpu("h100-sxm")
    t = h100.predict(Op(op="send_recv", bytes=2**30, ranks=2, nodes=2))
    assert 2**30 / t / 1e9 == pytest.approx(50 * 0.9, rel=0.05)  # NDR 400 Gb/s


def test_single_rank_collective_is_free(h100):
    assert h100.predict(Op(op="all_reduce", bytes=2**20, ranks=1)) == 0.0


def test_mi300x_mesh_pair_uses_one_link():
    mi = AnalyticalCostModel.for_gpu("mi300x")
    pair = mi.work(Op(op="all_gather", bytes=2**30, ranks=2))
    eight = mi.work(Op(op="all_gather", bytes=2**30, ranks=8))
    assert pair.bytes[0] / pair.time_s[0] < 0.3 * eight.bytes[0] / eight.time_s[0]


def test_module_level_predict_accepts_id_spec_and_system():
    import costmodels
    from hardware_specs.registry import builtin_catalog
    from workloads.ops import ops_frame

    op = Op(op="gemm", m=4096, n=4096, k=4096)
    cat = builtin_catalog()
    by_id = costmodels.predict(op, "h100-sxm")  # the shipped H100 profile
    assert by_id == get_cost_model("h100-sxm").predict(op)
    assert costmodels.predict(op, cat.gpu("h100-sxm")) == by_id
    system = cat.system("h100-sxm", 16)  # an explicit system: the uncalibrated model on it
    assert costmodels.predict(op, system) == AnalyticalCostModel(system).predict(op)
    data = cat.gpu("h100-sxm").model_dump()
    data.update(boost_clock_mhz=915.0, peak_dense_tflops={"bf16": 494.7})
    slower = type(cat.gpu("h100-sxm")).model_validate(data)
    assert costmodels.predict(op, slower) > AnalyticalCostModel(system).predict(op)
    assert costmodels.predict_many(ops_frame([op, op]), "h100-sxm").tolist() == [by_id, by_id]


def test_misaligned_rows_run_slower_kernels(h100):
    # measured on H100: k or n not a multiple of 8 bf16 elements (16 bytes) drops cuBLAS
    # from its TMA/wgmma kernels to much slower ones
    aligned = h100.predict(Op(op="gemm", m=8192, n=8192, k=8192))
    misaligned = h100.predict(Op(op="gemm", m=8192, n=8191, k=8192))
    assert misaligned > 1.4 * aligned
    assert h100.predict(Op(op="gemm", m=8191, n=8192, k=8192)) < 1.05 * aligned  # m is free
    fp32 = h100.predict(Op(op="gemm", m=4096, n=4095, k=4096, dtype="fp32"))
    assert fp32 < 1.05 * h100.predict(Op(op="gemm", m=4096, n=4096, k=4096, dtype="fp32"))
