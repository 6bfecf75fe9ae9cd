"""pydantic schemas for GPUs, links, nodes and clusters.

Spec files carry friendly units in their key names (``_gb_per_s``, ``_tflops``,
``_gib``); the properties ending in ``_bytes``, ``_bytes_per_s``, ``_flops_per_s``
and ``_s`` convert them once into SI for the rest of the code (DESIGN.md, units).
Every number in a spec must name its source in ``sources`` (a test enforces it).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GIB = 1024**3
MIB = 1024**2
KIB = 1024
GB = 1e9
TERA = 1e12
US = 1e-6


class Dtype(StrEnum):
    """Numeric formats a kernel can run in; ``tf32`` is fp32 storage on tensor cores."""

    fp64 = "fp64"
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"


# Storage bytes per element (tf32 is fp32 storage on tensor cores).
DTYPE_BYTES: dict[Dtype, int] = {
    Dtype.fp64: 8,
    Dtype.fp32: 4,
    Dtype.tf32: 4,
    Dtype.bf16: 2,
    Dtype.fp16: 2,
    Dtype.fp8: 1,
    Dtype.int8: 1,
}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sourced(_Frozen):
    """A spec whose every numeric field cites where it came from."""

    sources: dict[str, str] = Field(
        default_factory=dict,
        description="field name -> citation (datasheet, whitepaper, measurement)",
    )

    @model_validator(mode="after")
    def _sources_name_fields(self) -> _Sourced:
        unknown = set(self.sources) - set(type(self).model_fields)
        if unknown:
            raise ValueError(f"sources name unknown fields: {sorted(unknown)}")
        return self

    def unsourced_numbers(self) -> list[str]:
        """Numeric fields set to a value but without a citation."""
        missing = []
        for name in type(self).model_fields:
            if name == "sources" or name not in self.model_fields_set:
                continue  # schema defaults are not claims a spec file makes
            value = getattr(self, name)
            numeric = isinstance(value, int | float | dict) and not isinstance(value, bool)
            if numeric and value and name not in self.sources:
                missing.append(name)
        return missing


class GpuSpec(_Sourced):
    """One accelerator model. Peak rates are dense (no 2:4 sparsity) unless named sparse."""

    id: str = Field(description="stable id, e.g. h100-sxm")
    name: str
    vendor: Literal["nvidia", "amd"]
    architecture: Literal["ampere", "ada", "hopper", "blackwell", "cdna3"]
    form_factor: Literal["sxm", "pcie", "oam"]
    sm_count: int = Field(
        gt=0, description="streaming multiprocessors (NVIDIA) or compute units (AMD)"
    )
    boost_clock_mhz: float = Field(gt=0, description="max boost clock the peak rates assume")
    memory_gib: float = Field(gt=0, description="device memory capacity")
    memory_type: str
    memory_bandwidth_gb_per_s: float = Field(gt=0, description="peak DRAM bandwidth, decimal GB/s")
    l2_cache_mib: float = Field(gt=0)
    smem_per_sm_kib: float = Field(gt=0, description="max shared memory (configurable L1) per SM")
    peak_dense_tflops: dict[Dtype, float] = Field(
        description="dense peak TFLOP/s (TOP/s for int8) per dtype; fp64/fp32 on tensor cores "
        "where the vendor quotes that as the headline rate"
    )
    sparse_speedup: float = Field(
        default=1.0,
        ge=1.0,
        description="2:4 structured-sparsity speedup over dense (2.0 if supported)",
    )
    sfu_ops_per_clk_per_sm: float = Field(
        gt=0, description="special-function (exp2) throughput per SM per clock, for softmax cost"
    )
    tdp_w: float = Field(gt=0)
    nvlink_gb_per_s: float = Field(
        default=0.0,
        ge=0,
        description="total GPU-to-GPU bandwidth per direction (NVLink/xGMI), 0 if none",
    )
    pcie_gen: int = Field(ge=3, le=6)

    @field_validator("peak_dense_tflops")
    @classmethod
    def _positive_rates(cls, rates: dict[Dtype, float]) -> dict[Dtype, float]:
        for dtype, value in rates.items():
            if value <= 0:
                raise ValueError(f"peak_dense_tflops[{dtype}] must be > 0, got {value}")
        if Dtype.bf16 not in rates and Dtype.fp16 not in rates:
            raise ValueError("peak_dense_tflops needs at least bf16 or fp16")
        return rates

    # --- SI views -----------------------------------------------------------------------
    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gb_per_s * GB

    @property
    def l2_bytes(self) -> float:
        return self.l2_cache_mib * MIB

    @property
    def smem_per_sm_bytes(self) -> float:
        return self.smem_per_sm_kib * KIB

    @property
    def clock_hz(self) -> float:
        return self.boost_clock_mhz * 1e6

    @property
    def sfu_ops_per_s(self) -> float:
        return self.sfu_ops_per_clk_per_sm * self.sm_count * self.clock_hz

    @property
    def nvlink_bytes_per_s(self) -> float:
        return self.nvlink_gb_per_s * GB

    def supports(self, dtype: Dtype | str) -> bool:
        return Dtype(dtype) in self.peak_dense_tflops

    def peak_flops_per_s(self, dtype: Dtype | str) -> float:
        """Dense peak for ``dtype``; raises with the supported list if the GPU lacks it."""
        dtype = Dtype(dtype)
        if dtype not in self.peak_dense_tflops:
            allowed = ", ".join(sorted(d.value for d in self.peak_dense_tflops))
            raise ValueError(f"{self.id} has no {dtype.value} rate; supported: {allowed}")
        return self.peak_dense_tflops[dtype] * TERA


LinkKind = Literal["nvlink", "nvswitch", "xgmi", "pcie", "infiniband", "roce", "ethernet"]


class LinkSpec(_Sourced):
    """A point-to-point link or network port. Bandwidth is per direction, decimal GB/s."""

    id: str
    name: str
    kind: LinkKind
    bandwidth_gb_per_s: float = Field(gt=0, description="per direction, per port or per GPU")
    latency_us: float = Field(gt=0, description="one-way small-message latency")

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gb_per_s * GB

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class NodeSpec(_Sourced):
    """A vendor reference node: GPUs, their intra-node fabric and NICs."""

    id: str
    name: str
    gpu: str = Field(description="GpuSpec id")
    gpus_per_node: int = Field(gt=0)
    intra_node_link: str = Field(description="LinkSpec id of the GPU-to-GPU fabric")
    intra_node_gb_per_s: float = Field(
        gt=0, description="GPU-to-GPU bandwidth per GPU per direction through that fabric"
    )
    switched: bool = Field(description="True for NVSwitch/full crossbar, False for rings/meshes")
    nic: str = Field(description="LinkSpec id of the scale-out NIC")
    nics_per_gpu: float = Field(gt=0)
    host_link: str = Field(description="LinkSpec id of the GPU-host link (PCIe gen)")

    @property
    def intra_node_bytes_per_s(self) -> float:
        return self.intra_node_gb_per_s * GB


class FabricSpec(_Sourced):
    """Scale-out network between nodes: leaves, spines and, optionally, pods.

    A path between two nodes takes ``switch_hops`` switches (leaf, spine, leaf) unless
    both sit under one leaf (``leaf_nodes``: 1 hop). In a ``rail-optimized`` fabric the
    NIC of local rank i of every node in a leaf group goes to leaf i (NVIDIA DGX SuperPOD
    H100 reference architecture: one leaf per rail per scalable unit of 32 nodes), so
    rings that keep to one local rank (what NCCL builds across nodes) stay on that
    leaf; traffic between different local ranks first crosses NVLink to the GPU on the
    destination's rail (NCCL PXN, on by default since 2.12). In ``fat-tree`` and
    ``two-level`` (top-of-rack) fabrics all of a node's NICs sit on one leaf, and a
    leaf holds one rack's nodes.

    Pods (``pod_nodes``): nodes fill pods in rank order (node k is in pod
    k // pod_nodes; the last pod may be partial). Inside a pod the fabric is as above
    (``oversubscription`` at the leaves, 1.0 = full bisection); traffic leaving a pod
    shares uplinks with ``pod_oversubscription`` times less bandwidth than the pod's
    NICs and ``pod_switch_hops`` more switches (Llama 3, arXiv:2407.21783 sec. 3.3.1:
    24K GPUs on a three-layer Clos, pods of 3,072 GPUs with full bisection bandwidth,
    1:7 oversubscription at the aggregation layer between pods). Without pods the
    cluster is one pod and every field keeps its old meaning."""

    topology: Literal["fat-tree", "rail-optimized", "two-level"] = "fat-tree"
    oversubscription: float = Field(
        default=1.0, ge=1.0, description="at the leaf uplinks, inside a pod; 1.0 = non-blocking"
    )
    switch_hops: int = Field(
        default=3, ge=1, description="switch hops between nodes under different leaves of a pod"
    )
    switch_latency_us: float = Field(default=0.6, gt=0)
    leaf_nodes: int | None = Field(
        default=None,
        gt=0,
        description="nodes one leaf reaches (rail-optimized: a rail group, e.g. a DGX "
        "SuperPOD scalable unit of 32; top-of-rack: one rack); paths among them take 1 "
        "switch hop and no leaf uplink. None: every path takes switch_hops",
    )
    pod_nodes: int | None = Field(
        default=None,
        gt=0,
        description="nodes per pod, in rank order (last pod may be partial); None: one pod",
    )
    pod_oversubscription: float = Field(
        default=1.0,
        ge=1.0,
        description="pod NIC bandwidth over pod uplink bandwidth (7.0 for Llama 3's 1:7)",
    )
    pod_switch_hops: int = Field(
        default=2, ge=0, description="extra switch hops of a path between pods (up and down)"
    )

    @model_validator(mode="after")
    def _pods(self) -> FabricSpec:
        if self.pod_oversubscription > 1.0 and self.pod_nodes is None:
            raise ValueError(
                f"pod_oversubscription {self.pod_oversubscription} needs pod_nodes (nodes "
                "per pod); allowed: pod_nodes > 0 with it, or pod_oversubscription 1.0"
            )
        leaf, pod = self.leaf_nodes, self.pod_nodes
        if leaf is not None and pod is not None and pod % leaf:
            raise ValueError(
                f"pod_nodes {pod} is not a whole number of leaf groups of leaf_nodes {leaf}; "
                "allowed: pod_nodes a multiple of leaf_nodes"
            )
        return self

    @property
    def switch_latency_s(self) -> float:
        return self.switch_latency_us * US

    @property
    def pods_oversubscribed(self) -> bool:
        """Pods whose uplinks are slower than their NICs (else pods cost only hops)."""
        return self.pod_nodes is not None and self.pod_oversubscription > 1.0


class NodeGroup(_Frozen):
    """``num_nodes`` nodes of one NodeSpec inside a heterogeneous cluster (Holmes, Yang
    et al. 2024: node groups with different NICs training one model)."""

    node: str = Field(description="NodeSpec id")
    num_nodes: int = Field(gt=0)


class ClusterSpec(_Frozen):
    """``num_nodes`` nodes on one fabric: identical nodes, or node groups (same GPU,
    different NICs), optionally with measured per-node NIC bandwidths (Pipette, Yim et al.
    2024: real links differ from their spec and the slow ones bound every ring)."""

    name: str
    node: str = Field(description="NodeSpec id (of the first group when groups are given)")
    num_nodes: int = Field(gt=0)
    fabric: FabricSpec = FabricSpec()
    node_groups: list[NodeGroup] = Field(
        default_factory=list, description="groups in rank order; sum of num_nodes = num_nodes"
    )
    measured_nic_gb_per_s: list[float] | None = Field(
        default=None,
        description="measured scale-out bandwidth per GPU of each node, decimal GB/s, in "
        "rank order (num_nodes entries); overrides the NIC spec",
    )

    @model_validator(mode="after")
    def _groups(self) -> ClusterSpec:
        if self.node_groups:
            total = sum(g.num_nodes for g in self.node_groups)
            if total != self.num_nodes:
                raise ValueError(
                    f"cluster {self.name}: node_groups hold {total} nodes, num_nodes is "
                    f"{self.num_nodes}; allowed: groups summing to num_nodes"
                )
            if self.node_groups[0].node != self.node:
                raise ValueError(
                    f"cluster {self.name}: node must be the first group's node "
                    f"({self.node_groups[0].node!r})"
                )
        measured = self.measured_nic_gb_per_s
        if measured is not None and (
            len(measured) != self.num_nodes or any(x <= 0 for x in measured)
        ):
            raise ValueError(
                f"cluster {self.name}: measured_nic_gb_per_s needs {self.num_nodes} "
                f"positive entries (one per node), got {len(measured)}"
            )
        return self


class HardwareFile(_Frozen):
    """A user spec file (``--hardware FILE``): entries added to, or replacing, the built-ins."""

    gpus: list[GpuSpec] = []
    links: list[LinkSpec] = []
    nodes: list[NodeSpec] = []
    clusters: list[ClusterSpec] = []

    @model_validator(mode="after")
    def _unique_ids(self) -> HardwareFile:
        for section, key in (
            ("gpus", "id"),
            ("links", "id"),
            ("nodes", "id"),
            ("clusters", "name"),
        ):
            seen: set[str] = set()
            for entry in getattr(self, section):
                ident = getattr(entry, key)
                if ident in seen:
                    raise ValueError(f"{section}: {key} {ident!r} appears more than once")
                seen.add(ident)
        return self
