"""Built-in hardware catalogue: every entry loads, is sourced, and is physically sane."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import pytest

from hardware_specs.registry import SpecError, builtin_catalog, load_hardware_file
from hardware_specs.schema import Dtype

CATALOG = builtin_catalog()
GPU_IDS = sorted(CATALOG.gpus)
LINK_IDS = sorted(CATALOG.links)
NODE_IDS = sorted(CATALOG.nodes)

# Dense bf16 tensor FLOPs per clock per SM (per CU on AMD), from the vendors' architecture
# documents: A100 1024 FMA/clk/SM; Ada 512; Hopper 2x Ampere; Blackwell 2x Hopper
# (FlashAttention-4: 8192 ops/clk/SM); MI300X 2048 FLOPs/clk/CU (ROCm MI300 table).
BF16_FLOPS_PER_CLK_PER_SM = {
    "ampere": 2048,
    "ada": 1024,
    "hopper": 4096,
    "blackwell": 8192,
    "cdna3": 2048,
}

EXPECTED_GPUS = {
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "a100-sxm-80gb",
    "a100-sxm-40gb",
    "l40s",
    "b200",
    "mi300x",
}

VENDOR_REFERENCE_NODE = {
    "a100-sxm-80gb": "dgx-a100-80gb",
    "a100-sxm-40gb": "dgx-a100-40gb",
    "h100-sxm": "dgx-h100",
    "h200-sxm": "hgx-h200",
    "b200": "dgx-b200",
}


def _data_file(name: str) -> Path:
    return Path(str(resources.files("hardware_specs") / "data" / name))


def test_expected_gpus_are_built_in():
    assert set(CATALOG.gpus) >= EXPECTED_GPUS


@pytest.mark.parametrize("name", ["gpus.yaml", "links.yaml", "nodes.yaml"])
def test_data_file_loads_and_ids_are_unique(name):
    hw = load_hardware_file(_data_file(name))
    entries = hw.gpus + hw.links + hw.nodes
    assert entries, f"{name} is empty"
    ids = [e.id for e in entries]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"{name} repeats ids {duplicates} (later entries silently win)"


@pytest.mark.parametrize("kind", ["gpus", "links", "nodes"])
def test_every_number_has_a_source(kind):
    missing = {
        spec_id: spec.unsourced_numbers()
        for spec_id, spec in getattr(CATALOG, kind).items()
        if spec.unsourced_numbers()
    }
    assert not missing, f"unsourced numeric fields: {missing}"


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_every_gpu_has_a_reference_node(gpu_id):
    node = CATALOG.reference_node(gpu_id)
    assert node.gpu == gpu_id
    assert CATALOG.gpu(gpu_id).id == gpu_id


@pytest.mark.parametrize(("gpu_id", "node_id"), sorted(VENDOR_REFERENCE_NODE.items()))
def test_vendor_reference_node_comes_first(gpu_id, node_id):
    assert CATALOG.reference_node(gpu_id).id == node_id


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_bf16_peak_matches_architecture_flops_per_clock(gpu_id):
    gpu = CATALOG.gpu(gpu_id)
    per_sm_clk = gpu.peak_flops_per_s("bf16") / (gpu.sm_count * gpu.clock_hz)
    expected = BF16_FLOPS_PER_CLK_PER_SM[gpu.architecture]
    assert per_sm_clk == pytest.approx(expected, rel=0.02), (
        f"{gpu_id}: {per_sm_clk:.0f} bf16 FLOPs/clk/SM, expected {expected} for "
        f"{gpu.architecture}; is boost_clock_mhz the clock of the tensor peak?"
    )


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_fp8_is_twice_bf16_and_fp16_equals_bf16(gpu_id):
    gpu = CATALOG.gpu(gpu_id)
    bf16 = gpu.peak_flops_per_s(Dtype.bf16)
    assert gpu.peak_flops_per_s(Dtype.fp16) == pytest.approx(bf16, rel=0.01)
    if gpu.supports("fp8"):
        assert gpu.peak_flops_per_s("fp8") == pytest.approx(2 * bf16, rel=0.01)
    if gpu.supports("tf32"):
        assert gpu.peak_flops_per_s("tf32") == pytest.approx(bf16 / 2, rel=0.03)


def test_fp8_support_by_architecture():
    for gpu in CATALOG.gpus.values():
        assert gpu.supports("fp8") == (gpu.architecture != "ampere"), gpu.id


def test_unsupported_dtype_lists_the_supported_ones():
    with pytest.raises(ValueError, match="a100-sxm-80gb has no fp8 rate; supported: .*bf16"):
        CATALOG.gpu("a100-sxm-80gb").peak_flops_per_s("fp8")


@pytest.mark.parametrize("gpu_id", GPU_IDS)
def test_gpu_si_properties_are_positive_and_finite(gpu_id):
    gpu = CATALOG.gpu(gpu_id)
    positive = {
        "memory_bytes": gpu.memory_bytes,
        "hbm_bytes_per_s": gpu.hbm_bytes_per_s,
        "l2_bytes": gpu.l2_bytes,
        "smem_per_sm_bytes": gpu.smem_per_sm_bytes,
        "clock_hz": gpu.clock_hz,
        "sfu_ops_per_s": gpu.sfu_ops_per_s,
    }
    positive.update({f"peak[{d}]": gpu.peak_flops_per_s(d) for d in gpu.peak_dense_tflops})
    for name, value in positive.items():
        assert math.isfinite(value) and value > 0, f"{gpu_id}.{name} = {value}"
    assert math.isfinite(gpu.nvlink_bytes_per_s) and gpu.nvlink_bytes_per_s >= 0


@pytest.mark.parametrize("link_id", LINK_IDS)
def test_link_si_properties_are_positive_and_finite(link_id):
    link = CATALOG.link(link_id)
    for value in (link.bytes_per_s, link.latency_s):
        assert math.isfinite(value) and value > 0
    assert link.latency_s < 1e-3, "one-way small-message latency should be microseconds"


@pytest.mark.parametrize("node_id", NODE_IDS)
def test_node_is_consistent_with_its_gpu_and_links(node_id):
    node = CATALOG.node(node_id)
    gpu = CATALOG.gpu(node.gpu)
    intra = CATALOG.link(node.intra_node_link)
    assert math.isfinite(node.intra_node_bytes_per_s) and node.intra_node_bytes_per_s > 0
    assert CATALOG.link(node.nic).kind in {"infiniband", "roce", "ethernet"}
    assert CATALOG.link(node.host_link).kind == "pcie"
    # Only an NVSwitch crossbar is "switched"; PCIe trees and xGMI meshes are not.
    assert node.switched == (intra.kind == "nvswitch")
    if intra.kind == "nvswitch":
        assert node.intra_node_gb_per_s == intra.bandwidth_gb_per_s == gpu.nvlink_gb_per_s
    elif intra.kind == "xgmi":
        # Full mesh: one link to each peer.
        links = node.gpus_per_node - 1
        assert node.intra_node_gb_per_s == pytest.approx(links * intra.bandwidth_gb_per_s)
        assert node.intra_node_gb_per_s == pytest.approx(gpu.nvlink_gb_per_s)
    else:
        assert node.intra_node_gb_per_s <= intra.bandwidth_gb_per_s
    # The host link generation cannot exceed what the GPU supports.
    host_gen = int(node.host_link.split("-")[1].removeprefix("gen"))
    assert host_gen <= gpu.pcie_gen


def test_node_ids_named_by_known_specs():
    CATALOG.check_references()


def test_system_for_64_h100_is_8_dgx_nodes():
    system = CATALOG.system("h100-sxm", 64)
    assert system.num_nodes == 8
    assert system.num_gpus == 64
    assert system.gpus_per_node == 8
    assert system.node.id == "dgx-h100"
    assert system.intra_link.id == "nvlink4-nvswitch"
    assert system.nic.id == "ib-ndr"
    assert system.fabric.oversubscription == 1.0


def test_system_rounds_partial_nodes_up():
    system = CATALOG.system("a100-sxm-80gb", 12)
    assert (system.num_nodes, system.num_gpus) == (2, 12)
    assert CATALOG.system("mi300x").num_gpus == 8


def test_system_rejects_non_positive_gpu_count():
    with pytest.raises(SpecError, match="--gpus must be positive, got 0"):
        CATALOG.system("h100-sxm", 0)


def test_unknown_gpu_error_lists_known_ids():
    with pytest.raises(SpecError) as err:
        CATALOG.gpu("h100")
    message = str(err.value)
    assert "unknown GPU 'h100'" in message
    for gpu_id in EXPECTED_GPUS:
        assert gpu_id in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("lookup", "bad_id", "kind"),
    [("link", "nvlink9", "link"), ("node", "dgx-z", "node")],
)
def test_unknown_link_and_node_errors_list_known_ids(lookup, bad_id, kind):
    with pytest.raises(SpecError, match=f"unknown {kind} '{bad_id}'; known: .*,"):
        getattr(CATALOG, lookup)(bad_id)
