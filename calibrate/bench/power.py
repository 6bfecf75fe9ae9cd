"""Power suite: run one op back to back for a few seconds while NVML is read.

``avg_power_w`` = board power over the window: from NVML's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``) when it works, else the mean of power
samples taken every ~10 ms by a thread. ``energy_j`` = energy of one execution
(window energy / executions); ``measured_ms`` = window time / executions.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from .attention import make_sdpa_fn
from .common import Case, Context, GiB, Unsupported, _nvml_handle

NAME = "power"
WINDOW_S = 3.0


def cases(ctx: Context) -> list[Case]:
    rows: list[dict[str, Any]] = [
        {"op": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "family": "square"},
        {"op": "gemm", "dtype": "fp8", "m": 8192, "n": 8192, "k": 8192, "family": "square"},
        {
            "op": "attn_fwd",
            "dtype": "bf16",
            "batch": 2,
            "seq_q": 16384,
            "seq_kv": 16384,
            "heads_q": 32,
            "heads_kv": 8,
            "head_dim": 128,
            "causal": True,
            "backend": "flash",
            "family": "h32kv8d128",
        },
        {
            "op": "attn_fwdbwd",
            "dtype": "bf16",
            "batch": 2,
            "seq_q": 16384,
            "seq_kv": 16384,
            "heads_q": 32,
            "heads_kv": 8,
            "head_dim": 128,
            "causal": True,
            "backend": "flash",
            "family": "h32kv8d128",
        },
        {"op": "copy", "dtype": "bf16", "bytes": 2 * GiB, "family": "copy"},
    ]
    if ctx.quick or ctx.tiny:
        rows = rows[:1] + rows[2:3] + rows[4:]
    if ctx.tiny:
        rows = [{"op": "gemm", "dtype": "bf16", "m": 256, "n": 256, "k": 256, "family": "square"}]
    return [Case(row=r, group="power") for r in rows]


def _make_fn(torch, r: dict[str, Any], dev: str):
    op = r["op"]
    if op == "gemm":
        m, n, k = r["m"], r["n"], r["k"]
        if r["dtype"] == "fp8":
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            return lambda: torch._scaled_mm(
                a, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16
            )
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16).t()
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        return lambda: torch.mm(a, w, out=c)
    if op in ("attn_fwd", "attn_fwdbwd"):
        grad = op == "attn_fwdbwd"
        b, hq, hkv, s, d = r["batch"], r["heads_q"], r["heads_kv"], r["seq_q"], r["head_dim"]
        q = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, requires_grad=grad)
        k = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=grad)
        v = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=grad)
        attn = make_sdpa_fn(torch, r["backend"], r["causal"], hq != hkv)
        if not grad:
            return lambda: attn(q, k, v)
        dout = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16)
        return lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), dout)
    if op == "copy":
        src = torch.randn(r["bytes"] // 2, device=dev, dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    raise NotImplementedError(op)


def run(case: Case, ctx: Context) -> dict[str, Any]:
    import torch

    if not ctx.is_cuda:
        raise Unsupported("power readings need an NVIDIA GPU (NVML)")
    nv, h = _nvml_handle()
    if nv is None or h is None:
        raise Unsupported("pynvml (nvidia-ml-py) not importable or no NVML handle")
    fn = _make_fn(torch, case.row, ctx.device)
    window_s = 0.5 if ctx.tiny else WINDOW_S
    # warm up (and estimate how many calls make ~20 ms, the sync granularity)
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    per = max(time.perf_counter() - t0, 1e-6)
    chunk = max(1, int(0.02 / per))
    t_end = time.perf_counter() + 0.5
    while time.perf_counter() < t_end:
        for _ in range(chunk):
            fn()
        torch.cuda.synchronize()

    samples: list[float] = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            with contextlib.suppress(Exception):
                samples.append(nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            time.sleep(0.01)

    try:
        e0 = nv.nvmlDeviceGetTotalEnergyConsumption(h)  # mJ
    except Exception:
        e0 = None
    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    n_exec = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < window_s:
        for _ in range(chunk):
            fn()
        n_exec += chunk
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    try:
        e1 = nv.nvmlDeviceGetTotalEnergyConsumption(h) if e0 is not None else None
    except Exception:
        e1 = None
    stop.set()
    th.join()
    if e0 is not None and e1 is not None and e1 > e0:
        avg_w = (e1 - e0) / 1000.0 / elapsed
    elif samples:
        avg_w = sum(samples) / len(samples)
    else:
        raise RuntimeError("no NVML power reading")
    return {
        "measured_ms": elapsed / n_exec * 1e3,
        "avg_power_w": round(avg_w, 2),
        "energy_j": avg_w * elapsed / n_exec,
    }
