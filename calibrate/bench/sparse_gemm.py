"""Sparse-weight GEMM suite: 2:4 semi-structured sparsity and CATS activation sparsity.

Every row is a ``gemm`` in the op-CSV convention C[m,n] = X[m,k] . W[n,k]^T (nn.Linear:
m tokens, n output features, k input features), told apart by ``pattern`` and ``backend``:

- ``pattern=dense``, ``backend`` empty: ``F.linear(x, W)`` on a dense random weight
  (cuBLAS), the baseline measured beside every sparse row under the same conditions.
- ``pattern=2:4``, ``backend=cusparselt|cutlass``: ``F.linear(x, Ws)`` where ``Ws`` is the
  weight pruned to a random 2:4 pattern (two of every four consecutive k elements kept)
  and compressed by ``to_sparse_semi_structured`` (cuSPARSELt, or the CUTLASS subclass).
  ``density`` = 0.5. Compression happens once per weight, outside the timed call. The
  result is checked against the dense product on the pruned weight.
  ``backend=cusparselt_graph``: the same call captured once in a CUDA graph and timed as
  graph replays, so torch's per-call host work (it rebuilds the cuSPARSELt descriptors and
  plan on every eager call, pytorch/pytorch#153825) is gone and the kernel alone is timed,
  as a serving engine that replays CUDA graphs (vLLM, SGLang decode) sees it.
- ``pattern=cats:F``: CATS-style MLP activation sparsity at decode (Lee et al. 2024): each
  of the m tokens keeps a fraction F of the MLP neurons; the batch reads the union of its
  tokens' neurons, here ``round8(N (1 - (1-F)^m))`` of the N neurons (independent tokens,
  rounded up to a multiple of 8 so that the compacted operands stay 16-byte aligned),
  and ``density`` is that union's fraction. Layers: ``up`` (W [ffn, hidden]: active
  *rows* are read) and ``down`` (active *columns* of W [hidden, ffn], stored transposed as
  [ffn, hidden] so that they are rows). ``backend=gather``: ``index_select`` of the active
  rows (and, for down, of the activations) then a dense GEMM on the copy, as torch code
  would do it; ``backend=compact``: the dense GEMM on weights gathered beforehand, the
  bound a fused CATS kernel (which reads only the active rows) approaches.

Unstructured (Flash-LLM style) sparsity has no kernel in torch: it is modelled
analytically in ``costmodels/ops/sparse_gemm.py`` and not measured here.

Kernels that do not exist on the device (the CPU, an old GPU, a torch without cuSPARSELt)
are recorded as ``unsupported``. Imports only the standard library and torch.
"""

from __future__ import annotations

import math
import random
from typing import Any

from .common import Case, Context, Unsupported, bench, cleanup, dedupe
from .models import MODELS

NAME = "sparse_gemm"

ELEM_BYTES = {"bf16": 2, "fp16": 2}
FLOP_CAP = 8e12  # per case, as in the gemm suite
SEMI_BACKENDS = ("cusparselt", "cusparselt_graph", "cutlass")
CATS_FRACTIONS = (0.1, 0.3, 0.5, 0.7)
CATS_BACKENDS = ("gather", "compact")

# (model, tensor-parallel ranks) whose layers are measured: every TP degree the heads
# split over. Mistral-7B's linear layers have Llama-3-8B's shapes (hidden 4096, 32/8
# heads, ffn 14336), so llama3-8b's rows stand for both.
SEMI_MODELS = tuple(
    (m, tp) for m in ("llama3-8b", "llama3-70b", "qwen2.5-7b", "qwen2.5-72b") for tp in (1, 2, 4, 8)
)
SEMI_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
CATS_MODELS = (("llama3-8b", 1), ("llama3-70b", 1), ("llama3-70b", 8), ("qwen2.5-7b", 1))


