"""The attention kernels serving engines dispatch to on Hopper, timed: FlashInfer.

    python3 -m calibrate.bench.engine_kernels --out DIR [--mode full|quick|tiny]
        [--time-budget-s S] [--compile-budget-s S] [--suites decode,prefill]
        [--device auto|cuda|cpu] [--seed 0]

vLLM's FlashInfer backend and SGLang's ``flashinfer`` backend call FlashInfer's
wrappers; this runner calls the same wrappers with the engines' settings and writes
rows in the op-CSV schema of ``calibrate.bench.common`` (backend ``flashinfer``):

* ``decode.csv``, op ``attn_decode``: ``BatchDecodeWithPagedKVCacheWrapper``, page
  size 16, NHD layout, one query token per sequence, the page table a random draw of
  pages from one large pre-filled pool (an engine's pages are scattered). The wrapper
  is built with ``use_cuda_graph=True``, planned once, and one ``run`` is captured in a
  CUDA graph; the graph's replays are timed (engines replay decode from graphs).
  ``pattern`` says ``graph:tc`` (``use_tensor_cores=True``: the prefill kernel does the
  decode; what vLLM V1's FlashInfer backend always asks for, and SGLang for GQA groups
  over 4 or fp8 KV) or ``graph:cc`` (the CUDA-core decode kernel). ``dtype`` is the KV
  dtype (bf16, or fp8 e4m3 with bf16 queries).
* ``attention.csv``, op ``attn_fwd``, causal: ``BatchPrefillWithPagedKVCacheWrapper``
  (``pattern`` ``paged:<backend it resolved to>``) and, without a cached prefix,
  ``BatchPrefillWithRaggedKVCacheWrapper`` (``ragged:<backend>``): ``batch`` requests
  of ``seq_q`` new tokens each over ``seq_kv - seq_q`` cached ones (bottom-right
  causal, as a chunked prefill over a prefix). Planned once, ``run`` timed eagerly.

Timing is ``common.bench`` (CUDA events, L2 flushed before each call, a short GPU spin
before sub-millisecond calls, median). ``family`` is the head configuration
(``h{heads_q}kv{heads_kv}d{head_dim}``), the held-out split of the fit.

FlashInfer compiles its kernels at first use (JIT, nvcc). Before timing, one child
process per kernel module builds it (``--warm KEY``), all at once, within
``--compile-budget-s``; a module that fails to build is logged with its error and its
cases are recorded ``error`` while the rest still run. ``meta.json`` holds the
versions, GPU, driver, clocks and the build log of each module.

Imports only the standard library and ``calibrate.bench.common`` at module level (torch
and flashinfer lazily), so ``--help`` and the case lists work on any machine.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (the device copy): the repo root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, os.getcwd())

from calibrate.bench import common as C  # noqa: E402

BACKEND = "flashinfer"
PAGE_SIZE = 16  # vLLM's default block size on CUDA, SGLang pages of 1-64
WORKSPACE_BYTES = 256 * C.MiB  # vLLM's FLASHINFER_WORKSPACE_BUFFER_SIZE
MAX_REPS = 100  # timed calls per case at most (short kernels: enough for a stable median)

# (heads_q, heads_kv, head_dim) of real models: Llama-3-8B, Llama-3-70B at TP 8 and TP 4
# (per-rank heads), Qwen2.5-7B, an MHA model (Llama-2-7B), Llama-3.2-1B (d64), Gemma-2-9B
# (d256)
DECODE_HEADS = [(32, 8, 128), (8, 1, 128), (16, 2, 128), (28, 4, 128), (32, 32, 128),
                (32, 8, 64), (16, 8, 256)]  # fmt: skip
# the CUDA-core decode kernel and fp8 KV on a subset (one compiled module each)
CC_HEADS = [(32, 8, 128), (8, 1, 128), (32, 32, 128)]
FP8_HEADS = [(32, 8, 128)]
# fp8 KV through the tensor-core path (SGLang's choice for fp8 KV): Llama-3-8B heads only
TC_FP8_HEADS = [(32, 8, 128)]
DECODE_SHARE = 0.7  # of the timing budget, when prefill follows
PREFILL_HEADS = [(32, 8, 128), (8, 1, 128), (16, 2, 128), (28, 4, 128), (32, 32, 128),
                 (32, 8, 64), (16, 8, 256)]  # fmt: skip


def family(hq: int, hkv: int, d: int) -> str:
    return f"h{hq}kv{hkv}d{d}"


def module_key(row: dict[str, Any]) -> str:
    """The compiled FlashInfer module a case needs (one ``--warm`` child per key)."""
    d = row["head_dim"]
    if row["op"] == "attn_decode":
        variant = str(row["pattern"]).split(":")[1]
        return f"decode-{variant}-{row['dtype']}-d{d}"
    return f"prefill-d{d}"  # paged and ragged kernels live in one module


def _row(op: str, dtype: str, b: int, sq: int, skv: int, hq: int, hkv: int, d: int,
         causal: bool, pattern: str) -> dict[str, Any]:  # fmt: skip
    return {
        "op": op,
        "dtype": dtype,
        "batch": b,
        "seq_q": sq,
        "seq_kv": skv,
        "heads_q": hq,
        "heads_kv": hkv,
        "head_dim": d,
        "causal": causal,
        "backend": BACKEND,
        "family": family(hq, hkv, d),
        "pattern": pattern,
    }


def kv_bytes(row: dict[str, Any]) -> int:
    """Bytes of the pages a case's KV cache occupies (whole pages of K and V)."""
    elt = 1 if row["dtype"] == "fp8" else 2
    pages = row["batch"] * math.ceil(row["seq_kv"] / PAGE_SIZE)
    return pages * 2 * PAGE_SIZE * row["heads_kv"] * row["head_dim"] * elt


