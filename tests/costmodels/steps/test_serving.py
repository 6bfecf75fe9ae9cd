"""The serving step model (costmodels.steps.serving) and `simcli step`.

Validation against the real H100 steps of calibrate/data/steps-h100 (the target: every
prefill and CUDA-graph decode row within 10%), interpolation against exact pricing,
monotonicity, tensor parallelism, KV capacity, and the CLI contract.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from calibrate.validate_serving import derive_host_dispatch_s, h100_validation_rows
from costmodels.steps.serving import EAGER_HOST_DISPATCH_S, StepError, StepModel
from simcli.commands import step as step_cmd
from simcli.errors import set_debug

NONE = np.zeros(0, np.int64)
GB = 1e9
# The one measured row the model misses by more than 10%, and why: it is host-bound (26 ms
# of eager dispatch against ~20 ms of GPU work) and its session's host was slower (~24 us
# per torch call) than any of the eager-decode rows the host constant was solved from
# (16.7-21.8 us, median 20.9). See the validation notes in costmodels/steps/serving.py.
HOST_BOUND_MISS = {("prefill", 1, 512)}


@pytest.fixture(scope="module")
def eager() -> StepModel:
    return StepModel("llama3-8b", "h100-sxm", engine="pytorch-eager")


@pytest.fixture(scope="module")
def vllm() -> StepModel:
    return StepModel("llama3-8b", "h100-sxm")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return h100_validation_rows()


def prefill(b: int, n: int, past: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.full(b, n), np.full(b, past), NONE


def decode(b: int, ctx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return NONE, NONE, np.full(b, ctx)


# --- validation against the H100 measurements ------------------------------------------


def test_every_measured_row_is_covered(rows):
    phases = [r["phase"] for r in rows]
    assert phases.count("prefill") == 24 and phases.count("decode") == 18
    assert phases.count("decode-eager") == 6


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_h100_steps_within_10_percent(rows, phase):
    sel = [r for r in rows if r["phase"] == phase]
    bad = [
        (r["batch"], r["length"], round(r["error_pct"], 1))
        for r in sel
        if abs(r["error_pct"]) > 10.0 and (phase, r["batch"], r["length"]) not in HOST_BOUND_MISS
    ]
    assert not bad, bad
    mape = np.mean([abs(r["error_pct"]) for r in sel])
    assert mape < 5.0, mape


def test_the_host_bound_miss_is_what_it_claims(rows, eager):
    (row,) = [r for r in rows if (r["phase"], r["batch"], r["length"]) in HOST_BOUND_MISS]
    assert -16.0 < row["error_pct"] < -10.0
    parts = eager.breakdown(*prefill(1, 512))
    assert parts["host_stall"] > 0.2 * sum(parts.values())  # host-bound in the model
    # the measurement implies a host slower than every eager-decode row
    _, per_row = derive_host_dispatch_s()
    implied = row["measured_ms"] / 1e3 / 1258  # torch calls of the 1x512 prefill
    assert implied > max(r["host_s_per_call"] for r in per_row)


def test_host_constant_comes_from_the_eager_decode_rows():
    median, per_row = derive_host_dispatch_s()
    assert len(per_row) == 6
    assert median == pytest.approx(EAGER_HOST_DISPATCH_S, rel=0.01)


def test_graph_decode_is_faster_than_eager_decode(rows):
    eager_rows = {(r["batch"], r["length"]): r for r in rows if r["phase"] == "decode-eager"}
    for r in rows:
        if r["phase"] == "decode" and (r["batch"], r["length"]) in eager_rows:
            assert r["predicted_ms"] < eager_rows[(r["batch"], r["length"])]["predicted_ms"]


def test_vllm_engine_beats_the_plain_model(rows):
    for r in rows:
        if r["phase"] in ("prefill", "decode"):
            assert r["vllm_ms"] < r["predicted_ms"]


# --- interpolation, monotonicity, speed-critical paths -----------------------------------


@pytest.mark.parametrize("engine", ["vllm", "pytorch-eager"])
def test_interpolation_matches_exact_pricing(engine, vllm, eager):
    sm = vllm if engine == "vllm" else eager
    rng = np.random.default_rng(7)
    worst = 0.0
    for i in range(36):
        kind = i % 4
        if kind == 0:  # prefill chunks over cached prefixes
            pn = rng.integers(1, 16384, rng.integers(1, 4))
            dc = NONE
        elif kind == 1:  # decode only
            pn, dc = NONE, rng.integers(0, 16000, rng.integers(1, 512))
        elif kind == 2:  # chunked prefill mixed with decodes
            pn, dc = rng.integers(1, 2048, rng.integers(1, 3)), rng.integers(0, 8192, 200)
        else:  # many short prefills (the vectorised path) and a few decodes
            pn, dc = rng.integers(1, 64, rng.integers(9, 40)), rng.integers(0, 8192, 20)
        pp = rng.integers(0, 8192, pn.size)
        fast, exact = sm.step_s(pn, pp, dc), sm.exact_step_s(pn, pp, dc)
        worst = max(worst, abs(fast / exact - 1.0))
    assert worst < 0.02, worst


@pytest.mark.parametrize("engine", ["vllm", "pytorch-eager"])
def test_more_tokens_or_context_is_never_faster(engine, vllm, eager):
    sm = vllm if engine == "vllm" else eager

    def nondecreasing(values):
        d = np.diff(np.asarray(values))
        assert (d >= -1e-12).all(), np.flatnonzero(d < -1e-12)[:5]

    nondecreasing([sm.step_s(*prefill(1, n)) for n in range(1, 20000, 37)])
    nondecreasing([sm.step_s(*prefill(b, 512)) for b in range(1, 80)])
    nondecreasing([sm.step_s(*prefill(1, 512, p)) for p in range(0, 40000, 97)])
    nondecreasing([sm.step_s(*decode(b, 2048)) for b in range(1, 700, 3)])
    nondecreasing([sm.step_s(*decode(32, c)) for c in range(0, 40000, 53)])
    nondecreasing(
        [sm.step_s(np.array([256]), np.array([1000]), np.full(b, 2048)) for b in range(300)]
    )


def test_breakdown_adds_up(vllm, eager):
    for sm, args in [
        (eager, prefill(1, 512)),
        (eager, prefill(4, 2048)),
        (eager, decode(32, 4096)),
        (vllm, (np.array([512, 100]), np.array([0, 3000]), np.full(64, 1500))),
    ]:
        parts = sm.breakdown(*args)
        assert sum(parts.values()) == pytest.approx(sm.step_s(*args), rel=1e-9)
        assert all(v >= 0 for v in parts.values())
        assert {"attn", "qkv_proj", "mlp_up", "mlp_down", "lm_head"} <= set(parts)


def test_mixed_step_costs_more_than_either_part(vllm):
    pre = (np.array([512]), np.array([1024]), NONE)
    dec = decode(64, 2048)
    mixed = (pre[0], pre[1], dec[2])
    t = vllm.step_s(*mixed)
    assert t > vllm.step_s(*pre) and t > vllm.step_s(*dec)
    # one pass over all tokens: cheaper than two separate iterations
    assert t < vllm.step_s(*pre) + vllm.step_s(*dec)


def test_verify_step(vllm):
    ctx = np.full(16, 2000)
    assert vllm.verify_step_s(ctx, 0) == pytest.approx(vllm.step_s(NONE, NONE, ctx))
    times = [vllm.verify_step_s(ctx, k) for k in range(6)]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_bad_step_inputs_raise_one_line(vllm):
    for args in [(NONE, NONE, NONE), (np.array([4]), NONE, NONE), (np.array([0]), [0], NONE)]:
        with pytest.raises(StepError) as exc:
            vllm.step_s(*args)
        assert "\n" not in str(exc.value)


# --- parallelism and memory ------------------------------------------------------------------


def test_tp_reduces_per_gpu_time_of_a_large_prefill():
    args = prefill(8, 2048)
    times = [StepModel("llama3-8b", "h100-sxm", tp=tp).step_s(*args) for tp in (1, 2, 4)]
    assert times[0] > times[1] > times[2]
    parts = StepModel("llama3-8b", "h100-sxm", tp=2).breakdown(*args)
    assert parts["tp_allreduce"] > 0


def test_pipeline_latency_and_stage(vllm):
    sm = StepModel("llama3-8b", "h100-sxm", pp=2)
    args = prefill(2, 2048)
    assert sm.stage_layers() == [16, 16]
    step, stage = sm.step_s(*args), sm.stage_s(*args)
    assert step > vllm.step_s(*args)  # plus the stage-to-stage send
    assert 0.45 * step < stage < 0.6 * step
    assert sum(sm.breakdown(*args).values()) == pytest.approx(step)


def test_kv_capacity_llama3_8b_on_h100(vllm):
    assert vllm.kv_bytes_per_token == 131072  # serve_step.meta.json kv_bytes_per_token
    tokens = vllm.kv_capacity_tokens(16, 0.9)
    assert tokens % 16 == 0
    assert 40 * GB < tokens * vllm.kv_bytes_per_token < 60 * GB  # vLLM logs 53.29 GiB
    assert vllm.kv_capacity_tokens(16, 0.5) < tokens


def test_kv_bytes_per_token_splits_over_tp_and_pp():
    sm = StepModel("llama3-70b", "h100-sxm", tp=4, pp=2)
    assert sm.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert sm.kv_bytes_per_token_per_gpu(0) == 2 * 40 * 2 * 128 * 2
    assert sm.kv_capacity_tokens(16, 0.9) > 0


def test_model_that_does_not_fit_raises():
    with pytest.raises(StepError, match="does not fit"):
        StepModel("llama3-70b", "h100-sxm")
    sm = StepModel("llama3-8b", "h100-sxm")
    with pytest.raises(StepError, match="no room for a KV block"):
        sm.kv_capacity_tokens(16, 0.2)


def test_eager_engine_is_single_gpu_llama_style_only():
    with pytest.raises(StepError, match="tp=1"):
        StepModel("llama3-8b", "h100-sxm", engine="pytorch-eager", tp=2)
    with pytest.raises(StepError, match="Llama-style"):
        StepModel("deepseek-v3", "h100-sxm", engine="pytorch-eager")  # MLA
    # an MoE runs (transformers' grouped experts with bf16 weights)
    moe = StepModel("mixtral-8x7b", "h200-sxm", engine="pytorch-eager")
    fused = StepModel("mixtral-8x7b", "h200-sxm")
    assert moe.step_ms([512], [0], []) > fused.step_ms([512], [0], [])


# --- the CLI -------------------------------------------------------------------------------


def _app() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(step_cmd.app, name="step")

    @root.callback()
    def _root() -> None:
        set_debug(False)

    return root


def invoke(*args: str):
    return CliRunner().invoke(_app(), ["step", *args])


def one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def test_cli_decode_json():
    r = invoke(
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--tp",
        "1",
        "--phase",
        "decode",
        "--batch",
        "32",
        "--context-len",
        "4096",
        "--format",
        "json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in (
        "step_ms",
        "tokens_per_s",
        "breakdown_ms",
        "engine",
        "cost_model",
        "kv_capacity_tokens",
        "kv_bytes_per_token",
    ):
        assert key in out
    assert out["engine"] == "vllm" and out["tokens"] == 32
    assert sum(out["breakdown_ms"].values()) == pytest.approx(out["step_ms"])
    assert out["tokens_per_s"] == pytest.approx(32 / (out["step_ms"] / 1e3))


def test_cli_eager_prefill_matches_the_model(eager):
    r = invoke(
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--phase",
        "prefill",
        "--batch",
        "4",
        "--prompt-len",
        "2048",
        "--engine",
        "pytorch-eager",
        "--format",
        "json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["step_ms"] == pytest.approx(1e3 * eager.step_s(*prefill(4, 2048)))
    assert out["tokens"] == 8192


def test_cli_mixed_chunk():
    r = invoke(
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--tp",
        "2",
        "--phase",
        "mixed",
        "--batch",
        "16",
        "--context-len",
        "1000",
        "--prompt-len",
        "4096",
        "--chunk",
        "512",
        "--past",
        "1024",
        "--format",
        "json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["prefill_new_tokens"] == 512 and out["decode_seqs"] == 16
    assert out["tokens"] == 528


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--gpu", "h999", "--phase", "decode", "--context-len", "10"), "unknown GPU"),
        (
            ("--gpu", "h100-sxm", "--tp", "3", "--phase", "decode", "--context-len", "10"),
            "does not divide",
        ),
        (("--gpu", "h100-sxm", "--phase", "sideways", "--context-len", "10"), "--phase"),
        (("--gpu", "h100-sxm", "--phase", "prefill"), "--prompt-len"),
        (
            ("--gpu", "h100-sxm", "--phase", "decode", "--context-len", "10", "--engine", "trt"),
            "--engine",
        ),
    ],
)
def test_cli_bad_input_is_one_line(args, needle):
    line = one_error_line(invoke("--model", "llama3-8b", *args))
    assert needle in line


def test_cli_model_that_does_not_fit_is_one_line():
    line = one_error_line(
        invoke(
            "--model",
            "llama3-70b",
            "--gpu",
            "h100-sxm",
            "--phase",
            "decode",
            "--context-len",
            "100",
        )
    )
    assert "does not fit" in line
