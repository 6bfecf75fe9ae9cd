"""Collectives on described fabrics: leaves, rails, pods (hardware_specs.schema.FabricSpec)."""

import dataclasses

import numpy as np
import pytest

from costmodels import AnalyticalCostModel, arch_params
from costmodels.ops.collectives import NCCL_NET_HOPS, collective_work
from hardware_specs.registry import builtin_catalog
from hardware_specs.schema import ClusterSpec, FabricSpec
from workloads.ops import Op

KINDS = np.array(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"])
SWITCH_S = 0.6e-6  # FabricSpec's default switch latency


def _system(fabric: FabricSpec = FabricSpec(), num_nodes: int = 3072):
    spec = ClusterSpec(name="c", node="dgx-h100", num_nodes=num_nodes, fabric=fabric)
    return builtin_catalog().system_for_cluster(spec)


def _t(fabric: FabricSpec, kind: str, nbytes: float, ranks: int, nodes: int) -> float:
    model = AnalyticalCostModel(_system(fabric))
    return model.predict(Op(op=kind, bytes=int(nbytes), ranks=ranks, nodes=nodes))


def _grid(system):
    rng = np.random.default_rng(3)
    n = 3000
    kind = KINDS[rng.integers(0, len(KINDS), n)]
    nbytes = 10 ** rng.uniform(2, 10, n)
    nodes = rng.choice([1, 2, 4, 8, 64, 512, 2048], n).astype(float)
    ranks = nodes * rng.choice([1, 2, 4, 8], n)
    ranks = np.where(kind == "send_recv", 2.0, ranks)
    nodes = np.where(kind == "send_recv", np.minimum(nodes, 2.0), nodes)
    p = arch_params(system.gpu.architecture).collectives
    return nodes, collective_work(kind, nbytes, ranks, nodes, system, p).time_s


def test_pods_cost_nothing_here_for_groups_inside_a_pod():
    """The default fabric and Llama 3's pods (1:7 above 384 nodes) price every group of
    at most a pod identically: crossing pods is placement, which System.slowdown prices.
    Groups larger than a pod must leave one: their network steps take 2 more switches."""
    nodes, base = _grid(_system())
    _, pods = _grid(_system(FabricSpec(pod_nodes=384, pod_oversubscription=7.0)))
    small = nodes <= 384
    assert small.any() and (~small).any()
    assert np.array_equal(base[small], pods[small])
    assert (pods[~small] > base[~small]).all()


def test_pod_hops_add_switch_latency_to_each_network_step():
    fabric = FabricSpec(pod_nodes=4, pod_oversubscription=7.0, pod_switch_hops=2)
    inside = _t(fabric, "all_to_all", 1024, 32, 4)
    across = _t(fabric, "all_to_all", 1024, 64, 8)
    flat = _t(FabricSpec(), "all_to_all", 1024, 64, 8)
    assert across - flat == pytest.approx(2 * SWITCH_S, rel=1e-9)
    assert inside == _t(FabricSpec(), "all_to_all", 1024, 32, 4)


def test_rail_leaf_saves_two_switches_per_step_top_of_rack_does_not():
    """4 DGX H100 nodes: under one rail leaf (a 32-node scalable unit) rail-aligned rings
    take 1 switch; with 2 nodes per top-of-rack leaf they cross the spine (3), as the
    default fabric assumes. A latency-bound all-reduce saves 2 x 0.6 us on each of its
    network steps: between a tree's 4 and a ring's 6."""
    rail = FabricSpec(topology="rail-optimized", leaf_nodes=32)
    tor = FabricSpec(topology="fat-tree", leaf_nodes=2)
    t_rail = _t(rail, "all_reduce", 4096, 32, 4)
    t_tor = _t(tor, "all_reduce", 4096, 32, 4)
    assert t_tor == _t(FabricSpec(), "all_reduce", 4096, 32, 4)
    assert 4 * 2 * SWITCH_S * 0.999 <= t_tor - t_rail <= 6 * 2 * SWITCH_S * 1.001
    # a pair inside one rack is one switch apart in both fabrics
    assert _t(rail, "send_recv", 4096, 2, 2) == _t(tor, "send_recv", 4096, 2, 2)
    assert _t(FabricSpec(), "send_recv", 4096, 2, 2) - _t(tor, "send_recv", 4096, 2, 2) == (
        pytest.approx((3 - 1) * SWITCH_S, rel=1e-9)
    )
    assert NCCL_NET_HOPS == 3


def test_rail_all_to_all_relays_over_nvlink_at_the_cost_of_one_nvlink_hop():
    """PXN: on a rail-optimised fabric the bytes for another local rank cross NVLink to
    the GPU on the destination's rail first. The NICs still bound a large all-to-all;
    the relay adds one NVLink step of latency (Simple protocol)."""
    simple = arch_params("hopper").collectives.protocols["Simple"]
    rail = FabricSpec(topology="rail-optimized")
    for nbytes in (4096, 2**30):
        gap = _t(rail, "all_to_all", nbytes, 16, 2) - _t(FabricSpec(), "all_to_all", nbytes, 16, 2)
        assert gap == pytest.approx(simple.step_latency_s, rel=1e-6)
    # one rank per node: every destination is on our rail, nothing to relay
    assert _t(rail, "all_to_all", 2**30, 8, 8) == _t(FabricSpec(), "all_to_all", 2**30, 8, 8)
    # NVLink carries the relay: on a node with slow GPU links it becomes the bound
    pcie = builtin_catalog().system("l40s", 16)
    rail_pcie = dataclasses.replace(pcie, fabric=rail)
    op = Op(op="all_to_all", bytes=2**30, ranks=16, nodes=2)
    slow = AnalyticalCostModel(rail_pcie).predict(op)
    assert slow > 1.5 * AnalyticalCostModel(pcie).predict(op)


def test_leaf_uplink_oversubscription_spares_groups_under_one_leaf():
    blocking = FabricSpec(topology="rail-optimized", leaf_nodes=32, oversubscription=2.0)
    under = _t(blocking, "all_reduce", 2**30, 64, 8)
    assert under == _t(FabricSpec(topology="rail-optimized", leaf_nodes=32), "all_reduce",
                       2**30, 64, 8)  # fmt: skip
    across = _t(blocking, "all_reduce", 2**30, 512, 64)
    free = _t(FabricSpec(topology="rail-optimized", leaf_nodes=32), "all_reduce", 2**30, 512, 64)
    assert across / free == pytest.approx(2.0, rel=0.05)  # NIC-bound: half the bandwidth
    # without leaf_nodes every group pays it, as before
    assert _t(FabricSpec(oversubscription=2.0), "all_reduce", 2**30, 64, 8) > 1.9 * under


def test_all_to_all_across_pods_hand_derived():
    """EP over 8 nodes x 8 GPUs in two pods of 4 nodes, 1:4 above them. Per GPU the model
    prices the off-node 7/8 of 1 GiB at the NIC rate. Half of each GPU's bytes go to the
    32 ranks of the other pod, and the pod's 32 GPUs share uplinks worth 32 x NIC / 4:
    0.5 GiB / (NIC / 4) = 2 GiB / NIC, which the NIC-bound time times System.slowdown's
    16/7 reproduces."""
    system = _system(FabricSpec(pod_nodes=4, pod_oversubscription=4.0), num_nodes=8)
    model = AnalyticalCostModel(system)
    gib = 2**30
    t = model.predict(Op(op="all_to_all", bytes=gib, ranks=64, nodes=8))
    p = arch_params("hopper").collectives
    nic = 50e9 * p.network_efficiency
    assert t == pytest.approx(gib * 7 / 8 / nic, rel=0.01)  # NIC-bound
    factor = system.slowdown(range(8), "all_to_all")
    assert factor == pytest.approx(16 / 7)
    assert t * factor == pytest.approx((gib / 2) / (nic / 4), rel=0.01)
    # the same ranks inside one pod: no uplinks, no factor
    assert system.slowdown(range(4), "all_to_all") == 1.0


def test_ring_across_pods_bandwidth_bound_slowdown():
    """DP of 8 ranks, one node per pod (stride = a pod): the bandwidth-bound ring runs
    at 1/7 of the NIC rate; its time times the factor is the uplink-bound time."""
    system = _system(FabricSpec(pod_nodes=384, pod_oversubscription=7.0))
    model = AnalyticalCostModel(system)
    gib = 2**30
    t = model.predict(Op(op="all_reduce", bytes=gib, ranks=8, nodes=8))
    nic = 50e9 * arch_params("hopper").collectives.network_efficiency
    bus = 2 * 7 / 8 * gib
    assert t == pytest.approx(bus / nic, rel=0.02)
    assert t * system.slowdown(range(0, 3072, 384)) == pytest.approx(bus / (nic / 7), rel=0.02)
    assert system.slowdown(range(8)) == 1.0  # the same ring inside one pod
