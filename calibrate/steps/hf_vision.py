"""Time Hugging Face transformers' own Qwen2.5-VL vision encoder (``model.visual``) on
images of several sizes, and the kernels it runs.

    python3 -m calibrate.steps.hf_vision --config examples/models/qwen2.5-vl-7b.config.json
        --out DIR [--warmup 3] [--steps 10] [--trace-dir DIR]

The encoder is built from the config's ``vision_config`` with random weights in bf16
(``Qwen2_5_VisionTransformerPretrainedModel._from_config``; no checkpoint), its attention
implementation as transformers defaults it (``attn_impl`` records it), and run without
gradients on ``pixel_values`` of the flattened patches and the ``grid_thw`` that Qwen2-VL's
processor would give each image (the grid comes from simcli's ``smart_resize`` port, the
``grid_*`` columns; patches per image = rows x columns). Rows: median forward time (CUDA
events), the GPU-busy time of the traced forward summed per kernel class (``gemm``,
``attention``, ``other``), kernel counts, peak memory. ``--trace-dir`` keeps a trimmed
profiler trace per row. Imports the standard library, torch and transformers only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
import sys
import time
from pathlib import Path

# (label, images, width px, height px): one image at growing sizes, then a batch
CASES = (
    ("448sq", 1, 448, 448),
    ("1024sq", 1, 1024, 1024),
    ("1280x720", 1, 1280, 720),
    ("1920x1080", 1, 1920, 1080),
    ("4x448sq", 4, 448, 448),
    ("4x1024sq", 4, 1024, 1024),
)
MIN_PIXELS, MAX_PIXELS = 3136, 12845056
# --prefill: (label, text tokens, width px, height px) of one request's whole prefill
PREFILL_CASES = (
    ("t512_448sq", 512, 448, 448),
    ("t512_1024sq", 512, 1024, 1024),
    ("t2048_1280x720", 2048, 1280, 720),
)


def grid(vc: dict, w: int, h: int) -> tuple[int, int]:
    """Qwen2-VL's smart_resize, in patches (workloads.vision.VisionEncoder.grid)."""
    f = vc.get("patch_size", 14) * vc.get("spatial_merge_size", 2)
    hb, wb = round(h / f) * f, round(w / f) * f
    if hb * wb > MAX_PIXELS:
        beta = math.sqrt(h * w / MAX_PIXELS)
        hb, wb = max(f, math.floor(h / beta / f) * f), max(f, math.floor(w / beta / f) * f)
    elif hb * wb < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (h * w))
        hb, wb = math.ceil(h * beta / f) * f, math.ceil(w * beta / f) * f
    p = vc.get("patch_size", 14)
    return hb // p, wb // p


