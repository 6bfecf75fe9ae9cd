"""`simcli sparsity compare --output DIR`: comparison.csv, speedup_curves.csv, config.json,
report.html."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simcli.reports.sparsity import CSV_SCHEMAS, curve_lengths
from simcli.sparsity.whatif import COLUMNS
from tests.simcli.reports.browser import check_report, one_error_line

PATTERNS = "dense,window:2048,s2:local=2,stride=8"
ARGS = ["sparsity", "compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--patterns", PATTERNS]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from typer.testing import CliRunner

    from simcli.cli import app

    folder = tmp_path_factory.mktemp("sparsity") / "run"
    args = [*ARGS, "--seq-len", "8192", "--gqa-groups", "4,8", "--format", "json", "--quiet"]
    result = CliRunner().invoke(app, [*args, "--output", str(folder)])
    assert result.exit_code == 0, result.output
    return folder, result


def test_curve_lengths():
    assert curve_lengths([8192]) == [4096, 8192]
    assert curve_lengths([1000, 20000]) == [1000, 4096, 8192, 16384, 20000]
    assert curve_lengths([2048]) == [2048]


def test_bundle_files_and_json_stdout(bundle):
    folder, result = bundle
    assert sorted(p.name for p in folder.iterdir()) == [
        "comparison.csv",
        "config.json",
        "report.html",
        "speedup_curves.csv",
    ]
    obj = json.loads(result.stdout)  # stdout stays machine-clean with --output DIR
    assert obj["columns"] == COLUMNS and len(obj["rows"]) == 2 * 3
    comparison = pd.read_csv(folder / "comparison.csv")
    assert len(comparison) == len(obj["rows"])
    assert list(comparison["pattern"]) == [r["pattern"] for r in obj["rows"]]


def test_csv_schemas(bundle):
    folder, _ = bundle
    for name, schema in CSV_SCHEMAS.items():
        if name == "gemm_break_even.csv":  # only with --weight/--activation-sparsity
            assert not (folder / name).exists()
            continue
        assert list(pd.read_csv(folder / name).columns) == list(schema), name
    assert list(CSV_SCHEMAS["comparison.csv"]) == list(COLUMNS)
    curves = pd.read_csv(folder / "speedup_curves.csv")
    combos = set(zip(curves.seq_len, curves.gqa_group, curves.pattern, strict=True))
    patterns = ("dense", "window:2048", "s2:local=2,stride=8")
    assert combos == {(s, g, p) for s in (4096, 8192) for g in (4, 8) for p in patterns}
    dense = curves[curves.pattern == "dense"]
    assert (dense[["attn_fwd_speedup", "attn_bwd_speedup", "decode_attn_speedup"]] == 1).all().all()
    # the curve point at the requested length is the comparison row's kernel time
    comp = pd.read_csv(folder / "comparison.csv").set_index(["gqa_group", "pattern"])
    at = curves[curves.seq_len == 8192].set_index(["gqa_group", "pattern"])
    pd.testing.assert_series_equal(
        at["attn_fwd_ms"].sort_index(), comp["attn_fwd_ms"].sort_index(), rtol=1e-5
    )


def test_config_records_resolved_inputs(bundle):
    folder, _ = bundle
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["command"] == "sparsity compare" and cfg["simcli_version"]
    inputs = cfg["inputs"]
    assert inputs["model"] == "llama3-8b" and inputs["gpu"] == "h100-sxm"
    assert inputs["seq_lens"] == [8192] and inputs["gqa_groups"] == [4, 8]
    assert inputs["patterns"] == PATTERNS and inputs["curve_seq_lens"] == [4096, 8192]
    assert inputs["tp"] == 1 and inputs["kernels_only"] is False
    assert cfg["cost_model"] and cfg["seconds"] > 0


def test_report_renders(bundle, tmp_path):
    folder, _ = bundle
    # curves for G=4 and G=8, the breakdown, the end-to-end bars
    rendered = check_report(folder / "report.html", tmp_path, min_svgs=4)
    assert "Speedup over dense against sequence length" in rendered.text
    assert "powers of two" in rendered.text


def test_single_file_outputs_unchanged(run, tmp_path):
    base = [*ARGS, "--seq-len", "8192", "--kernels-only", "--format", "csv"]
    r = run(*base, "--output", str(tmp_path / "rows.json"))
    assert r.exit_code == 0, r.output
    assert len(json.loads((tmp_path / "rows.json").read_text())["rows"]) == 3
    r = run(*base, "--output", str(tmp_path / "rows.csv"))
    assert r.exit_code == 0, r.output
    assert list(pd.read_csv(tmp_path / "rows.csv").columns) == list(COLUMNS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv", "rows.json"]


def test_bad_output_is_one_line_and_writes_nothing(run, tmp_path):
    base = [*ARGS, "--seq-len", "8192", "--kernels-only", "--output"]
    line = one_error_line(run(*base, str(tmp_path / "missing" / "run")))
    assert "does not exist" in line
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    line = one_error_line(run(*base, str(taken)))
    assert "is an existing file" in line
    assert taken.read_text() == "keep me"
    # a bad pattern fails before anything is written
    r = run(*ARGS[:-1], "dense,foo:3", "--seq-len", "8192", "--output", str(tmp_path / "run"))
    assert "unknown sparsity pattern" in one_error_line(r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_break_even_csv_schema(tmp_path):
    """With weight/activation sparsity the bundle adds gemm_break_even.csv, columns as
    documented."""
    from typer.testing import CliRunner

    from simcli.cli import app

    folder = tmp_path / "run"
    args = [*ARGS[:-2], "--patterns", "dense", "--seq-len", "8192", "--kernels-only",
            "--weight-sparsity", "2:4", "--quiet", "--output", str(folder)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(folder / "gemm_break_even.csv")
    assert list(frame.columns) == list(CSV_SCHEMAS["gemm_break_even.csv"])
    assert len(frame) >= 4  # QKV, out-projection, MLP up, MLP down
