"""Fit and validate the tile-table block-sparse attention model (costmodels/ops/).

Run:  python benchmarks/sparse_attention_fit.py            # print the tables
      python benchmarks/sparse_attention_fit.py --write    # also write the fitted YAML

Data: the measured FlexAttention rows (calibrate/data/{h100,h200}-sxm/blocksparse.csv,
bf16, head_dim 128, batch 1; forward and backward). Splits are by pattern family, never
random:

1. The shipped profiles' held-out families (nsa/l2n4, nsa/l4n8, s2/l2s8, topk/k2,
   topk/k32): the tile model is fitted on the other 15 families and compared, family by
   family, with the density-only model (``attention_work``) of the calibrated profile,
   analytical and learned (its learned residuals were fitted without these families too).
   These parameters are the ones written to costmodels/data/sparse_attention.yaml.
2. Leave one pattern out: all window (or top-k, S2, NSA, dense, causal) families held out
   at once, the model fitted on the rest.

Also printed: the H100 run-to-run noise per family (the suite was measured twice), the
NSA-kernel vs FSA-kernel figures, and a SALE and an S2 example.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from costmodels.ops import sparse_attention as sa

ROOT = Path(__file__).resolve().parents[1]
GPUS = ("h100-sxm", "h200-sxm")
PATTERNS = ("dense", "causal", "window", "topk", "s2", "nsa")
FALLBACK_HELD_OUT = ("nsa/l2n4", "nsa/l4n8", "s2/l2s8", "topk/k2", "topk/k32")
OUT = ROOT / "costmodels" / "data" / "sparse_attention.yaml"


def measured(gpu: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "calibrate" / "data" / gpu / "blocksparse.csv")


def profile_held_out(gpu: str, families: set[str]) -> list[str]:
    """The block-sparse families the shipped profile held out (same split, fair compare)."""
    path = ROOT / "costmodels" / "profiles" / f"{gpu}.json"
    if path.exists():
        held = [g for g in json.loads(path.read_text()).get("held_out_groups", []) if g in families]
        if held:
            return sorted(held)
    return list(FALLBACK_HELD_OUT)


def density_model_predictions(gpu: str, frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The density-only model (costmodels.ops.attention.attention_work) with the shipped
    profile: its fitted analytical part and its learned correction, seconds per row."""
    from costmodels.ops.select import get_cost_model
    from workloads.ops import CSV_COLUMNS, normalise_frame

    model = get_cost_model(gpu)
    ops = normalise_frame(frame[[c for c in CSV_COLUMNS if c in frame.columns]].copy())
    base = model.base if hasattr(model, "base") else model
    return {"analytical": base.predict_many(ops), "learned": model.predict_many(ops)}


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


def evaluate(gpu: str) -> dict:
    frame = measured(gpu)
    ok = frame[frame["status"] == "ok"].reset_index(drop=True)
    rows = sa.calibration_rows(ok)
    families = {r.family for r in rows}
    held = profile_held_out(gpu, families)
    fit_rows, test_rows = sa.split_rows(rows, held)
    params = sa.fit_tile_params(
        fit_rows, gpu, source=f"fitted on {len(fit_rows)} rows of {gpu}, held out {held}"
    )
    pred = sa.predict_rows(test_rows, gpu, params)
    dens = density_model_predictions(gpu, ok)
    test_mask = ok["family"].isin(held).to_numpy()
    meas = np.array([r.measured_s for r in test_rows])
    fams = np.array([r.family for r in test_rows])
    dirs = np.array([r.direction for r in test_rows])
    ok_test = ok[test_mask].reset_index(drop=True)
    assert (ok_test["family"].to_numpy() == fams).all()  # same row order
    table = []
    for fam in [*held, "all"]:
        s = np.ones(len(fams), bool) if fam == "all" else fams == fam
        table.append(
            {
                "family": fam,
                "rows": int(s.sum()),
                "tile_mape": mape(pred[s], meas[s]),
                "tile_fwd": mape(pred[s & (dirs == "fwd")], meas[s & (dirs == "fwd")]),
                "tile_bwd": mape(pred[s & (dirs == "bwd")], meas[s & (dirs == "bwd")])
                if (s & (dirs == "bwd")).any()
                else float("nan"),
                "density_analytical": mape(dens["analytical"][test_mask][s], meas[s]),
                "density_learned": mape(dens["learned"][test_mask][s], meas[s]),
            }
        )
    fit_pred = sa.predict_rows(fit_rows, gpu, params)
    fit_meas = np.array([r.measured_s for r in fit_rows])
    lopo = []
    for pattern in PATTERNS:
        f_rows, t_rows = sa.split_rows(rows, [pattern])
        p = sa.fit_tile_params(f_rows, gpu)
        by_fam = sa.mape_by_family(t_rows, sa.predict_rows(t_rows, gpu, p))
        for fam, entry in by_fam.items():
            lopo.append({"pattern": pattern, "family": fam, **entry})
    return {
        "gpu": gpu,
        "held_out": held,
        "params": params,
        "fit_rows": len(fit_rows),
        "fit_mape": mape(fit_pred, fit_meas),
        "held_out_table": table,
        "lopo": lopo,
    }


