"""``serve plan --prefill-gpu-types/--decode-gpu-types``: the per-pool search over the cross
product of pool GPU types (Splitwise-AA/-HH/-HA/-AH), each pool's count minimal (one
fewer in either pool re-simulated with ``simcli serve`` misses the SLO), ranked by $/hour
with each pool at its own GPU's price, reported in JSON and CSV."""

from __future__ import annotations

import csv
import io
import itertools
import json

import pytest

from simcli.scenario.serving import plan_deployments
from simcli.serving.plan_inputs import SLO, PlanSpace, Workload

H100, A100 = "h100-sxm", "a100-sxm-80gb"
GPUS = f"{H100},{A100}"
# a decode-heavy load (outputs as long as the prompts): where Splitwise puts A100 token machines
LOAD = ("--model", "llama3-8b", "--qps", "40", "--num-requests", "400", "--seed", "2",
        "--prompt-len", "uniform:256:1024", "--output-len", "uniform:256:768")  # fmt: skip
SLO_ARGS = ("--slo-ttft-s", "0.5", "--slo-tpot-s", "0.04")
SPACE = ("--gpu-types", GPUS, "--prefill-gpu-types", GPUS, "--decode-gpu-types", GPUS,
         "--tp", "1", "--schedulers", "vllm", "--pd-ratios", "none,1:2")  # fmt: skip
POOL_KEYS = ("prefill_gpu", "prefill_tp", "prefill_gpus", "prefill_usd_per_gpu_hour",
             "decode_gpu", "decode_tp", "decode_gpus", "decode_usd_per_gpu_hour",
             "attainment_one_fewer_prefill", "attainment_one_fewer_decode")  # fmt: skip


