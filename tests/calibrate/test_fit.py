"""Dataset -> fit -> profile -> report, on synthetic measurements made from known parameters."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from calibrate.dataset import DatasetError, held_out, load_dataset, split_groups, strata
from calibrate.fit import fit_profile
from costmodels import AnalyticalCostModel, arch_params
from costmodels.ops.profile import Profile
from costmodels.ops.select import get_cost_model
from workloads.ops import CSV_COLUMNS, Op, ops_frame

TRUE = {
    "gemm": {"mma_efficiency": {"bf16": 0.70}, "launch_s": 7e-6},
    "elementwise": {"memory_efficiency": {"rmsnorm": 0.55}},
}


def _synthetic_ops(rng):
    ops, fams = [], []
    for model, h in (("m1", 1024), ("m2", 2048), ("m3", 3072), ("m4", 4096), ("m5", 5120)):
        for tokens in (16, 128, 1024, 4096):
            for name, n, k in (
                ("qkv", 3 * h, h),
                ("out", h, h),
                ("up", 4 * h, h),
                ("down", h, 4 * h),
            ):
                ops.append(Op(op="gemm", m=tokens, n=n, k=k))
                fams.append(f"{model}/{name}")
    for shape in rng.integers(16, 8192, (60, 3)):
        ops.append(
            Op(
                op="gemm",
                m=int(shape[0]),
                n=int(shape[1]) // 8 * 8 + 8,
                k=int(shape[2]) // 8 * 8 + 8,
            )
        )
        fams.append("random")
    for e in range(8, 27):
        for n in (1024, 4096, 8192):
            ops.append(Op(op="rmsnorm", m=max(1, 2**e // n), n=n))
            fams.append("rmsnorm")
    return ops, fams


def write_dataset(folder, gpu_name="NVIDIA H100 80GB HBM3", seed=0, true=TRUE):
    rng = np.random.default_rng(seed)
    ops, fams = _synthetic_ops(rng)
    base = AnalyticalCostModel.for_gpu("h100-sxm")
    truth = AnalyticalCostModel(base.system, arch_params("hopper", true))
    frame = ops_frame(ops)
    seconds = truth.predict_many(frame, validated=True) * np.exp(rng.normal(0, 0.02, len(ops)))
    out = frame[list(CSV_COLUMNS)].copy()
    out["measured_ms"] = seconds * 1e3
    out["suite"] = np.where(out["op"] == "gemm", "gemm", "elementwise")
    out["family"] = fams
    out["status"] = "ok"
    folder.mkdir(parents=True, exist_ok=True)
    for suite, part in out.groupby("suite"):
        part.to_csv(folder / f"{suite}.csv", index=False)
    # one failed row, as the runner records them
    with open(folder / "gemm.csv", "a") as fh:
        fh.write("gemm,bf16,99999,99999,99999" + "," * (len(CSV_COLUMNS) - 5) + ",,gemm,huge,oom\n")
    (folder / "meta.json").write_text(
        json.dumps({"environment": {"gpu_name": gpu_name, "sm_count": 132}})
    )
    return folder


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("ds") / "h100")


@pytest.fixture(scope="module")
def fitted(dataset_dir):
    ds = load_dataset(dataset_dir, expect_gpu="h100-sxm")
    return ds, fit_profile([ds], "h100-sxm", name="synthetic")


def test_dataset_loads_ok_rows_only(fitted):
    ds, _ = fitted
    assert ds.gpu_id == "h100-sxm"
    assert ds.skipped == {"oom": 1}
    assert (ds.frame["measured_s"] > 0).all()


def test_split_moves_whole_families(fitted):
    ds, _ = fitted
    groups = split_groups(ds.frame)
    test = held_out(groups, strata(ds.frame))
    for g in np.unique(groups):
        assert len(set(test[groups == g])) == 1  # a group is never split
    gemm_models = {g for g in groups[test] if g.startswith("gemm_half:m")}
    assert gemm_models and len(gemm_models) < 5  # some models held out, not all
    assert 0.1 < test.mean() < 0.5


def test_fit_recovers_parameters_and_beats_defaults(fitted):
    _, result = fitted
    fit = result.profile["params"]
    assert fit["gemm"]["mma_efficiency"]["bf16"] == pytest.approx(0.70, rel=0.08)
    assert fit["elementwise"]["memory_efficiency"]["rmsnorm"] == pytest.approx(0.55, rel=0.08)
    fid = result.fidelity.set_index("op_class")
    assert fid.loc["gemm_half", "learned_mape"] < 5.0
    assert fid.loc["gemm_half", "learned_mape"] < fid.loc["gemm_half", "default_mape"]
    assert fid.loc["all", "rows_held_out"] > 0


def test_profile_records_machine_and_fidelity(fitted, tmp_path):
    _, result = fitted
    prof = Profile.model_validate(json.loads(json.dumps(result.profile)))
    assert prof.gpu == "h100-sxm" and prof.measured_on["gpu_name"].startswith("NVIDIA H100")
    assert "gemm_half" in prof.fidelity and prof.held_out_groups
    model = get_cost_model("h100-sxm", profile=prof, use_shipped=False)
    assert model.label == "profile synthetic"
    op = Op(op="gemm", m=4096, n=4096, k=4096)
    truth = AnalyticalCostModel(model.system, arch_params("hopper", TRUE)).predict(op)
    assert model.predict(op) == pytest.approx(truth, rel=0.05)


def test_profile_predicts_without_scikit_learn(fitted, tmp_path):
    _, result = fitted
    path = tmp_path / "p.json"
    path.write_text(json.dumps(result.profile))
    expected = get_cost_model("h100-sxm", profile=path, use_shipped=False).predict(
        Op(op="gemm", m=333, n=4096, k=1024)
    )
    code = (
        "import sys; sys.modules['sklearn'] = None\n"  # any sklearn import now fails
        "from costmodels.ops.select import get_cost_model\nfrom workloads.ops import Op\n"
        f"m = get_cost_model('h100-sxm', profile={str(path)!r}, use_shipped=False)\n"
        "print(repr(m.predict(Op(op='gemm', m=333, n=4096, k=1024))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) == pytest.approx(expected, rel=1e-12)


def test_cli_fit_and_report(run, dataset_dir, tmp_path):
    profile = tmp_path / "prof.json"
    report = tmp_path / "report"
    args = ["--data", str(dataset_dir), "--gpu", "h100-sxm", "--out", str(profile)]
    args += ["--report", str(report)]
    result = run("calibrate", "fit", *args, "--format", "json")
    assert result.exit_code == 0, result.output
    fidelity = {r["op_class"]: r for r in json.loads(result.stdout)["fidelity"]}
    assert fidelity["gemm_half"]["learned_mape"] < 5
    assert (report / "report.html").read_text().count("<svg") >= 2
    assert list(pd.read_csv(report / "fidelity.csv").columns)[:2] == ["op_class", "description"]
    again = run(
        "calibrate",
        "report",
        "--profile",
        str(profile),
        "--data",
        str(dataset_dir),
        "--format",
        "json",
    )
    assert again.exit_code == 0, again.output
    rep = {r["op_class"]: r for r in json.loads(again.stdout)["fidelity"]}
    assert rep["gemm_half"]["profile_mape"] == pytest.approx(fidelity["gemm_half"]["learned_mape"])
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
        "h100-sxm",
        "--profile",
        str(profile),
        "--format",
        "json",
    )
    assert json.loads(pred.stdout)["model"].startswith("profile h100-sxm")


def _one_line(result):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def test_cli_bad_datasets_write_no_profile(run, dataset_dir, tmp_path):
    out = tmp_path / "p.json"

    def fit(folder, gpu="h100-sxm"):
        return run("calibrate", "fit", "--data", str(folder), "--gpu", gpu, "--out", str(out))

    assert "does not exist" in _one_line(fit(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no meta.json" in _one_line(fit(empty))
    corrupt = write_dataset(tmp_path / "corrupt")
    (corrupt / "gemm.csv").write_text('op,measured_ms,status\n"gemm,1\n')
    assert "corrupt" in _one_line(fit(corrupt))
    bad_value = write_dataset(tmp_path / "badvalue")
    text = (bad_value / "elementwise.csv").read_text().splitlines()
    cells = text[1].split(",")
    cells[len(CSV_COLUMNS)] = "-3"
    (bad_value / "elementwise.csv").write_text(
        "\n".join([text[0], ",".join(cells), *text[2:]]) + "\n"
    )
    assert "measured_ms must be a positive number" in _one_line(fit(bad_value))
    (corrupt / "meta.json").write_text("{nope")
    assert "meta.json is corrupt" in _one_line(fit(corrupt))
    assert "unknown GPU" in _one_line(fit(dataset_dir, gpu="h900"))
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".p.json")] == []


def test_cli_fit_on_another_gpus_data_warns_and_marks_the_profile(run, tmp_path):
    """Data from another device is a warning (one stderr line), not a failure; the profile
    says so, gets no power model, and its predictions count as transferred."""
    h200 = write_dataset(tmp_path / "h200", gpu_name="NVIDIA H200")
    out = tmp_path / "p.json"
    result = run("calibrate", "fit", "--data", str(h200), "--gpu", "h100-sxm", "--out", str(out))
    assert result.exit_code == 0, result.output
    warnings = [x for x in result.stderr.splitlines() if x.startswith("warning: ")]
    assert warnings == [
        f"warning: dataset {h200} was measured on 'NVIDIA H200' (h200-sxm), not h100-sxm"
    ]
    prof = json.loads(out.read_text())
    assert prof["measured_on"]["device_matches_gpu"] is False and prof["power"] is None
    model = get_cost_model("h100-sxm", profile=out, use_shipped=False)
    assert model.provenance.kind == "transferred"
    assert model.power.cap_w == 700.0  # the datasheet estimate of the H100's own TDP


def test_cli_bad_profile(run, dataset_dir, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x"}')
    assert "gpu" in _one_line(
        run("calibrate", "report", "--profile", str(bad), "--data", str(dataset_dir))
    )
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"name": "x", "gpu": "h200-sxm"}))
    line = _one_line(
        run("calibrate", "report", "--profile", str(other), "--data", str(dataset_dir))
    )
    assert "not h200-sxm" in line


def test_dataset_error_type():
    with pytest.raises(DatasetError):
        load_dataset("/nonexistent/folder")


def test_cpu_runner_to_profile_end_to_end(run, tmp_path):
    """runner (torch CPU, tiny shapes) -> dataset -> fit -> report, as CI can run it."""
    pytest.importorskip("torch")
    data = tmp_path / "cpu"
    result = run(
        "calibrate",
        "run",
        "--suite",
        "gemm,elementwise",
        "--tiny",
        "--device",
        "cpu",
        "--out",
        str(data),
    )
    assert result.exit_code == 0, result.output
    assert (data / "gemm.csv").exists() and (data / "meta.json").exists()
    profile, report = tmp_path / "cpu.json", tmp_path / "report"
    fit = run(
        "calibrate",
        "fit",
        "--data",
        str(data),
        "--gpu",
        "h100-sxm",
        "--out",
        str(profile),
        "--report",
        str(report),
        "--format",
        "json",
    )
    assert fit.exit_code == 0, fit.output
    classes = {r["op_class"] for r in json.loads(fit.stdout)["fidelity"]}
    assert {"gemm_half", "elementwise", "all"} <= classes
    assert (report / "report.html").read_text().startswith("<!doctype html>")
    again = run(
        "calibrate", "report", "--profile", str(profile), "--data", str(data), "--format", "csv"
    )
    assert again.exit_code == 0 and again.stdout.startswith("op_class,")


def test_unknown_suite(run, tmp_path):
    pytest.importorskip("torch")
    result = run("calibrate", "run", "--suite", "gemm,nope", "--out", str(tmp_path / "x"))
    assert "unknown --suite nope" in _one_line(result)
    assert not (tmp_path / "x").exists()


def test_runner_measures_an_ops_file_on_cpu(run, tmp_path):
    pytest.importorskip("torch")
    ops = tmp_path / "ops.csv"
    ops.write_text("op,dtype,m,n,k,family\ngemm,fp32,64,96,128,mine\nrmsnorm,bf16,32,256,,mine\n")
    out = tmp_path / "measured"
    result = run("calibrate", "run", "--ops", str(ops), "--device", "cpu", "--out", str(out))
    assert result.exit_code == 0, result.output
    gemm = pd.read_csv(out / "gemm.csv")
    assert gemm["status"].tolist() == ["ok"] and gemm["family"].tolist() == ["mine"]
    assert (pd.read_csv(out / "elementwise.csv")["measured_ms"] > 0).all()
    bad = tmp_path / "bad.csv"
    bad.write_text("op\nattn_blocksparse_fwd\n")
    line = _one_line(run("calibrate", "run", "--ops", str(bad), "--out", str(tmp_path / "x")))
    assert "cannot be measured from a file" in line and not (tmp_path / "x").exists()