def repeat_noise() -> dict[str, float]:
    """H100 run-to-run noise: MAPE of the accidental second measurement vs the first."""
    rep = pd.read_csv(
        ROOT / "calibrate" / "data" / "h100-sxm" / "repeats" / "attention_blocksparse.csv"
    )
    rep = rep[(rep["suite"] == "blocksparse") & (rep["status"] == "ok")]
    main = measured("h100-sxm")
    key = ["op", "seq_q", "heads_q", "block_size", "family"]
    m = main.merge(rep, on=key, suffixes=("", "_rep"))
    m = m[np.isfinite(m["measured_ms"]) & np.isfinite(m["measured_ms_rep"])]
    ape = np.abs(m["measured_ms_rep"] / m["measured_ms"] - 1.0) * 100.0
    out = ape.groupby(m["family"]).mean().to_dict()
    out["all"] = float(ape.mean())
    return out


def nsa_fsa_table() -> list[dict]:
    from workloads.sparsity import parse_pattern

    out = []
    for gpu in GPUS:
        for block, sel in ((64, 16), (128, 8)):
            pattern = parse_pattern(f"nsa:lsel={block},n={sel}")
            for seq in (32768, 65536):
                for g in (1, 2, 4, 8, 16):
                    t = sa.nsa_attention_time(
                        seq_len=seq, heads_q=4 * g, heads_kv=4, pattern=pattern, gpu=gpu
                    )
                    out.append(
                        {
                            "gpu": gpu,
                            "block": block,
                            "selected": sel,
                            "seq": seq,
                            "group": g,
                            "nsa_sel_ms": t.selected.nsa_s * 1e3,
                            "fsa_sel_ms": t.selected.fsa_s * 1e3,
                            "sel_speedup": t.selected.fsa_speedup,
                            "full_speedup": t.nsa_total_s / t.fsa_total_s,
                            "choice": t.selected.choice,
                        }
                    )
    return out


def measured_on(gpu: str) -> dict:
    """Where the rows were measured (calibrate/data/<gpu>/meta.json; the H200 block-sparse
    rows were completed on a one-GPU machine, whose environment is recorded separately)."""
    meta = json.loads((ROOT / "calibrate" / "data" / gpu / "meta.json").read_text())
    env = meta.get("environment") or meta.get("blocksparse_completion", {}).get("meta", {}).get(
        "environment", {}
    )
    keys = ("date", "gpu_name", "sm_count", "device_kind", "driver", "torch", "torch_cuda")
    out = {k: env[k] for k in (*keys, "triton", "timing_method") if k in env}
    if "note" in meta:
        out["note"] = meta.get("blocksparse_completion", {}).get("note", meta["note"])
    return out