@pytest.fixture(scope="module")
def planned() -> dict:
    from typer.testing import CliRunner

    from simcli.cli import app
    from simcli.errors import set_debug

    set_debug(False)
    args = ["serve", "plan", *LOAD, *SLO_ARGS, *SPACE, "--top", "10", "--format", "json"]
    res = CliRunner().invoke(app, [*args, "--quiet"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _disagg(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["pd_ratio"] is not None]


def test_rows_name_each_pool(planned):
    rows = planned["deployments"]
    assert _disagg(rows), "no disaggregated deployment ranked"
    for r in rows:
        for k in POOL_KEYS:
            assert k in r
        if r["pd_ratio"] is None:
            assert r["decode_gpu"] is None and r["prefill_replicas"] is None
            continue
        assert r["prefill_replicas"] + r["decode_replicas"] == r["replicas"]
        assert r["prefill_gpus"] == r["prefill_replicas"] * r["prefill_tp"]
        assert r["decode_gpus"] == r["decode_replicas"] * r["decode_tp"]
        cost = (r["prefill_gpus"] * r["prefill_usd_per_gpu_hour"]
                + r["decode_gpus"] * r["decode_usd_per_gpu_hour"])  # fmt: skip
        assert r["usd_per_hour"] == pytest.approx(cost, rel=1e-12)
        assert r["usd_per_gpu_hour"] == pytest.approx(cost / r["gpus"], rel=1e-12)
    costs = [r["usd_per_hour"] for r in rows]
    assert costs == sorted(costs)
    pairs = {(r["prefill_gpu"], r["decode_gpu"]) for r in _disagg(rows)}
    assert len(pairs) >= 2  # pools of two GPU types appear among the ranked deployments
    assert any(p != d for p, d in pairs)


def test_search_covers_the_cross_product():
    space = PlanSpace(
        gpus=(H100, A100), prefill_gpus=(H100, A100), decode_gpus=(H100, A100), tp=(1, 2),
        schedulers=("vllm",), pd_ratios=(None, "1:1"),
    )  # fmt: skip
    res = plan_deployments(
        "llama3-8b",
        Workload(qps=5, num_requests=60, prompt_len="fixed:256", output_len="fixed:32"),
        SLO(ttft_s=2.0),
        space,
        top=1,
    )
    disagg = {(c.gpu, c.decode_gpu, c.tp) for c, *_ in res.searched if c.pd_ratio}
    colocated = {(c.gpu, c.tp) for c, *_ in res.searched if c.pd_ratio is None}
    assert disagg == set(itertools.product((H100, A100), (H100, A100), (1, 2)))
    assert colocated == set(itertools.product((H100, A100), (1, 2)))
    assert res.configs_evaluated == len(disagg) + len(colocated)


def _serve_attainment(run, row: dict, pools: tuple[int, int]) -> float:
    """``simcli serve`` with the row's flags and the given pools: its SLO attainment."""
    res = run(
        "serve", *LOAD, *SLO_ARGS, "--gpu", row["prefill_gpu"], "--decode-gpu",
        row["decode_gpu"], "--tp", str(row["tp"]), "--scheduler", row["scheduler"],
        "--disaggregate", "--prefill-replicas", str(pools[0]), "--decode-replicas",
        str(pools[1]), "--format", "json", "--quiet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["slo_attainment"]


def test_counts_are_minimal_pool_by_pool(planned, run):
    """The cheapest deployment with pools of two GPU types meets the SLO when served by
    `simcli serve` with its flags, and one replica fewer in either pool does not."""
    hetero = [r for r in _disagg(planned["deployments"]) if r["prefill_gpu"] != r["decode_gpu"]]
    assert hetero
    row = hetero[0]
    p, d = row["prefill_replicas"], row["decode_replicas"]
    assert _serve_attainment(run, row, (p, d)) == pytest.approx(row["slo_attainment"])
    assert row["slo_attainment"] >= 0.9
    for which, fewer in ((0, (p - 1, d)), (1, (p, d - 1))):
        key = ("attainment_one_fewer_prefill", "attainment_one_fewer_decode")[which]
        if fewer[which] < 1:
            assert row[key] is None
            continue
        assert row[key] is not None and row[key] < 0.9
        assert _serve_attainment(run, row, fewer) < 0.9


def test_csv_has_the_pool_columns(run):
    res = run("serve", "plan", *LOAD, *SLO_ARGS, *SPACE, "--top", "3", "--format", "csv",
              "--quiet")  # fmt: skip
    assert res.exit_code == 0, res.output
    header = next(csv.reader(io.StringIO(res.stdout)))
    for k in ("gpu", "tp", "replicas", "usd_per_hour", *POOL_KEYS):
        assert k in header


def test_table_names_both_pools(planned, run):
    res = run("serve", "plan", *LOAD, *SLO_ARGS, *SPACE, "--top", "3", "--quiet")
    assert res.exit_code == 0, res.output
    top = planned["deployments"][:3]
    best = top[0]
    text = " ".join(res.stdout.split())
    mixed = any(r["decode_gpu"] not in (None, r["gpu"]) for r in top)
    assert ("decode_g" in text) == mixed  # pool columns (headers wrap in a narrow terminal)
    if best["decode_gpu"] not in (None, best["gpu"]):
        want = f"{best['prefill_replicas']} x 1 {best['gpu']} + {best['decode_replicas']} x 1"
        assert want in text


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--prefill-gpu-types", H100, "--pd-ratios", "none"), "has none; allowed"),
        (("--decode-gpu-types", "a100-sxm-8gb"), "unknown GPU"),
        (("--decode-gpu-types", A100, "--kv-cache-dtype", "fp8"), "--decode-gpu-types"),
        (("--decode-gpu-types", ","), "--decode-gpu-types"),
    ],
)
def test_bad_pool_types_one_line(run, extra, needle):
    res = run("serve", "plan", *LOAD, *SLO_ARGS, "--gpu-types", H100, "--tp", "1", *extra,
              "--quiet")  # fmt: skip
    assert res.exit_code != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr


def test_plan_space_refuses_pool_search_without_ratio():
    with pytest.raises(ValueError, match="has none"):
        PlanSpace(prefill_gpus=(H100,), pd_ratios=(None,))
