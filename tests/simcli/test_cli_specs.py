import json

from hardware_specs.registry import builtin_catalog


def test_specs_list_json_has_every_gpu(run):
    result = run("specs", "list", "--format", "json")
    assert result.exit_code == 0, result.output
    ids = {g["id"] for g in json.loads(result.stdout)["gpus"]}
    assert ids == set(builtin_catalog().gpus)
    assert {
        "h100-sxm",
        "h100-pcie",
        "h200-sxm",
        "a100-sxm-80gb",
        "a100-sxm-40gb",
        "l40s",
        "b200",
        "mi300x",
    } <= ids


def test_specs_list_csv_and_table(run):
    csv = run("specs", "list", "--format", "csv")
    assert csv.exit_code == 0
    assert csv.stdout.splitlines()[0].startswith("id,name,architecture")
    table = run("specs", "list")
    assert table.exit_code == 0 and "h100-sxm" in table.stdout


def test_specs_list_links_and_nodes(run):
    for kind in ("links", "nodes"):
        result = run("specs", "list", "--kind", kind, "--format", "json")
        assert result.exit_code == 0
        assert json.loads(result.stdout)[kind]


def test_specs_show_gpu_with_sources(run):
    result = run("specs", "show", "h100-sxm", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["sm_count"] == 132
    assert data["reference_node"] == "dgx-h100"
    assert "peak_dense_tflops" in data["sources"]


def test_specs_show_node(run):
    result = run("specs", "show", "dgx-a100-80gb", "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["gpus_per_node"] == 8


def test_unknown_spec_id_lists_known(run):
    result = run("specs", "show", "h900")
    assert result.exit_code == 2
    assert "unknown spec id 'h900'" in result.stderr and "h100-sxm" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_user_hardware_file(run, tmp_path):
    gpu = builtin_catalog().gpu("h100-sxm").model_dump(mode="json")
    gpu.update(id="h100-custom", name="H100 at lower clock", boost_clock_mhz=1500.0)
    node = builtin_catalog().node("dgx-h100").model_dump(mode="json")
    node.update(id="custom-node", gpu="h100-custom")
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"gpus": [gpu], "nodes": [node]}))
    result = run("specs", "show", "h100-custom", "--hardware", str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["reference_node"] == "custom-node"
    pred = run(
        "predict",
        "gemm",
        "--m",
        "4096",
        "--n",
        "4096",
        "--k",
        "4096",
        "--gpu",
        "h100-custom",
        "--hardware",
        str(path),
        "--format",
        "json",
    )
    assert pred.exit_code == 0, pred.output


def test_bad_hardware_file(run, tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n  - id: x\n    sm_count: -1\n")
    result = run("specs", "list", "--hardware", str(path))
    assert result.exit_code == 2
    assert "hw.yaml" in result.stderr and len(result.stderr.strip().splitlines()) == 1
