"""NCCL collectives: alpha-beta per algorithm and protocol, NVLink vs network.

``bytes`` follows nccl-tests' "size": the buffer each rank holds (all_reduce), the
gathered output (all_gather), the input to scatter (reduce_scatter), each rank's
whole send buffer (all_to_all), the message (send_recv). Bus bytes per rank use
nccl-tests' factors (PERFORMANCE.md): all_reduce 2(n-1)/n, all_gather and
reduce_scatter (n-1)/n, all_to_all (n-1)/n, send_recv 1.

Bandwidth: inside a node each GPU drives its fabric port (NVSwitch, PCIe) at
``intra_node_gb_per_s`` x efficiency; in a full xGMI mesh (MI300X) a group of r ranks
uses only its r - 1 direct peer links. A ring that spans nodes runs one channel per
local rank, each leaving its node through that rank's NIC(s), so its bus bandwidth is
min(fabric, ranks_per_node x NICs per GPU x NIC bandwidth) (NCCL's rail-aligned rings).
All-to-all sends the off-node share through each GPU's own NICs.

Latency: NCCL's tuning model (src/graph/tuning.cc): a base latency per protocol plus
a per-step hardware latency, NVLink steps and network steps priced separately; ring
all-reduce has 2(n-1) steps, all-gather / reduce-scatter n-1; a tree all-reduce across
nodes has 2 log2(nodes) network steps. NCCL picks the fastest algorithm and protocol
(LL, LL128, Simple) per size; so does this model, over ring, tree and a hierarchical
(intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather) all-reduce.

The fabric (``system.fabric``, :class:`~hardware_specs.schema.FabricSpec`). This model
knows how many nodes a group spans, not which: it assumes they are consecutive from a
leaf and pod boundary (Megatron rank order). On that assumption:

- Hops. NCCL's network step latency is one constant (efficiency.yaml, tuning.cc
  hwLat[NET]); links.yaml reads it as the NIC plus ``NCCL_NET_HOPS`` = 3 switches
  (leaf, spine, leaf). Each network step here costs that plus (hops - 3) x
  ``switch_latency_us``, with hops from :func:`~hardware_specs.topology.contiguous_hops`:
  1 for a group under one leaf (``leaf_nodes``), ``switch_hops`` across leaves, plus
  ``pod_switch_hops`` for a group larger than a pod. A ring step lasts as long as its
  slowest hop, so one path through the spine prices every step at ``switch_hops``.
- Leaf oversubscription divides the NIC bandwidth (as before) unless the group sits
  under one leaf, where no traffic takes an uplink.
- Rail-optimized fabrics (NIC i of each node on leaf i): rings, trees and send/recv
  between the same local rank stay on their rail (NCCL builds them so). All-to-all
  bytes for another local rank take NCCL's PXN path (on by default since NCCL 2.12;
  NVIDIA blog "Doubling all2all performance with NCCL 2.12", 2022): NVLink to the local
  GPU on the destination's rail, then that rail, so they stay on one leaf too, at the
  cost of an NVLink hop and of (rpn - 1) / rpn of the off-node bytes crossing NVLink
  once more. Top-of-rack fabrics (fat-tree, two-level) put all of a node's NICs on one
  leaf: no relay, and ``leaf_nodes`` is a rack.
- Pods: which nodes a group spans decides how much of it crosses the oversubscribed
  uplinks above the pods, and its copies on other nodes share them; that is placement,
  so :meth:`~hardware_specs.registry.System.slowdown` prices it for the simulator (a
  factor on these times), not this model.
"""

from __future__ import annotations

import numpy as np

from costmodels.ops.common import Work
from costmodels.ops.params import CollectiveParams, ProtocolParams
from hardware_specs.registry import System
from hardware_specs.topology import contiguous_hops, within_leaf

# Switch hops inside NCCL's per-step network latency (see the module doc).
NCCL_NET_HOPS = 3

BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: np.ones_like(n),
}


