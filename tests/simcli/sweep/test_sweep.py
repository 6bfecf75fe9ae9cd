"""simcli sweep: spec validation and expansion, executors, stores, resume, status/export, report."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import typer
import yaml
from typer.testing import CliRunner

from simcli.commands import sweep as sweep_cmd
from simcli.errors import set_debug
from simcli.sweep.report import CSV_SCHEMAS, FIXED_COLUMNS
from simcli.sweep.spec import expand, parse_spec, point_id
from simcli.sweep.store import open_store
from simcli.sweep.target import SweepError, resolve

ROOT = Path(__file__).resolve().parents[3]

GEMM = {
    "command": "predict gemm",
    "fixed": {"k": 1024},
    "grid": {"gpu": ["h100-sxm", "h200-sxm"], "m": [256, 512, 1024]},
    "zip": {"n": [512, 1024], "dtype": ["bf16", "fp16"]},
    "filters": ["m * n <= 512 * 1024"],
}
TRAIN = {
    "command": "train",
    "fixed": {"model": "llama3-8b", "seq_len": 4096, "global-batch": 64, "gpus": 8},
    "grid": {"gpu": ["h100-sxm", "a100-sxm-80gb"], "tp": [1, 2, 8], "recompute": ["none", "full"]},
}


@pytest.fixture
def sweep():
    """`simcli sweep ...` as registered in simcli/cli.py (app.add_typer(..., name="sweep"))."""
    cli = typer.Typer()
    cli.add_typer(sweep_cmd.app, name="sweep")

    @cli.callback()
    def _root() -> None:
        set_debug(False)

    runner = CliRunner()

    def invoke(*args: str):
        set_debug(False)
        return runner.invoke(cli, ["sweep", *map(str, args)])

    return invoke


def write_spec(folder: Path, doc: dict, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def stored(path: Path) -> pd.DataFrame:
    st = open_store(path)
    try:
        return st.frame().drop(columns=["wall_s", "finished_utc"])
    finally:
        st.close()


# -- spec ---------------------------------------------------------------------------------
def test_expansion_grid_times_zip_then_filters():
    points = expand(parse_spec(GEMM))
    # 2 gpus x 3 m x 2 zipped (n, dtype) = 12, minus m*n > 512*1024: (1024,1024) x 2 gpus
    assert len(points) == 10
    assert [p.seq for p in points] == list(range(10))
    first = points[0].params
    assert first == {"dtype": "bf16", "gpu": "h100-sxm", "k": 1024, "m": 256, "n": 512}
    assert all(
        (p.params["n"], p.params["dtype"]) in {(512, "bf16"), (1024, "fp16")} for p in points
    )
    assert all(p.params["m"] * p.params["n"] <= 512 * 1024 for p in points)
    assert len({p.point_id for p in points}) == 10
    assert points[0].point_id == point_id("predict gemm", first)


def test_names_normalised_points_merged_duplicates_dropped_seed_added():
    spec = parse_spec(
        {
            "command": "serve",
            "fixed": {"model": "llama3-8b", "gpu": "h100-sxm", "num_requests": 20},
            "grid": {"qps": [1, 2]},
            "points": [{"qps": 1}, {"qps": 4, "seed": 7}],
            "seed": 3,
        }
    )
    points = expand(spec)
    assert [p.params["qps"] for p in points] == [1, 2, 4]  # the explicit qps 1 is a duplicate
    assert [p.params["seed"] for p in points] == [3, 3, 7]
    assert "num-requests" in points[0].params
    # the click option default fills a name a filter needs but the point leaves unset
    train = parse_spec({**TRAIN, "filters": ["pp == 1 and tp * pp <= gpus"]})
    assert len(expand(train)) == 12


def test_sparsity_alias_and_predict_batch_resolve():
    assert resolve("sparsity").command == "sparsity compare"
    assert "input" in resolve("predict").options
    assert "causal" in resolve("predict attention").options
    argv = resolve("predict attention").argv({"causal": False, "seq-q": 128, "heads-q": 8})
    assert argv[:2] == ["predict", "attention"] and "--no-causal" in argv
    assert argv[-2:] == ["--format", "json"]


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        ({**TRAIN, "gird": {}}, ["unknown field 'gird'", "did you mean 'grid'", "allowed:"]),
        (
            {**TRAIN, "grid": {"globl-batch": [64]}},
            [
                "grid.globl-batch",
                "'globl-batch'",
                "did you mean 'global-batch'",
                "allowed:",
                "micro-batch",
            ],
        ),
        (
            {**TRAIN, "command": "trian"},
            ["command: 'trian'", "did you mean 'train'", "predict gemm"],
        ),
        ({**TRAIN, "grid": {"tp": []}}, ["grid.tp: empty list"]),
        ({**TRAIN, "zip": {"pp": [1, 2], "zero": [1]}}, ["zip: lists of unequal length", "pp=2"]),
        ({**TRAIN, "filters": ["tp * (pp"]}, ["filters[0]", "not an expression", "allowed:"]),
        ({**TRAIN, "filters": ["__import__('os')"]}, ["filters[0]", "not allowed"]),
        ({**TRAIN, "filters": ["tp.real > 0"]}, ["Attribute is not allowed"]),
        ({**TRAIN, "filters": ["tpp > 1"]}, ["unknown name 'tpp'", "did you mean 'tp'"]),
        ({**TRAIN, "grid": {"tp": 4}}, ["grid.tp", "valid list"]),
        ({**TRAIN, "grid": {"format": ["csv"]}}, ["'format'", "--format json"]),
        ({"command": "train", "fixed": {"gpu": "h100-sxm"}}, ["no points"]),
    ],
)
def test_bad_spec_is_one_clear_line(doc, needles, sweep, tmp_path):
    with pytest.raises(SweepError) as err:
        parse_spec(doc, "s.yaml")
    text = str(err.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text
    res = sweep(write_spec(tmp_path, doc), "--results", tmp_path / "r.sqlite")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert res.stdout == ""
    assert not (tmp_path / "r.sqlite").exists()  # no partial output


def test_spec_file_errors(sweep, tmp_path):
    res = sweep(tmp_path / "nope.yaml")
    assert res.exit_code == 2 and "does not exist" in res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: [train\n")
    res = sweep(bad)
    assert res.exit_code == 2 and "not valid YAML" in res.stderr


# -- running, stores, status, export --------------------------------------------------------
def test_local_run_records_failures_and_resumes(sweep, tmp_path):
    spec = write_spec(tmp_path, TRAIN)
    db = tmp_path / "r.sqlite"
    res = sweep(spec, "--results", db, "--workers", "2", "--format", "json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["points_total"] == 12 and out["points_run"] == 12
    assert out["points_failed"] >= 1 and out["points_ok"] >= 1  # tp 1 without recompute: OOM
    frame = stored(db)
    assert len(frame) == 12 and frame["point_id"].is_unique
    bad = frame[~frame["ok"]]
    assert bad["error"].str.startswith("error: plan does not fit").all()
    assert bad["outputs_json"].isna().all()
    good = frame[frame["ok"]]
    assert good["profile_id"].str.contains("profile").all()
    assert all("iteration_s" in json.loads(o) for o in good["outputs_json"])
    assert (frame["simcli_version"] != "").all()

    again = json.loads(sweep("run", spec, "--results", db, "--format", "json").stdout)
    assert again["points_skipped"] == 12 and again["points_run"] == 0
    retry = json.loads(sweep(spec, "--results", db, "--retry-failed", "--format", "json").stdout)
    assert retry["points_run"] == out["points_failed"]
    assert len(stored(db)) == 12

    status = sweep("status", db, "--format", "json")
    assert status.exit_code == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["points_total"] == 12 and st["points_done"] == 12
    assert st["points_failed"] == out["points_failed"] and st["points_to_run"] == 0
    assert st["last_errors"] and "plan does not fit" in st["last_errors"][0]

    csv = sweep("export", db, "--format", "csv")
    assert csv.exit_code == 0, csv.stderr
    header = csv.stdout.splitlines()[0].split(",")
    assert header[: len(FIXED_COLUMNS)] == list(FIXED_COLUMNS)
    assert {"in.tp", "in.recompute", "out.iteration_s", "out.peak_memory_gib"} <= set(header)
    assert "out.breakdown_s.compute_s" in header
    js = json.loads(sweep("export", db, "--format", "json").stdout)
    assert len(js["points"]) == 12
    target = tmp_path / "points.json"
    assert sweep("export", db, "--format", "json", "--output", target).exit_code == 0
    assert json.loads(target.read_text()) == js


def test_parquet_store_round_trip(sweep, tmp_path):
    spec = write_spec(tmp_path, GEMM)
    pq_dir = tmp_path / "r.parquet"
    res = sweep(spec, "--store", "parquet", "--results", pq_dir, "--workers", "2")
    assert res.exit_code == 0, res.stderr
    assert list(pq_dir.glob("part-*.parquet")) and (pq_dir / "meta.json").is_file()
    db = tmp_path / "r.sqlite"
    assert sweep(spec, "--results", db, "--workers", "1").exit_code == 0
    a, b = stored(pq_dir), stored(db)
    assert len(a) == 10
    pd.testing.assert_frame_equal(a, b)
    again = json.loads(
        sweep(spec, "--store", "parquet", "--results", pq_dir, "--format", "json").stdout
    )
    assert again["points_run"] == 0 and again["points_skipped"] == 10
    st = json.loads(sweep("status", pq_dir, "--format", "json").stdout)
    assert st["store_kind"] == "parquet" and st["points_ok"] == 10
    exported = sweep("export", pq_dir).stdout.splitlines()
    assert len(exported) == 11 and "out.predicted_ms" in exported[0]


def test_missing_and_corrupt_stores(sweep, tmp_path):
    res = sweep("status", tmp_path / "none.sqlite")
    assert (
        res.exit_code == 2
        and res.stderr == f"error: store {tmp_path / 'none.sqlite'} does not exist\n"
    )
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database at all, just text\n")
    res = sweep("export", junk)
    assert res.exit_code == 2 and "not an SQLite file" in res.stderr and res.stdout == ""
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    res = sweep("status", other)
    assert res.exit_code == 2 and "not a simcli sweep store" in res.stderr
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    res = sweep("status", empty_dir)
    assert res.exit_code == 2 and "not a simcli sweep store" in res.stderr


def test_report_bundle(sweep, tmp_path):
    from tests.simcli.reports.browser import check_report

    spec = write_spec(tmp_path, TRAIN)
    out = tmp_path / "report"
    res = sweep(spec, "--results", tmp_path / "r.sqlite", "--workers", "2", "--output", out)
    assert res.exit_code == 0, res.stderr
    assert {p.name for p in out.iterdir()} == {"points.csv", "config.json", "report.html"}
    header = (out / "points.csv").read_text().splitlines()[0].split(",")
    schema = CSV_SCHEMAS["points.csv"]
    fixed = [c for c in schema if "<" not in c]
    assert header[: len(fixed)] == fixed
    assert all(c.startswith(("in.", "out.")) for c in header[len(fixed) :])
    config = json.loads((out / "config.json").read_text())
    assert config["command"] == "sweep" and config["inputs"]["spec"]["command"] == "train"
    page = (out / "report.html").read_text()
    assert "Pareto front" in page and "Best point per GPU type" in page
    assert "Failed points" in page
    rendered = check_report(out / "report.html", tmp_path, min_svgs=2)
    assert "a100-sxm-80gb" in rendered.text


def test_report_of_a_partial_store(sweep, tmp_path):
    """`sweep report` draws a stored sweep, counting points not yet run (as after Ctrl-C)."""
    spec = write_spec(tmp_path, GEMM)
    results = tmp_path / "r.sqlite"
    assert sweep(spec, "--results", results, "--workers", "1").exit_code == 0
    with sqlite3.connect(results) as con:  # two points "not run yet"
        con.execute("DELETE FROM points WHERE seq IN (SELECT seq FROM points LIMIT 2)")
    out = tmp_path / "partial"
    res = sweep("report", results, "--output", out, "--format", "json")
    assert res.exit_code == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["points_done"] == got["points_total"] - 2
    assert len(pd.read_csv(out / "points.csv")) == got["points_done"]
    page = (out / "report.html").read_text()
    assert "not run: 2" in page
    res = sweep("report", results, "--output", tmp_path / "no" / "dir")
    assert res.exit_code == 2 and "does not exist" in res.stderr


# -- executors ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    yield ray
    ray.shutdown()


def test_local_and_ray_give_identical_stores(ray_local, sweep, tmp_path):
    spec = write_spec(
        tmp_path, {**GEMM, "points": [{"gpu": "h100-sxm", "m": 64, "n": 64, "dtype": "fp4"}]}
    )
    local, ray_db = tmp_path / "local.sqlite", tmp_path / "ray.sqlite"
    res = sweep(spec, "--results", local, "--workers", "2", "--chunk-size", "3")
    assert res.exit_code == 0, res.stderr
    res = sweep(spec, "--results", ray_db, "--executor", "ray", "--chunk-size", "4")
    assert res.exit_code == 0, res.stderr
    a, b = stored(local), stored(ray_db)
    assert len(a) == 11 and (~a["ok"]).sum() == 1  # the fp4 point failed, the rest ran
    assert "dtype" in a.loc[~a["ok"], "error"].iloc[0]
    pd.testing.assert_frame_equal(a, b)


# -- kill and resume ------------------------------------------------------------------------
def _count(db: Path) -> int:
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM points").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def test_sigkill_then_resume_loses_and_duplicates_nothing(sweep, tmp_path):
    doc = {
        **GEMM,
        "grid": {"gpu": ["h100-sxm", "h200-sxm"], "m": list(range(64, 64 * 61, 64))},
        "zip": {"n": [512, 1024, 2048], "dtype": ["bf16", "fp16", "fp8"]},
        "filters": [],
    }
    spec = write_spec(tmp_path, doc)
    total = len(expand(parse_spec(doc)))
    assert total == 360
    db = tmp_path / "r.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "from simcli.commands.sweep import app; app(prog_name='simcli sweep')"
    cmd = [
        sys.executable,
        "-c",
        code,
        str(spec),
        "--results",
        str(db),
        "--workers",
        "2",
        "--chunk-size",
        "2",
        "--quiet",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    try:
        while _count(db) < 20:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no rows after 60 s"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = open_store(db).frame()
    assert 20 <= len(before) < total
    res = sweep(spec, "--results", db, "--workers", "2", "--format", "json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["points_skipped"] == len(before) and out["points_run"] == total - len(before)
    after = open_store(db).frame()
    assert len(after) == total and after["point_id"].is_unique
    assert set(after["point_id"]) == {p.point_id for p in expand(parse_spec(doc))}
    kept = after.set_index("point_id").loc[before["point_id"]].reset_index()
    pd.testing.assert_frame_equal(kept[before.columns], before)  # earlier rows unchanged


def test_ctrl_c_stores_what_finished_and_exits_130(tmp_path):
    doc = {**TRAIN, "grid": {**TRAIN["grid"], "micro-batch": [1, 2, 4, 8], "pp": [1, 2, 4]}}
    spec = write_spec(tmp_path, doc)
    db = tmp_path / "r.sqlite"
    code = "from simcli.commands.sweep import app; app(prog_name='simcli sweep')"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            str(spec),
            "--results",
            str(db),
            "--workers",
            "2",
            "--chunk-size",
            "2",
            "--quiet",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a child inherits an ignored SIGINT across exec; earlier tests (ray) may have left
        # the test process ignoring it, and a user's shell never does
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while _count(db) < 4:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert "interrupted" in err.decode() and "rerun the same command to resume" in err.decode()
    n = _count(db)
    assert 4 <= n < len(expand(parse_spec(doc)))


def test_a_sweep_that_cannot_finish_checks_first_and_leaves_nothing(sweep, tmp_path, monkeypatch):
    """Issue 18 item 8: a bad --output or an unreachable Ray cluster used to run every
    point and leave a store beside the spec (in the source tree for shipped specs); now
    they fail before any work, and the default store goes to the current folder."""
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = write_spec(specs, GEMM)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "no-ray"))
    res = sweep(spec, "--output", tmp_path / "missing" / "x")
    assert res.exit_code == 2 and "does not exist" in res.output
    res = sweep(spec, "--executor", "ray", "--ray-address", "auto")
    assert res.exit_code == 2 and "no running Ray cluster" in res.output
    assert sorted(p.name for p in specs.iterdir()) == ["spec.yaml"]
    assert list(work.iterdir()) == []
    assert sweep(spec, "--workers", "1").exit_code == 0
    assert (work / "spec.results.sqlite").exists() and len(list(specs.iterdir())) == 1


def test_a_store_created_by_a_sweep_that_failed_before_any_point_is_removed(
    sweep, tmp_path, monkeypatch
):
    import simcli.sweep.runner as runner_mod
    from simcli.sweep.errors import SweepError

    def broken(*args, **kwargs):
        raise SweepError("--ray-address 10.0.0.1:6379: cannot start or join Ray: timeout")

    monkeypatch.setattr(runner_mod, "run_sweep", broken)
    spec = write_spec(tmp_path, GEMM)
    db = tmp_path / "r.sqlite"
    res = sweep(spec, "--results", db)
    assert res.exit_code == 2 and "cannot start or join Ray" in res.output
    assert not db.exists()