def decode_cases(mode: str, pool_bytes: int, only: list[tuple[int, int, int]] | None = None
                 ) -> list[C.Case]:  # fmt: skip
    """The decode grid; ``only``: these head configurations, tensor-core bf16 only."""
    if mode == "tiny":
        heads, cc, fp8 = [(4, 2, 64)], [(4, 2, 64)], [(4, 2, 64)]
        tcfp8: list[tuple[int, int, int]] = []
        batches, ctxs = [1, 3], [40, 130]
    elif mode == "quick":
        heads, cc, fp8, tcfp8 = DECODE_HEADS[:2], CC_HEADS[:1], FP8_HEADS[:1], []
        batches, ctxs = [1, 16, 128], [512, 4096, 32768]
    else:
        heads, cc, fp8, tcfp8 = DECODE_HEADS, CC_HEADS, FP8_HEADS, TC_FP8_HEADS
        batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
        ctxs = [128, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    out = []
    variants = (("tc", "bf16", heads), ("cc", "bf16", cc), ("cc", "fp8", fp8), ("tc", "fp8", tcfp8))
    if only:
        variants = (("tc", "bf16", only),)
    for variant, dtype, hs in variants:
        for hq, hkv, d in hs:
            for b in batches:
                for s in ctxs:
                    row = _row("attn_decode", dtype, b, 1, s, hq, hkv, d, False, f"graph:{variant}")
                    if kv_bytes(row) <= pool_bytes:
                        out.append(C.Case(row=row))
    for c in out:
        c.group = module_key(c.row)
    return C.shuffled(out, 7)


def prefill_cases(mode: str, pool_bytes: int, only: list[tuple[int, int, int]] | None = None
                  ) -> list[C.Case]:  # fmt: skip
    """The prefill grid; ``only``: these head configurations."""
    if mode == "tiny":
        heads = [(4, 2, 64)]
        shapes = [(1, 64, 0), (2, 32, 0), (1, 32, 100)]
    else:
        heads = PREFILL_HEADS[:2] if mode == "quick" else PREFILL_HEADS
        # (batch, new tokens, cached prefix tokens): one prompt, several prompts, and
        # chunks of a chunked prefill over a cached prefix
        one = [(1, n, 0) for n in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
        many = [(b, n, 0) for b in (2, 4, 8, 16) for n in (128, 512, 2048) if b * n <= 32768]
        chunks = [(1, n, p) for n in (256, 512, 2048, 8192) for p in (1024, 4096, 16384)]
        chunks += [(4, 512, 4096), (8, 256, 2048), (2, 2048, 8192)]
        shapes = one + many + chunks
        if mode == "quick":
            shapes = [(1, 512, 0), (1, 4096, 0), (4, 512, 0), (1, 2048, 4096)]
    out = []
    for hq, hkv, d in only or heads:
        for b, n, p in shapes:
            kinds = ("paged", "ragged") if p == 0 else ("paged",)
            for kind in kinds:
                row = _row("attn_fwd", "bf16", b, n, n + p, hq, hkv, d, True, f"{kind}:auto")
                if kv_bytes(row) <= pool_bytes:
                    out.append(C.Case(row=row))
    for c in out:
        c.group = module_key(c.row)
    return C.shuffled(out, 11)


# --------------------------------------------------------------------------- device side


class Pools:
    """One KV page pool per KV dtype, filled with N(0, 1) once; every case views pages
    of it (random page ids), so no case pays for allocating and filling its cache."""

    def __init__(self, ctx: C.Context, bf16_bytes: int, fp8_bytes: int):
        import torch

        self.ctx = ctx
        self.bytes = {"bf16": bf16_bytes, "fp8": fp8_bytes}
        self.buf: dict[str, Any] = {}
        self.torch = torch
        self.workspace = None

    def get(self, dtype: str):
        torch = self.torch
        if dtype not in self.buf:
            nbytes = self.bytes[dtype]
            if dtype == "bf16":
                t = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=self.ctx.device)
                t.normal_()
            else:
                t = torch.empty(nbytes, dtype=torch.float8_e4m3fn, device=self.ctx.device)
                step = 1 << 28
                for i in range(0, nbytes, step):
                    n = min(step, nbytes - i)
                    t[i : i + n] = torch.randn(n, device=self.ctx.device).to(t.dtype)
            self.buf[dtype] = t
        return self.buf[dtype]

    def kv(self, dtype: str, hkv: int, d: int):
        """The pool as paged KV, (pages, 2, PAGE_SIZE, hkv, d) NHD, and its page count."""
        flat = self.get(dtype)
        per_page = 2 * PAGE_SIZE * hkv * d
        pages = flat.numel() // per_page
        return flat[: pages * per_page].view(pages, 2, PAGE_SIZE, hkv, d), pages

    def ws(self):
        if self.workspace is None:
            t = self.torch
            self.workspace = t.zeros(WORKSPACE_BYTES, dtype=t.uint8, device=self.ctx.device)
        return self.workspace


def _page_table(torch, pools_pages: int, b: int, skv: int, device: str, gen):
    per_seq = math.ceil(skv / PAGE_SIZE)
    need = b * per_seq
    if need > pools_pages:
        raise C.Unsupported(f"needs {need} pages, the pool holds {pools_pages}")
    perm = torch.randperm(pools_pages, device=device, generator=gen)[:need].to(torch.int32)
    indptr = (torch.arange(b + 1, device=device, dtype=torch.int32) * per_seq).contiguous()
    last = torch.full((b,), skv - (per_seq - 1) * PAGE_SIZE, dtype=torch.int32, device=device)
    return indptr, perm.contiguous(), last


def _torch_dtype(torch, name: str):
    return {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[name]


def run_decode(case: C.Case, ctx: C.Context, pools: Pools) -> dict[str, Any]:
    import flashinfer
    import torch

    r = case.row
    b, skv, hq, hkv, d = r["batch"], r["seq_kv"], r["heads_q"], r["heads_kv"], r["head_dim"]
    tc = str(r["pattern"]).endswith(":tc")
    kv, pages = pools.kv(r["dtype"], hkv, d)
    gen = torch.Generator(device=ctx.device)
    gen.manual_seed(ctx.seed + b * 7919 + skv)
    indptr, indices, last = _page_table(torch, pages, b, skv, ctx.device, gen)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        pools.ws(), "NHD", use_cuda_graph=True, use_tensor_cores=tc,
        paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last,
    )  # fmt: skip
    wrapper.plan(
        indptr, indices, last, hq, hkv, d, PAGE_SIZE,
        q_data_type=torch.bfloat16, kv_data_type=_torch_dtype(torch, r["dtype"]),
    )  # fmt: skip
    q = torch.randn(b, hq, d, dtype=torch.bfloat16, device=ctx.device)
    out = torch.empty_like(q)
    wrapper.run(q, kv, out=out)
    torch.cuda.synchronize()
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError("non-finite output")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            wrapper.run(q, kv, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        wrapper.run(q, kv, out=out)
    graph.replay()
    torch.cuda.synchronize()
    ms = C.bench(graph.replay, ctx, max_reps=MAX_REPS)
    del graph
    return {"measured_ms": ms}


def run_prefill(case: C.Case, ctx: C.Context, pools: Pools) -> dict[str, Any]:
    import flashinfer
    import torch

    r = case.row
    b, sq, skv = r["batch"], r["seq_q"], r["seq_kv"]
    hq, hkv, d = r["heads_q"], r["heads_kv"], r["head_dim"]
    kind = str(r["pattern"]).split(":")[0]
    dev, bf16 = ctx.device, torch.bfloat16
    qo_indptr = torch.arange(b + 1, device=dev, dtype=torch.int32) * sq
    q = torch.randn(b * sq, hq, d, dtype=bf16, device=dev)
    out = torch.empty_like(q)
    if kind == "paged":
        kv, pages = pools.kv("bf16", hkv, d)
        gen = torch.Generator(device=dev)
        gen.manual_seed(ctx.seed + b * 104729 + skv)
        indptr, indices, last = _page_table(torch, pages, b, skv, dev, gen)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(pools.ws(), "NHD")
        wrapper.plan(
            qo_indptr, indptr, indices, last, hq, hkv, d, PAGE_SIZE,
            causal=True, q_data_type=bf16, kv_data_type=bf16,
        )  # fmt: skip

        def fn():
            return wrapper.run(q, kv, out=out)
    else:
        if skv != sq:
            raise C.Unsupported("ragged cases have no cached prefix")
        k = torch.randn(b * skv, hkv, d, dtype=bf16, device=dev)
        v = torch.randn(b * skv, hkv, d, dtype=bf16, device=dev)
        kv_indptr = torch.arange(b + 1, device=dev, dtype=torch.int32) * skv
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(pools.ws(), "NHD")
        wrapper.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=True, q_data_type=bf16)

        def fn():
            return wrapper.run(q, k, v, out=out)

    fn()
    torch.cuda.synchronize()
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError("non-finite output")
    resolved = str(getattr(wrapper, "_backend", "") or "")
    ms = C.bench(fn, ctx, max_reps=MAX_REPS)
    return {"measured_ms": ms, "pattern": f"{kind}:{resolved or 'auto'}"}


# --------------------------------------------------------------------------- JIT warm-up


def warm_one(key: str, device: str) -> int:
    """Child process: build (or load) the module ``key`` names by running a tiny case."""
    ctx = C.make_context("tiny", device, "events", 0)
    kind, *rest = key.split("-")
    d = int(rest[-1][1:])
    hq, hkv = (8, 1) if d == 128 else (8, 2)
    pools = Pools(ctx, 64 * C.MiB, 32 * C.MiB)
    if kind == "decode":
        variant, dtype = rest[0], rest[1]
        row = _row("attn_decode", dtype, 2, 1, 100, hq, hkv, d, False, f"graph:{variant}")
        ctx.warmup_ms, ctx.rep_ms = 0.1, 0.3
        run_decode(C.Case(row=row), ctx, pools)
    else:
        ctx.warmup_ms, ctx.rep_ms = 0.1, 0.3
        for kind2 in ("paged", "ragged"):
            row = _row("attn_fwd", "bf16", 1, 64, 64, hq, hkv, d, True, f"{kind2}:auto")
            got = run_prefill(C.Case(row=row), ctx, pools)
            print(f"resolved {got['pattern']}", flush=True)
    return 0


def warm_start(keys: list[str], out: Path, device: str) -> dict[str, Any]:
    """Start one child process per module, all at once (nvcc runs in them)."""
    log_dir = out / "jit_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = {}
    for key in keys:
        f = (log_dir / f"{key}.log").open("w")
        env = dict(os.environ)
        # the prefill module has the most files; decode modules are small
        env.setdefault("MAX_JOBS", "12" if key.startswith("prefill") else "4")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--warm", key, "--device", device]
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        procs[key] = (p, f, time.monotonic(), log_dir / f"{key}.log")
    return procs


def warm_wait(procs: dict[str, Any], keys: list[str], until: float) -> dict[str, Any]:
    """Wait for the children of ``keys`` until ``until`` (time.monotonic); a child still
    building then is killed. Returns {key: {rc, s, tail}}."""
    report: dict[str, Any] = {}
    for key in keys:
        p, f, start, path = procs[key]
        try:
            rc: Any = p.wait(timeout=max(1.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = "timeout"
        f.close()
        text = path.read_text(errors="replace")
        report[key] = {"rc": rc, "s": round(time.monotonic() - start, 1),
                       "tail": text[-1500:] if rc != 0 else text[-300:]}  # fmt: skip
        print(f"[jit] {key}: rc={rc} after {report[key]['s']} s", flush=True)
        if rc != 0:
            print(text[-1500:], flush=True)
    return report


# --------------------------------------------------------------------------- main


def _flashinfer_version() -> tuple[str, str]:
    try:
        import flashinfer

        return str(flashinfer.__version__), ""
    except Exception as exc:  # recorded: the run still writes what it can
        return "", f"{type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--mode", choices=("full", "quick", "tiny"), default="full")
    ap.add_argument("--suites", default="decode,prefill")
    ap.add_argument("--time-budget-s", type=float, default=420.0)
    ap.add_argument("--compile-budget-s", type=float, default=240.0)
    ap.add_argument("--pool-fraction", type=float, default=0.55,
                    help="share of free GPU memory for the bf16 KV page pool (fp8: a fifth)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm", help=argparse.SUPPRESS)
    ap.add_argument("--heads", default="",
                    help="only these head configs, e.g. 8x4x256,16x8x256 (decode: tensor-core "
                         "bf16 only)")  # fmt: skip
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    args = ap.parse_args(argv)
    if args.warm:
        return warm_one(args.warm, "cuda" if args.device == "auto" else args.device)
    try:
        only = [tuple(int(x) for x in h.split("x")) for h in args.heads.split(",") if h]
    except ValueError:
        raise SystemExit(f"--heads: want HQxHKVxD[,...], got {args.heads!r}") from None
    if any(len(h) != 3 for h in only):
        raise SystemExit(f"--heads: want HQxHKVxD[,...], got {args.heads!r}")
    suites = [s for s in args.suites.split(",") if s]
    bad = [s for s in suites if s not in ("decode", "prefill")]
    if bad:
        raise SystemExit(f"--suites: unknown {', '.join(bad)}; allowed: decode, prefill")
    if args.list:
        pool = 64 * C.GiB
        for s in suites:
            make = decode_cases if s == "decode" else prefill_cases
            cs = make(args.mode, pool, only)
            print(f"{s}: {len(cs)} cases, modules {sorted({c.group for c in cs})}")
        return 0
    if args.out is None:
        raise SystemExit("--out is required")
    t_start = time.monotonic()
    deadline = t_start + args.time_budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = C.make_context(args.mode, args.device, "events", args.seed)
    if args.mode == "full":
        ctx.warmup_ms, ctx.rep_ms = 5.0, 25.0
    import torch

    meta: dict[str, Any] = {"environment": C.environment(ctx), "runs": []}
    version, import_error = _flashinfer_version()
    meta["flashinfer"] = {"version": version, "import_error": import_error,
                          "page_size": PAGE_SIZE, "workspace_bytes": WORKSPACE_BYTES,
                          "layout": "NHD"}  # fmt: skip
    meta["clocks_start"] = C.clocks_snapshot(ctx)
    C.write_json_atomic(out / "meta.json", meta)
    if import_error:
        print(f"flashinfer import failed: {import_error}", flush=True)
        return 1
    if not ctx.is_cuda:
        raise SystemExit("FlashInfer's kernels need a CUDA device; --list works anywhere")
    pool_bytes = int(torch.cuda.mem_get_info()[0] * args.pool_fraction)
    pools = Pools(ctx, pool_bytes, pool_bytes // 5)
    meta["flashinfer"]["pool_bytes"] = {"bf16": pool_bytes, "fp8": pool_bytes // 5}
    plan = []
    if "decode" in suites:
        cases = decode_cases(args.mode, pool_bytes, only)
        # fp8 cases must fit their smaller pool
        cases = [c for c in cases if c.row["dtype"] != "fp8" or kv_bytes(c.row) <= pool_bytes // 5]
        plan.append(("engine_decode", "decode.csv", cases))
    if "prefill" in suites:
        plan.append(("engine_prefill", "attention.csv", prefill_cases(args.mode, pool_bytes, only)))
    keys = sorted({c.group for _, _, cs in plan for c in cs})
    t0 = time.monotonic()
    procs = warm_start(keys, out, ctx.device)
    compile_until = t0 + args.compile_budget_s
    meta["jit"] = {}

    def veto(group: str, _ctx: C.Context, _deadline: float) -> str | None:
        got = meta["jit"].get(group)
        return f"module {group} did not build" if got is None or got["rc"] != 0 else None

    # Every suite but the last stops at DECODE_SHARE of the time left; the last at the end
    for i, (suite, fname, cases) in enumerate(plan):
        # this suite's modules built first; later suites' keep building meanwhile
        mine = sorted({c.group for c in cases} - set(meta["jit"]))
        meta["jit"].update(warm_wait(procs, mine, compile_until))
        C.write_json_atomic(out / "meta.json", meta)
        share = deadline
        if i < len(plan) - 1:
            share = time.monotonic() + (deadline - time.monotonic()) * DECODE_SHARE
        sink = C.CsvSink(out / fname)
        runner = run_decode if suite == "engine_decode" else run_prefill
        before = C.clocks_snapshot(ctx)
        try:
            res = C.run_cases(suite, cases, lambda c, x, run=runner: run(c, x, pools), ctx,
                              sink, share, before_group=veto)  # fmt: skip
        except C.FatalDeviceError as exc:
            print(f"[{suite}] fatal device error: {exc}", flush=True)
            res = C.SuiteResult(suite, fatal=str(exc))
        finally:
            sink.close()
        meta["runs"].append({
            "suite": suite, "mode": args.mode, "planned": res.planned, "counts": res.counts,
            "not_run": res.not_run, "stopped_early": res.stopped_early,
            "elapsed_s": round(res.elapsed_s, 1), "fatal": res.fatal,
            "clocks_before": before, "clocks_after": C.clocks_snapshot(ctx),
        })  # fmt: skip
        C.write_json_atomic(out / "meta.json", meta)
        print(f"[{suite}] {res.counts} not_run={res.not_run} in {res.elapsed_s:.0f} s", flush=True)
        if res.fatal:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
