"""Fit the traffic factors of transformers' eager attention with sinks (gpt-oss) on the
function timed alone, and report the held-out error.

    python -m calibrate.fit_eager_sinks [--write]

Data: ``calibrate/data/eager-sinks-h200-sxm`` (``python3 -m calibrate.bench.eager_sinks`` on
an H200: ``eager_attention_forward`` with sinks, bf16, head width 64, 8-64 heads x 1k-4k
tokens; forward and forward+backward). The GEMMs and the softmax are priced by their op
classes on the shipped H200 calibration; the elementwise kernels' nominal traffic
(:func:`workloads.decompose.training.sinks_attention_ops`) is priced as copies of its
bytes times a factor, the median over the fit rows (8, 16 and 32 heads) of the factor
that prices each row's measured forward (backward) exactly. Held out: 64 heads
(gpt-oss-20b's per GPU), every length.

``--write`` stores ``workloads/data/hf_sinks_attention.yaml``. Nothing here sees gpt-oss's
whole training steps, which ``benchmarks/validate_hf_steps.py`` checks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

from costmodels.ops.select import get_cost_model
from workloads.decompose.training import sinks_attention_ops
from workloads.ops import Dtype, ops_frame

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibrate" / "data" / "eager-sinks-h200-sxm" / "eager_sinks.json"
OUT = ROOT / "workloads" / "data" / "hf_sinks_attention.yaml"
FIT_HEADS = (8, 16, 32)


def priced_ms(cm, r: dict, factors: tuple[float, float]) -> tuple[float, float]:
    """(forward, backward) milliseconds of row ``r``'s shape priced with ``factors``."""
    f_ops, b_ops = sinks_attention_ops(r["heads"], r["seq_len"], r["head_dim"], Dtype.bf16, factors)
    out = []
    for ops in (f_ops, b_ops):
        t = cm.predict_many(ops_frame([o.op for o in ops]))
        out.append(1e3 * sum(x * o.count for o, x in zip(ops, t, strict=True)))
    return out[0], out[1]


def solve(fn, target: float) -> float:
    """The factor in [0.1, 50] where ``fn(factor)`` (increasing) meets ``target``."""
    lo, hi = 0.1, 50.0
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if fn(mid) < target else (lo, mid)
    return (lo * hi) ** 0.5


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    cm = get_cost_model("h200-sxm")
    rows = json.loads(DATA.read_text())["rows"]
    fit = [r for r in rows if r["heads"] in FIT_HEADS]
    # per fit row, the factor that prices its measured forward (backward) exactly
    ff = float(np.median([solve(lambda x, r=r: priced_ms(cm, r, (x, 1.0))[0], r["fwd_ms"])
                          for r in fit]))  # fmt: skip
    fb = float(np.median([solve(lambda x, r=r: priced_ms(cm, r, (1.0, x))[1],
                                r["fwdbwd_ms"] - r["fwd_ms"]) for r in fit]))  # fmt: skip
    print(f"traffic factors fitted on {FIT_HEADS} heads: fwd {ff:.3f}, bwd {fb:.3f}")
    errs = []
    for r in rows:
        fwd, bwd = priced_ms(cm, r, (round(ff, 3), round(fb, 3)))
        tot = fwd + bwd
        held = r["heads"] not in FIT_HEADS
        e = tot / r["fwdbwd_ms"] - 1
        if held:
            errs.append(abs(e))
        print(f"{r['heads']:>3} heads x {r['seq_len']:>5} {'held-out' if held else 'fit':>8}: "
              f"fwd {r['fwd_ms']:7.2f} / {fwd:7.2f} ms, fwd+bwd {r['fwdbwd_ms']:7.2f} / "
              f"{tot:7.2f} ms ({100 * e:+.1f}%)")  # fmt: skip
    mape = round(100 * float(np.mean(errs)), 1)
    print(f"held-out MAPE (fwd+bwd): {mape}%")
    if args.write:
        head = (
            "# Measured over nominal copy-priced traffic of transformers' eager attention\n"
            "# with sinks (gpt-oss), H200 (calibrate/data/eager-sinks-h200-sxm).\n"
            "# Regenerate: python -m calibrate.fit_eager_sinks --write\n"
        )
        body = {
            "traffic_factor": {"fwd": round(ff, 3), "bwd": round(fb, 3)},
            "fitted_on_heads": list(FIT_HEADS),
            "held_out_mape_pct": mape,
        }
        OUT.write_text(head + yaml.safe_dump(body, sort_keys=True))
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
