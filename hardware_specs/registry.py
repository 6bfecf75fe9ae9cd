"""Built-in hardware catalogue, user spec files, and resolving ``--gpu ID --gpus N``.

Built-in data lives in ``data/*.yaml`` in the same format as a user ``--hardware``
file, so one schema validates both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import yaml
from pydantic import ValidationError

from hardware_specs.schema import (
    GB,
    ClusterSpec,
    FabricSpec,
    GpuSpec,
    HardwareFile,
    LinkSpec,
    NodeGroup,
    NodeSpec,
)

if TYPE_CHECKING:  # numpy and the topology load where used: `simcli specs` needs neither
    import numpy as np


class SpecError(ValueError):
    """Unknown id or invalid spec file; the message is one line meant for users."""


# libyaml's parser (same constructor, so the same objects, ~8x faster) for the shipped
# files; users' files keep the pure-Python parser and its error messages
_BUILTIN_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_mapping(path: Path, *, builtin: bool = False) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read hardware file {path}: {exc.strerror or exc}") from exc
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.load(text, Loader=_BUILTIN_LOADER) if builtin else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"hardware file {path} is not valid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"hardware file {path} is not valid YAML{where}: {problem}") from exc
    if not isinstance(data, dict):
        raise SpecError(f"hardware file {path} must be a mapping with gpus/links/nodes/clusters")
    return data


def _validation_line(exc: ValidationError, where: str, data: dict | None = None) -> str:
    """First error as one line, naming the entry by id rather than by list index."""
    err = exc.errors()[0]
    loc = list(err["loc"])
    if data is not None and len(loc) >= 2 and isinstance(loc[1], int):
        try:
            entry = data[loc[0]][loc[1]]
            ident = entry.get("id") or entry.get("name")
        except (KeyError, IndexError, TypeError, AttributeError):
            ident = None
        if ident:
            loc[1] = f"[{ident}]"
    text = ".".join(str(p) for p in loc).replace(".[", "[")
    shown = err.get("input")
    got = "" if err["type"] == "missing" or isinstance(shown, dict | list) else f" (got {shown!r})"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {text}: {msg}{got}"


def load_hardware_file(path: str | Path, *, builtin: bool = False) -> HardwareFile:
    """Parse and validate a spec file; raises :class:`SpecError` with one line.
    ``builtin``: a file shipped with simcli (parsed by libyaml when installed)."""
    path = Path(path)
    data = _read_mapping(path, builtin=builtin)
    try:
        return HardwareFile.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_validation_line(exc, f"hardware file {path}", data)) from exc


@dataclass(frozen=True)
class Catalog:
    """All known GPUs, links, nodes and clusters, keyed by id (read-only views)."""

    gpus: Mapping[str, GpuSpec]
    links: Mapping[str, LinkSpec]
    nodes: Mapping[str, NodeSpec]
    clusters: Mapping[str, ClusterSpec]

    def __post_init__(self) -> None:
        for name in ("gpus", "links", "nodes", "clusters"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def merged(self, extra: HardwareFile, where: str = "") -> Catalog:
        """A new catalogue where ``extra``'s entries add to or replace ours by id."""
        cat = Catalog(
            gpus={**self.gpus, **{g.id: g for g in extra.gpus}},
            links={**self.links, **{lk.id: lk for lk in extra.links}},
            nodes={**self.nodes, **{n.id: n for n in extra.nodes}},
            clusters={**self.clusters, **{c.name: c for c in extra.clusters}},
        )
        cat.check_references(where)
        return cat

    def check_references(self, where: str = "") -> None:
        prefix = f"{where}: " if where else ""
        for node in self.nodes.values():
            if node.gpu not in self.gpus:
                raise SpecError(f"{prefix}node {node.id} names unknown gpu {node.gpu!r}")
            for field in ("intra_node_link", "nic", "host_link"):
                link = getattr(node, field)
                if link not in self.links:
                    raise SpecError(f"{prefix}node {node.id} names unknown {field} {link!r}")
        for cluster in self.clusters.values():
            for node_id in [cluster.node, *(g.node for g in cluster.node_groups)]:
                if node_id not in self.nodes:
                    raise SpecError(
                        f"{prefix}cluster {cluster.name} names unknown node {node_id!r}"
                    )
            gpus = {self.nodes[g.node].gpu for g in cluster.node_groups}
            sizes = {self.nodes[g.node].gpus_per_node for g in cluster.node_groups}
            if len(gpus) > 1 or len(sizes) > 1:
                raise SpecError(
                    f"{prefix}cluster {cluster.name}: node groups must share the GPU and "
                    f"GPUs per node (got {sorted(gpus)}, {sorted(sizes)}); only NICs may differ"
                )

    def gpu(self, gpu_id: str) -> GpuSpec:
        try:
            return self.gpus[gpu_id]
        except KeyError:
            raise SpecError(
                f"unknown GPU {gpu_id!r}; known: {', '.join(sorted(self.gpus))}"
            ) from None

    def link(self, link_id: str) -> LinkSpec:
        try:
            return self.links[link_id]
        except KeyError:
            raise SpecError(
                f"unknown link {link_id!r}; known: {', '.join(sorted(self.links))}"
            ) from None

    def node(self, node_id: str) -> NodeSpec:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise SpecError(
                f"unknown node {node_id!r}; known: {', '.join(sorted(self.nodes))}"
            ) from None

    def reference_node(self, gpu_id: str) -> NodeSpec:
        """The vendor reference node for a GPU (first node listed with that GPU)."""
        self.gpu(gpu_id)
        for node in self.nodes.values():
            if node.gpu == gpu_id:
                return node
        raise SpecError(f"no reference node describes GPU {gpu_id!r}; add one with --hardware")

    def system(self, gpu_id: str, num_gpus: int | None = None) -> System:
        """``--gpu ID --gpus N``: N GPUs in reference nodes on a non-blocking fat-tree."""
        node = self.reference_node(gpu_id)
        if num_gpus is None:
            num_gpus = node.gpus_per_node
        if num_gpus <= 0:
            raise SpecError(f"--gpus must be positive, got {num_gpus}")
        if num_gpus > MAX_GPUS:
            raise SpecError(
                f"--gpus {num_gpus} is beyond any cluster simcli models; allowed: 1..{MAX_GPUS:,}"
            )
        num_nodes = -(-num_gpus // node.gpus_per_node)
        cluster = ClusterSpec(name=f"{num_nodes}x{node.id}", node=node.id, num_nodes=num_nodes)
        return self.system_for_cluster(cluster, num_gpus)

    def system_for_cluster(self, cluster: ClusterSpec, num_gpus: int | None = None) -> System:
        node = self.node(cluster.node)
        total = cluster.num_nodes * node.gpus_per_node
        groups = cluster.node_groups or [NodeGroup(node=cluster.node, num_nodes=cluster.num_nodes)]
        nominal = self.link(node.nic).bytes_per_s * node.nics_per_gpu
        # per-node bandwidths by group (a few entries), expanded to nodes only when they differ
        runs = [
            (self.link(self.node(g.node).nic).bytes_per_s * self.node(g.node).nics_per_gpu,
             g.num_nodes)
            for g in groups
        ]  # fmt: skip
        if cluster.measured_nic_gb_per_s is not None:
            runs = [(x * GB, 1) for x in cluster.measured_nic_gb_per_s]
        uniform = all(abs(bw - nominal) <= 1e-9 * nominal for bw, _ in runs)
        per_node = () if uniform else tuple(bw for bw, n in runs for _ in range(n))
        return System(
            gpu=self.gpu(node.gpu),
            node=node,
            intra_link=self.link(node.intra_node_link),
            nic=self.link(node.nic),
            host_link=self.link(node.host_link),
            num_nodes=cluster.num_nodes,
            num_gpus=total if num_gpus is None else num_gpus,
            fabric=cluster.fabric,
            nic_bytes_per_s_by_node=per_node,
        )


@dataclass(frozen=True)
class System:
    """Everything a cost model needs to know about where an op runs."""

    gpu: GpuSpec
    node: NodeSpec
    intra_link: LinkSpec
    nic: LinkSpec
    host_link: LinkSpec
    num_nodes: int
    num_gpus: int
    fabric: FabricSpec
    # Scale-out bandwidth per GPU of each node (rank order) when nodes differ from the
    # first node's NIC spec (node groups, measured links); empty when all match it.
    nic_bytes_per_s_by_node: tuple[float, ...] = ()

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    @property
    def nominal_nic_bytes_per_s(self) -> float:
        """Per-GPU scale-out bandwidth the cost models assume (the first node's NICs)."""
        return self.nic.bytes_per_s * self.node.nics_per_gpu

    def pod_of(self, node: int) -> int:
        """Pod of node index ``node`` (nodes fill pods in rank order; 0 without pods)."""
        from hardware_specs.topology import pod_of

        return pod_of(self.fabric, node)

    def pods_spanned(self, nodes: Sequence[int] | range) -> int:
        """How many pods the nodes ``nodes`` (indices, rank order) lie in."""
        return len({self.pod_of(n) for n in nodes})

    def nic_slowdown(self, nodes: Sequence[int] | range) -> float:
        """Factor by which the slowest NIC among ``nodes`` is slower than the nominal NIC
        the cost models assume (node groups, measured links; Pipette, Yim et al. 2024)."""
        if not self.nic_bytes_per_s_by_node or len(nodes) < 2:
            return 1.0
        slowest = min(self.nic_bytes_per_s_by_node[n] for n in nodes)
        return self.nominal_nic_bytes_per_s / slowest

    def slowdown(
        self,
        nodes: Sequence[int] | range,
        kind: str = "all_reduce",
        concurrent_nodes: float | None = None,
    ) -> float:
        """Factor by which scale-out traffic of a ``kind`` collective among ``nodes``
        (node indices) is slower than the cost models assume: the larger of the slowest
        NIC on it and the pod uplinks it crosses (:mod:`hardware_specs.topology`). The
        larger, not the product: a ring (or an all-to-all) is bounded by its slowest
        hop, and a hop runs at the lesser of its NIC and its share of the uplink; the
        two limits act on different hops or at once, never one after the other.
        ``concurrent_nodes``: nodes whose NICs carry copies of this traffic at once
        (default: the group's node stride; for send/recv between pipeline stages pass
        the stage's node count)."""
        from hardware_specs.topology import pod_factor_of_nodes

        nic = self.nic_slowdown(nodes)
        return max(nic, pod_factor_of_nodes(self.fabric, nodes, kind, concurrent_nodes))

    def slowdown_many(
        self,
        first_node: np.ndarray,
        node_stride: np.ndarray,
        node_count: np.ndarray,
        kind: str = "all_reduce",
        concurrent_nodes: np.ndarray | float | None = None,
    ) -> np.ndarray:
        """:meth:`slowdown` of groups whose nodes are ``first_node + i * node_stride``,
        ``i < node_count`` (integer arrays, broadcast together), as one array."""
        import numpy as np

        from hardware_specs.topology import pod_factor_many

        first, stride, count = np.broadcast_arrays(
            np.asarray(first_node, dtype=np.int64),
            np.asarray(node_stride, dtype=np.int64),
            np.asarray(node_count, dtype=np.int64),
        )
        out = pod_factor_many(self.fabric, first, stride, count, kind, concurrent_nodes)
        if self.nic_bytes_per_s_by_node and first.size:
            rows = np.stack([first.ravel(), stride.ravel(), count.ravel()], axis=1)
            uniq, inv = np.unique(rows, axis=0, return_inverse=True)
            groups = [range(f, f + max(c, 1) * max(s, 1), max(s, 1)) for f, s, c in uniq]
            nic = np.array([self.nic_slowdown(g) for g in groups])
            out = np.maximum(out, nic[inv.reshape(-1)].reshape(first.shape))
        return out


# The largest GPU count a system may have (the biggest published training runs use ~10^5;
# beyond 2^20 the per-node structures stop being meaningful and work grows without bound)
MAX_GPUS = 1 << 20


def _builtin_file(name: str) -> HardwareFile:
    path = resources.files("hardware_specs") / "data" / name
    return load_hardware_file(Path(str(path)), builtin=True)


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    parts = [_builtin_file(n) for n in ("gpus.yaml", "links.yaml", "nodes.yaml")]
    merged = HardwareFile(
        gpus=[g for p in parts for g in p.gpus],
        links=[lk for p in parts for lk in p.links],
        nodes=[n for p in parts for n in p.nodes],
        clusters=[c for p in parts for c in p.clusters],
    )
    cat = Catalog(gpus={}, links={}, nodes={}, clusters={}).merged(merged)
    return cat


def load_catalog(hardware_file: str | Path | None = None) -> Catalog:
    """Built-ins, plus a user file's entries if given."""
    cat = builtin_catalog()
    if hardware_file is not None:
        cat = cat.merged(load_hardware_file(hardware_file), f"hardware file {hardware_file}")
    return cat


def get_gpu(gpu_id: str, hardware_file: str | Path | None = None) -> GpuSpec:
    return load_catalog(hardware_file).gpu(gpu_id)
