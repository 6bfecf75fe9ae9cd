"""User hardware files (``--hardware FILE``): same schema as the built-ins, one-line errors."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from hardware_specs.registry import SpecError, builtin_catalog, load_catalog, load_hardware_file
from hardware_specs.schema import GIB, GpuSpec, LinkSpec

USER_GPU = {
    "id": "acme-x1",
    "name": "ACME X1",
    "vendor": "nvidia",
    "architecture": "hopper",
    "form_factor": "sxm",
    "sm_count": 100,
    "boost_clock_mhz": 2000,
    "memory_gib": 96,
    "memory_type": "HBM3",
    "memory_bandwidth_gb_per_s": 4000,
    "l2_cache_mib": 64,
    "smem_per_sm_kib": 228,
    "peak_dense_tflops": {"bf16": 819.2, "fp16": 819.2, "fp8": 1638.4},
    "sparse_speedup": 2.0,
    "sfu_ops_per_clk_per_sm": 16,
    "tdp_w": 800,
    "nvlink_gb_per_s": 450,
    "pcie_gen": 5,
    "sources": {
        f: "ACME X1 datasheet"
        for f in [
            "sm_count",
            "boost_clock_mhz",
            "memory_gib",
            "memory_bandwidth_gb_per_s",
            "l2_cache_mib",
            "smem_per_sm_kib",
            "peak_dense_tflops",
            "sparse_speedup",
            "sfu_ops_per_clk_per_sm",
            "tdp_w",
            "nvlink_gb_per_s",
            "pcie_gen",
        ]
    },
}

USER_NODE = {
    "id": "acme-node",
    "name": "ACME 4-GPU node",
    "gpu": "acme-x1",
    "gpus_per_node": 4,
    "intra_node_link": "acme-link",
    "intra_node_gb_per_s": 450,
    "switched": True,
    "nic": "ib-ndr",
    "nics_per_gpu": 1,
    "host_link": "pcie-gen5-x16",
    "sources": {
        "gpus_per_node": "ACME node manual",
        "intra_node_gb_per_s": "ACME node manual",
        "nics_per_gpu": "ACME node manual",
    },
}

USER_LINK = {
    "id": "acme-link",
    "name": "ACME switch fabric",
    "kind": "nvswitch",
    "bandwidth_gb_per_s": 450,
    "latency_us": 0.5,
    "sources": {"bandwidth_gb_per_s": "ACME", "latency_us": "ACME"},
}


def _write(tmp_path, data, name="hw.yaml"):
    path = tmp_path / name
    text = json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data)
    path.write_text(text)
    return path


def test_user_file_adds_gpu_link_and_node(tmp_path):
    path = _write(tmp_path, {"gpus": [USER_GPU], "links": [USER_LINK], "nodes": [USER_NODE]})
    cat = load_catalog(path)
    gpu = cat.gpu("acme-x1")
    assert gpu.unsourced_numbers() == []
    assert gpu.memory_bytes == 96 * GIB
    assert cat.reference_node("acme-x1").id == "acme-node"
    system = cat.system("acme-x1", 16)
    assert (system.num_nodes, system.gpus_per_node, system.intra_link.id) == (4, 4, "acme-link")
    # Built-ins are still there, and the cached built-in catalogue is untouched.
    assert "h100-sxm" in cat.gpus
    assert "acme-x1" not in builtin_catalog().gpus


def test_user_json_file_is_accepted(tmp_path):
    path = _write(tmp_path, {"gpus": [USER_GPU]}, name="hw.json")
    assert load_catalog(path).gpu("acme-x1").sm_count == 100


def test_user_file_replaces_builtin_by_id(tmp_path):
    h100 = builtin_catalog().gpu("h100-sxm").model_dump(mode="json")
    h100["tdp_w"] = 500
    cat = load_catalog(_write(tmp_path, {"gpus": [h100]}))
    assert cat.gpu("h100-sxm").tdp_w == 500
    assert builtin_catalog().gpu("h100-sxm").tdp_w == 700


def test_user_cluster_resolves(tmp_path):
    path = _write(
        tmp_path,
        {
            "clusters": [
                {
                    "name": "pod",
                    "node": "dgx-h100",
                    "num_nodes": 4,
                    "fabric": {"topology": "rail-optimized", "oversubscription": 2.0},
                }
            ]
        },
    )
    cat = load_catalog(path)
    system = cat.system_for_cluster(cat.clusters["pod"])
    assert system.num_gpus == 32
    assert system.fabric.oversubscription == 2.0


def _with(base, **changes):
    return {**base, **changes}


BAD_FILES = {
    "negative bandwidth": (
        {"links": [_with(USER_LINK, bandwidth_gb_per_s=-5)]},
        ["links[acme-link].bandwidth_gb_per_s", "greater than 0", "-5"],
    ),
    "zero latency": (
        {"links": [_with(USER_LINK, latency_us=0)]},
        ["links[acme-link].latency_us", "greater than 0"],
    ),
    "unknown key": (
        {"gpus": [_with(USER_GPU, colour="red")]},
        ["gpus[acme-x1].colour", "Extra inputs are not permitted", "'red'"],
    ),
    "unknown top-level key": (
        {"gpu": [USER_GPU]},
        ["gpu", "Extra inputs are not permitted"],
    ),
    "missing field": (
        {"gpus": [{k: v for k, v in USER_GPU.items() if k != "sm_count"}]},
        ["gpus[acme-x1].sm_count", "Field required"],
    ),
    "negative peak rate": (
        {"gpus": [_with(USER_GPU, peak_dense_tflops={"bf16": -1.0})]},
        ["gpus[acme-x1].peak_dense_tflops", "peak_dense_tflops[bf16] must be > 0"],
    ),
    "no bf16 or fp16 rate": (
        {"gpus": [_with(USER_GPU, peak_dense_tflops={"fp32": 60.0})]},
        ["peak_dense_tflops needs at least bf16 or fp16"],
    ),
    "unknown dtype": (
        {"gpus": [_with(USER_GPU, peak_dense_tflops={"bf16": 1.0, "fp4": 2.0})]},
        ["gpus[acme-x1].peak_dense_tflops.fp4", "'fp64'", "'int8'"],
    ),
    "unknown vendor": (
        {"gpus": [_with(USER_GPU, vendor="intel")]},
        ["gpus[acme-x1].vendor", "'nvidia' or 'amd'", "'intel'"],
    ),
    "pcie gen out of range": (
        {"gpus": [_with(USER_GPU, pcie_gen=7)]},
        ["gpus[acme-x1].pcie_gen", "less than or equal to 6"],
    ),
    "source names unknown field": (
        {"gpus": [_with(USER_GPU, sources={**USER_GPU["sources"], "tdp": "x"})]},
        ["gpus[acme-x1]", "sources name unknown fields", "tdp"],
    ),
    "unknown gpu referenced by node": (
        {"nodes": [_with(USER_NODE, gpu="nope")]},
        ["node acme-node", "unknown gpu", "'nope'"],
    ),
    "unknown nic referenced by node": (
        {"gpus": [USER_GPU], "links": [USER_LINK], "nodes": [_with(USER_NODE, nic="ib-zdr")]},
        ["node acme-node", "unknown nic", "'ib-zdr'"],
    ),
    "unknown node referenced by cluster": (
        {"clusters": [{"name": "pod", "node": "dgx-z", "num_nodes": 2}]},
        ["cluster pod", "unknown node", "'dgx-z'"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_gives_one_useful_line(tmp_path, case):
    data, expected = BAD_FILES[case]
    path = _write(tmp_path, data)
    with pytest.raises(SpecError) as err:
        load_catalog(path)
    message = str(err.value)
    assert "\n" not in message, message
    for fragment in expected:
        assert fragment in message, f"{fragment!r} missing from: {message}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: [\n  - id: x\n", "is not valid YAML at line"),
        ("- 1\n- 2\n", "must be a mapping with gpus/links/nodes/clusters"),
        ("", "must be a mapping"),
    ],
)
def test_malformed_file_gives_one_line(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_hardware_file(path)
    assert expected in str(err.value)
    assert str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_malformed_json_gives_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"gpus": [')
    with pytest.raises(SpecError, match="is not valid JSON"):
        load_hardware_file(path)


@pytest.mark.parametrize("make_path", [lambda p: p / "missing.yaml", lambda p: p])
def test_unreadable_path_gives_one_line(tmp_path, make_path):
    path = make_path(tmp_path)  # a missing file, then a directory
    with pytest.raises(SpecError, match="cannot read hardware file") as err:
        load_catalog(path)
    assert str(path) in str(err.value)


def test_direct_construction_raises_validation_error_naming_the_field():
    with pytest.raises(ValidationError, match="bandwidth_gb_per_s"):
        LinkSpec(id="x", name="x", kind="pcie", bandwidth_gb_per_s=-1, latency_us=1)


def test_specs_are_frozen():
    link = builtin_catalog().link("ib-ndr")
    with pytest.raises(ValidationError):
        link.bandwidth_gb_per_s = 1.0


_positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(
    sm=st.integers(min_value=1, max_value=1024),
    clock=_positive,
    mem=_positive,
    bw=_positive,
    l2=_positive,
    smem=_positive,
    bf16=_positive,
    sfu=_positive,
    nvlink=st.floats(min_value=0, max_value=1e5),
)
def test_valid_gpu_specs_have_positive_finite_si_views(
    sm, clock, mem, bw, l2, smem, bf16, sfu, nvlink
):
    gpu = GpuSpec.model_validate(
        _with(
            USER_GPU,
            sm_count=sm,
            boost_clock_mhz=clock,
            memory_gib=mem,
            memory_bandwidth_gb_per_s=bw,
            l2_cache_mib=l2,
            smem_per_sm_kib=smem,
            peak_dense_tflops={"bf16": bf16},
            sfu_ops_per_clk_per_sm=sfu,
            nvlink_gb_per_s=nvlink,
        )
    )
    for value in (
        gpu.memory_bytes,
        gpu.hbm_bytes_per_s,
        gpu.l2_bytes,
        gpu.smem_per_sm_bytes,
        gpu.clock_hz,
        gpu.sfu_ops_per_s,
        gpu.peak_flops_per_s("bf16"),
    ):
        assert math.isfinite(value) and value > 0
    assert gpu.peak_flops_per_s("bf16") == pytest.approx(bf16 * 1e12)
    assert gpu.memory_bytes == pytest.approx(mem * 2**30)
    assert gpu.nvlink_bytes_per_s >= 0


def test_yaml_in_docs_shape_round_trips(tmp_path):
    """A file written by hand in the documented shape (units in key names) loads."""
    path = tmp_path / "hw.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            links:
              - id: my-roce
                name: 800G RoCE
                kind: roce
                bandwidth_gb_per_s: 100
                latency_us: 1.5
                sources: {bandwidth_gb_per_s: 800 Gb/s / 8, latency_us: estimate}
            """
        )
    )
    link = load_catalog(path).link("my-roce")
    assert link.bytes_per_s == 100e9
    assert link.latency_s == pytest.approx(1.5e-6)
