"""Fit of the NSA-versus-FSA kernel-choice model on the measured Triton kernels.

Data: ``calibrate/data/nsa-fsa-h100-sxm/nsa_fsa.csv`` from ``python -m
calibrate.sparse.nsa_triton --sweep`` (see that module for the two kernels and the
configuration: 64-token blocks, 16 selected per query, 2 KV heads, d=128, bf16).

Model, per kernel, linear in the work counts that :func:`costmodels.ops.sparse_attention.
nsa_kernel_choice` already uses (``pairs_kv``: (token, KV head, selected block) steps;
``pairs_q = G x pairs_kv``; ``rows_q``: tokens x query heads):

- NSA: ``t = launch + c_step * pairs_kv``: a program per (token, KV head) reloads each
  selected block; measured flat in G up to 16 (the M=16 MMA tile is padded, not
  widened), so no G term can be fitted.
- FSA: ``t = launch + c_index * pairs_kv + c_pair * pairs_q + c_row * rows_q``: the index
  (sort of every selection), the main kernel's per-(query head, selection) work and fp32
  partials, the reduction per output row.

(``nsa_fsa_features`` in ``costmodels.ops.sparse_attention``, which prices with them.)

Coefficients are non-negative least squares on relative error (rows scaled by 1 / time).
Validation holds out whole families, never random rows: the two longest lengths (98k,
128k: extrapolation in length) and the largest group (G = 16). ``--write`` stores the
fit on all rows in ``costmodels/data/nsa_fsa.yaml``; the held-out figures and the old
(analytical, unfitted) model's errors and crossover go with it.

``python -m calibrate.sparse.nsa_fit [--write]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import nnls

DATA = Path(__file__).resolve().parents[1] / "data" / "nsa-fsa-h100-sxm" / "nsa_fsa.csv"
OUT = Path(__file__).resolve().parents[2] / "costmodels" / "data" / "nsa_fsa.yaml"


def load(path: Path | str = DATA) -> pd.DataFrame:
    """The sweep's ``ok`` rows with the work counts of :func:`features`."""
    d = pd.read_csv(path)
    need = {"seq_len", "group", "heads_q", "heads_kv", "block", "selected", "nsa_ms", "fsa_ms"}
    missing = need - set(d.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    d = d[d["status"] == "ok"].reset_index(drop=True)
    return d


def features(d: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(NSA, FSA) feature rows of ``costmodels.ops.sparse_attention.nsa_fsa_features``."""
    from costmodels.ops.sparse_attention import nsa_fsa_features, nsa_work

    pairs = [
        nsa_fsa_features(
            nsa_work(
                seq_len=int(r.seq_len),
                heads_q=int(r.heads_q),
                heads_kv=int(r.heads_kv),
                block=int(r.block),
                selected=int(r.selected),
                batch=int(getattr(r, "batch", 1)),
                head_dim=int(r.head_dim),
            )
        )
        for r in d.itertuples()
    ]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def fit_kernel(x: np.ndarray, y_s: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the relative squared error."""
    w = 1.0 / y_s
    coef, _ = nnls(x * w[:, None], y_s * w)
    return coef


def mape(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - y) / y) * 100.0)


SPLITS = {
    "length>=98304": lambda d: d["seq_len"] >= 98304,
    "group=16": lambda d: d["group"] == 16,
}


def evaluate(d: pd.DataFrame) -> dict:
    """Held-out MAPE per kernel and split, the choice accuracy, and the old model's."""
    f_nsa, f_fsa = features(d)
    y_nsa, y_fsa = d["nsa_ms"].to_numpy() / 1e3, d["fsa_ms"].to_numpy() / 1e3
    out: dict = {"rows": len(d), "splits": {}}
    for name, rule in SPLITS.items():
        test = rule(d).to_numpy()
        c_n = fit_kernel(f_nsa[~test], y_nsa[~test])
        c_f = fit_kernel(f_fsa[~test], y_fsa[~test])
        p_n, p_f = f_nsa[test] @ c_n, f_fsa[test] @ c_f
        right = (p_n < p_f) == (y_nsa[test] < y_fsa[test])
        out["splits"][name] = {
            "train_rows": int((~test).sum()),
            "held_out_rows": int(test.sum()),
            "nsa_mape_pct": mape(p_n, y_nsa[test]),
            "fsa_mape_pct": mape(p_f, y_fsa[test]),
            "choice_right": int(right.sum()),
        }
    out["previous_model"] = previous_model(d)
    return out


def previous_model(d: pd.DataFrame) -> dict:
    """The analytical model before this fit (``NSA_FSA`` constants), on the same rows."""
    from costmodels.ops.sparse_attention import nsa_kernel_choice

    choices = [
        nsa_kernel_choice(
            seq_len=int(r.seq_len),
            heads_q=int(r.heads_q),
            heads_kv=int(r.heads_kv),
            block=int(r.block),
            selected=int(r.selected),
            gpu="h100-sxm",
            fitted=False,
        )
        for r in d.itertuples()
    ]
    p_n = np.array([c.nsa_s for c in choices])
    p_f = np.array([c.fsa_s for c in choices])
    y_n, y_f = d["nsa_ms"].to_numpy() / 1e3, d["fsa_ms"].to_numpy() / 1e3
    meas = np.where(y_n < y_f, "nsa", "fsa")
    pred = np.where(p_n < p_f, "nsa", "fsa")
    wrong = [
        f"G={int(g)} {int(t) // 1024}k: predicted {p}, measured {m}"
        for g, t, p, m in zip(d["group"], d["seq_len"], pred, meas, strict=True)
        if p != m
    ]
    return {
        "nsa_mape_pct": mape(p_n, y_n),
        "fsa_mape_pct": mape(p_f, y_f),
        "choice_right": int((pred == meas).sum()),
        "choice_wrong": wrong,
    }


def fit_all(d: pd.DataFrame) -> dict:
    from costmodels.ops.sparse_attention import FSA_FIT_TERMS, NSA_FIT_TERMS

    f_nsa, f_fsa = features(d)
    c_n = fit_kernel(f_nsa, d["nsa_ms"].to_numpy() / 1e3)
    c_f = fit_kernel(f_fsa, d["fsa_ms"].to_numpy() / 1e3)
    return {
        "nsa": dict(zip(NSA_FIT_TERMS, map(float, c_n), strict=True)),
        "fsa": dict(zip(FSA_FIT_TERMS, map(float, c_f), strict=True)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    a = ap.parse_args(argv)
    d = load(a.data)
    ev = evaluate(d)
    print(json.dumps(ev, indent=1))
    if a.write:
        meta = json.loads((Path(a.data).parent / "nsa_fsa.meta.json").read_text())
        doc = {
            "h100-sxm": {
                **fit_all(d),
                "source": (
                    f"fitted on {len(d)} Triton NSA/FSA forward timings, "
                    f"{meta['gpu']}, triton {meta['triton']}, {meta['date']} "
                    "(calibrate/data/nsa-fsa-h100-sxm)"
                ),
                "held_out": ev["splits"],
            }
        }
        OUT.write_text(
            "# NSA vs FSA selected-attention kernels: fitted by "
            "python -m calibrate.sparse.nsa_fit --write\n" + yaml.safe_dump(doc, sort_keys=False)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
