"""Pods, leaves and rails in cluster files, and the slow-down of traffic leaving a pod."""

from pathlib import Path

import numpy as np
import pytest
import yaml

from hardware_specs.registry import SpecError, builtin_catalog, load_catalog, load_hardware_file
from hardware_specs.schema import ClusterSpec, FabricSpec
from hardware_specs.topology import contiguous_hops, pod_factor_many, pod_factor_of_nodes

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "clusters").glob("*.yaml"))

# Llama 3's layout (arXiv:2407.21783 sec. 3.3.1): pods of 384 8-GPU nodes, 1:7 above.
LLAMA3 = FabricSpec(pod_nodes=384, pod_oversubscription=7.0)


def _system(fabric: FabricSpec, num_nodes: int = 3072, **cluster):
    spec = ClusterSpec(name="c", node="dgx-h100", num_nodes=num_nodes, fabric=fabric, **cluster)
    return builtin_catalog().system_for_cluster(spec)


def test_old_files_and_defaults_mean_one_pod():
    fabric = FabricSpec()
    assert (fabric.pod_nodes, fabric.pod_oversubscription, fabric.leaf_nodes) == (None, 1.0, None)
    assert not fabric.pods_oversubscribed
    system = _system(fabric, num_nodes=64)
    assert system.pods_spanned(range(64)) == 1
    assert system.pod_of(63) == 0
    assert system.slowdown(range(0, 64, 8)) == 1.0
    assert system.slowdown(range(64), "all_to_all") == 1.0
    assert system.slowdown_many([0, 0], [8, 1], [8, 64]).tolist() == [1.0, 1.0]
    # pods without oversubscription above them cost no bandwidth either
    flat = _system(FabricSpec(pod_nodes=4), num_nodes=64)
    assert flat.pods_spanned(range(64)) == 16
    assert flat.slowdown(range(0, 64, 4)) == 1.0


def test_nodes_fill_pods_in_rank_order_last_pod_partial():
    system = _system(LLAMA3, num_nodes=1000)  # 2 full pods and one of 232 nodes
    assert [system.pod_of(n) for n in (0, 383, 384, 767, 768, 999)] == [0, 0, 1, 1, 2, 2]
    assert system.pods_spanned([0, 383]) == 1
    assert system.pods_spanned([383, 384, 999]) == 3


def test_group_inside_one_pod_pays_nothing():
    system = _system(LLAMA3)
    assert system.slowdown(range(384)) == 1.0  # a whole pod, contiguous
    assert system.slowdown(range(400, 700, 3)) == 1.0  # strided, inside pod 1
    assert system.slowdown(range(384, 768), "all_to_all") == 1.0


def test_ring_with_one_node_per_pod_runs_at_the_uplink_rate():
    """DP outermost across pods: every hop of every copy crosses, so the ring runs at
    1/7 of the NIC rate; half a pod apart, half the pod's NICs cross: 7/2."""
    system = _system(LLAMA3)
    assert system.slowdown(range(0, 3072, 384)) == pytest.approx(7.0)
    assert system.slowdown(range(5, 3072, 384)) == pytest.approx(7.0)
    assert system.slowdown(range(0, 3072, 192)) == pytest.approx(3.5)
    assert system.slowdown(range(0, 768, 16)) == 1.0  # 16 of 384 nodes up: under 1/7
    assert system.slowdown(range(0, 3072, 96)) == pytest.approx(7 * 96 / 384)


def test_contiguous_ring_across_a_boundary_barely_loads_the_uplinks():
    """A ring over consecutive nodes leaves each pod once: one node of 384 sends up."""
    system = _system(LLAMA3)
    assert system.pods_spanned(range(320, 448)) == 2
    assert system.slowdown(range(320, 448)) == 1.0
    assert system.slowdown(range(3072)) == 1.0


def test_pipeline_send_recv_across_pods_counts_the_stage():
    """Every rank of a 128-node stage sends to the next stage at once: a third of the
    pod's NICs through uplinks of a seventh: 7/3."""
    system = _system(LLAMA3)
    assert system.slowdown([256, 384], "send_recv", concurrent_nodes=128) == pytest.approx(7 / 3)
    assert system.slowdown([256, 384], "send_recv") == pytest.approx(7 / 3)  # gap = stage
    assert system.slowdown([0, 128], "send_recv", concurrent_nodes=128) == 1.0  # same pod
    assert system.slowdown([0, 768], "send_recv", concurrent_nodes=768) == pytest.approx(7.0)


def test_all_to_all_sends_the_share_outside_the_pod_across():
    """Hand-derived: pods of 4 nodes, 1:4 above; an EP group over 8 consecutive nodes
    (2 pods). Each rank sends 4 of its 7 off-node shares out of its pod, and all 4
    nodes of each pod do: uplink load 4/7 x 4 = 16/7 of what the NICs alone allow."""
    system = _system(FabricSpec(pod_nodes=4, pod_oversubscription=4.0), num_nodes=16)
    assert system.slowdown(range(8), "all_to_all") == pytest.approx(16 / 7)
    # partial crossing: 6 nodes, 4 in pod 0 and 2 in pod 1. Pod 0: 2 of 5 off-node
    # shares leave, from 4 nodes (4 x 2/5 x 4 / 4 = 1.6); pod 1: 4 of 5, from 2 nodes
    # (4 x 4/5 x 2 / 4 = 1.6).
    assert system.slowdown(range(6), "all_to_all") == pytest.approx(1.6)
    # one node per pod: every off-node byte leaves its pod
    assert system.slowdown([0, 4, 8, 12], "all_to_all") == pytest.approx(4.0)
    # a small group straddling a boundary of large pods hardly loads them
    llama = _system(LLAMA3)
    assert llama.slowdown(range(380, 388), "all_to_all") == 1.0
    assert llama.slowdown(range(768), "all_to_all") == pytest.approx(7 * 384 / 767)


