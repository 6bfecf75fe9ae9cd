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
"""

from __future__ import annotations

import numpy as np

from costmodels.ops.common import Work
from costmodels.ops.params import CollectiveParams
from hardware_specs.registry import System

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
    nic_bw = system.nic.bytes_per_s * node.nics_per_gpu * p.network_efficiency
    nic_bw = nic_bw / system.fabric.oversubscription

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
            proto.base_latency_s
            + nvl_steps * proto.step_latency_s
            + net_steps * proto.net_step_latency_s
        )
        t_ring = lat_ring + bus_bytes / (ring_bw * proto.bandwidth_fraction)
        best = np.minimum(best, t_ring)
        # tree all-reduce across nodes: chain inside the node, binary tree across nodes
        tree_lat = proto.base_latency_s + 2.0 * (
            (rpn - 1) * proto.step_latency_s
            + np.ceil(np.log2(np.maximum(nodes, 1))) * proto.net_step_latency_s
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
                + 2.0 * (nodes - 1) * proto.net_step_latency_s
                + intra_bus / (fabric * bw)
                + inter_bus / (nic_bw * bw)
            )
            best = np.where(hier, np.minimum(best, t_hier), best)

    # all-to-all: on-node and off-node shares move concurrently over different links
    a2a = kind == "all_to_all"
    simple = p.protocols.get("Simple", next(iter(p.protocols.values())))
    on_node = nbytes * (rpn - 1) / n / fabric
    off_node = nbytes * (n - rpn) / n / nic_bw
    a2a_lat = p.all_to_all_latency_s + multi * simple.net_step_latency_s
    best = np.where(a2a, a2a_lat + np.maximum(on_node, off_node), best)

    # send/recv between two ranks: one link, NVLink/fabric or one GPU's NIC(s)
    p2p = kind == "send_recv"
    p2p_bw = np.where(multi, nic_bw, fabric)
    p2p_lat = p.send_recv_latency_s + np.where(multi, simple.net_step_latency_s, 0.0)
    best = np.where(p2p, p2p_lat + nbytes / p2p_bw, best)

    time_s = np.where(n <= 1, 0.0, p.launch_s + best)
    return Work(time_s=time_s, flops=np.zeros(len(kind)), bytes=np.where(n <= 1, 0.0, bus_bytes))
