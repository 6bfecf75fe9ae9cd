"""Fit the linear mixers' scan kernels: measured time over the time simcli prices for the
scan's nominal memory traffic (:func:`workloads.decompose.mixer.scan_bytes_per_token`,
the state read and written once per decoding sequence), per mixer kind and direction.

    python -m calibrate.fit_mixers [--write]

Data: ``calibrate/data/linear-mixers-h200-sxm`` (``python3 -m calibrate.bench.linear_mixers``
on an H200: fla's ``chunk_gated_delta_rule`` / ``chunk_kda`` and mamba_ssm's Triton SSD,
CUDA-graph replays). The nominal traffic is priced as the step models price it, a ``copy``
on the shipped H200 calibration. Each factor is the median ratio over its fit rows:

- ``fwd``: the chunked scan, fitted on single sequences of 2-8k tokens; held out: 32k
  tokens and batches of 4 and 8 sequences (GDN, KDA, SSD: one head family each measured
  under graphs), and Granite 4.0-H's SSD family (eager launches, >= 8k tokens).
- ``bwd``: the backward's kernels over the forward's in one profiled 8k-token call (fla /
  mamba_ssm, ``linear_mixers_kernels.csv``), times ``fwd``: what the backward of the
  scan's traffic costs in training.
- ``decode``: the recurrent step, fitted on the released model's head family; held out:
  every other family measured (heads 16-128, head widths 64-256, grouped values, SSD
  groups 1-8, d_state 128-256). Its nominal traffic counts the state in fp32 elements:
  the update takes the same time on bf16 and fp32 states (Nemotron-H's rows).

``--write`` stores ``costmodels/data/linear_mixers.yaml``. Prints held-out MAPE.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from costmodels.ops.select import get_cost_model
from workloads.decompose.mixer import scan_bytes_per_token
from workloads.mixers import LinearMixer
from workloads.ops import Op, OpKind, ops_frame

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibrate" / "data" / "linear-mixers-h200-sxm"
OUT = ROOT / "costmodels" / "data" / "linear_mixers.yaml"
FIT_FAMILY = {"gdn": "qwen3-next-hf", "kda": "kimi-linear", "ssd": "nemotron-h-8b",
              "mamba1": "jamba-mini"}  # fmt: skip
KIND = {"gdn": "gdn", "kda": "kda", "ssd": "mamba2", "mamba1": "mamba"}


def mixer_of(r) -> LinearMixer:
    """The row's shape as a :class:`LinearMixer` (one rank: the kernel's heads; Mamba-1's
    d_inner is the runner's ``dv``)."""
    kind = KIND[r.kernel]
    h, dv = int(r.heads), int(r.dv)
    common = {"kind": kind, "conv_kernel": 4}
    if kind == "mamba":
        return LinearMixer(**common, heads=1, head_dim=dv, key_heads=1,
                           key_dim=int(r.d_state), dt_rank=1, out_norm=False)  # fmt: skip
    if kind == "mamba2":
        return LinearMixer(**common, heads=h, head_dim=dv, key_heads=int(r.ngroups),
                           key_dim=int(r.d_state), chunk_size=int(r.chunk))  # fmt: skip
    hk = int(r.key_heads) if kind == "gdn" and not math.isnan(r.key_heads) else h
    gate = int(r.dk) if kind == "kda" else None
    return LinearMixer(**common, heads=h, head_dim=dv, key_heads=hk, key_dim=int(r.dk),
                       gate_rank=gate)  # fmt: skip


def nominal_bytes(r) -> float:
    """Bytes the step models price for the row: the chunked scan's traffic per token, or
    the state read and written per decoding sequence."""
    mx = mixer_of(r)
    if r.direction == "decode":  # fp32 elements whatever the state's dtype (see mixer.py)
        return float(r.batch) * 2.0 * mx.state_elements * 4.0
    return float(r.batch * r.seq_len) * scan_bytes_per_token(mx, 2.0)