def cats_rows_read(neurons: int, active: float, tokens: int) -> int:
    """Neurons whose weights a batch reads: the expected union of ``tokens`` independent
    per-token active sets of fraction ``active``, rounded up to a multiple of 8."""
    union = 1.0 - (1.0 - active) ** tokens
    return min(neurons, max(8, 8 * math.ceil(neurons * union / 8)))


def _case(
    m: int,
    n: int,
    k: int,
    dtype: str,
    family: str,
    pattern: str,
    backend: str | None,
    density: float | None = None,
    layer: str = "",
) -> Case:
    row: dict[str, Any] = {
        "op": "gemm",
        "dtype": dtype,
        "m": m,
        "n": n,
        "k": k,
        "backend": backend,
        "density": density,
        "family": family,
        "pattern": pattern,
    }
    return Case(row=row, params={"layer": layer}, group=f"{dtype}/{n}x{k}/{layer or 'w'}")


def _fits(c: Case, ctx: Context) -> bool:
    r = c.row
    if 2.0 * r["m"] * r["n"] * r["k"] > FLOP_CAP * (0.02 if ctx.tiny else 1):
        return False
    eb = ELEM_BYTES[r["dtype"]]
    # input, weight, a pruned copy and two compressed ones, output
    nbytes = (r["m"] * r["k"] + 3 * r["n"] * r["k"] + r["m"] * r["n"]) * eb
    return nbytes <= ctx.input_budget_bytes()


def _semi_cases(m_list, n: int, k: int, dtype: str, family: str) -> list[Case]:
    """Dense and 2:4 rows of one weight; CUTLASS (compute capability 8.x only) on the
    square anchors and TP-1 layers alone, so a Hopper run spends little on refusals."""
    out = [_case(m, n, k, dtype, family, "dense", None) for m in m_list]
    cutlass = family.split("/")[0] in ("square", "tiny") or "/tp1/" in family
    for be in SEMI_BACKENDS if cutlass else SEMI_BACKENDS[:-1]:
        out += [_case(m, n, k, dtype, family, "2:4", be, 0.5) for m in m_list]
    return out


def _cats_cases(m_list, ffn: int, hidden: int, dtype: str, family: str) -> list[Case]:
    """``family`` ends in /up or /down."""
    layer = family.rsplit("/", 1)[1]
    n, k = (ffn, hidden) if layer == "up" else (hidden, ffn)
    out = [_case(m, n, k, dtype, family, "dense", None, layer=layer) for m in m_list]
    for be in CATS_BACKENDS:
        for f in CATS_FRACTIONS:
            for m in m_list:
                d = cats_rows_read(ffn, f, m) / ffn
                out.append(_case(m, n, k, dtype, family, f"cats:{f:g}", be, d, layer))
    return out


