"""Power suite: run one op back to back for a few seconds while NVML is read.

A power model fitted on five points (one per op) cannot tell the tensor-core term from
the HBM term or the idle floor, so the suite spreads its points over utilisation:

- sustained GEMMs of several sizes (small ones leave SMs idle between waves), fp8, and a
  skinny GEMM that streams weights from HBM (high HBM, low tensor-core utilisation);
- dense attention forward at several sequence lengths, and forward + backward;
- device copies of several sizes (HBM only);
- duty-cycled runs of the large GEMM and the copy (busy a fraction of each ~20 ms
  period, idle the rest): the same kernel at 25-75% average utilisation.

``avg_power_w`` = board power over the window: from NVML's energy counter
(``nvmlDeviceGetTotalEnergyConsumption``) when it works, else the mean of power
samples taken every ~10 ms by a thread. ``energy_j`` = energy of one execution
(window energy / executions); ``measured_ms`` = window time / executions, idle gaps of
a duty-cycled row included, so utilisation from it is the window's average. A duty
cycle is recorded in ``pattern`` (``duty=0.5``), which keeps the row's key distinct.

Without CUDA or NVML every row is recorded as ``unsupported`` (``--tiny`` on a CPU runs
in well under a second).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from .attention import make_sdpa_fn
from .common import Case, Context, GiB, MiB, Unsupported, _nvml_handle

NAME = "power"
WINDOW_S = 3.0
CHUNK_S = 0.02  # executions between synchronisations: the duty-cycle period


def _gemm(m: int, n: int, k: int, dtype: str = "bf16", **extra: Any) -> dict[str, Any]:
    family = "square" if m == n == k else "skinny"
    return {"op": "gemm", "dtype": dtype, "m": m, "n": n, "k": k, "family": family, **extra}


def _attn(op: str, seq: int, batch: int, **extra: Any) -> dict[str, Any]:
    return {
        "op": op, "dtype": "bf16", "batch": batch, "seq_q": seq, "seq_kv": seq, "heads_q": 32,
        "heads_kv": 8, "head_dim": 128, "causal": True, "backend": "flash",
        "family": "h32kv8d128", **extra,
    }  # fmt: skip


def _copy(nbytes: int, **extra: Any) -> dict[str, Any]:
    return {"op": "copy", "dtype": "bf16", "bytes": nbytes, "family": "copy", **extra}


def _duty(row: dict[str, Any], duty: float) -> dict[str, Any]:
    return {**row, "pattern": f"duty={duty:g}"}


def cases(ctx: Context) -> list[Case]:
    big = _gemm(8192, 8192, 8192)
    if ctx.tiny:
        small = _gemm(256, 256, 256)
        rows = [small, _duty(small, 0.5), _copy(16 * MiB), _attn("attn_fwd", 256, 1)]
    elif ctx.quick:
        rows = [
            big, _gemm(2048, 2048, 2048), _gemm(16, 8192, 8192),
            _attn("attn_fwd", 16384, 2), _attn("attn_fwd", 2048, 2),
            _copy(2 * GiB), _copy(256 * MiB),
            _duty(big, 0.5), _duty(_copy(2 * GiB), 0.5),
        ]  # fmt: skip
    else:
        rows = [
            big, _gemm(4096, 4096, 4096), _gemm(2048, 2048, 2048), _gemm(1024, 1024, 1024),
            _gemm(8192, 8192, 8192, "fp8"), _gemm(4096, 4096, 4096, "fp8"),
            _gemm(16, 8192, 8192), _gemm(128, 8192, 8192),
            _attn("attn_fwd", 16384, 2), _attn("attn_fwd", 4096, 2), _attn("attn_fwd", 1024, 4),
            _attn("attn_fwdbwd", 16384, 2), _attn("attn_fwdbwd", 4096, 2),
            _copy(2 * GiB), _copy(512 * MiB), _copy(128 * MiB),
            _duty(big, 0.25), _duty(big, 0.5), _duty(big, 0.75),
            _duty(_copy(2 * GiB), 0.25), _duty(_copy(2 * GiB), 0.5),
        ]  # fmt: skip
    return [Case(row=r, group="power") for r in rows]


def _duty_of(row: dict[str, Any]) -> float:
    text = str(row.get("pattern") or "")
    if text.startswith("duty="):
        return min(max(float(text[5:]), 0.05), 1.0)
    return 1.0


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


class _Sampler:
    """NVML power samples every ~10 ms on a thread (the fallback when the energy counter
    is unavailable)."""

    def __init__(self, nv, handle) -> None:
        self.nv, self.handle = nv, handle
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.samples.append(self.nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0)
            time.sleep(0.01)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _energy_mj(nv, handle) -> float | None:
    try:
        return float(nv.nvmlDeviceGetTotalEnergyConsumption(handle))
    except Exception:
        return None


def run(case: Case, ctx: Context) -> dict[str, Any]:
    if not ctx.is_cuda:
        raise Unsupported("power readings need an NVIDIA GPU (NVML)")
    nv, h = _nvml_handle()
    if nv is None or h is None:
        raise Unsupported("pynvml (nvidia-ml-py) not importable or no NVML handle")
    import torch

    fn = _make_fn(torch, case.row, ctx.device)
    window_s = 0.5 if ctx.tiny else WINDOW_S
    duty = _duty_of(case.row)
    # warm up (and estimate how many calls make ~20 ms, the sync granularity)
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    per = max(time.perf_counter() - t0, 1e-6)
    chunk = max(1, int(CHUNK_S * duty / per))
    t_end = time.perf_counter() + 0.5
    while time.perf_counter() < t_end:
        for _ in range(chunk):
            fn()
        torch.cuda.synchronize()

    e0 = _energy_mj(nv, h)
    n_exec = 0
    with _Sampler(nv, h) as sampler:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < window_s:
            busy0 = time.perf_counter()
            for _ in range(chunk):
                fn()
            n_exec += chunk
            torch.cuda.synchronize()
            if duty < 1.0:  # idle for the rest of the period
                time.sleep((time.perf_counter() - busy0) * (1.0 - duty) / duty)
        elapsed = time.perf_counter() - t0
        e1 = _energy_mj(nv, h) if e0 is not None else None
    if e0 is not None and e1 is not None and e1 > e0:
        avg_w = (e1 - e0) / 1000.0 / elapsed
    elif sampler.samples:
        avg_w = sum(sampler.samples) / len(sampler.samples)
    else:
        raise RuntimeError("no NVML power reading")
    return {
        "measured_ms": elapsed / n_exec * 1e3,
        "avg_power_w": round(avg_w, 2),
        "energy_j": avg_w * elapsed / n_exec,
    }
