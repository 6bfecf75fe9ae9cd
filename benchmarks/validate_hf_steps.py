"""`simcli train` and `simcli step` against Hugging Face transformers' own modeling code.

Run: python benchmarks/validate_hf_steps.py [--format table|csv]

The truth is calibrate/data/hf-steps-h200-sxm (``python3 -m calibrate.steps.hf_step`` on an
H200: gpt-oss, Gemma 2/3, Phi-3/4 and a Llama reference built from examples/models with
random weights, layers cut to fit, transformers' default attention): training steps
(bf16 mixed precision, fused AdamW) and bf16 prefills. Each row is simulated with the
same layers (the config cut alike, its layer_types too): training as ``simcli train
--framework pytorch --gpus 1`` (its step time and peak memory), prefill as ``simcli step
--engine pytorch-eager --phase prefill`` (HF's eager forward; ``--max-model-len`` the
prompt, as HF does not stop at the config's positions), attention on flash. Nothing of
simcli is fitted on these rows. Rows simcli cannot run yet say why (an MoE or hybrid
prefill under pytorch-eager; gpt-oss's eager attention with sinks is not an op class of
ours). The hybrids' rows (Qwen3-Next, Kimi-Linear, Nemotron-H) are in
calibrate/data/hf-steps-hybrids-h200-sxm; calibrate/data/hf-steps-bf16-h200-sxm holds
training steps with bf16 parameters (``train-bf16``: ``--precision bf16``), where
transformers' MoE experts run one grouped GEMM per projection instead of the per-expert
loop they fall back to with fp32 parameters (``--experts-impl``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from calibrate.steps.hf_step import cut_layers

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "calibrate" / "data" / "hf-steps-h200-sxm" / "hf_step.csv"
HYBRIDS = ROOT / "calibrate" / "data" / "hf-steps-hybrids-h200-sxm" / "hf_step.csv"
BF16 = ROOT / "calibrate" / "data" / "hf-steps-bf16-h200-sxm" / "hf_step.csv"
GIB = 1024**3


def cut_config(name: str, layers: int, folder: Path) -> Path:
    """examples/models/<name>.config.json with ``layers`` layers (layer_types cut alike)."""
    cfg = json.loads((ROOT / "examples" / "models" / f"{name}.config.json").read_text())
    text = cfg.get("text_config") if cfg.get("model_type") == "gemma3" else None
    body = text if isinstance(text, dict) else cfg
    body.update(cut_layers(body, layers))
    cfg["name"] = f"{name}-{layers}l"
    path = folder / f"{name}-{layers}l.json"
    path.write_text(json.dumps(cfg))
    return path


def _run(args: list[str]) -> dict | str:
    from simcli.cli import app

    res = CliRunner().invoke(app, [*args, "--format", "json"])
    if res.exit_code != 0:
        return (res.stderr or res.output).strip().splitlines()[-1]
    return json.loads(res.stdout)


def rows() -> pd.DataFrame:
    data = pd.concat([pd.read_csv(p) for p in (DATA, HYBRIDS, BF16)], ignore_index=True)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in data[data.status == "ok"].itertuples():
            cfg = str(cut_config(r.model, int(r.layers), Path(tmp)))
            row = {"model": r.model, "phase": r.phase, "seq_len": r.seq_len,
                   "attn_impl": r.attn_impl, "measured_ms": r.step_ms}  # fmt: skip
            if r.phase.startswith("train"):
                # train-bf16: bf16 parameters, so transformers' MoE experts run grouped_mm
                bf16 = ["--precision", "bf16"] if r.phase == "train-bf16" else []
                got = _run(["train", "--model", cfg, "--gpu", "h200-sxm", "--gpus", "1",
                            "--micro-batch", str(r.batch), "--global-batch", str(r.batch),
                            "--seq-len", str(r.seq_len), "--framework", "pytorch",
                            "--attn-backend", "flash", *bf16])  # fmt: skip
                if isinstance(got, dict):
                    row["predicted_ms"] = got["iteration_s"] * 1e3
                    row["measured_peak_gib"] = r.peak_alloc_bytes / GIB
                    row["predicted_peak_gib"] = got["memory_gib"]["total"]
            else:
                got = _run(["step", "--model", cfg, "--gpu", "h200-sxm", "--engine",
                            "pytorch-eager", "--phase", "prefill", "--batch", str(r.batch),
                            "--prompt-len", str(r.seq_len), "--attn-backend", "flash",
                            "--max-model-len", str(r.seq_len)])  # fmt: skip
                if isinstance(got, dict):
                    row["predicted_ms"] = got["step_ms"]
            if isinstance(got, str):
                row["not_runnable"] = got
            out.append(row)
    df = pd.DataFrame(out)
    df["error_pct"] = 100 * (df["predicted_ms"] / df["measured_ms"] - 1)
    if "predicted_peak_gib" in df:
        df["peak_error_pct"] = 100 * (df["predicted_peak_gib"] / df["measured_peak_gib"] - 1)
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", choices=("table", "csv"), default="table")
    args = ap.parse_args(argv)
    df = rows()
    if args.format == "csv":
        df.to_csv(sys.stdout, index=False)
        return 0
    pd.set_option("display.width", 200)
    print(df.round(1).to_string(index=False))
    ok = df.dropna(subset=["predicted_ms"])
    print("\nMAPE by model and phase (step time):")
    print(ok.assign(abs=ok.error_pct.abs()).groupby(["model", "phase"])["abs"].mean().round(1))
    if "peak_error_pct" in ok:
        peak = ok.dropna(subset=["peak_error_pct"])
        print("\ntraining peak memory MAPE:", round(peak.peak_error_pct.abs().mean(), 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
