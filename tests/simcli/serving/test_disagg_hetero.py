"""Heterogeneous prefill/decode pools (Splitwise-HA and kin, Patel et al. ISCA 2024): each
pool's own step model and KV capacity, the KV transfer at the slower node's NIC, one-line
refusals of pools that cannot share a KV cache, and the per-pool cost and energy keys."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simcli.scenario.hardware import resolve_hardware
from simcli.scenario.serving import build_step_model
from simcli.serving.disagg import (
    DisaggConfig,
    KVTransferModel,
    check_compatible,
    default_transfer,
)
from simcli.serving.requests import SyntheticSpec, synthetic_requests
from simcli.serving.simulator import ServeConfig, SimulationError, Simulator
from workloads.lengths import parse_dist
from workloads.models import load_model

H100, A100, H200 = "h100-sxm", "a100-sxm-80gb", "h200-sxm"
NONE = np.zeros(0, np.int64)


@pytest.fixture(scope="module")
def steps() -> dict[str, object]:
    model = load_model("llama3-8b")
    return {g: build_step_model(model, resolve_hardware(g, 1), tp=1) for g in (H100, A100, H200)}


def _dis(pre: str, dec: str, **kw) -> DisaggConfig:
    return DisaggConfig(
        prefill_replicas=1, decode_replicas=1, prefill_gpu=pre, decode_gpu=dec, **kw
    )


def test_transfer_between_types_runs_at_the_slower_nic(steps):
    """DGX A100's NIC (200 Gb/s HDR per GPU) is slower than DGX H100's (400 Gb/s NDR): an
    H100 -> A100 transfer takes what an A100 -> A100 transfer over the NICs takes, and more
    than H100 -> H100 over the NICs."""
    nic = {g: resolve_hardware(g, 1).system.nominal_nic_bytes_per_s for g in (H100, A100)}
    assert nic[A100] < nic[H100]
    pre, dec = steps[H100], steps[A100]
    hetero = default_transfer(_dis(H100, A100), pre, dec, 1, 1)
    a100 = KVTransferModel.from_cost_model(
        dec.cost_model, float(dec.kv_bytes_per_token), inter_node=True
    )
    h100 = KVTransferModel.from_cost_model(
        pre.cost_model, float(pre.kv_bytes_per_token), inter_node=True
    )
    for tokens in (16, 1000, 8192, 100_000):
        assert hetero.seconds(tokens) == pytest.approx(a100.seconds(tokens), rel=1e-12)
        assert hetero.seconds(tokens) > h100.seconds(tokens)
    # the other direction prices the same link
    back = default_transfer(_dis(A100, H100), dec, pre, 1, 1)
    assert back.seconds(8192) == pytest.approx(hetero.seconds(8192), rel=1e-12)
    # a large transfer is bandwidth-bound: about bytes / the A100 node's NIC
    big = 100_000 * float(dec.kv_bytes_per_token)
    assert hetero.seconds(100_000) == pytest.approx(big / nic[A100], rel=0.15)


def test_layerwise_overlap_kept_between_types(steps):
    pre, dec = steps[H100], steps[A100]
    whole = default_transfer(_dis(H100, A100), pre, dec, 1, 1)
    layered = default_transfer(_dis(H100, A100, kv_transfer_overlap=True), pre, dec, 1, 1)
    t = whole.seconds(4096)
    assert layered.seconds(4096) == pytest.approx(t, rel=1e-12)
    assert layered.exposed_s(t, prefill_s=10 * t) == pytest.approx(t / pre.model.num_layers)
    assert whole.exposed_s(t, prefill_s=10 * t) == t


def test_each_pool_holds_the_kv_its_memory_leaves(steps):
    """H100 prefill (80 GB) + H200 decode (141 GB): each pool's KV capacity is its own
    step model's, so the decode replicas hold more than twice the prefill's."""
    cfg = ServeConfig(replicas=2, disaggregation=_dis(H100, H200))
    sim = Simulator(steps[H200], cfg, prefill_step_model=steps[H100], decode_step_model=steps[H200])
    pre_cap = int(steps[H100].kv_capacity_tokens(16, 0.9))
    dec_cap = int(steps[H200].kv_capacity_tokens(16, 0.9))
    assert sim.prefill_capacity_tokens == pre_cap
    assert sim.kv_capacity_tokens == dec_cap
    assert dec_cap > 2 * pre_cap
    blocks = {r.role: r.blocks_per_engine for r in sim.replicas}
    assert blocks == {"prefill": pre_cap // 16, "decode": dec_cap // 16}


def test_pools_that_cannot_share_a_kv_cache_are_refused(steps):
    other = build_step_model(load_model("qwen2.5-7b"), resolve_hardware(A100, 1), tp=1)
    with pytest.raises(ValueError, match="one model in both pools"):
        check_compatible(steps[H100], other)
    fp8 = build_step_model(
        load_model("llama3-8b"), resolve_hardware(H200, 1), tp=1, kv_cache_dtype="fp8"
    )
    with pytest.raises(ValueError, match="one KV cache dtype in both pools"):
        check_compatible(fp8, steps[H100])
    cfg = ServeConfig(replicas=2, disaggregation=_dis(H200, H100))
    with pytest.raises(SimulationError) as err:
        Simulator(steps[H100], cfg, prefill_step_model=fp8, decode_step_model=steps[H100])
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="never share a node"):
        _dis(H100, A100, kv_transfer="intra")


def test_run_prices_each_pool_and_energy_adds_up(steps):
    dis = _dis(H100, A100, prefill_price_per_gpu_hour=4.76, decode_price_per_gpu_hour=2.21)
    dis = dis.model_copy(update={"decode_replicas": 2})
    cfg = ServeConfig(replicas=3, disaggregation=dis, price_per_gpu_hour=(4.76 + 2 * 2.21) / 3)
    from simcli.serving.metrics import EnergyMeter

    sim = Simulator(
        steps[A100],
        cfg,
        prefill_step_model=steps[H100],
        decode_step_model=steps[A100],
        energy=EnergyMeter.for_step_model(steps[A100]),
    )
    spec = SyntheticSpec(
        qps=4, num_requests=60, prompt_len=parse_dist("fixed:512"),
        output_len=parse_dist("fixed:64"), seed=1,
    )  # fmt: skip
    s = sim.run(synthetic_requests(spec)).summary
    assert (s["prefill_gpu"], s["decode_gpu"]) == (H100, A100)
    assert (s["prefill_gpus"], s["decode_gpus"]) == (1, 2)
    assert s["prefill_cost_usd"] + s["decode_cost_usd"] == pytest.approx(s["cost_usd"], rel=1e-9)
    assert s["decode_cost_usd"] == pytest.approx(2 * 2.21 * s["duration_s"] / 3600, rel=1e-9)
    if s["energy_kwh"] is not None:  # the shipped profiles carry power models
        both = s["prefill_energy_kwh"] + s["decode_energy_kwh"]
        assert both == pytest.approx(s["energy_kwh"], rel=1e-9)
        # idle A100s draw A100 idle power: the decode pool's energy exceeds its idle floor
        idle_w = steps[A100].cost_model.power.idle_w
        assert s["decode_energy_kwh"] * 3.6e6 >= 2 * s["duration_s"] * idle_w * 0.999


def test_decode_follows_memory_bandwidth_prefill_follows_compute(steps):
    """The model property behind Splitwise-HA: A100's handicap against H100 is much smaller
    for decode (memory-bound, HBM 2.04 vs 3.35 TB/s) than for prefill (compute-bound), so
    at a price ratio between the two handicaps -- Splitwise's CoreWeave prices, $4.76 vs
    $2.21 per GPU-hour (SplitwiseSim configs/experiment/splitwise_ha_isocost.yaml) -- an
    A100 generates tokens for less per token and an H100 runs prompts for less."""
    h, a = steps[H100], steps[A100]
    dec = [a.step_s(NONE, NONE, np.full(b, c)) / h.step_s(NONE, NONE, np.full(b, c))
           for b, c in ((32, 1024), (64, 2048), (128, 1024))]  # fmt: skip
    pre = a.step_s(np.array([4096]), np.array([0]), NONE) / h.step_s(
        np.array([4096]), np.array([0]), NONE
    )
    hbm = 3.35 / 2.039  # catalogue HBM bandwidths
    for r in dec:
        assert 1.0 < r < 1.15 * hbm
    assert pre > 1.4 * max(dec)
    price = 4.76 / 2.21
    assert max(dec) < price < pre  # A100 cheaper per decode token, H100 per prompt token


def test_serve_cli_heterogeneous_pools(run):
    res = run(
        "serve", "--model", "llama3-8b", "--prefill-gpu", H100, "--decode-gpu", A100,
        "--disaggregate", "--prefill-replicas", "1", "--decode-replicas", "2", "--qps", "4",
        "--num-requests", "40", "--format", "json", "--quiet",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["gpu"] == H100  # --gpu defaults to --prefill-gpu
    assert (out["prefill_gpu"], out["decode_gpu"]) == (H100, A100)
    assert out["kv_transfer"] == "inter"
    for key in ("prefill_price_per_gpu_hour", "decode_price_per_gpu_hour", "prefill_cost_usd",
                "decode_cost_usd", "prefill_gpu_hours", "decode_gpu_hours", "prefill_energy_kwh",
                "decode_energy_kwh", "prefill_op_model_provenance"):  # fmt: skip
        assert key in out
    assert out["prefill_cost_usd"] + out["decode_cost_usd"] == pytest.approx(out["cost_usd"])
    mean = (out["prefill_price_per_gpu_hour"] + 2 * out["decode_price_per_gpu_hour"]) / 3
    assert out["price_per_gpu_hour"] == pytest.approx(mean)
    assert out["kv_capacity_tokens_per_replica"] != out["kv_capacity_tokens_prefill_replica"]


@pytest.mark.parametrize(
    "extra, needle",
    [
        (("--decode-gpu", A100, "--kv-transfer", "intra"), "never share a node"),
        (("--decode-gpu", A100, "--kv-cache-dtype", "fp8"), "decode pool (--decode-gpu"),
        (("--decode-gpu", "a100-sxm-8gb"), "--decode-gpu: unknown GPU"),
        (("--decode-gpu", A100, "--profile", "x.json"), "--profile fits one GPU type"),
    ],
)
def test_serve_cli_bad_pools_one_line(run, extra, needle):
    base = ("serve", "--model", "llama3-8b", "--gpu", H100, "--disaggregate", "--pd-ratio",
            "1:1", "--replicas", "2", "--qps", "4", "--num-requests", "10", "--quiet")  # fmt: skip
    res = run(*base, *extra)
    assert res.exit_code != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert res.stdout == ""


def test_pool_gpu_needs_disaggregate(run):
    res = run("serve", "--model", "llama3-8b", "--gpu", H100, "--decode-gpu", A100, "--qps",
              "4", "--quiet")  # fmt: skip
    assert res.exit_code != 0
    assert res.stderr.strip() == "error: --decode-gpu needs --disaggregate"
