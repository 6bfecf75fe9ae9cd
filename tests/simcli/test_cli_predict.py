import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodels.ops.select import get_cost_model
from workloads.ops import CSV_COLUMNS, normalise_frame

HEADER = ",".join(CSV_COLUMNS)
ROWS = [
    "gemm,bf16,4096,4096,4096,,,,,,,,,,,,",
    "gemm,fp8,8192,8192,8192,,,,,,,,,,,,",
    "attn_fwd,bf16,,,,2,4096,4096,32,8,128,true,flash,,,,",
    "attn_fwdbwd,fp16,,,,1,8192,8192,16,16,128,1,cudnn,,,,",
    "attn_decode,bf16,,,,64,1,8192,32,8,128,,,,,,",
    "attn_blocksparse_fwd,bf16,,,,1,32768,32768,16,16,128,false,,0.1,128,,",
    "all_reduce,,,,,,,,,,,,,,,1073741824,8",
    "all_gather,,,,,,,,,,,,,,,1048576,4",
    "send_recv,,,,,,,,,,,,,,,4194304,",
    "copy,,,,,,,,,,,,,,,268435456,",
    "rmsnorm,bf16,8192,4096,,,,,,,,,,,,,",
    "swiglu,bf16,8192,14336,,,,,,,,,,,,,",
]


def write_csv(path, rows, header=HEADER):
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def one_error_line(result):
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_batch_predict_keeps_rows_in_order(run, tmp_path):
    src = write_csv(tmp_path / "ops.csv", ROWS)
    out = tmp_path / "pred.csv"
    result = run("predict", "--gpu", "h100-sxm", "--input", str(src), "--output", str(out))
    assert result.exit_code == 0, result.output
    pred = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(pred.columns) == [*CSV_COLUMNS, "predicted_ms"]
    raw = pd.read_csv(src, dtype=str, keep_default_na=False)
    pd.testing.assert_frame_equal(pred[list(CSV_COLUMNS)], raw)
    ms = pred["predicted_ms"].astype(float).to_numpy()
    expected = get_cost_model("h100-sxm").predict_many(normalise_frame(raw)) * 1e3
    np.testing.assert_allclose(ms, expected, rtol=1e-5)
    assert (ms > 0).all()


