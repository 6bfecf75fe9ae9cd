"""`simcli train` against published NeMo throughput on DGX H100 (benchmarks/
validate_published.py; validation only, never fitted on): FP8 pre-training of GPT-3 and
Llama 7B-175B on 8-512 GPUs, and Llama-2-7B with context parallelism from 4k to 1M tokens."""

from __future__ import annotations

from benchmarks.validate_published import fp8_rows, long_context_rows, nemo_llama2_flops
from workloads.models import load_model


def test_long_context_runs_with_context_parallelism():
    rows = long_context_rows()
    assert [r["seq_k"] for r in rows] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    errs = [abs(r["error_pct"]) for r in rows]
    assert sum(errs) / len(errs) <= 8.0 and max(errs) <= 12.0
    # no drift with length: the 1M-token row is as close as the 16k one
    assert abs(rows[-1]["error_pct"]) <= 8.0
    assert all(r["headroom_gib"] >= 0 for r in rows)  # published runs fit


def test_fp8_pretraining_throughput():
    rows = fp8_rows()
    assert len(rows) == 7
    for key in ("error_pct", "overlap_error_pct"):  # TP comm exposed / overlapped (NeMo's)
        errs = [abs(r[key]) for r in rows]
        assert sum(errs) / len(errs) <= 8.0 and max(errs) <= 12.0, key
    # with NeMo's memory settings (fp8 weights, bf16 gradient sync) every published run
    # fits inside the default margin (GPT-3 175B on 128 GPUs and Llama-3-8B with CP 2
    # used to be refused)
    assert all(r["headroom_gib"] >= 0 for r in rows)


def test_nemo_flop_formula_counts_full_attention():
    """The published TFLOPS are converted back to seconds with NeMo's formula of that
    release: 6 x parameters-ish per token plus full (non-causal) s^2 attention."""
    m = load_model("llama2-7b")
    short, long = (nemo_llama2_flops(m, 1, s) for s in (4096, 1 << 20))
    attn = 12 * m.num_layers * m.hidden_size * ((1 << 20) - 4096)
    assert long - short == attn
    assert 6 * m.num_params * 0.95 < short < 6 * m.num_params * 1.2
