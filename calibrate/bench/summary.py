"""Headline numbers of a dataset folder (stdlib only): status counts per suite, GEMM
TFLOP/s, copy bandwidth, attention TFLOP/s, NCCL bus bandwidth at the largest size."""

from __future__ import annotations

from pathlib import Path

from .collectives import BUSBW
from .common import read_rows


def _f(r: dict[str, str], c: str) -> float:
    return float(r[c]) if r.get(c) else 0.0


def _i(r: dict[str, str], c: str) -> int:
    return int(r[c]) if r.get(c) else 0


def _ok(rows):
    return [r for r in rows if r.get("status") == "ok" and r.get("measured_ms")]


def summarize(folder: Path) -> str:
    folder = Path(folder)
    lines: list[str] = []
    by_suite: dict[str, list[dict[str, str]]] = {}
    for p in sorted(folder.glob("*.csv")):
        by_suite.setdefault(p.name.split(".")[0], []).extend(read_rows(p))
    for suite, rows in by_suite.items():
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
        lines.append(f"{suite}: {len(rows)} rows {counts}")

    g = _ok(by_suite.get("gemm", []))
    for dt in ("bf16", "fp16", "fp8", "tf32", "fp32"):
        sel = [r for r in g if r["dtype"] == dt and not r.get("batch")]
        if not sel:
            continue
        tf = [
            (2 * _i(r, "m") * _i(r, "n") * _i(r, "k") / (_f(r, "measured_ms") * 1e-3) / 1e12, r)
            for r in sel
        ]
        best = max(tf, key=lambda x: x[0])
        sq = [t for t, r in tf if r["m"] == r["n"] == r["k"] == "8192"]
        lines.append(f"gemm {dt}: 8192^3 {sq[0]:.0f} TFLOP/s; " if sq else f"gemm {dt}: ")
        lines[-1] += f"best {best[0]:.0f} TFLOP/s at {best[1]['m']}x{best[1]['n']}x{best[1]['k']}"

    e = _ok(by_suite.get("elementwise", []))
    cp = [r for r in e if r["op"] == "copy"]
    if cp:
        big = max(cp, key=lambda r: _i(r, "bytes"))
        bw = 2 * _i(big, "bytes") / (_f(big, "measured_ms") * 1e-3) / 1e9
        lines.append(f"copy {_i(big, 'bytes') / 2**20:.0f} MiB: {bw:.0f} GB/s (read+write)")

    a = _ok(by_suite.get("attention", []))
    for r in a:
        if (
            r["seq_q"] == "8192"
            and r["causal"] == "true"
            and r["head_dim"] == "128"
            and r["heads_q"] == "32"
            and r["heads_kv"] == "8"
            and r["op"] in ("attn_fwd", "attn_fwdbwd")
        ):
            fl = 4 * _i(r, "batch") * _i(r, "heads_q") * 8192 * 8192 * 128 / 2
            fl *= 3.5 if r["op"] == "attn_fwdbwd" else 1
            tflops = fl / (_f(r, "measured_ms") * 1e-3) / 1e12
            lines.append(
                f"{r['op']} {r['backend']} causal s8192 h32kv8 d128 b{r['batch']} "
                f"({r['family']}): {tflops:.0f} TFLOP/s"
            )

    d = _ok(by_suite.get("decode", []))
    if d:

        def kvbw(r):
            kv = 2 * _i(r, "batch") * _i(r, "heads_kv") * _i(r, "seq_kv") * _i(r, "head_dim") * 2
            return kv / (_f(r, "measured_ms") * 1e-3) / 1e9

        best = max(d, key=kvbw)
        lines.append(
            f"decode best KV-read bandwidth {kvbw(best):.0f} GB/s ({best['backend']}, "
            f"b{best['batch']} kv{best['seq_kv']} h{best['heads_q']}/{best['heads_kv']})"
        )

    c = _ok(by_suite.get("collectives", []))
    for ranks in sorted({_i(r, "ranks") for r in c}):
        for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
            sel = [r for r in c if r["op"] == op and _i(r, "ranks") == ranks]
            if not sel:
                continue
            big = max(sel, key=lambda r: _i(r, "bytes"))
            alg = _i(big, "bytes") / (_f(big, "measured_ms") * 1e-3) / 1e9
            lines.append(
                f"{op} ranks={ranks} {_i(big, 'bytes') / 2**20:.0f} MiB: "
                f"{_f(big, 'measured_ms'):.3f} ms busbw {alg * BUSBW[op](ranks):.0f} GB/s"
            )

    for r in _ok(by_suite.get("power", [])):
        lines.append(
            f"power {r['op']} {r['dtype']}: {r['avg_power_w']} W, "
            f"{float(r['energy_j']) * 1e3:.2f} mJ/exec, {r['measured_ms']} ms"
        )
    bs = _ok(by_suite.get("blocksparse", []))
    if bs:
        pats: dict[str, int] = {}
        for r in bs:
            pats[r["pattern"]] = pats.get(r["pattern"], 0) + 1
        lines.append(f"blocksparse ok rows by pattern: {pats}")
    return "\n".join(lines)