def test_batch_predict_subset_of_columns_and_json_summary(run, tmp_path):
    src = write_csv(tmp_path / "ops.csv", ["gemm,128,256,512", "copy,,,"], header="op,m,n,k")
    src.write_text("op,m,n,k,bytes\ngemm,128,256,512,\ncopy,,,,1024\n")
    out = tmp_path / "pred.csv"
    result = run(
        "predict",
        "--gpu",
        "a100-sxm-80gb",
        "--input",
        str(src),
        "--output",
        str(out),
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 2 and summary["output"] == str(out)
    assert list(pd.read_csv(out).columns) == ["op", "m", "n", "k", "bytes", "predicted_ms"]


def test_batch_predict_to_stdout(run, tmp_path):
    src = write_csv(tmp_path / "ops.csv", ROWS[:2])
    result = run("predict", "--gpu", "h100-sxm", "--input", str(src), "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert len(data["rows"]) == 2 and data["rows"][0]["predicted_ms"] > 0
    csv = run("predict", "--gpu", "h100-sxm", "--input", str(src), "--format", "csv")
    assert csv.stdout.splitlines()[0].endswith("predicted_ms")


BAD_CASES = {
    "unknown column": ("op,m,n,k,colour\ngemm,1,2,3,red\n", "unknown column(s) 'colour'"),
    "missing op column": ("m,n,k\n1,2,3\n", "no 'op' column"),
    "unknown op": ("op,m,n,k\nconv2d,1,2,3\n", "row 1: unknown op 'conv2d'"),
    "missing size": ("op,m,n,k\ngemm,1,2,\n", "row 1: op 'gemm' needs column 'k'"),
    "negative size": ("op,m,n,k\ngemm,1,2,3\ngemm,-4,2,3\n", "row 2: column 'm' must be positive"),
    "zero size": ("op,m,n,k\ngemm,0,2,3\n", "column 'm'"),
    "non-integer": ("op,m,n,k\ngemm,1.5,2,3\n", "column 'm' must be an integer"),
    "text size": ("op,m,n,k\ngemm,big,2,3\n", "column 'm' must be an integer"),
    "gqa mismatch": (
        f"{HEADER}\nattn_fwd,bf16,,,,1,128,128,32,6,128,,,,,,\n",
        "heads_q (32) must be a multiple of heads_kv (6)",
    ),
    "bad dtype": ("op,dtype,m,n,k\ngemm,fp4,1,2,3\n", "unknown dtype 'fp4'"),
    "bad backend": (
        f"{HEADER}\nattn_fwd,bf16,,,,1,128,128,8,8,64,,triton,,,,\n",
        "no backend 'triton'",
    ),
    "bad density": (
        f"{HEADER}\nattn_blocksparse_fwd,bf16,,,,1,128,128,8,8,64,,,1.5,64,,\n",
        "density",
    ),
    "bad causal": (f"{HEADER}\nattn_fwd,bf16,,,,1,128,128,8,8,64,maybe,,,,,\n", "causal"),
    "ragged": ("op,m,n,k\ngemm,1,2,3,4,5\n", "malformed"),
    "empty file": ("", "is empty"),
    "fp8 on a100": ("op,dtype,m,n,k\ngemm,fp8,16,16,16\n", "fp8"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_gives_one_line_and_no_output(run, tmp_path, case):
    text, message = BAD_CASES[case]
    src = tmp_path / "ops.csv"
    src.write_text(text)
    out = tmp_path / "pred.csv"
    gpu = "a100-sxm-80gb" if case == "fp8 on a100" else "h100-sxm"
    result = run("predict", "--gpu", gpu, "--input", str(src), "--output", str(out))
    line = one_error_line(result)
    assert message in line, line
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ops.csv"]  # no temp files left


def test_unknown_gpu_lists_valid_ids(run, tmp_path):
    src = write_csv(tmp_path / "ops.csv", ROWS[:1])
    out = tmp_path / "pred.csv"
    line = one_error_line(
        run("predict", "--gpu", "h900", "--input", str(src), "--output", str(out))
    )
    assert "unknown GPU 'h900'" in line and "h100-sxm" in line and "mi300x" in line
    assert not out.exists()


def test_missing_and_directory_inputs(run, tmp_path):
    line = one_error_line(
        run("predict", "--gpu", "h100-sxm", "--input", str(tmp_path / "nope.csv"))
    )
    assert "does not exist" in line
    line = one_error_line(run("predict", "--gpu", "h100-sxm", "--input", str(tmp_path)))
    assert "directory" in line


def test_output_folder_missing(run, tmp_path):
    src = write_csv(tmp_path / "ops.csv", ROWS[:1])
    line = one_error_line(
        run(
            "predict",
            "--gpu",
            "h100-sxm",
            "--input",
            str(src),
            "--output",
            str(tmp_path / "no" / "p.csv"),
        )
    )
    assert "does not exist" in line


def test_batch_needs_gpu_and_input(run):
    line = one_error_line(run("predict"))
    assert "--gpu and --input" in line


def test_debug_shows_the_exception(tmp_path):
    from typer.testing import CliRunner

    from simcli.cli import app

    result = CliRunner().invoke(
        app, ["--debug", "predict", "gemm", "--m", "1", "--n", "1", "--k", "1", "--gpu", "nope"]
    )
    assert result.exit_code != 0
    assert result.exception is not None and "unknown GPU" in str(result.exception)


def test_single_gemm_command(run):
    result = run(
        "predict",
        "gemm",
        "--m",
        "8192",
        "--n",
        "8192",
        "--k",
        "8192",
        "--dtype",
        "bf16",
        "--gpu",
        "h100-sxm",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert 740 < data["achieved_tflops"] < 830  # measured on H100: 783
    assert data["model"].startswith("calibrated profile h100-sxm")
    assert data["predicted_ms"] > 0


@pytest.mark.parametrize(
    "args",
    [
        ["attention", "--seq-q", "8192", "--heads-q", "32", "--heads-kv", "8", "--phase", "fwdbwd"],
        ["attention", "--seq-q", "4096", "--heads-q", "16", "--no-causal", "--backend", "cudnn"],
        ["decode", "--batch", "32", "--context-len", "4096", "--heads-q", "32", "--heads-kv", "8"],
        ["blocksparse", "--seq-len", "32768", "--heads-q", "16", "--density", "0.05"],
        [
            "collective",
            "--kind",
            "all_gather",
            "--bytes",
            "1048576",
            "--ranks",
            "16",
            "--nodes",
            "2",
        ],
        ["elementwise", "--op", "rmsnorm", "--m", "8192", "--n", "4096"],
        ["elementwise", "--op", "copy", "--bytes", "1073741824"],
    ],
)
def test_single_op_commands(run, args):
    result = run("predict", *args, "--gpu", "h100-sxm", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["predicted_ms"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gemm", "--m", "0", "--n", "1", "--k", "1"], "m"),
        (
            ["attention", "--seq-q", "128", "--heads-q", "32", "--heads-kv", "5"],
            "multiple of heads_kv",
        ),
        (["attention", "--seq-q", "128", "--heads-q", "8", "--phase", "sideways"], "--phase"),
        (["collective", "--kind", "broadcast", "--bytes", "8"], "--kind"),
        (["collective", "--bytes", "8", "--ranks", "6", "--nodes", "4"], "multiple of nodes"),
        (["elementwise", "--op", "rmsnorm", "--m", "8"], "needs n"),
        (["gemm", "--m", "1", "--n", "1", "--k", "1", "--dtype", "fp12"], "dtype"),
    ],
)
def test_single_op_bad_input(run, args, message):
    line = one_error_line(run("predict", *args, "--gpu", "h100-sxm"))
    assert message in line, line


int_or_junk = st.one_of(
    st.integers(-5, 10**6).map(str), st.sampled_from(["", "x", "1.5", "1e3", " 7 "])
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    op=st.sampled_from(
        ["gemm", "attn_fwd", "attn_decode", "copy", "all_reduce", "rmsnorm", "nope"]
    ),
    cells=st.lists(int_or_junk, min_size=16, max_size=16),
)
def test_random_rows_never_crash(run, tmp_path, op, cells):
    src = tmp_path / "fuzz.csv"
    out = tmp_path / "fuzz_pred.csv"
    out.unlink(missing_ok=True)
    cells[10] = ""  # causal
    cells[11] = ""  # backend
    cells[12] = ""  # density
    src.write_text(HEADER + "\n" + ",".join([op, *cells]) + "\n")
    result = run("predict", "--gpu", "h100-sxm", "--input", str(src), "--output", str(out))
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 0:
        assert float(pd.read_csv(out)["predicted_ms"][0]) >= 0
    else:
        assert result.stderr.startswith("error: ") and not out.exists()
