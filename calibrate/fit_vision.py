"""Fit the host costs of transformers' eager Qwen2.5-VL vision encoder and report how
simcli's encoder pricing does on the forwards it was not fitted on.

    python -m calibrate.fit_vision [--write]

Data: ``calibrate/data/hf-vision-h200-sxm`` (``python3 -m calibrate.steps.hf_vision`` on an
H200: the encoder of ``examples/models/qwen2.5-vl-7b.config.json``, random bf16 weights,
SDPA as transformers defaults it; one image of 448x448, 1024x1024, 1280x720 and
1920x1080 px, four of 448x448 and 1024x1024). The kernels are priced by the shipped H200
calibration (:func:`costmodels.steps.vision_step.encoder_kernels`); the host launches
each after :data:`~costmodels.steps.serving_grid.EAGER_HOST_DISPATCH_S` (measured on the eager
serving steps, not refitted here) and syncs once per block. Two constants are fitted:
``per_window_call`` (the Python loop iteration around each window's SDPA call beyond its
dispatch) and ``per_forward`` (rotary table and window index built on the host), by
least squares on the relative error of the two single-image forwards at 448 and 1024 px.
Held out: the 1280x720 and 1920x1080 images and both four-image batches.

``--write`` stores ``costmodels/data/vision_encoder.yaml``. Prints per-row errors and the
held-out MAPE of the forward time, then the whole model's prefills of a prompt with one
image (``hf_vlm_prefill.json``, ``hf_vision --prefill``: transformers' Qwen2.5-VL-7B, all
layers) against ``simcli step --engine pytorch-eager --images-per-request 1``, never fitted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import yaml
from scipy.optimize import minimize

from costmodels.ops.select import get_cost_model
from costmodels.steps import vision_step
from workloads.models import load_model
from workloads.vision import ImageLoad

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibrate" / "data" / "hf-vision-h200-sxm"
CONFIG = ROOT / "examples" / "models" / "qwen2.5-vl-7b.config.json"
OUT = ROOT / "costmodels" / "data" / "vision_encoder.yaml"
FIT_CASES = ("448sq", "1024sq")


def rows() -> list[dict]:
    return json.loads((DATA / "hf_vision.json").read_text())["rows"]


def predict_ms(step: SimpleNamespace, r: dict, host: dict[str, float]) -> float:
    """The priced eager forward of row ``r`` with host constants ``host``."""
    img = ImageLoad(1, r["width_px"], r["height_px"])
    return 1e3 * vision_step.dispatch_s(*vision_step.encoder_kernels(step, img, r["images"], host))


def prefill_rows() -> list[dict]:
    """The measured whole prefills next to ``step``'s price of the same request on an H200
    (eager engine: transformers' model, its encoder included)."""
    from costmodels.steps.serving import StepModel

    model = load_model(CONFIG)
    out = []
    for r in json.loads((DATA / "hf_vlm_prefill.json").read_text())["rows"]:
        img = ImageLoad(1, r["width_px"], r["height_px"])
        step = vision_step.with_images(StepModel(model, "h200-sxm", engine="pytorch-eager"), img)
        tokens = r["text_tokens"] + img.tokens(model.vision)
        ms = 1e3 * step.step_s(np.array([tokens]), np.array([0]), np.zeros(0, np.int64))
        out.append({**r, "predicted_ms": ms, "error_pct": 100 * (ms / r["ms"] - 1)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    model = load_model(CONFIG)
    step = SimpleNamespace(
        model=model,
        engine="pytorch-eager",
        dtype="bf16",
        tp=1,
        cost_model=get_cost_model("h200-sxm"),
    )
    data = rows()
    fit = [r for r in data if r["case"] in FIT_CASES]

    def loss(x: np.ndarray) -> float:
        host = {"per_window_call": max(0.0, x[0]) * 1e-6, "per_forward": max(0.0, x[1]) * 1e-3}
        return sum((predict_ms(step, r, host) / r["ms"] - 1.0) ** 2 for r in fit)

    best = minimize(loss, np.array([20.0, 5.0]), method="Nelder-Mead", options={"xatol": 0.01})
    host = {
        "per_window_call": round(float(max(0.0, best.x[0])) * 1e-6, 9),
        "per_forward": round(float(max(0.0, best.x[1])) * 1e-3, 6),
    }
    print(f"fitted on {', '.join(FIT_CASES)}: per_window_call {host['per_window_call'] * 1e6:.1f} "
          f"us, per_forward {host['per_forward'] * 1e3:.2f} ms")  # fmt: skip
    errs: dict[str, list[float]] = {"forward": []}
    for r in data:
        ms = predict_ms(step, r, host)
        held = r["case"] not in FIT_CASES
        g, _, _ = vision_step.encoder_kernels(
            step, ImageLoad(1, r["width_px"], r["height_px"]), r["images"]
        )
        print(f"{r['case']:>10} {'held-out' if held else 'fit':>8}  measured {r['ms']:7.1f} ms  "
              f"priced {ms:7.1f} ms  {100 * (ms / r['ms'] - 1):+6.1f}%  kernels "
              f"{int(r['kernels'])} / {g.size}")  # fmt: skip
        if held:
            errs["forward"].append(abs(ms / r["ms"] - 1))
    mape = {k: round(100 * float(np.mean(v)), 1) for k, v in errs.items() if v}
    print(f"held-out MAPE of the forward: {mape['forward']}%")
    pre = prefill_rows()
    for r in pre:
        print(f"prefill {r['case']:>15}: measured {r['ms']:7.1f} ms  priced "
              f"{r['predicted_ms']:7.1f} ms  {r['error_pct']:+6.1f}%")  # fmt: skip
    print(f"whole-prefill MAPE: {np.mean([abs(r['error_pct']) for r in pre]):.1f}%")
    if args.write:
        head = (
            "# Host costs of transformers' eager Qwen2.5-VL vision encoder beyond one dispatch\n"
            "# per kernel, fitted on its H200 forwards (calibrate/data/hf-vision-h200-sxm).\n"
            "# Regenerate: python -m calibrate.fit_vision --write\n"
        )
        body = {"eager_host_s": host, "fitted_on": list(FIT_CASES), "held_out_mape_pct": mape}
        OUT.write_text(head + yaml.safe_dump(body, sort_keys=True))
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