def test_nic_and_pod_limits_combine_by_the_larger():
    fabric = FabricSpec(pod_nodes=4, pod_oversubscription=3.0)
    measured = [50.0] * 7 + [10.0]  # node 7's NICs at a fifth of the spec
    system = _system(fabric, num_nodes=8, measured_nic_gb_per_s=measured)
    assert system.slowdown([3, 7]) == pytest.approx(5.0)  # NIC bound (pod: 3)
    assert system.slowdown([0, 4]) == pytest.approx(3.0)  # pod bound, NICs fine
    assert system.slowdown([0, 1]) == 1.0
    assert system.slowdown_many([3, 0, 0], [4, 4, 1], [2, 2, 2]).tolist() == pytest.approx(
        [5.0, 3.0, 1.0]
    )


@pytest.mark.parametrize("kind", ["all_reduce", "send_recv", "all_to_all"])
def test_vectorised_helper_agrees_with_the_scalar_one(kind):
    rng = np.random.default_rng(7)
    fabric = FabricSpec(pod_nodes=24, pod_oversubscription=5.0)
    measured = list(rng.uniform(20.0, 50.0, 200))
    system = _system(fabric, num_nodes=200, measured_nic_gb_per_s=measured)
    stride = rng.integers(1, 40, 400)
    count = rng.integers(1, 12, 400)
    first = np.array([rng.integers(0, 200 - (c - 1) * s) if (c - 1) * s < 200 else 0
                      for s, c in zip(stride, count, strict=True)])  # fmt: skip
    keep = first + (count - 1) * stride < 200
    first, stride, count = first[keep], stride[keep], count[keep]
    many = system.slowdown_many(first, stride, count, kind)
    groups = [range(f, f + c * s, s) for f, s, c in zip(first, stride, count, strict=True)]
    one = [system.slowdown(g, kind) for g in groups]
    assert many == pytest.approx(one)
    assert (many > 1).any() and (many == 1).any()
    pods_only = pod_factor_many(fabric, first, stride, count, kind, concurrent_nodes=3)
    expect = [pod_factor_of_nodes(fabric, g, kind, concurrent_nodes=3) for g in groups]
    assert pods_only == pytest.approx(expect)


def test_unknown_kind_lists_the_allowed():
    with pytest.raises(ValueError, match="allowed: all_reduce, .*all_to_all"):
        _system(LLAMA3).slowdown([0, 384], "broadcast")


def test_hops_by_leaf_and_pod():
    rail = FabricSpec(topology="rail-optimized", leaf_nodes=32, pod_nodes=384, pod_switch_hops=2)
    assert contiguous_hops(rail, np.array([2, 32, 33, 384, 385])).tolist() == [1, 1, 3, 3, 5]
    assert contiguous_hops(FabricSpec(), np.array([2, 4096])).tolist() == [3, 3]


def _file(tmp_path, fabric):
    data = {"clusters": [{"name": "big", "node": "dgx-h100", "num_nodes": 16, "fabric": fabric}]}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("fabric", "expected"),
    [
        ({"pod_oversubscription": 7.0}, ["clusters[big].fabric", "pod_oversubscription 7.0 "
                                         "needs pod_nodes", "allowed: pod_nodes > 0"]),
        ({"pod_nodes": 0}, ["clusters[big].fabric.pod_nodes", "greater than 0", "(got 0)"]),
        ({"pod_nodes": 384, "leaf_nodes": 5}, ["pod_nodes 384 is not a whole number of leaf",
                                               "allowed: pod_nodes a multiple of leaf_nodes"]),
        ({"pod_oversubscription": 0.5, "pod_nodes": 4}, ["pod_oversubscription",
                                                        "greater than or equal to 1"]),
        ({"leaf_nodes": -1}, ["clusters[big].fabric.leaf_nodes", "greater than 0"]),
        ({"pod_nodes": 4, "pod_switch_hops": -1}, ["pod_switch_hops", "greater than or equal"]),
        ({"pods": 8}, ["clusters[big].fabric.pods", "Extra inputs are not permitted"]),
    ],
)  # fmt: skip
def test_bad_fabric_gives_one_clear_line(tmp_path, fabric, expected):
    with pytest.raises(SpecError) as err:
        load_catalog(_file(tmp_path, fabric))
    message = str(err.value)
    assert "\n" not in message and "Value error" not in message, message
    for fragment in expected:
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_a_partial_last_pod_and_a_pod_larger_than_the_cluster_are_valid(tmp_path):
    for fabric in ({"pod_nodes": 6, "pod_oversubscription": 2.0}, {"pod_nodes": 64}):
        cat = load_catalog(_file(tmp_path, fabric))
        assert cat.system_for_cluster(cat.clusters["big"]).num_gpus == 128


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_cluster_files_resolve_and_cite_their_numbers(path):
    hw = load_hardware_file(path)
    assert len(hw.clusters) == 1  # what --cluster accepts
    cluster = hw.clusters[0]
    system = load_catalog(path).system_for_cluster(cluster)
    assert system.gpu.id == "h100-sxm" and system.num_gpus == 24576
    assert cluster.fabric.unsourced_numbers() == []
    assert all(n.unsourced_numbers() == [] for n in hw.nodes)
    assert system.pods_spanned(range(system.num_nodes)) == 8
    assert system.slowdown(range(0, 3072, 384)) == pytest.approx(7.0)


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"llama3-24k-h100-roce.yaml", "h100-24k-rail-pods.yaml"}