def priced_s(nbytes: np.ndarray) -> np.ndarray:
    """A ``copy`` moving ``nbytes`` (read + written: half of them copied) on the H200."""
    cm = get_cost_model("h200-sxm")
    ops = [Op(op=OpKind.copy, dtype="bf16", bytes=max(1, int(b / 2))) for b in nbytes]
    return np.asarray(cm.predict_many(ops_frame(ops)), dtype=float)


def rows() -> pd.DataFrame:
    d = pd.read_csv(DATA / "linear_mixers.csv")
    d = d[(d.status == "ok") & d.kernel.isin(list(KIND))]
    d = d.drop_duplicates("case", keep="last")
    d = d.assign(nominal=[nominal_bytes(r) for r in d.itertuples()])
    return d.assign(priced_ms=1e3 * priced_s(d.nominal.to_numpy()))


def bwd_over_fwd() -> dict[str, float]:
    """Backward kernel time over forward kernel time of one profiled 8k-token call."""
    k = pd.read_csv(DATA / "linear_mixers_kernels.csv")
    out = {}
    for kernel in ("gdn", "kda", "ssd"):
        fwd = k[k.case == f"{kernel}:fwd:eager:{FIT_FAMILY[kernel]}:1x8192"].device_us.sum()
        both = k[k.case == f"{kernel}:fwdbwd:eager:{FIT_FAMILY[kernel]}:1x8192"].device_us.sum()
        if fwd and both:
            out[kernel] = float((both - fwd) / fwd)
    return out


def fit(d: pd.DataFrame) -> tuple[dict, pd.DataFrame]:
    d = d.assign(ratio=d.time_ms / d.priced_ms)
    factors: dict[str, dict[str, float]] = {}
    held: list[pd.DataFrame] = []
    for kernel, kind in KIND.items():
        fam = FIT_FAMILY[kernel]
        dec = d[(d.kernel == kernel) & (d.direction == "decode") & (d["mode"] == "graph")]
        fwd = d[(d.kernel == kernel) & (d.direction == "fwd")]
        out: dict[str, float] = {}
        if len(dec):
            train = dec[dec.family == fam]
            out["decode"] = round(float(train.ratio.median()), 3)
            held.append(dec[dec.family != fam].assign(factor=out["decode"], what="decode"))
        if len(fwd):
            g = fwd[(fwd["mode"] == "graph") & (fwd.family == fam)]
            train = g[(g.batch == 1) & (g.seq_len <= 8192)]
            out["fwd"] = round(float(train.ratio.median()), 3)
            test = pd.concat([g[(g.batch > 1) | (g.seq_len > 8192)],
                              fwd[(fwd["mode"] == "eager") & (fwd.family != fam)
                                  & (fwd.batch * fwd.seq_len >= 8192)]])  # fmt: skip
            held.append(test.assign(factor=out["fwd"], what="fwd"))
        if out:
            factors[kind] = out
    for kernel, ratio in bwd_over_fwd().items():
        f = factors[KIND[kernel]]
        f["bwd"] = round(f["fwd"] * ratio, 3)
    test = pd.concat(held)
    test = test.assign(pred_ms=test.priced_ms * test.factor)
    return factors, test.assign(ape=(test.pred_ms / test.time_ms - 1).abs() * 100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    factors, test = fit(rows())
    print(yaml.safe_dump(factors, sort_keys=True).strip())
    print("\nheld-out MAPE (%):")
    print(test.groupby(["kernel", "what"]).ape.agg(["mean", "max", "count"]).round(1).to_string())
    if args.write:
        head = (
            "# Measured scan time over the priced nominal traffic, per mixer kind (fwd: the\n"
            "# chunked scan; bwd: its backward; decode: the recurrent step), H200 graph replays\n"
            "# of fla / mamba_ssm's Triton kernels (calibrate/data/linear-mixers-h200-sxm).\n"
            "# Regenerate: python -m calibrate.fit_mixers --write\n"
        )
        OUT.write_text(head + yaml.safe_dump({"factors": factors}, sort_keys=True))
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