def write_yaml(results: list[dict]) -> None:
    backends = {}
    for res in results:
        entry = res["params"].to_dict()
        entry["source"] = (
            f"fitted by benchmarks/sparse_attention_fit.py on calibrate/data/{res['gpu']}/"
            f"blocksparse.csv: {res['fit_rows']} rows (FlexAttention, bf16, head_dim 128, "
            f"batch 1), families {', '.join(res['held_out'])} held out"
        )
        entry["measured_on"] = measured_on(res["gpu"])
        entry["fit_mape_pct"] = round(res["fit_mape"], 2)
        entry["held_out_mape_pct"] = {
            r["family"]: round(r["tile_mape"], 2) for r in res["held_out_table"]
        }
        backends[res["gpu"]] = entry
    doc = {
        "about": (
            "Fitted parameters of costmodels/ops/sparse_attention.py (tile-table block-sparse "
            "attention). Regenerate with: python benchmarks/sparse_attention_fit.py --write. "
            "Efficiencies are of the tile matmuls (forward 2, backward 7 per tile: "
            "FlexAttention's dK/dV and dQ programs both recompute QK^T and dP), keyed by "
            "block size; mask_s is the extra SM-seconds of a partial tile; cta_s the fixed "
            "SM-seconds per CTA; launch_s per call. Block size 64 backward was not measurable "
            "(no inductor config): its values are the 128 ones scaled by the forward ratio."
        ),
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "backends": {"flex": backends},
    }
    text = yaml.safe_dump(doc, sort_keys=False, width=100)
    fd, tmp = tempfile.mkstemp(dir=OUT.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, OUT)
    print(f"wrote {OUT.relative_to(ROOT)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the fitted parameters YAML")
    args = ap.parse_args()
    results = [evaluate(g) for g in GPUS]
    noise = repeat_noise()
    for res in results:
        p = res["params"]
        print(
            f"\n== {res['gpu']}: fitted on {res['fit_rows']} rows "
            f"(in-sample MAPE {res['fit_mape']:.1f}%)"
        )
        print(
            f"   fwd efficiency {p.fwd_efficiency}  mask_s {p.fwd_mask_s}  "
            f"cta {p.fwd_cta_s * 1e6:.2f} us  launch {p.fwd_launch_s * 1e6:.1f} us"
        )
        print(
            f"   bwd efficiency {p.bwd_efficiency}  mask_s {p.bwd_mask_s}  "
            f"cta {p.bwd_cta_s * 1e6:.2f} us  launch {p.bwd_launch_s * 1e6:.1f} us"
        )
        print("Held-out families (the shipped profile's split), MAPE %")
        head = ("family", "rows", "tile", "fwd", "bwd", "density", "density+learned")
        print(
            f"{head[0]:12s} {head[1]:>4s} {head[2]:>6s} {head[3]:>6s} {head[4]:>6s} "
            f"{head[5]:>8s} {head[6]:>16s}"
            + ("  H100 repeat noise" if res["gpu"] == "h100-sxm" else "")
        )
        for r in res["held_out_table"]:
            extra = (
                f"  {noise.get(r['family'], float('nan')):8.1f}" if res["gpu"] == "h100-sxm" else ""
            )
            print(
                f"{r['family']:12s} {r['rows']:4d} {r['tile_mape']:6.1f} {r['tile_fwd']:6.1f} "
                f"{r['tile_bwd']:6.1f} {r['density_analytical']:8.1f} "
                f"{r['density_learned']:16.1f}{extra}"
            )
        print("Leave one pattern out (fit on the other patterns), MAPE %")
        print(f"{'held out':8s} {'family':12s} {'rows':>4s} {'mape':>6s} {'fwd':>6s} {'bwd':>6s}")
        for r in res["lopo"]:
            print(
                f"{r['pattern']:8s} {r['family']:12s} {r['rows']:4d} {r['mape']:6.1f} "
                f"{r.get('fwd_mape', float('nan')):6.1f} "
                f"{r.get('bwd_mape', float('nan')):6.1f}"
            )
    print("\nNSA selected attention: NSA kernel vs FSA kernel (forward; 4 KV heads, d 128)")
    print(
        f"{'gpu':9s} {'blk':>3s} {'n':>2s} {'seq':>6s} {'G':>2s} {'NSA ms':>8s} {'FSA ms':>8s} "
        f"{'sel x':>6s} {'all x':>6s} choice"
    )
    rows = nsa_fsa_table()
    for r in rows:
        print(
            f"{r['gpu']:9s} {r['block']:3d} {r['selected']:2d} {r['seq']:6d} {r['group']:2d} "
            f"{r['nsa_sel_ms']:8.2f} {r['fsa_sel_ms']:8.2f} {r['sel_speedup']:6.2f} "
            f"{r['full_speedup']:6.2f} {r['choice']}"
        )
    for gpu in GPUS:
        full = np.array([r["full_speedup"] for r in rows if r["gpu"] == gpu])
        small = np.array([r["full_speedup"] for r in rows if r["gpu"] == gpu and r["group"] <= 8])
        print(
            f"{gpu}: NSA/FSA over all three branches: max {full.max():.2f}x, geometric mean "
            f"{np.exp(np.log(small).mean()):.2f}x for G <= 8 (published: up to 3.5x, 1.6x on "
            "average at kernel level)"
        )
    from workloads.sparsity import parse_pattern

    sale = parse_pattern("sale:density=0.1").tiles(65536, 32)
    st = sa.sale_time(sale, gpu="h100-sxm")
    print(
        f"\nSALE density 0.1, 64k x 32 heads, H100: estimate {st.estimate_s * 1e3:.2f} ms + "
        f"sparse {st.sparse_s * 1e3:.2f} ms vs dense causal {st.dense_s * 1e3:.2f} ms "
        f"({st.speedup:.2f}x)"
    )
    s2 = parse_pattern("s2:local=2,stride=8")
    masks = s2.tile_masks(32768, 16)["main"]
    hs = sa.head_sharded_time(s2.tiles(32768, 16), 4, direction="bwd", masks=masks)
    print(
        f"S2 local=2 stride=8, 32k x 16 heads over 4 ranks, H100 backward: ranks "
        f"{[round(x * 1e3, 2) for x in hs['rank_s']]} ms, imbalance {hs['imbalance']:.3f}"
    )
    if args.write:
        write_yaml(results)


if __name__ == "__main__":
    main()