def kernel_classes(trace_path: Path) -> dict[str, float]:
    """GPU-busy microseconds per kernel class of the traced forwards (per forward)."""
    with gzip.open(trace_path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps = max(1, len({e["name"] for e in events if e.get("cat") == "user_annotation"
                        and str(e.get("name", "")).startswith("ProfilerStep#")}))  # fmt: skip
    out = {"gemm_us": 0.0, "attention_us": 0.0, "other_us": 0.0, "kernels": 0.0}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        name = str(e.get("name", "")).lower()
        if any(s in name for s in ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")):
            key = "gemm_us"
        elif any(s in name for s in ("flash", "fmha", "attention", "sdpa")):
            key = "attention_us"
        else:
            key = "other_us"
        out[key] += float(e.get("dur", 0.0))
        out["kernels"] += 1
    return {k: v / steps for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--trace-dir", default=None)
    ap.add_argument("--prefill", action="store_true",
                    help="time the whole model's prefill of a prompt with an image")  # fmt: skip
    args = ap.parse_args(argv)
    if args.prefill:
        return prefill_main(args)

    import torch
    import transformers
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as mq

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from calibrate.bench.common import cuda_event_times_ms
    from calibrate.steps import tracing

    cfg = json.loads(Path(args.config).read_text())
    full = transformers.Qwen2_5_VLConfig(**cfg)
    vc = full.vision_config
    torch.manual_seed(0)
    model = mq.Qwen2_5_VisionTransformerPretrainedModel._from_config(vc)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    attn_impl = getattr(model.config, "_attn_implementation", None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace_dir = Path(args.trace_dir) if args.trace_dir else None
    if trace_dir:
        trace_dir.mkdir(parents=True, exist_ok=True)
    vcd = cfg["vision_config"]
    patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    rows = []
    for label, n, w, h in CASES:
        gh, gw = grid(vcd, w, h)
        thw = torch.tensor([[1, gh, gw]] * n, device="cuda")
        pix = torch.randn(n * gh * gw, patch_dim, device="cuda", dtype=torch.bfloat16)

        def fwd(pix=pix, thw=thw) -> None:
            with torch.no_grad():
                model(pix, grid_thw=thw)

        torch.cuda.reset_peak_memory_stats()
        times = cuda_event_times_ms(fwd, args.steps, warmup=args.warmup)
        row = {
            "case": label, "images": n, "width_px": w, "height_px": h, "grid_h": gh,
            "grid_w": gw, "patches": n * gh * gw, "attn_impl": attn_impl,
            "ms": statistics.median(times), "ms_min": min(times),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__,
        }  # fmt: skip
        if trace_dir:
            dst = trace_dir / f"hf_vision_{label}.json.gz"
            tracing.capture(fwd, dst, steps=2, extra={"case": label})
            row.update(kernel_classes(dst))
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "hf_vision.json").write_text(json.dumps({"rows": rows, "when": time.time()}, indent=1))
    return 0


def prefill_main(args) -> int:
    """The whole Qwen2.5-VL (random bf16 weights, all layers) prefilling one request: text
    tokens, then the image's placeholder tokens between vision start/end markers; one
    forward without gradients and without a cache (transformers computes the mRoPE
    positions, runs the encoder, scatters its output into the embeddings)."""
    import torch
    import transformers

    from calibrate.bench.common import cuda_event_times_ms
    from calibrate.steps import tracing

    cfg = json.loads(Path(args.config).read_text())
    config = transformers.Qwen2_5_VLConfig(**cfg)
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration._from_config(config)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    vc, vcd = config.vision_config, cfg["vision_config"]
    patch_dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace_dir = Path(args.trace_dir) if args.trace_dir else None
    rows = []
    for label, text, w, h in PREFILL_CASES:
        gh, gw = grid(vcd, w, h)
        n_img = gh * gw // vc.spatial_merge_size**2
        ids = [11] * (text // 2) + [cfg["vision_start_token_id"]] + [cfg["image_token_id"]] * n_img
        ids += [cfg["vision_end_token_id"]] + [11] * (text - text // 2 - 2)
        input_ids = torch.tensor([ids], device="cuda")
        pix = torch.randn(gh * gw, patch_dim, device="cuda", dtype=torch.bfloat16)
        thw = torch.tensor([[1, gh, gw]], device="cuda")

        def fwd(input_ids=input_ids, pix=pix, thw=thw) -> None:
            with torch.no_grad():
                model(input_ids=input_ids, pixel_values=pix, image_grid_thw=thw, use_cache=False)

        torch.cuda.reset_peak_memory_stats()
        times = cuda_event_times_ms(fwd, args.steps, warmup=args.warmup)
        row = {
            "case": label, "text_tokens": text, "width_px": w, "height_px": h,
            "image_tokens": n_img, "prompt_tokens": len(ids), "ms": statistics.median(times),
            "ms_min": min(times), "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "attn_impl": getattr(model.config, "_attn_implementation", None),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__,
        }  # fmt: skip
        if trace_dir:
            trace_dir.mkdir(parents=True, exist_ok=True)
            dst = trace_dir / f"hf_vlm_prefill_{label}.json.gz"
            tracing.capture(fwd, dst, steps=1, extra={"case": label})
            row.update(kernel_classes(dst))
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "hf_vlm_prefill.json").write_text(
        json.dumps({"rows": rows, "when": time.time()}, indent=1)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