def _layers(model: str, tp: int) -> dict[str, tuple[int, int]]:
    """(n, k) of the QKV, out-projection, gate+up and down layers of one TP rank; empty
    when the heads do not split over ``tp`` ranks (Qwen2.5-7B's 28 heads over 8)."""
    d = MODELS[model]
    if d.heads % tp or d.ffn % tp:
        return {}
    kv = max(1, d.kv_heads // tp)
    return {
        "qkv": ((d.heads // tp + 2 * kv) * d.head_dim, d.hidden),
        "out": (d.hidden, d.heads * d.head_dim // tp),
        "gateup": (2 * d.ffn // tp, d.hidden),
        "down": (d.hidden, d.ffn // tp),
    }


def cases(ctx: Context) -> list[Case]:
    if ctx.tiny:
        out = _semi_cases((8, 32), 128, 128, "bf16", "tiny/w")
        out += _cats_cases((1, 4), 256, 128, "bf16", "tiny/up")
        out += _cats_cases((1, 4), 256, 128, "bf16", "tiny/down")
        out = [c for c in out if c.row["pattern"] in ("dense", "2:4", "cats:0.3")]
        return [c for c in out if _fits(c, ctx)]

    quick = ctx.quick
    tokens = (1, 16, 256, 4096) if quick else SEMI_TOKENS
    decode = (1, 8, 64) if quick else (1, 2, 4, 8, 16, 64)
    semi_models = SEMI_MODELS[:1] if quick else SEMI_MODELS
    cats_models = CATS_MODELS[:1] if quick else CATS_MODELS

    groups: list[list[Case]] = []
    for model, tp in semi_models:
        for layer, (n, k) in _layers(model, tp).items():
            groups.append(_semi_cases(tokens, n, k, "bf16", f"{model}/tp{tp}/{layer}"))
            if model == "llama3-8b" and not quick:
                groups.append(_semi_cases(tokens, n, k, "fp16", f"{model}/tp{tp}/{layer}"))
    for model, tp in cats_models:
        d = MODELS[model]
        for layer in ("up", "down"):
            groups.append(
                _cats_cases(decode, d.ffn // tp, d.hidden, "bf16", f"{model}/tp{tp}/{layer}")
            )
    anchors = [_semi_cases((s,), s, s, "bf16", "square") for s in (4096, 8192)]
    # whole weight groups in a seeded order (a run cut short still covers every family),
    # the square anchors first; inside a group the weight is built once
    random.Random(ctx.seed + 7).shuffle(groups)
    out = dedupe(c for g in anchors + groups for c in g)
    return [c for c in out if _fits(c, ctx)]


# ----------------------------------------------------------------------------- running

# Weights of the current group (dense, pruned, compressed), built once per group.
_STATE: dict[str, Any] = {"group": None, "objs": {}}


def _tdtype(torch, dt: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]


def _objs(case: Case, ctx: Context) -> dict[str, Any]:
    if _STATE["group"] != case.group:
        _STATE["objs"] = {}
        _STATE["group"] = case.group
        cleanup(ctx)
    return _STATE["objs"]


def _rel_err(torch, out, ref) -> float:
    ref = ref.float()
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def _semi_weight(torch, objs: dict[str, Any], backend: str, ctx: Context):
    """The pruned dense weight and its compressed form for ``backend`` (cached)."""
    if backend in objs:
        return objs["pruned"], objs[backend]
    if "pruned" not in objs:
        w = objs["dense"]
        n, k = w.shape
        scores = torch.rand(n, k // 4, 4, device=w.device)
        keep = torch.zeros_like(scores, dtype=torch.bool)
        keep.scatter_(-1, scores.topk(2, dim=-1).indices, True)
        objs["pruned"] = w * keep.view(n, k)
        del scores, keep
    from torch.sparse import to_sparse_semi_structured

    sparse = torch.sparse
    try:
        if backend == "cusparselt":
            be = getattr(torch.backends, "cusparselt", None)
            if be is None or not be.is_available():
                raise Unsupported("cuSPARSELt is not available in this torch build")
            cls = getattr(sparse, "SparseSemiStructuredTensorCUSPARSELT", None)
            ws = (
                cls.from_dense(objs["pruned"]) if cls else to_sparse_semi_structured(objs["pruned"])
            )
        else:
            cls = getattr(sparse, "SparseSemiStructuredTensorCUTLASS", None)
            if cls is None:
                raise Unsupported("no CUTLASS semi-structured subclass in this torch")
            ws = cls.from_dense(objs["pruned"])
    except Unsupported:
        raise
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:
        raise Unsupported(f"2:4 {backend} not supported here: {exc}") from exc
    objs[backend] = ws
    return objs["pruned"], ws


def run(case: Case, ctx: Context) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    r = case.row
    dt, m, n, k = r["dtype"], r["m"], r["n"], r["k"]
    pattern, backend = r["pattern"], r.get("backend") or ""
    tdt = _tdtype(torch, dt)
    dev = ctx.device
    objs = _objs(case, ctx)
    layer = case.params.get("layer", "")
    x = torch.randn(m, k, device=dev, dtype=tdt)

    if pattern == "dense":
        if "dense" not in objs:
            objs["dense"] = torch.randn(n, k, device=dev, dtype=tdt)
        w = objs["dense"]
        return {"measured_ms": bench(lambda: F.linear(x, w), ctx)}

    if pattern == "2:4":
        if "dense" not in objs:
            objs["dense"] = torch.randn(n, k, device=dev, dtype=tdt)
        graph = backend.endswith("_graph")
        if graph and not ctx.is_cuda:
            raise Unsupported("2:4 cuSPARSELt graph replay needs a CUDA device")
        pruned, ws = _semi_weight(torch, objs, backend.removesuffix("_graph"), ctx)
        try:
            out = F.linear(x, ws)
        except (RuntimeError, NotImplementedError) as exc:
            raise Unsupported(f"2:4 {backend} matmul not supported here: {exc}") from exc
        err = _rel_err(torch, out, F.linear(x, pruned))
        if not err < 2e-2:
            raise RuntimeError(f"2:4 {backend} result differs from dense: rel err {err:.3g}")
        del out
        if graph:
            return {"measured_ms": _bench_graph(torch, F, x, ws, pruned, ctx)}
        return {"measured_ms": bench(lambda: F.linear(x, ws), ctx)}

    if pattern.startswith("cats:"):
        return _run_cats(torch, F, case, ctx, objs, x, layer)
    raise ValueError(f"unknown pattern {pattern!r}")


def _bench_graph(torch, F, x, ws, pruned, ctx: Context) -> float:
    """Median ms of replays of ``F.linear(x, ws)`` captured in a CUDA graph (warmed up on
    a side stream first, as torch's graph docs ask); the replay's output is checked."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                F.linear(x, ws)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = F.linear(x, ws)
    except (RuntimeError, NotImplementedError) as exc:
        raise Unsupported(f"2:4 cuSPARSELt call not capturable: {exc}") from exc
    out.fill_(float("nan"))
    g.replay()
    err = _rel_err(torch, out, F.linear(x, pruned))
    if not err < 2e-2:
        raise RuntimeError(f"2:4 graph replay differs from dense: rel err {err:.3g}")
    ms = bench(g.replay, ctx)
    del g, out
    return ms


def _run_cats(torch, F, case: Case, ctx: Context, objs, x, layer: str) -> dict[str, Any]:
    r = case.row
    m, n, k, backend = r["m"], r["n"], r["k"], r["backend"]
    tdt, dev = x.dtype, x.device
    neurons = n if layer == "up" else k
    active = float(r["pattern"].split(":", 1)[1])
    rows = cats_rows_read(neurons, active, m)
    g = torch.Generator().manual_seed(ctx.seed * 1_000_003 + neurons * 97 + rows)
    idx = torch.randperm(neurons, generator=g)[:rows].sort().values.to(dev)
    if "cats_w" not in objs:
        # up: W [ffn, hidden], active rows; down: W^T [ffn, hidden], active rows of the
        # transposed weight = active columns of W [hidden, ffn]
        objs["cats_w"] = torch.randn(neurons, n if layer == "down" else k, device=dev, dtype=tdt)
    w = objs["cats_w"]
    if layer == "up":
        w_act = w.index_select(0, idx)

        def gather():
            return F.linear(x, w.index_select(0, idx))

        def compact():
            return F.linear(x, w_act)

        ref = F.linear(x, w)[:, idx]
    else:
        w_act = w.index_select(0, idx)
        x_act = x.index_select(1, idx)

        def gather():
            return torch.mm(x.index_select(1, idx), w.index_select(0, idx))

        def compact():
            return torch.mm(x_act, w_act)

        mask = torch.zeros(k, device=dev, dtype=tdt)
        mask[idx] = 1
        ref = torch.mm(x * mask, w)  # the dense product on the thresholded activations
    fn = gather if backend == "gather" else compact
    err = _rel_err(torch, fn(), ref)
    if not err < 2e-2:
        raise RuntimeError(f"cats {backend} result differs from dense: rel err {err:.3g}")
    del ref
    return {"measured_ms": bench(fn, ctx)}
