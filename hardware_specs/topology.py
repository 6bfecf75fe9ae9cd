"""Where a group of nodes sits in the fabric: leaves, pods, and how much slower its
scale-out traffic runs when it leaves a pod (a bandwidth ratio, not a time).

Two questions, answered for one group or for arrays of groups (the plan search prices
thousands at once):

- :func:`contiguous_hops`: switch hops of the longest path among ``n`` consecutive nodes
  that start on a leaf and pod boundary (what the placement-free collective model
  assumes: Megatron rank order puts a group's nodes next to each other).
- :func:`pod_factor_many` / :func:`pod_factor_of_nodes`: how much slower a collective
  among given nodes runs because part of it crosses the oversubscribed uplinks above
  the pods, relative to the per-GPU NIC bandwidth the cost models assume.

The pod model. Training is SPMD: when one DP (or CP, EP) group runs a collective, so do
its copies on the other local ranks, the other DP offsets and the other stages, on the
same or neighbouring nodes; every NIC of those nodes carries one flow. A pod of P nodes
has uplinks for P / pod_oversubscription nodes' worth of NIC bandwidth (Llama 3,
arXiv:2407.21783 sec. 3.3.1: 3,072-GPU pods, 1:7 above them). The question is how many
of a pod's NIC flows leave the pod at once:

- Rings (all-reduce, all-gather, reduce-scatter; NCCL's trees too, which also follow
  the rank order of nodes) and send/recv: a ring over nodes in rank order leaves a pod
  once, from the last of its nodes in that pod (its closing hop leaves the last pod).
  Its copies interleaved with it - a group of node stride s has s of them, one per
  offset - leave at the same boundary, so s of the pod's P nodes send through the
  uplinks: share = min(1, s / P). A ring is as fast as its slowest hop, and the uplink
  gives each crossing flow P / (pod_oversubscription x s) of a NIC, so the whole ring
  slows by max(1, pod_oversubscription x min(1, s / P)). A group with one node per pod
  (s >= P, e.g. DP outermost across pods) runs every hop through the uplinks: the full
  pod_oversubscription; a large contiguous group crossing a boundary or two (s = 1)
  barely loads them (a ring needs little bisection bandwidth).
  For send/recv between pipeline stages the copies are the stage's nodes (every rank
  of a stage sends to its peer in the next): pass ``concurrent_nodes``.
- All-to-all: every rank sends (c - c_p) / (c - 1) of its off-node bytes out of its
  pod p (c nodes in the group, c_p of them in pod p), and every node of the group's
  family in the pod (min(P, s x c_p) nodes) does so at once, so the uplinks carry
  x_p x min(P, s x c_p) / P of the pod's NIC bandwidth: factor max over pods of
  max(1, pod_oversubscription x x_p x min(P, s x c_p) / P).

Not modelled: ECMP hash collisions on the uplinks (Llama 3 sec. 3.3.1 and Alibaba HPN,
Qian et al. SIGCOMM'24, design around them), traffic of other jobs, a pod-level
hierarchical all-reduce (NCCL does not build one). A partial last pod is priced as if
its uplinks were a full pod's share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from hardware_specs.schema import FabricSpec

RING_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
KINDS = (*RING_KINDS, "all_to_all")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; allowed: {', '.join(KINDS)}")


def pod_of(fabric: FabricSpec, node: int) -> int:
    """Pod of node ``node`` (rank order; 0 for every node without pods)."""
    return 0 if fabric.pod_nodes is None else int(node) // fabric.pod_nodes


def within_leaf(fabric: FabricSpec, nodes: np.ndarray) -> np.ndarray:
    """True where ``nodes`` consecutive nodes from a leaf boundary share one leaf."""
    nodes = np.asarray(nodes, dtype=float)
    if fabric.leaf_nodes is None:
        return np.zeros(nodes.shape, dtype=bool)
    return nodes <= fabric.leaf_nodes


def contiguous_hops(fabric: FabricSpec, nodes: np.ndarray) -> np.ndarray:
    """Switch hops of the longest path among ``nodes`` consecutive nodes that start on a
    leaf and pod boundary: 1 under one leaf, ``switch_hops`` across leaves, plus
    ``pod_switch_hops`` once the group is larger than a pod (it must leave one)."""
    nodes = np.asarray(nodes, dtype=float)
    hops = np.where(within_leaf(fabric, nodes), 1.0, float(fabric.switch_hops))
    if fabric.pod_nodes is not None:
        hops = hops + np.where(nodes > fabric.pod_nodes, float(fabric.pod_switch_hops), 0.0)
    return hops


def pod_factor_many(
    fabric: FabricSpec,
    first_node: np.ndarray,
    node_stride: np.ndarray,
    node_count: np.ndarray,
    kind: str = "all_reduce",
    concurrent_nodes: np.ndarray | float | None = None,
) -> np.ndarray:
    """Slow-down from the pod uplinks of groups whose nodes are ``first_node + i *
    node_stride`` for ``i < node_count`` (arrays broadcast together; see the module doc
    for the rules). ``concurrent_nodes``: nodes whose NICs run copies of the group's
    crossing traffic at once (default ``node_stride``: its interleaved copies)."""
    _check_kind(kind)
    first = np.asarray(first_node, dtype=np.int64)
    stride = np.maximum(np.asarray(node_stride, dtype=np.int64), 1)
    count = np.asarray(node_count, dtype=np.int64)
    first, stride, count = np.broadcast_arrays(first, stride, count)
    out = np.ones(first.shape)
    if not fabric.pods_oversubscribed or first.size == 0:
        return out
    pods_n = int(fabric.pod_nodes)  # type: ignore[arg-type]
    ratio = fabric.pod_oversubscription
    conc = stride if concurrent_nodes is None else np.asarray(concurrent_nodes, dtype=float)
    conc = np.broadcast_to(np.maximum(conc, 1.0), first.shape).astype(float)
    last = first + (np.maximum(count, 1) - 1) * stride
    spans = (count >= 2) & (first // pods_n != last // pods_n)
    if kind in RING_KINDS:
        share = np.minimum(1.0, conc / pods_n)
        return np.where(spans, np.maximum(1.0, ratio * share), 1.0)
    # all-to-all: the busiest pod's uplinks
    worst = np.zeros(first.shape)
    c = count.astype(float)
    for p in range(int(np.min(first // pods_n)), int(np.max(last // pods_n)) + 1):
        lo, hi = p * pods_n, (p + 1) * pods_n
        before = np.clip(-(-(lo - first) // stride), 0, count)  # nodes below the pod
        upto = np.clip(-(-(hi - first) // stride), 0, count)  # nodes below its end
        c_p = (upto - before).astype(float)
        fam = np.minimum(float(pods_n), conc * c_p)
        x = np.where(c > 1, (c - c_p) / np.maximum(c - 1, 1), 0.0)
        worst = np.maximum(worst, np.where(c_p > 0, ratio * x * fam / pods_n, 0.0))
    return np.where(spans, np.maximum(1.0, worst), 1.0)


def pod_factor_of_nodes(
    fabric: FabricSpec,
    nodes: Sequence[int] | range,
    kind: str = "all_reduce",
    concurrent_nodes: float | None = None,
) -> float:
    """:func:`pod_factor_many` for one group given as node indices (any order, repeats
    allowed); its node stride is the mean gap between its sorted distinct nodes."""
    _check_kind(kind)
    if not fabric.pods_oversubscribed:
        return 1.0
    distinct = sorted({int(n) for n in nodes})
    if len(distinct) < 2:
        return 1.0
    pods_n = int(fabric.pod_nodes)  # type: ignore[arg-type]
    per_pod = Counter(n // pods_n for n in distinct)
    if len(per_pod) < 2:
        return 1.0
    c = len(distinct)
    stride = max(1.0, (distinct[-1] - distinct[0]) / (c - 1))
    conc = max(1.0, stride if concurrent_nodes is None else float(concurrent_nodes))
    ratio = fabric.pod_oversubscription
    if kind in RING_KINDS:
        return max(1.0, ratio * min(1.0, conc / pods_n))
    worst = max(
        ratio * (c - c_p) / (c - 1) * min(float(pods_n), conc * c_p) / pods_n
        for c_p in per_pod.values()
    )
    return max(1.0, worst)
