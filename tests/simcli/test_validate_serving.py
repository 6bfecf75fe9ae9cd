"""benchmarks/validate_serving.py and its published set (benchmarks/data/
serving_published.yaml): the schema of every row, the runner on two fast rows against the
`simcli serve` command itself, and the MAE arithmetic on made-up predictions."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from benchmarks import validate_serving as vs
from hardware_specs.registry import load_catalog
from simcli.cli import app
from simcli.scenario.serving_options import ServeOptions
from workloads.lengths import parse_dist
from workloads.models import load_model

# serve options being added under issue 29 (other branches); every other option a row
# names must be a field of ServeOptions today
PENDING_OPTIONS = {"max_concurrency"}
ENGINES = {"vllm", "vllm-v0", "sglang", "trtllm", "trtllm-0.6"}


@pytest.fixture(scope="module")
def published() -> vs.Published:
    return vs.load_published()


def test_every_row_is_complete_and_loads(published):
    rows = published.rows
    assert len(rows) >= 40
    assert {r.engine for r in rows} >= {"vllm", "vllm-v0", "sglang", "trtllm"}
    assert {r.gpu for r in rows} >= {"a100-sxm-80gb", "h100-sxm", "h200-sxm"}
    assert {r.metric_class for r in rows} == set(vs.CLASSES)
    catalog = load_catalog()
    for model in {r.model for r in rows}:
        load_model(model)  # a built-in id or a config.json under examples/models
    for r in rows:
        catalog.gpu(r.gpu)
        assert r.unit in vs.UNIT_TO_SI
        assert published.sources[r.source].url.startswith("https://")
        assert r.engine_version and r.model_as_published and r.dataset
        if r.near_saturation:  # every near-saturation row says why
            assert any(f.startswith("near_saturation") for f in r.flags), r.id
        unknown = set(r.simcli) - set(ServeOptions.model_fields) - PENDING_OPTIONS
        assert not unknown, (r.id, unknown)
        assert r.simcli.get("engine", "vllm") in ENGINES
        for key in ("prompt_len", "output_len"):
            text = r.simcli.get(key)
            if text is not None and not str(text).startswith("dataset:"):
                parse_dist(text)
        if r.load.kind == "closed_loop" and r.num_requests > r.load.concurrency:
            assert r.simcli["max_concurrency"] == r.load.concurrency
        if r.load.kind == "poisson":
            assert float(r.simcli["qps"]) == r.load.rate_per_s
        if r.load.kind == "offline":
            assert r.simcli["qps"] == "inf"


def test_quick_and_stand_ins_name_real_rows_and_options(published):
    assert set(published.quick) <= {r.id for r in published.rows}
    assert set(published.stand_ins) <= set(ServeOptions.model_fields)
    for table in published.stand_ins.values():
        for value in table.values():
            if isinstance(value, str) and ":" in value:
                parse_dist(value)


def _row(**over) -> dict:
    row = {
        "id": "x", "source": "s", "engine": "vllm", "engine_version": "0.9.0", "gpu": "h100-sxm",
        "gpus": 1, "tp": 1, "model": "llama3.1-8b", "model_as_published": "m", "weights": "bf16",
        "kv_cache": "bf16", "dataset": "fixed", "input_tokens": "128", "output_tokens": "16",
        "load": {"kind": "offline"}, "num_requests": 8, "metric": "ttft", "statistic": "mean",
        "value": 10.0, "unit": "ms", "near_saturation": False,
        "simcli": {"model": "llama3.1-8b", "gpu": "h100-sxm", "qps": "inf",
                   "prompt_len": "fixed:128", "output_len": "fixed:16"},
    }  # fmt: skip
    row.update(over)
    return row


@pytest.mark.parametrize(
    "over, words",
    [
        ({"unit": "tokens/s"}, "unit 'tokens/s' for ttft"),
        ({"statistic": "total"}, "ttft 'total'"),
        ({"metric": "output_throughput", "statistic": "per_gpu", "unit": "tokens/s"}, "per_gpu"),
        ({"gpu": "a100-sxm-80gb"}, "simcli gpu"),
        ({"gpus": 2}, "gpus 2"),
        ({"engine": "sglang"}, "simcli engine"),
        ({"load": {"kind": "poisson"}}, "rate_per_s"),
        ({"simcli": {**_row()["simcli"], "num_requests": 5}}, "runner sets num_requests"),
    ],
)
def test_schema_refuses_inconsistent_rows(over, words):
    with pytest.raises(ValidationError, match=words.replace("(", r"\(")):
        vs.Row.model_validate(_row(**over))


def test_file_level_checks(published):
    data = yaml.safe_load(vs.PUBLISHED.read_text())
    data["rows"].append(dict(data["rows"][0]))
    with pytest.raises(ValidationError, match="duplicate row ids"):
        vs.Published.model_validate(data)
    data["rows"].pop()
    data["rows"][0] = {**data["rows"][0], "source": "nowhere"}
    with pytest.raises(ValidationError, match="unknown source 'nowhere'"):
        vs.Published.model_validate(data)


def test_runner_on_two_fast_rows_matches_the_cli(published):
    ids = ["tw-vllm-llama31-8b-h100-c5-ttft", "trt05-h100-llama2-7b-tp1-bs1-128-ttft"]
    rows = [r for r in published.rows if r.id in ids]
    # stand-ins only replace options not in simcli yet: a no-op once they are merged
    results = vs.run_rows(rows, published, stand_ins=True)
    for row, res in zip(rows, results, strict=True):
        assert res["error"] is None, res["error"]
        assert res["published"] == pytest.approx(row.value * vs.UNIT_TO_SI[row.unit])
        assert res["predicted"] > 0 and math.isfinite(res["predicted"])
        assert res["error_pct"] == pytest.approx(100 * (res["predicted"] / res["published"] - 1))
    # the same number as `simcli serve ... --format json` with the row's options
    values = vs.serve_values(rows[0], published.request_cap, published.seed, published.stand_ins)
    args = ["serve", "--format", "json"]
    for key, value in values.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["ttft_s_mean"] == pytest.approx(results[0]["predicted"])


def test_a_row_that_cannot_run_gives_one_line():
    row = vs.Row.model_validate(_row(simcli={**_row()["simcli"], "qps": 1.0, "not_an_option": 1}))
    res = vs.predict_row(row, vs.serve_values(row, 10, 0))
    assert res["predicted"] is None and res["error_pct"] is None
    assert "not_an_option" in res["error"] and "\n" not in res["error"]


def test_mae_arithmetic_on_made_up_predictions():
    rows = [
        # ttft 10 ms published, 12 ms predicted: +20%
        vs.Row.model_validate(_row(id="a")),
        # tpot 20 ms published, 15 ms predicted: -25%
        vs.Row.model_validate(_row(id="b", metric="tpot", value=20.0)),
        # 1000 tokens/s/gpu on 2 GPUs published, 2200 tokens/s total predicted: +10%
        vs.Row.model_validate(
            _row(
                id="c",
                engine="trtllm",
                gpus=2,
                tp=2,
                metric="output_throughput",
                statistic="per_gpu",
                value=1000.0,
                unit="tokens/s/gpu",
                simcli={**_row()["simcli"], "engine": "trtllm", "tp": 2},
            )
        ),  # fmt: skip
        # near saturation, e2e 2 s published, 5 s predicted: +150%, kept apart
        vs.Row.model_validate(
            _row(
                id="d",
                metric="e2e",
                value=2.0,
                unit="s",
                near_saturation=True,
                flags=["near_saturation: made up"],
            )
        ),  # fmt: skip
    ]
    fake = {
        "a": {"ttft_s_mean": 0.012},
        "b": {"tpot_s_mean": 0.015},
        "c": {"throughput_tokens_per_s": 2200.0},
        "d": {"e2e_s_mean": 5.0},
    }
    results = [vs.predict_row(r, {}, run=lambda _v, r=r: fake[r.id]) for r in rows]
    assert [round(r["error_pct"], 9) for r in results] == [20.0, -25.0, 10.0, 150.0]
    s = vs.summarize(results)
    assert s["all"]["rows"] == 3 and s["all"]["mae_pct"] == pytest.approx(55 / 3)
    assert s["all"]["mean_signed_pct"] == pytest.approx(5 / 3)
    assert s["latency"]["mae_pct"] == pytest.approx(22.5)
    assert s["by_engine"]["trtllm"]["mae_pct"] == pytest.approx(10.0)
    assert s["by_metric_class"]["tpot_itl"]["max_abs_pct"] == pytest.approx(25.0)
    assert s["near_saturation"]["rows"] == 1 and s["near_saturation"]["mae_pct"] == 150.0
    assert s["all_with_near_saturation"]["mae_pct"] == pytest.approx(205 / 4)
    assert s["rows_beyond"] == []  # 25% is not beyond 25%; d is near saturation
    assert [w["id"] for w in s["worst"]] == ["d", "b", "a", "c"]
    assert vs.mae([]) is None


def test_cli_of_the_script(capsys):
    assert vs.main(["--rows", "no-such-row*"]) == 2
    assert "matches no row" in capsys.readouterr().err
    assert vs.main(["--jobs", "0"]) == 2
    assert vs.main(["--quick", "--rows", "tw-*", "--format", "csv", "--stand-ins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(",") == list(vs.CSV_COLUMNS) and len(lines) == 3


def test_stand_ins_apply_only_to_rows_simcli_refuses():
    table = {"qps": {"1.0": 2.0}, "gpu": {"h100-sxm": "h200-sxm"}}
    ok = vs.Row.model_validate(_row(simcli={**_row()["simcli"], "qps": 1.0}))
    assert vs.serve_values(ok, 10, 0, table) == vs.serve_values(ok, 10, 0)
    refused = vs.Row.model_validate(
        _row(simcli={**_row()["simcli"], "qps": 1.0, "prompt_len": "x"})
    )
    subbed = vs.serve_values(refused, 10, 0, table)
    assert subbed["qps"] == 2.0 and subbed["gpu"] == "h200-sxm" and subbed["num_requests"] == 8
    assert vs.serve_values(ok, 10, 0)["qps"] == 1.0
    assert vs.serve_values(vs.Row.model_validate(_row()), 3, 0)["qps"] == math.inf
