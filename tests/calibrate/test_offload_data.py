"""calibrate/data/offload-h100-sxm (calibrate.steps.offload_bench on the lent H100): the
host-offload constants of costmodels.steps.training are what it measured."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest

from costmodels.steps.training import (
    CPU_ADAM_PROCESS_BYTES_PER_S,
    HOST_ADAM_BYTES_PER_S_PER_GPU,
    HOST_COPY_EFFICIENCY,
)
from hardware_specs.registry import builtin_catalog

DATA = Path(__file__).resolve().parents[2] / "calibrate" / "data" / "offload-h100-sxm"


def _rows() -> pd.DataFrame:
    return pd.read_csv(DATA / "offload.csv")


def test_copy_efficiency_is_the_measured_share_of_the_host_link():
    df = _rows()
    rates = df[df.what.isin(["h2d", "d2h"])].bytes_per_s
    link = builtin_catalog().link("pcie-gen5-x16").bytes_per_s
    assert statistics.median(rates) / link == pytest.approx(HOST_COPY_EFFICIENCY, abs=0.01)


def test_cpu_adam_rate_is_the_measured_16_thread_rate_capped_by_the_node_share():
    df = _rows()
    adam = df[df.what.str.startswith("adamw_cpu") & (df.threads == 16)].bytes_per_s
    assert adam.median() == pytest.approx(CPU_ADAM_PROCESS_BYTES_PER_S, rel=0.05)
    assert HOST_ADAM_BYTES_PER_S_PER_GPU <= CPU_ADAM_PROCESS_BYTES_PER_S
    # more threads, faster (memory-bound, so far from linear)
    by_t = df[df.what.str.startswith("adamw_cpu")].groupby("threads").bytes_per_s.median()
    assert by_t.is_monotonic_increasing


def test_a_copy_on_its_own_stream_hides_behind_gemms():
    """What activation offload's exposed = max(0, copy - compute) assumes."""
    t = _rows().set_index("what").seconds
    assert t["overlap_both"] <= 1.02 * max(t["overlap_gemm"], t["overlap_copy"])
