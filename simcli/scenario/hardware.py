"""Hardware resolved once: ``--gpu ID --gpus N`` (or a ``--cluster`` file), the catalog
with any ``--hardware`` file merged, the system (nodes, links, NICs), the op cost model
that answers for it (``--profile``, a shipped profile, or defaults) and its price.

Simulators and searches take a :class:`Hardware`; none of them resolves a GPU id, a
profile or a price on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from costmodels.ops.analytical import AnalyticalCostModel
from costmodels.ops.learned import LearnedCostModel
from costmodels.ops.select import get_cost_model, provenance_fields
from hardware_specs.prices import GpuPrice, gpu_price, gpu_prices, host_copy_bytes_per_s
from hardware_specs.registry import Catalog, SpecError, System, load_catalog, load_hardware_file
from hardware_specs.schema import GpuSpec

CostModel = AnalyticalCostModel | LearnedCostModel


@dataclass(frozen=True)
class Hardware:
    """One GPU type and count, with everything priced against it (see the module doc)."""

    gpu_id: str
    num_gpus: int
    catalog: Catalog
    system: System
    cost_model: CostModel
    price: GpuPrice | None  # None: no price known and none given

    @property
    def gpu(self) -> GpuSpec:
        return self.system.gpu

    @property
    def gpus_per_node(self) -> int:
        return self.system.node.gpus_per_node

    @property
    def host_copy_bytes_per_s(self) -> float:
        """Pinned host<->GPU copy rate of one GPU (KV swapping), from its PCIe generation."""
        return host_copy_bytes_per_s(self.gpu.pcie_gen)

    @property
    def usd_per_gpu_hour(self) -> float | None:
        return None if self.price is None else self.price.usd_per_gpu_hour

    @property
    def label(self) -> str:
        """How the op cost model was obtained (calibrated, transferred, defaults)."""
        return str(getattr(self.cost_model, "label", ""))

    def provenance_fields(self) -> dict[str, Any]:
        """The output keys that say how the op models were obtained and how far off they
        are expected to be (:func:`costmodels.ops.select.provenance_fields`)."""
        return provenance_fields(self.cost_model)


@lru_cache(maxsize=32)
def _builtin_cost_model(gpu_id: str, profile: str | None, num_gpus: int | None) -> CostModel:
    return get_cost_model(gpu_id, profile=profile, num_gpus=num_gpus)


def _price(gpu_id: str, price_usd_per_gpu_hour: float | None) -> GpuPrice | None:
    if price_usd_per_gpu_hour is not None:
        return gpu_price(gpu_id, {"*": price_usd_per_gpu_hour})
    return gpu_prices().get(gpu_id)


def _cluster_system(catalog: Catalog, cluster: Path, gpu_id: str, num_gpus: int) -> System:
    clusters = load_hardware_file(cluster).clusters
    if len(clusters) != 1:
        raise SpecError(
            f"cluster file {cluster} describes {len(clusters)} clusters; allowed: exactly one"
        )
    system = catalog.system_for_cluster(clusters[0], num_gpus)
    if system.gpu.id != gpu_id:
        raise SpecError(
            f"--gpu {gpu_id} but cluster {clusters[0].name} has {system.gpu.id}; "
            f"allowed: --gpu {system.gpu.id}"
        )
    total = clusters[0].num_nodes * system.node.gpus_per_node
    if num_gpus > total:
        raise SpecError(f"--gpus {num_gpus} exceeds the {total} GPUs of cluster {clusters[0].name}")
    return system


def resolve_hardware(
    gpu_id: str,
    num_gpus: int | None = None,
    *,
    profile: str | Path | None = None,
    hardware_file: str | Path | None = None,
    cluster_file: str | Path | None = None,
    price_usd_per_gpu_hour: float | None = None,
) -> Hardware:
    """Resolve ``gpu_id`` x ``num_gpus`` once (see the module docstring).

    With ``cluster_file`` the system is that cluster's node groups and fabric (pods,
    leaves, oversubscription), which the collective models price; they price the first
    node's NICs (the simulator scales other nodes' scale-out traffic by their bandwidths
    and pod crossings, see :meth:`System.slowdown`)."""
    catalog = load_catalog(hardware_file)
    if cluster_file is not None:
        cluster = Path(cluster_file)
        catalog = catalog.merged(load_hardware_file(cluster), f"cluster file {cluster}")
        system = _cluster_system(catalog, cluster, gpu_id, num_gpus or 1)
    else:
        system = catalog.system(gpu_id, num_gpus)
    if hardware_file is None and cluster_file is None:
        cost_model = _builtin_cost_model(gpu_id, str(profile) if profile else None, num_gpus)
    else:
        cost_model = get_cost_model(
            gpu_id,
            profile=profile,
            num_gpus=num_gpus,
            catalog=catalog,
            system=system if cluster_file is not None else None,
        )
    return Hardware(
        gpu_id=gpu_id,
        num_gpus=num_gpus or system.num_gpus,
        catalog=catalog,
        system=system,
        cost_model=cost_model,
        price=_price(gpu_id, price_usd_per_gpu_hour),
    )
