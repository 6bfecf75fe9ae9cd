"""``calibrate run --tiny --device cpu`` -> ``calibrate fit`` -> ``calibrate report``, the
path a user takes on any machine, as CI runs it (no GPU, a few seconds). The fit must
take whatever the runner writes: tiny shapes, head dims no factor table has, suites that
only recorded ``unsupported`` rows, partial suites, dtypes the target GPU has no rate for.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from costmodels.ops.select import get_cost_model  # noqa: E402
from workloads.ops import Op  # noqa: E402

OPS = [
    Op(op="gemm", m=4096, n=4096, k=4096),
    Op(op="gemm", m=33, n=47, k=65, dtype="fp32"),
    Op(op="attn_fwd", batch=1, seq_q=2048, seq_kv=2048, heads_q=32, heads_kv=8, head_dim=32),
    Op(op="attn_fwdbwd", batch=2, seq_q=512, seq_kv=512, heads_q=8, heads_kv=8, head_dim=96),
    Op(op="attn_decode", batch=8, seq_q=1, seq_kv=4096, heads_q=32, heads_kv=8, head_dim=192),
    Op(op="rmsnorm", m=4096, n=4096),
    Op(op="copy", bytes=2**28),
]


def _one_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """Every single-GPU suite, tiny shapes, on the CPU (blocksparse and power: all rows
    ``unsupported``), exactly as ``simcli calibrate run --tiny --device cpu`` writes it."""
    from typer.testing import CliRunner

    from simcli.cli import app

    out = tmp_path_factory.mktemp("run") / "cpu"
    result = CliRunner().invoke(
        app, ["calibrate", "run", "--tiny", "--device", "cpu", "--out", str(out), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    return out


def test_run_fit_report_end_to_end(run, tiny_data, tmp_path):
    meta = json.loads((tiny_data / "meta.json").read_text())
    assert meta["device"] == {"type": "cpu"}
    profile, report = tmp_path / "cpu.json", tmp_path / "report"
    fit = run(
        "calibrate", "fit", "--data", str(tiny_data), "--gpu", "h100-sxm", "--out",
        str(profile), "--report", str(report), "--format", "json",
    )  # fmt: skip
    assert fit.exit_code == 0, fit.output
    # the recorded device is the CPU: one warning line on stderr, not a failure
    warnings = [x for x in fit.stderr.splitlines() if x.startswith("warning: ")]
    assert warnings == [f"warning: dataset {tiny_data} was measured on the CPU, not on h100-sxm"]
    out = json.loads(fit.stdout)
    classes = {r["op_class"]: r for r in out["fidelity"]}
    assert {"gemm_half", "attn", "decode", "elementwise", "all"} <= set(classes)
    assert classes["all"]["rows_held_out"] > 0 and np.isfinite(classes["all"]["learned_mape"])
    assert out["held_out_split"].startswith("a quarter of the shape families")
    assert any("head_dim 32" in n for n in out["notes"])  # the pooled factor, said so
    assert out["provenance"]["kind"] == "transferred"  # CPU data, named for an H100
    assert (report / "report.html").exists() and (report / "fidelity.csv").exists()

    # the profile loads and predicts finite, positive times, unseen head dims included
    stored = json.loads(profile.read_text())  # strict JSON: no NaN for unmeasured classes
    assert stored["fidelity"]["all"]["learned_mape"] == pytest.approx(
        classes["all"]["learned_mape"]
    )
    model = get_cost_model("h100-sxm", profile=profile)
    times = np.array([model.predict(op) for op in OPS])
    assert np.isfinite(times).all() and (times > 0).all()
    assert model.provenance.kind == "transferred" and model.expected_error > 0

    rep = run("calibrate", "report", "--profile", str(profile), "--data", str(tiny_data))
    assert rep.exit_code == 0, rep.output
    assert "provenance: transferred" in rep.stdout
    as_json = run(
        "calibrate", "report", "--profile", str(profile), "--data", str(tiny_data),
        "--format", "json",
    )  # fmt: skip
    assert json.loads(as_json.stdout)["provenance"]["kind"] == "transferred"


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "l40s", "mi300x", "b200", "h100-pcie"])
def test_tiny_data_fits_for_any_gpu(run, tiny_data, tmp_path, gpu):
    """GPUs without an fp8 (A100) or other rate leave those rows out, with a note."""
    profile = tmp_path / f"{gpu}.json"
    fit = run(
        "calibrate", "fit", "--data", str(tiny_data), "--gpu", gpu, "--out", str(profile),
        "--format", "json", "--quiet",
    )  # fmt: skip
    assert fit.exit_code == 0, fit.output
    notes = json.loads(fit.stdout)["notes"]
    if gpu == "a100-sxm-80gb":
        assert any(n.startswith("left out 1 gemm fp8 row(s)") for n in notes)
    model = get_cost_model(gpu, profile=profile)
    times = np.array([model.predict(op) for op in OPS])
    assert np.isfinite(times).all() and (times > 0).all()


def _subset(tiny_data: Path, folder: Path, *suites: str) -> Path:
    """A dataset folder holding only some of the runner's suite files (a partial run)."""
    import shutil

    folder.mkdir()
    for name in ("meta.json", *(f"{s}.csv" for s in suites)):
        shutil.copy(tiny_data / name, folder / name)
    return folder


