"""A GPU simcli does not know: ``calibrate fit --hardware FILE``, or a spec derived from
what the device recorded in meta.json (peaks from the GEMMs measured, said so)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from calibrate.dataset import derive_gpu_spec, load_dataset
from costmodels.ops.select import get_cost_model
from hardware_specs.registry import load_catalog, load_hardware_file
from tests.calibrate.test_fit import write_dataset
from workloads.ops import Op

RTX = {
    "type": "cuda",
    "vendor": "nvidia",
    "name": "NVIDIA GeForce RTX 4090",
    "compute_capability": "8.9",
    "sm_count": 128,
    "memory_bytes": 25393692672,
    "l2_bytes": 75497472,
    "shared_memory_per_sm_bytes": 102400,
    "memory_bus_width_bits": 384,
    "memory_clock_khz": 10501000,
    "power_default_limit_w": 450.0,
    "max_sm_clock_mhz": 3105,
    "pcie_max_generation": 4,
}
GEMM = Op(op="gemm", m=4096, n=4096, k=4096)


@pytest.fixture(scope="module")
def rtx_data(tmp_path_factory):
    folder = write_dataset(tmp_path_factory.mktemp("rtx") / "data", gpu_name=RTX["name"])
    env = {"gpu_name": RTX["name"], "device": "cuda", "sm_count": 128, "torch": "2.5"}
    (folder / "meta.json").write_text(json.dumps({"environment": env, "device": RTX}))
    return folder


def test_spec_derived_from_the_device_says_where_numbers_come_from(rtx_data):
    spec, notes = derive_gpu_spec("rtx4090", [load_dataset(rtx_data)])
    assert (spec.architecture, spec.sm_count, spec.tdp_w) == ("ada", 128, 450.0)
    assert spec.memory_bandwidth_gb_per_s == pytest.approx(1008.1, rel=1e-3)  # 384 bit GDDR6X
    assert "DERIVED from measurements" in spec.sources["peak_dense_tflops"]
    assert spec.sources["tdp_w"].startswith("device: NVML default power limit")
    assert spec.unsourced_numbers() == []
    assert any(n.startswith("peak bf16") and "no datasheet figure" in n for n in notes)


def test_fit_derives_a_spec_and_writes_it_beside_the_profile(run, rtx_data, tmp_path):
    profile = tmp_path / "rtx.json"
    fit = run("calibrate", "fit", "--data", str(rtx_data), "--gpu", "rtx4090", "--out",
              str(profile), "--format", "json")  # fmt: skip
    assert fit.exit_code == 0, fit.output
    out = json.loads(fit.stdout)
    assert out["warnings"] == [] and out["provenance"]["kind"] == "calibrated"
    assert out["provenance"]["expected_error"] == pytest.approx(
        next(r for r in out["fidelity"] if r["op_class"] == "all")["learned_mape"] / 100
    )
    spec_file = tmp_path / "rtx.hardware.yaml"
    assert yaml.safe_load(spec_file.read_text())["gpus"][0]["id"] == "rtx4090"
    hw = load_hardware_file(spec_file)
    assert [n.gpus_per_node for n in hw.nodes] == [1]
    model = get_cost_model("rtx4090", profile=profile, hardware_file=spec_file)
    assert np.isfinite(model.predict(GEMM)) and model.predict(GEMM) > 0
    assert model.power.cap_w == 450.0  # no power suite: the datasheet estimate of its TDP
    # report needs the spec, and says where to find it when it is missing
    line = run("calibrate", "report", "--profile", str(profile), "--data", str(rtx_data))
    assert line.exit_code == 2 and "rtx.hardware.yaml was written beside it" in line.stderr
    rep = run("calibrate", "report", "--profile", str(profile), "--data", str(rtx_data),
              "--hardware", str(spec_file))  # fmt: skip
    assert rep.exit_code == 0, rep.output
    assert "provenance: calibrated (profile rtx4090)" in rep.stdout


def test_unknown_id_for_a_built_in_device_is_refused(run, tmp_path):
    h100 = write_dataset(tmp_path / "h100")  # meta: NVIDIA H100 80GB HBM3, 132 SMs
    result = run("calibrate", "fit", "--data", str(h100), "--gpu", "myh100", "--out",
                 str(tmp_path / "p.json"))  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: unknown GPU 'myh100'; the data was measured on 'NVIDIA H100 80GB HBM3', "
        "built in as h100-sxm: use --gpu h100-sxm"
    )


def test_no_device_properties_to_derive_from(run, tmp_path):
    data = write_dataset(tmp_path / "cpu")
    (data / "meta.json").write_text(json.dumps({"environment": {"device": "cpu"}}))
    result = run("calibrate", "fit", "--data", str(data), "--gpu", "mygpu", "--out",
                 str(tmp_path / "p.json"))  # fmt: skip
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert line.startswith("error: unknown GPU 'mygpu' and the data records no GPU properties")
    assert "--hardware FILE" in line and "\n" not in line


def test_fit_with_a_hardware_file_of_a_gpu_without_a_node(run, tmp_path):
    """A user spec (JSON, the format of hardware_specs/data) with only the GPU: the fit
    adds a one-GPU node and writes the completed spec beside the profile."""
    gpu = load_catalog().gpu("l40s").model_dump(mode="json")
    gpu.update(id="mygpu", name="My GPU")
    spec = tmp_path / "mygpu.json"
    spec.write_text(json.dumps({"gpus": [gpu]}))
    data = write_dataset(tmp_path / "data", gpu_name="My GPU")
    meta = {"environment": {"gpu_name": "My GPU", "sm_count": 99}}  # not the spec's 142
    (data / "meta.json").write_text(json.dumps(meta))
    profile = tmp_path / "p.json"
    fit = run("calibrate", "fit", "--data", str(data), "--gpu", "mygpu", "--hardware",
              str(spec), "--out", str(profile))  # fmt: skip
    assert fit.exit_code == 0, fit.output
    assert "warning: dataset" in fit.stderr and "with 99 SMs; mygpu has 142" in fit.stderr
    written = tmp_path / "p.hardware.yaml"
    model = get_cost_model("mygpu", profile=profile, hardware_file=written)
    assert model.predict(GEMM) > 0 and model.provenance.kind == "transferred"