def collective_work(
    kind: np.ndarray,
    nbytes: np.ndarray,
    ranks: np.ndarray,
    nodes: np.ndarray,
    system: System,
    p: CollectiveParams,
) -> Work:
    n = np.where(np.isnan(ranks), 2.0, ranks)
    nodes = np.where(np.isnan(nodes), 1.0, nodes)
    rpn = n / nodes  # ranks per node
    node = system.node
    fab = system.fabric
    nic_bw = system.nic.bytes_per_s * node.nics_per_gpu * p.network_efficiency
    # leaf uplinks are oversubscribed; a group under one leaf never takes them
    nic_bw = np.where(within_leaf(fab, nodes), nic_bw, nic_bw / fab.oversubscription)
    # switches on the slowest path beyond the 3 that NCCL's network latency holds
    hop_s = (contiguous_hops(fab, nodes) - NCCL_NET_HOPS) * fab.switch_latency_s

    def net_lat(proto: ProtocolParams) -> np.ndarray:
        return np.maximum(proto.net_step_latency_s + hop_s, 0.0)

    intra_eff = np.full(len(kind), 0.75)
    for name in np.unique(kind):
        intra_eff[kind == name] = p.intra_node_efficiency.get(str(name), 0.75)
    fabric = node.intra_node_bytes_per_s * intra_eff
    if not node.switched and system.intra_link.kind == "xgmi":
        # full mesh: a group of r ranks in a node reaches its peers over r - 1 direct links
        per_link = system.intra_link.bytes_per_s * intra_eff
        fabric = np.minimum(fabric, np.maximum(rpn - 1, 1) * per_link)
    multi = nodes > 1
    ring_bw = np.where(multi, np.minimum(fabric, rpn * nic_bw), fabric)

    factor = np.zeros(len(kind))
    for name, fn in BUS_FACTOR.items():
        mask = kind == name
        factor[mask] = fn(n[mask])
    bus_bytes = factor * nbytes

    # steps of the ring (inter-node steps cross the network)
    is_ar = kind == "all_reduce"
    steps_total = np.where(is_ar, 2.0 * (n - 1), n - 1)
    net_steps = np.where(is_ar, 2.0 * (nodes - 1), nodes - 1)
    nvl_steps = steps_total - net_steps

    best = np.full(len(kind), np.inf)
    for proto in p.protocols.values():
        lat_ring = (
            proto.base_latency_s + nvl_steps * proto.step_latency_s + net_steps * net_lat(proto)
        )
        t_ring = lat_ring + bus_bytes / (ring_bw * proto.bandwidth_fraction)
        best = np.minimum(best, t_ring)
        # tree all-reduce across nodes: chain inside the node, binary tree across nodes
        tree_lat = proto.base_latency_s + 2.0 * (
            (rpn - 1) * proto.step_latency_s
            + np.ceil(np.log2(np.maximum(nodes, 1))) * net_lat(proto)
        )
        t_tree = tree_lat + bus_bytes / (ring_bw * proto.bandwidth_fraction)
        best = np.where(is_ar & multi, np.minimum(best, t_tree), best)

    # hierarchical all-reduce across nodes: reduce-scatter inside each node, all-reduce of
    # each GPU's 1/rpn shard across nodes over its own NIC(s), all-gather inside the node
    # (the 2D scheme of Jia et al. 2018 / NCCL's CollNet chain shape).
    hier = is_ar & multi & (rpn > 1)
    if hier.any():
        shard = nbytes / rpn
        intra_bus = 2.0 * (rpn - 1) / rpn * nbytes  # RS + AG inside the node
        inter_bus = 2.0 * (nodes - 1) / nodes * shard
        for proto in p.protocols.values():
            bw = proto.bandwidth_fraction
            t_hier = (
                2.0 * proto.base_latency_s
                + 2.0 * (rpn - 1) * proto.step_latency_s
                + 2.0 * (nodes - 1) * net_lat(proto)
                + intra_bus / (fabric * bw)
                + inter_bus / (nic_bw * bw)
            )
            best = np.where(hier, np.minimum(best, t_hier), best)

    # all-to-all: on-node and off-node shares move concurrently over different links
    a2a = kind == "all_to_all"
    simple = p.protocols.get("Simple", next(iter(p.protocols.values())))
    on_bytes = nbytes * (rpn - 1) / n
    off_bytes = nbytes * (n - rpn) / n
    a2a_lat = p.all_to_all_latency_s + multi * net_lat(simple)
    if fab.topology == "rail-optimized":
        # PXN: off-node bytes for another local rank cross NVLink to the GPU on the
        # destination's rail first (an extra NVLink hop, NVLink bytes added)
        relay = multi & (rpn > 1)
        on_bytes = on_bytes + np.where(relay, off_bytes * (rpn - 1) / rpn, 0.0)
        a2a_lat = a2a_lat + np.where(relay, simple.step_latency_s, 0.0)
    on_node = on_bytes / fabric
    off_node = off_bytes / nic_bw
    best = np.where(a2a, a2a_lat + np.maximum(on_node, off_node), best)

    # send/recv between two ranks: one link, NVLink/fabric or one GPU's NIC(s)
    p2p = kind == "send_recv"
    p2p_bw = np.where(multi, nic_bw, fabric)
    p2p_lat = p.send_recv_latency_s + np.where(multi, net_lat(simple), 0.0)
    best = np.where(p2p, p2p_lat + nbytes / p2p_bw, best)

    time_s = np.where(n <= 1, 0.0, p.launch_s + best)
    return Work(time_s=time_s, flops=np.zeros(len(kind)), bytes=np.where(n <= 1, 0.0, bus_bytes))