def test_partial_suites_and_unsupported_only(run, tiny_data, tmp_path):
    """A run of one suite fits; a run whose every row is unsupported says why, in one line."""
    decode = _subset(tiny_data, tmp_path / "decode", "decode")
    profile = tmp_path / "decode.json"
    fit = run("calibrate", "fit", "--data", str(decode), "--gpu", "h200-sxm", "--out",
              str(profile))  # fmt: skip
    assert fit.exit_code == 0, fit.output
    assert "held-out MAPE: decode" in fit.stdout
    prof = json.loads(profile.read_text())
    assert prof["fidelity"]["decode"]["rows_held_out"] > 0

    sparse = _subset(tiny_data, tmp_path / "sparse", "blocksparse", "power")
    line = _one_error(
        run(
            "calibrate",
            "fit",
            "--data",
            str(sparse),
            "--gpu",
            "h100-sxm",
            "--out",
            str(tmp_path / "none.json"),
        )  # fmt: skip
    )
    assert "no rows with status ok" in line and "unsupported" in line
    assert not (tmp_path / "none.json").exists()


def test_ops_file_with_head_dims_no_table_has(run, tmp_path):
    """Head dims 40, 80 and 160 have no factor of their own: the fit pools them with
    their side of 128 and says so; the profile prices every head dim."""
    ops = tmp_path / "ops.csv"
    header = "op,dtype,batch,seq_q,seq_kv,heads_q,heads_kv,head_dim,causal,family\n"
    lines = [
        f"{op},bf16,1,{1 if op == 'attn_decode' else s},{s},4,{kv},{d},false,h4kv{kv}d{d}"
        for op in ("attn_fwd", "attn_decode")
        for d in (40, 80, 128, 160)
        for kv in (1, 2, 4)
        for s in (64, 128)
    ]
    ops.write_text(header + "\n".join(lines) + "\n")
    data = tmp_path / "measured"
    ok = run("calibrate", "run", "--ops", str(ops), "--device", "cpu", "--out", str(data),
             "--quiet")  # fmt: skip
    assert ok.exit_code == 0, ok.output
    profile = tmp_path / "p.json"
    fit = run("calibrate", "fit", "--data", str(data), "--gpu", "h100-sxm", "--out",
              str(profile), "--format", "json")  # fmt: skip
    assert fit.exit_code == 0, fit.output
    notes = " ".join(json.loads(fit.stdout)["notes"])
    assert "head_dim 40, 80, 160 not in the factor table" in notes
    model = get_cost_model("h100-sxm", profile=profile)
    for d in (16, 40, 64, 96, 128, 160, 256, 512):
        t = model.predict(
            Op(op="attn_fwd", batch=1, seq_q=1024, seq_kv=1024, heads_q=8, heads_kv=8, head_dim=d)
        )
        assert np.isfinite(t) and t > 0


def test_a_profile_overriding_one_head_dim_point_prices_every_head_dim(tmp_path):
    """The KeyError behind ``error: 256``: a fit (or a hand-written profile) that sets the
    factor at 64 only; the other point stays at its neutral 1.0."""
    params = {
        "attention": {
            "backends": {"efficient": {"fwd_head_dim_factor": {"64": 0.9}}},
            "decode_head_dim_factor": {"256": 0.8},
        }
    }
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "one-point", "gpu": "h100-sxm", "params": params}))
    model = get_cost_model("h100-sxm", profile=path, use_shipped=False)
    assert model.params.attention.backends["efficient"].fwd_head_dim_factor == {64: 0.9, 256: 1.0}
    for d in (64, 256):
        fwd = Op(op="attn_fwd", batch=1, seq_q=512, seq_kv=512, heads_q=8, heads_kv=8,
                 head_dim=d, backend="efficient")  # fmt: skip
        dec = Op(op="attn_decode", batch=4, seq_q=1, seq_kv=512, heads_q=8, heads_kv=8,
                 head_dim=d)  # fmt: skip
        assert model.predict(fwd) > 0 and model.predict(dec) > 0
