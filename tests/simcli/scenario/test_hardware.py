"""simcli.scenario.hardware: a --cluster file's fabric reaches the collective models."""

from __future__ import annotations

from pathlib import Path

from costmodels.steps.training import collective_s
from simcli.scenario import resolve_hardware

RAIL = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "h100-24k-rail-pods.yaml"


def test_cluster_fabric_prices_the_collectives():
    """On the rail-optimised cluster a 2-node ring stays under one rail leaf (1 switch hop,
    not the reference fat-tree's 3), so a latency-bound all-reduce is faster; a large one
    is bandwidth-bound and the same."""
    ref = resolve_hardware("h100-sxm", 16)
    rail = resolve_hardware("h100-sxm", 16, cluster_file=RAIL)
    small = [
        collective_s(h.cost_model, "all_reduce", 64 * 1024, 16, 2, "bf16") for h in (ref, rail)
    ]
    assert small[1] < small[0]
    big = [collective_s(h.cost_model, "all_reduce", 1 << 30, 16, 2, "bf16") for h in (ref, rail)]
    assert abs(big[1] / big[0] - 1) < 0.02
